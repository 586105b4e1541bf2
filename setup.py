# setuptools has no pyproject key for cffi modules; everything else is in pyproject.toml.
import os
import sys

# One line, before anything is imported or compiled, on a machine that cannot
# build envd (not Linux, no C compiler, no Python headers): native/build_checks.py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "native"))
from build_checks import check_build_machine
from build_warnings import own_warnings_build_ext

check_build_machine()

from setuptools import Extension, setup  # noqa: E402
from setuptools.command.build_ext import build_ext  # noqa: E402

# cffi compiles the native core against Python's limited API (the module is
# _envd_native.abi3.so), so one wheel serves every CPython >= 3.10 (the
# project's requires-python): tag it cp310-abi3.  envd's own C compiles with
# warnings as errors (native/build_warnings.py).  envd.native._envd_call
# (native/capi/bound_call.c) is a small CPython extension on the same limited
# API: the in-process step's call without cffi's GIL release; it links
# nothing of envd (cffi hands it the functions' addresses).
# (linked to libc although it calls none of it: the linker drops an unused
# libc, and auditwheel then cannot tell which libc the wheel is for)
BOUND_CALL = Extension("envd.native._envd_call", ["native/capi/bound_call.c"],
                       define_macros=[("Py_LIMITED_API", "0x030A0000")], py_limited_api=True,
                       extra_link_args=["-Wl,--no-as-needed", "-lc"])
setup(cffi_modules=["native/build_ffi.py:ffibuilder"],
      ext_modules=[BOUND_CALL],
      cmdclass={"build_ext": own_warnings_build_ext(build_ext)},
      options={"bdist_wheel": {"py_limited_api": "cp310"}})
