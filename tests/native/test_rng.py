"""The per-env RNG (native/src/rng.c) against numpy itself: SeedSequence ->
PCG64 raw 64-bit outputs, Generator.random() and Generator.uniform()."""
from __future__ import annotations

import ctypes
import re

import cbuild
import numpy as np
import pytest

SEEDS = [0, 1, 2, 123, 2**31 - 1, 2**32 - 1, 2**32, 2**40 + 5, 2**63, 2**64 - 1]


@pytest.fixture(scope="module")
def lib():
    lib = cbuild.load(["rng.c", cbuild.ROOT / "tests/native/rng_draws.c"])
    # the draws are static inline in envd.h; rng_draws.c exports them
    for name in ("next_u64", "random", "uniform"):
        setattr(lib, f"envd_rng_{name}", getattr(lib, f"test_rng_{name}"))
    lib.envd_rng_seed.argtypes = [ctypes.POINTER(cbuild.Rng), ctypes.c_uint64]
    lib.envd_rng_next_u64.argtypes = [ctypes.POINTER(cbuild.Rng)]
    lib.envd_rng_next_u64.restype = ctypes.c_uint64
    lib.envd_rng_random.argtypes = [ctypes.POINTER(cbuild.Rng)]
    lib.envd_rng_random.restype = ctypes.c_double
    lib.envd_rng_uniform.argtypes = [ctypes.POINTER(cbuild.Rng), ctypes.c_double, ctypes.c_double]
    lib.envd_rng_uniform.restype = ctypes.c_double
    return lib


def seeded(lib, seed):
    rng = cbuild.Rng()
    lib.envd_rng_seed(ctypes.byref(rng), seed)
    return rng


@pytest.mark.parametrize("seed", SEEDS)
def test_raw_stream_matches_numpy_pcg64(lib, seed):
    rng = seeded(lib, seed)
    expected = np.random.PCG64(np.random.SeedSequence(seed)).random_raw(1000)
    ours = [lib.envd_rng_next_u64(ctypes.byref(rng)) for _ in range(1000)]
    assert ours == [int(x) for x in expected]


@pytest.mark.parametrize("seed", SEEDS)
def test_doubles_match_numpy_generator(lib, seed):
    rng = seeded(lib, seed)
    gen = np.random.default_rng(seed)
    assert [lib.envd_rng_random(ctypes.byref(rng)) for _ in range(500)] == list(gen.random(500))
    for low, high in [(-0.05, 0.05), (-0.6, -0.4), (-np.pi, np.pi), (0.0, 1e-300), (-1e300, 1e300)]:
        assert lib.envd_rng_uniform(ctypes.byref(rng), low, high) == gen.uniform(low, high)


def test_different_seeds_give_different_streams(lib):
    first = [lib.envd_rng_next_u64(ctypes.byref(seeded(lib, s))) for s in range(100)]
    assert len(set(first)) == 100


def test_no_global_rand_in_native_sources():
    """libc's global generators are not thread-safe and not reproducible per env."""
    call = re.compile(r"(?<![\w.])(rand|srand|random|srandom|drand48|rand_r)\s*\(")
    comment = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
    for path in cbuild.NATIVE.rglob("*.c"):
        code = comment.sub("", path.read_text())
        assert not call.search(code), f"{path} calls a libc RNG"
