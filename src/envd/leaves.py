"""Spaces as leaves: how envd lays out, checks and describes the observation
and action spaces of hosted Python envs (docs/python-envs.md, "Spaces").

A space is a tree whose inner nodes are Dict and Tuple and whose leaves are
Box (any dtype), Discrete, MultiDiscrete and MultiBinary; a space with no
inner node is one leaf.  Leaves are numbered in a fixed order (a Dict's keys
in its own order, a Tuple's items in order, depth first), the same in the
daemon and the client, which rebuilds the space from its wire form
(``space_to_wire``: msgpack-able, never pickled).

* Observations: one batch buffer per leaf, ``(num_envs, *leaf shape)`` of
  the leaf's dtype, named ``observations`` for a one-leaf space and
  ``observations.<k>`` (k = leaf number) otherwise; the VecEnv returns them as
  gymnasium's ``batch_space`` batches the space (a dict of arrays for a
  Dict, a tuple for a Tuple).
* Actions: one row of bytes per env (``action_row``): a one-leaf space's row
  is the leaf itself, ``(num_envs, *shape)`` of its dtype; a Dict or Tuple's
  row packs its leaves one after the other (each aligned to its item size)
  in a ``(num_envs, row bytes)`` uint8 buffer whose leaves are numpy views
  (``leaf_views``).  One row per env is what the native backend copies out
  of the caller's buffer and range-checks, whatever the space.
* Range checks (``range_checks``): every element of a Discrete, MultiDiscrete
  or MultiBinary leaf, as (byte offset in the row, size, signed, low, high);
  Box actions are passed to the env as gymnasium passes them (unchecked).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from gymnasium import spaces

from envd.errors import InvalidActionError, InvalidArgumentError

#: The leaf spaces envd hosts.
LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
#: Nesting deeper than this is refused (a wire form is decoded recursively).
MAX_DEPTH = 16
#: At most this many leaves per space (each is a buffer of the segment).
MAX_LEAVES = 256

Path = tuple  # keys (Dict) and indices (Tuple) from the root to a leaf


def path_name(path: Path) -> str:
    """A leaf's path as Python would index the value: "['pos'][0]" ("" for the root)."""
    return "".join(f"[{key!r}]" for key in path)


def check_space(space: spaces.Space, what: str, env_name: str) -> None:
    """Refuse (InvalidArgumentError naming the space and its path) a space
    envd cannot host: anything but the leaves above and Dict/Tuple of them,
    a Dict key that is not a str, nesting deeper than MAX_DEPTH or more than
    MAX_LEAVES leaves."""
    count = 0

    def visit(node: spaces.Space, path: Path) -> None:
        nonlocal count
        where = f"its {what} space" + (f" at {path_name(path)}" if path else "")
        if len(path) > MAX_DEPTH:
            raise InvalidArgumentError(f"{env_name}: {where} nests deeper than {MAX_DEPTH}")
        if isinstance(node, spaces.Dict):
            for key, sub in node.spaces.items():
                if not isinstance(key, str):
                    raise InvalidArgumentError(
                        f"{env_name}: {where} has a Dict key {key!r} that is not a str")
                visit(sub, path + (key,))
        elif isinstance(node, spaces.Tuple):
            for k, sub in enumerate(node.spaces):
                visit(sub, path + (k,))
        elif isinstance(node, LEAF_SPACES):
            count += 1
            if count > MAX_LEAVES:
                raise InvalidArgumentError(f"{env_name}: its {what} space has more than "
                                           f"{MAX_LEAVES} leaves")
        else:
            raise InvalidArgumentError(
                f"{env_name}: {where} is {type(node).__name__} ({node}); hosted Python envs "
                "support Box, Discrete, MultiDiscrete, MultiBinary and Dict/Tuple of them")
    visit(space, ())


def is_composite(space: spaces.Space) -> bool:
    return isinstance(space, (spaces.Dict, spaces.Tuple))


def leaves(space: spaces.Space, path: Path = ()) -> Iterator[tuple[Path, spaces.Space]]:
    """(path, leaf space) of every leaf, in leaf order."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            yield from leaves(sub, path + (key,))
    elif isinstance(space, spaces.Tuple):
        for k, sub in enumerate(space.spaces):
            yield from leaves(sub, path + (k,))
    else:
        yield path, space


def leaf_shape_dtype(leaf: spaces.Space) -> tuple[tuple[int, ...], np.dtype]:
    """One env's value of a leaf: (shape, dtype), as gymnasium batches it."""
    if isinstance(leaf, spaces.Discrete):
        return (), np.dtype(leaf.dtype)
    if isinstance(leaf, spaces.MultiDiscrete):
        return tuple(leaf.nvec.shape), np.dtype(leaf.dtype)
    shape = leaf.shape
    assert shape is not None  # (every leaf space has one: Box, MultiBinary)
    return tuple(shape), np.dtype(leaf.dtype)


def observation_buffers(prefix: str, space: spaces.Space, num_envs: int
                        ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """name -> (shape, dtype) of the observation leaves' buffers (prefix:
    "observations" or "final_observations")."""
    if not is_composite(space):
        shape, dtype = leaf_shape_dtype(space)
        return {prefix: ((num_envs, *shape), dtype)}
    return {f"{prefix}.{k}": ((num_envs, *shape), dtype)
            for k, (shape, dtype) in enumerate(leaf_shape_dtype(leaf) for _, leaf in leaves(space))}


def leaf_names(prefix: str, space: spaces.Space) -> list[str]:
    """The buffer names of observation_buffers, in leaf order."""
    if not is_composite(space):
        return [prefix]
    return [f"{prefix}.{k}" for k in range(sum(1 for _ in leaves(space)))]


def _row_offsets(space: spaces.Space) -> tuple[list[int], int]:
    """Byte offsets of the leaves in a packed action row, and the row's size
    (each leaf aligned to its item size; the row to 8 bytes)."""
    offsets, offset = [], 0
    for _, leaf in leaves(space):
        shape, dtype = leaf_shape_dtype(leaf)
        offset = -(-offset // dtype.itemsize) * dtype.itemsize
        offsets.append(offset)
        offset += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return offsets, max(8, -(-offset // 8) * 8)


def action_row(space: spaces.Space) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of one env's row of the actions buffer."""
    if not is_composite(space):
        return leaf_shape_dtype(space)
    return (_row_offsets(space)[1],), np.dtype(np.uint8)


def leaf_views(space: spaces.Space, rows: np.ndarray) -> list[np.ndarray]:
    """The leaves of an actions buffer (or of any rows of it, shape (m, *row)):
    (m, *leaf shape) arrays of the leaves' dtypes, views of rows."""
    if not is_composite(space):
        return [rows]
    offsets, _ = _row_offsets(space)
    views = []
    for offset, (_, leaf) in zip(offsets, leaves(space)):
        shape, dtype = leaf_shape_dtype(leaf)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        views.append(rows[:, offset:offset + size].view(dtype).reshape(len(rows), *shape))
    return views


def unflatten(space: spaces.Space, values: list[Any]) -> Any:
    """The value of space whose leaves (in leaf order) are values: a dict for
    a Dict, a tuple for a Tuple, the value itself for a leaf."""
    it = iter(values)

    def build(node: spaces.Space) -> Any:
        if isinstance(node, spaces.Dict):
            return {key: build(sub) for key, sub in node.spaces.items()}
        if isinstance(node, spaces.Tuple):
            return tuple(build(sub) for sub in node.spaces)
        return next(it)
    return build(space)


def flatten(space: spaces.Space, value: Any, what: str = "value",
            error: type[Exception] = InvalidActionError) -> list[Any]:
    """The leaves of a value of space, in leaf order; error (InvalidActionError:
    a caller's actions) if its structure (dict keys, tuple length) does not
    match the space's."""
    out: list[Any] = []

    def visit(node: spaces.Space, v: Any, path: Path) -> None:
        if isinstance(node, spaces.Dict):
            if not isinstance(v, dict) or set(v) != set(node.spaces):
                got = sorted(map(str, v)) if isinstance(v, dict) else type(v).__name__
                raise error(
                    f"{what}{path_name(path)} must be a dict with keys "
                    f"{sorted(node.spaces)}, got {got}")
            for key, sub in node.spaces.items():
                visit(sub, v[key], path + (key,))
        elif isinstance(node, spaces.Tuple):
            if not isinstance(v, (tuple, list)) or len(v) != len(node.spaces):
                got = f"length {len(v)}" if isinstance(v, (tuple, list)) else type(v).__name__
                raise error(
                    f"{what}{path_name(path)} must be a tuple of {len(node.spaces)} items, "
                    f"got {got}")
            for k, sub in enumerate(node.spaces):
                visit(sub, v[k], path + (k,))
        else:
            out.append(v)
    visit(space, value, ())
    return out


def leaf_bounds(leaf: spaces.Space) -> tuple[np.ndarray, np.ndarray] | None:
    """The inclusive integer bounds of every element of a Discrete,
    MultiDiscrete or MultiBinary leaf (int64 arrays of its shape), None for a Box."""
    if isinstance(leaf, spaces.Discrete):
        low = np.array(int(leaf.start), np.int64)
        return low, low + int(leaf.n) - 1
    if isinstance(leaf, spaces.MultiDiscrete):
        low = np.asarray(leaf.start, np.int64)
        return low, low + np.asarray(leaf.nvec, np.int64) - 1
    if isinstance(leaf, spaces.MultiBinary):
        shape = tuple(leaf.shape)
        return np.zeros(shape, np.int64), np.ones(shape, np.int64)
    return None


def range_checks(space: spaces.Space) -> list[tuple[int, int, bool, int, int]]:
    """(byte offset in the action row, size, signed, low, high) of every
    integer action element the backend checks after copying a row."""
    offsets = _row_offsets(space)[0] if is_composite(space) else [0]
    checks = []
    for offset, (_, leaf) in zip(offsets, leaves(space)):
        bounds = leaf_bounds(leaf)
        if bounds is None:
            continue
        _, dtype = leaf_shape_dtype(leaf)
        for k, (low, high) in enumerate(zip(bounds[0].ravel().tolist(),
                                            bounds[1].ravel().tolist())):
            checks.append((offset + k * dtype.itemsize, dtype.itemsize, dtype.kind == "i",
                           max(low, -2**63), min(high, 2**63 - 1)))
    return checks


def first_out_of_range(space: spaces.Space, row: np.ndarray) -> tuple[str, int, int, int] | None:
    """(leaf path, value, low, high) of the first element of one env's action
    row (a row of the actions buffer) outside its leaf's bounds, or None."""
    for (path, leaf), view in zip(leaves(space), leaf_views(space, row[None])):
        bounds = leaf_bounds(leaf)
        if bounds is None:
            continue
        values = np.asarray(view[0]).astype(object).ravel()  # (exact: any int dtype)
        low, high = bounds[0].ravel().tolist(), bounds[1].ravel().tolist()
        if not low:
            continue
        for k, value in enumerate(values.tolist()):
            lo, hi = (low[k], high[k]) if len(low) > 1 else (low[0], high[0])
            if not lo <= value <= hi:
                index = np.unravel_index(k, view.shape[1:]) if view.ndim > 1 else ()
                return (path_name(path) + "".join(f"[{i}]" for i in index), value, lo, hi)
    return None


def first_row_out_of_range(space: spaces.Space, rows: np.ndarray) -> int:
    """The first row of action rows (m, *row) with an integer element outside
    its leaf's bounds, or -1."""
    bad = np.zeros(len(rows), bool)
    for (_, leaf), view in zip(leaves(space), leaf_views(space, rows)):
        bounds = leaf_bounds(leaf)
        if bounds is None or not view.size:
            continue
        values = view.reshape(len(rows), -1)
        low, high = bounds[0].reshape(1, -1), bounds[1].reshape(1, -1)
        if values.dtype.kind == "u":  # (compared exactly: no uint64 -> float promotion)
            bad |= (values > np.uint64(2**63 - 1)).any(axis=1)
            values = values.astype(np.int64)
        bad |= ((values < low) | (values > high)).any(axis=1)
    found = np.flatnonzero(bad)
    return int(found[0]) if len(found) else -1


def action_range_message(env_id: str, space: spaces.Space, row: np.ndarray,
                         index: int) -> str:
    """What an out-of-range action of env index says (row: its action row)."""
    found = first_out_of_range(space, row)
    if found is None:  # (the row changed since it was checked)
        return f"{env_id}: the action of env {index} is out of range of {space}"
    where, value, low, high = found
    return (f"{env_id}: action{where} {value} of env {index} is out of range; "
            f"it accepts {low}..{high}")


# ---- wire form (msgpack-able, docs/protocol.md "Spaces") ---------------------------------
def _bounds(array: np.ndarray) -> list:
    return np.asarray(array).tolist()


def space_to_wire(space: spaces.Space) -> dict[str, Any]:
    """The msgpack-able description of a space the client rebuilds with space_from_wire."""
    if isinstance(space, spaces.Discrete):
        return {"kind": "discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):
        return {"kind": "box", "dtype": space.dtype.str, "shape": list(space.shape),
                "low": _bounds(space.low), "high": _bounds(space.high)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"kind": "multi_discrete", "dtype": space.dtype.str,
                "nvec": _bounds(space.nvec), "start": _bounds(space.start)}
    if isinstance(space, spaces.MultiBinary):
        return {"kind": "multi_binary", "n": [int(d) for d in space.shape]}
    if isinstance(space, spaces.Dict):
        return {"kind": "dict", "spaces": [[key, space_to_wire(sub)]
                                           for key, sub in space.spaces.items()]}
    if isinstance(space, spaces.Tuple):
        return {"kind": "tuple", "spaces": [space_to_wire(sub) for sub in space.spaces]}
    raise TypeError(f"spaces of type {type(space).__name__} have no wire form")


def space_from_wire(wire: dict[str, Any], depth: int = 0) -> spaces.Space:
    """The space space_to_wire described (leaf order preserved: a Dict is
    rebuilt from its key/space pairs, never re-sorted)."""
    if depth > MAX_DEPTH:
        raise ValueError("a space nests too deeply")
    kind = wire["kind"]
    if kind == "discrete":
        return spaces.Discrete(int(wire["n"]), start=int(wire["start"]))
    if kind == "box":
        dtype, shape = np.dtype(wire["dtype"]), tuple(wire["shape"])
        low = np.array(wire["low"]).reshape(shape).astype(dtype)
        high = np.array(wire["high"]).reshape(shape).astype(dtype)
        return spaces.Box(low, high, shape=shape, dtype=dtype)
    if kind == "multi_discrete":
        dtype = np.dtype(wire["dtype"])
        return spaces.MultiDiscrete(np.array(wire["nvec"], dtype), dtype=dtype,
                                    start=np.array(wire["start"], dtype))
    if kind == "multi_binary":
        n = wire["n"]
        return spaces.MultiBinary(n[0] if len(n) == 1 else n)
    if kind == "dict":
        return spaces.Dict([(key, space_from_wire(sub, depth + 1)) for key, sub in wire["spaces"]])
    if kind == "tuple":
        return spaces.Tuple([space_from_wire(sub, depth + 1) for sub in wire["spaces"]])
    raise ValueError(f"unknown space kind {kind!r}")


def row_of(space: spaces.Space, value: Any, k: int) -> Any:
    """Env k's value (copied) of a batched value of space (an array, or a
    dict/tuple of them), as an env returns it: an array of a Box's shape (0-d
    for shape ()), a numpy scalar for a Discrete."""
    if isinstance(space, spaces.Dict):
        return {key: row_of(sub, value[key], k) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(row_of(sub, v, k) for sub, v in zip(space.spaces, value))
    if isinstance(space, spaces.Discrete):
        return value[k].copy()
    return value[k, ...].copy()


def copy_value(value: Any) -> Any:
    """A copy of a batched value (an array, or a dict/tuple of them)."""
    if isinstance(value, dict):
        return {key: copy_value(v) for key, v in value.items()}
    if isinstance(value, tuple):
        return tuple(copy_value(v) for v in value)
    return value.copy()
