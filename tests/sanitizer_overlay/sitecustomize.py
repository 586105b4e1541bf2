"""Loaded at interpreter start when this folder is on PYTHONPATH (see
tests/support/sanitized_build.py): answer the import of envd.native._envd_native with
the extension file named by ENVD_NATIVE_OVERRIDE (a sanitizer build); every
other import is left to the normal finders."""
import importlib.machinery
import os
import sys

_NAME = "envd.native._envd_native"
_PATH = os.environ.get("ENVD_NATIVE_OVERRIDE")


class _OverrideFinder:
    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname != _NAME:
            return None
        loader = importlib.machinery.ExtensionFileLoader(_NAME, _PATH)
        return importlib.machinery.ModuleSpec(_NAME, loader, origin=_PATH)


if _PATH:
    sys.meta_path.insert(0, _OverrideFinder())
