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

Bytes from a peer that is not trusted (a client's env_call request, a
worker's reply to one, in the daemon) are decoded with ``decode(data,
max_objects=...)``: the ext types nest at most MAX_EXT_DEPTH deep (each level
is a new msgpack unpacker on the C stack: unbounded, a few hundred levels in
a frame of a few KB crash the process) and at most max_objects objects
(containers and their items) are built, each container's length checked
before it is allocated, so a frame of empty lists cannot decode to ~64x its
size.
"""
from __future__ import annotations

from collections.abc import Callable
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


#: How deep ext types (tuples, arrays, scalars) may nest in a bounded decode.
MAX_EXT_DEPTH = 32


def _ext_value(code: int, data: bytes, inner: Callable[[bytes], Any]) -> Any:
    if code == EXT_TUPLE:
        return tuple(inner(data))
    if code == EXT_NDARRAY:
        dtype, shape, raw = inner(data)
        return np.frombuffer(raw, np.dtype(dtype)).reshape(shape).copy()
    if code == EXT_SCALAR:
        dtype, raw = inner(data)
        return np.frombuffer(raw, np.dtype(dtype))[0]
    return msgpack.ExtType(code, data)


def _ext_hook(code: int, data: bytes) -> Any:
    return _ext_value(code, data, decode)


def decode(data: bytes | memoryview, *, max_objects: int | None = None) -> Any:
    """The value encode encoded.  With max_objects (bytes from a peer that is
    not trusted): ValueError past MAX_EXT_DEPTH nested ext types or past
    max_objects objects, raised before they are built."""
    if max_objects is None:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    return _BoundedDecode(max_objects).decode(data, 0)


class _BoundedDecode:
    """One bounded decode: a budget of objects shared by every nested ext."""

    def __init__(self, max_objects: int) -> None:
        self.left = max_objects

    def _spend(self, container: Any) -> Any:
        self.left -= len(container) + 1
        if self.left < 0:
            raise ValueError("the data holds too many objects (send bulk values as "
                             "numpy arrays)")
        return container

    def decode(self, data: bytes | memoryview, depth: int) -> Any:
        if depth > MAX_EXT_DEPTH:
            raise ValueError(f"the data nests tuples or arrays more than {MAX_EXT_DEPTH} deep")
        # each container's length is checked against the budget before it is
        # allocated; the hooks then charge what was built
        limit = max(self.left, 0)
        return msgpack.unpackb(
            data, raw=False, strict_map_key=False,
            ext_hook=lambda code, inner: _ext_value(
                code, inner, lambda d: self.decode(d, depth + 1)),
            list_hook=self._spend, object_hook=self._spend,
            max_array_len=limit, max_map_len=limit)
