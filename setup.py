# setuptools has no pyproject key for cffi modules; everything else is in pyproject.toml.
from setuptools import setup

# cffi compiles the native core against Python's limited API (the module is
# _envd_native.abi3.so), so one wheel serves every CPython >= 3.10 (the
# project's requires-python): tag it cp310-abi3.
setup(cffi_modules=["native/build_ffi.py:ffibuilder"],
      options={"bdist_wheel": {"py_limited_api": "cp310"}})
