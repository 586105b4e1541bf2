"""PufferLib's own binding of an Ocean env, built as PufferLib builds it: the
yardstick of ``envd bench --ocean`` and the reference of the Ocean tests.

``build(env, tree, cache)`` compiles the env's unmodified ``binding.c`` with
the real ``Python.h``, numpy and PufferLib's own ``env_binding.h`` into a
Python extension (PufferLib's flags, raylib linked as its setup.py links it),
under ``cache/reference`` keyed by the sources, flags and Python; ``load``
imports it.  Nothing of PufferLib is copied: the files are read where they
are.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
import types
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from envd.native import ocean_build, ocean_source


def build(env: str, tree: Path, cache: Path, extra_flags: Sequence[str] = ()) -> Path:
    """The path of PufferLib's binding of env from tree, compiled once into
    cache (a private directory); RuntimeError with the compiler's output when
    it does not build."""
    ocean = ocean_source.ocean_dir(tree)
    raylib = next(tree.glob("raylib*/lib/libraylib.a"))
    flags = [*ocean_build.PUFFER_FLAGS, "-DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION",
             "-fPIC", *extra_flags]
    includes = [sysconfig.get_paths()["include"], np.get_include(),
                str(raylib.parent.parent / "include")]
    digest = hashlib.sha256()
    for path in sorted((ocean / env).glob("*.[ch]")) + [ocean / "env_binding.h"]:
        digest.update(path.read_bytes())
    digest.update(" ".join(flags + includes + [sys.version]).encode())
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    out = cache / "reference" / f"{env}-{digest.hexdigest()[:16]}" / f"binding{suffix}"
    if not out.is_file():
        out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = out.with_name(f".binding-{os.getpid()}{suffix}")
        cmd = ["gcc", "-shared", *flags, *(f"-I{i}" for i in includes),
               str(ocean / env / "binding.c"), "-o", str(tmp), str(raylib), "-lm",
               "-lpthread", "-ldl"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"PufferLib's binding of {env} does not build:\n"
                               f"{done.stderr[-3000:]}")
        tmp.replace(out)
    return out


def load(path: Path) -> types.ModuleType:
    """The extension at path, imported (as PufferLib's ``binding``)."""
    spec = importlib.util.spec_from_file_location("binding", path)
    if spec is None or spec.loader is None:  # (not a path an extension can have)
        raise ImportError(f"cannot import {path} as an extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
