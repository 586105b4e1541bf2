"""The encoding of hosted envs' info dicts: msgpack, numpy-aware, never pickle.

A hosted env's worker encodes each env's info after every reset and step
into that env's slot of the segment (docs/python-envs.md, "Infos"); the
VecEnv decodes the slots that are not empty and merges them as gymnasium's
vector envs do.  The daemon copies the slots like any output array and never
decodes them.

Types carried: None, bool, int, float, str, bytes, list, dict (str or int
keys) as msgpack has them; tuples, numpy arrays (any fixed-size dtype but
object, with their shape) and numpy scalars as ext types, so they come back
with their type, dtype and shape:

    ext 1  ndarray       msgpack [dtype.str, shape, C-order bytes]
    ext 2  numpy scalar  msgpack [dtype.str, bytes]
    ext 3  tuple         msgpack [items...]

Anything else is refused with a TypeError naming its type.
"""
from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

EXT_NDARRAY, EXT_SCALAR, EXT_TUPLE = 1, 2, 3


def _default(value: Any) -> msgpack.ExtType:
    if isinstance(value, tuple):
        return msgpack.ExtType(EXT_TUPLE, encode(list(value)))
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind not in "OV":
        if isinstance(value, np.generic):
            return msgpack.ExtType(EXT_SCALAR, encode([value.dtype.str, value.tobytes()]))
        return msgpack.ExtType(EXT_NDARRAY, encode(
            [value.dtype.str, list(value.shape), np.ascontiguousarray(value).tobytes()]))
    if isinstance(value, (bool, int, float, str, bytes, list, dict)):
        # a subclass (e.g. an IntEnum): strict_types does not take it as its base
        raise TypeError(f"a {type(value).__qualname__} (a subclass of a built-in type; "
                        "convert it to that type)")
    raise TypeError(f"a {type(value).__module__}.{type(value).__qualname__} "
                    "(info values may be None, bool, int, float, str, bytes, list, tuple, "
                    "dict, numpy arrays and numpy scalars)")


def encode(value: Any) -> bytes:
    """value (an info dict) as msgpack bytes; TypeError for a type it cannot carry."""
    return msgpack.packb(value, default=_default, strict_types=True, use_bin_type=True)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == EXT_TUPLE:
        return tuple(decode(data))
    if code == EXT_NDARRAY:
        dtype, shape, raw = decode(data)
        return np.frombuffer(raw, np.dtype(dtype)).reshape(shape).copy()
    if code == EXT_SCALAR:
        dtype, raw = decode(data)
        return np.frombuffer(raw, np.dtype(dtype))[0]
    return msgpack.ExtType(code, data)


def decode(data: bytes | memoryview) -> Any:
    """The value encode encoded."""
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
