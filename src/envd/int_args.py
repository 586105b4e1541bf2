"""Integer arguments, checked alike wherever they arrive (in-process make, the
client, the daemon): ints that are not bools, ranges, and per-env seeds."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard

import numpy as np

from envd.errors import InvalidArgumentError

SEED_LIMIT = 2**64


def is_int(value: Any) -> TypeGuard[int | np.integer[Any]]:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value: Any, low: int, high: int) -> int:
    if not is_int(value):
        raise InvalidArgumentError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name}={value} is out of range; expected {low} <= {name} <= {high}")
    return int(value)


def seed_list(seed: int | Sequence[int] | np.ndarray, num_envs: int) -> np.ndarray:
    """Per-env seeds: env i gets seed + i, or the i-th of an explicit list."""
    if is_int(seed):
        seed = int(seed)
        if not 0 <= seed <= SEED_LIMIT - num_envs:
            raise InvalidArgumentError(
                f"seed must be a non-negative int with seed + num_envs <= 2**64, got {seed}")
        return np.arange(num_envs, dtype=np.uint64) + np.uint64(seed)
    if isinstance(seed, (list, tuple)) or (isinstance(seed, np.ndarray) and seed.ndim == 1):
        if len(seed) != num_envs:
            raise InvalidArgumentError(
                f"a list of seeds needs num_envs={num_envs} entries, got {len(seed)}")
        if not all(is_int(s) and 0 <= int(s) < SEED_LIMIT for s in seed):
            raise InvalidArgumentError("every seed in the list must be an int in [0, 2**64)")
        return np.array([int(s) for s in seed], dtype=np.uint64)
    raise InvalidArgumentError(
        f"seed must be None, an int or a list of num_envs ints, got {type(seed).__name__}")
