# setuptools has no pyproject key for cffi modules; everything else is in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["native/build_ffi.py:ffibuilder"])
