"""envd_npy_sinf/cosf (native/src/npy_f32_trig.c) against numpy's float32 np.sin/np.cos.

numpy's float32 sin/cos is its own SIMD kernel, not libm, and envs whose
gymnasium reference applies it to float32 state (Acrobot's reset observation)
must match it bit for bit.
"""
import ctypes
import functools

import cbuild
import numpy as np
import pytest

N = 2_000_000
SIN_MAX, COS_MAX = np.float32(117435.992), np.float32(71476.0625)


@pytest.fixture(scope="module")
def lib():
    lib = cbuild.load(["npy_f32_trig.c"])
    lib.envd_npy_sincosf_array.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                           ctypes.c_int]
    lib.envd_npy_sinf.argtypes = [ctypes.c_float]
    lib.envd_npy_sinf.restype = ctypes.c_float
    lib.envd_npy_cosf.argtypes = [ctypes.c_float]
    lib.envd_npy_cosf.restype = ctypes.c_float
    return lib


def c_map(lib, x: np.ndarray, cosine: bool) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    lib.envd_npy_sincosf_array(x.ctypes.data, out.ctypes.data, x.size, int(cosine))
    return out


def assert_bits_equal(x, got, want):
    bad = np.nonzero(got.view(np.uint32) != want.view(np.uint32))[0]
    assert bad.size == 0, (f"{bad.size} mismatches, e.g. x={x[bad[:5]]!r} "
                           f"got={got[bad[:5]]!r} want={want[bad[:5]]!r}")


def special_values() -> np.ndarray:
    f32 = np.float32
    tiny = np.finfo(f32).tiny
    vals = [0.0, -0.0, tiny, -tiny, 1e-45, -1e-45, 1e-30, -1e-30, 1e-8, np.finfo(f32).max,
            -np.finfo(f32).max, np.inf, -np.inf, np.nan, -np.nan, 1e10, -1e10,
            np.pi / 4, np.pi / 2, np.pi, 2 * np.pi, 1e5, 2 ** 22, 2 ** 23]
    for edge in (SIN_MAX, COS_MAX):  # the libm fallback thresholds and their neighbours
        for e in (edge, -edge):
            vals += [np.nextafter(e, f32(0)), e, np.nextafter(e, f32(np.inf) * np.sign(e))]
    x = np.array(vals, f32)
    # quadrant boundaries: multiples of pi/4 and their float neighbours
    k = (np.arange(-2000, 2000) * (np.pi / 4)).astype(f32)
    near = [k, np.nextafter(k, f32(np.inf)), np.nextafter(k, f32(-np.inf))]
    return np.concatenate([x, *near])


@functools.cache
def inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20240607)
    return {
        "pi": rng.uniform(-np.pi, np.pi, N).astype(np.float32),
        "0.2": rng.uniform(-0.2, 0.2, N).astype(np.float32),
        "100": rng.uniform(-100, 100, N).astype(np.float32),
        # crosses both libm fallback thresholds
        "2e5": rng.uniform(-2e5, 2e5, N).astype(np.float32),
        # random bit patterns: all exponents, subnormals, inf and NaN payloads
        "bits": rng.integers(0, 2 ** 32, N, dtype=np.uint64).astype(np.uint32).view(np.float32),
        "special": special_values(),
    }


@pytest.mark.parametrize("cosine", [False, True], ids=["sin", "cos"])
@pytest.mark.parametrize("name", list(inputs()))
def test_matches_numpy_vectorised(lib, name, cosine):
    x = inputs()[name]
    with np.errstate(all="ignore"):
        want = (np.cos if cosine else np.sin)(x)
    assert_bits_equal(x, c_map(lib, x, cosine), want)


def test_matches_numpy_scalar_calls(lib):
    """np.sin(np.float32(v)) goes through the same kernel with one lane."""
    x = np.concatenate([special_values(),
                        np.random.default_rng(7).uniform(-4, 4, 2000).astype(np.float32)])
    for cosine, fn, cfn in ((False, np.sin, lib.envd_npy_sinf), (True, np.cos, lib.envd_npy_cosf)):
        with np.errstate(all="ignore"):
            want = np.array([fn(np.float32(v)) for v in x], np.float32)
        got = np.array([cfn(float(v)) for v in x], np.float32)
        assert_bits_equal(x, got, want)
        assert_bits_equal(x, c_map(lib, x, cosine), want)


def test_nan_is_numpys_positive_quiet_nan(lib):
    for v in (np.float32(np.nan), -np.float32(np.nan)):
        assert np.float32(lib.envd_npy_sinf(float(v))).view(np.uint32) == 0x7FC00000
        assert np.float32(lib.envd_npy_cosf(float(v))).view(np.uint32) == 0x7FC00000
