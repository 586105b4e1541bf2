"""The comparison the equivalence tests share (in-process and through the
daemon): an envd VecEnv and gymnasium's SyncVectorEnv, stepped with the same
seeds and actions, give the same observations (any space: dicts and tuples
of arrays, leaf by leaf, dtypes included), rewards (float64), terminations,
truncations and infos (the whole dict, gymnasium's merge with its "_" masks,
final_obs and final_info included)."""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

MODES = {"next_step": AutoresetMode.NEXT_STEP, "same_step": AutoresetMode.SAME_STEP,
         "disabled": AutoresetMode.DISABLED}


def sample_actions(space: spaces.Space, num_envs: int, rng: np.random.Generator) -> Any:
    """A batch of actions for a single-env space, as gymnasium's batch_space
    batches it (a dict of arrays for a Dict, a tuple for a Tuple).  Box
    actions go 50% beyond the bounds (the envs clip them)."""
    if isinstance(space, spaces.Dict):
        return {key: sample_actions(sub, num_envs, rng) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(sample_actions(sub, num_envs, rng) for sub in space.spaces)
    if isinstance(space, spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=num_envs, dtype=np.int64)
    if isinstance(space, spaces.MultiDiscrete):
        return rng.integers(space.start, space.start + space.nvec,
                            size=(num_envs, *space.nvec.shape)).astype(space.dtype)
    if isinstance(space, spaces.MultiBinary):
        return rng.integers(0, 2, size=(num_envs, *space.shape)).astype(space.dtype)
    low = np.broadcast_to(space.low, space.shape) * 1.5
    high = np.broadcast_to(space.high, space.shape) * 1.5
    return rng.uniform(low, high, size=(num_envs, *space.shape)).astype(space.dtype)


def assert_same(ours: Any, theirs: Any, what: str) -> None:
    """ours equals theirs exactly: same structure, types, dtypes, shapes, values."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), (what, ours, theirs)
        assert set(ours) == set(theirs), (what, sorted(ours), sorted(theirs))
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{what}[{key!r}]")
    elif isinstance(theirs, (tuple, list)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs), (what, ours, theirs)
        for k, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{what}[{k}]")
    elif isinstance(theirs, np.ndarray) and theirs.dtype == object:
        assert isinstance(ours, np.ndarray) and ours.dtype == object, (what, ours)
        assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
        for k, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{what}[{k}]")
    elif isinstance(theirs, (np.ndarray, np.generic)):
        assert isinstance(ours, (np.ndarray, np.generic)), (what, ours, theirs)
        # (an array where gymnasium has an array, a numpy scalar where it has one)
        assert isinstance(ours, np.ndarray) == isinstance(theirs, np.ndarray), \
            (what, type(ours), type(theirs))
        assert ours.dtype == theirs.dtype, (what, ours.dtype, theirs.dtype)
        assert np.shape(ours) == np.shape(theirs), (what, np.shape(ours), np.shape(theirs))
        assert np.array_equal(ours, theirs, equal_nan=ours.dtype.kind == "f"), \
            (what, ours, theirs)
    else:
        assert type(ours) is type(theirs) and ours == theirs, (what, ours, theirs)


def compare_runs(env, ref: gym.vector.VectorEnv, mode: str, steps: int, seed: int,
                 action_seed: int = 1, masked_reset_at: int | None = None) -> None:
    """Step env (made with seed, episode_statistics=False) and ref side by
    side and assert every result equal (see the module docstring).  In
    "disabled" mode the done envs are reset with a mask, as a caller must;
    masked_reset_at: a seeded reset of a mask of envs at that step."""
    n = env.num_envs
    assert env.single_observation_space == ref.single_observation_space
    assert env.single_action_space == ref.single_action_space
    obs, info = env.reset()
    ref_obs, ref_info = ref.reset(seed=seed)
    assert_same(obs, ref_obs, "reset obs")
    assert_same(info, ref_info, "reset info")
    rng = np.random.default_rng(action_seed)
    done = np.zeros(n, bool)
    for t in range(steps):
        if t == masked_reset_at:
            mask = np.arange(n) % 2 == 0
            seeds = [100 + i for i in range(n)]
            obs, info = env.reset(seed=seeds, options={"reset_mask": mask})
            ref_obs, ref_info = ref.reset(seed=seeds, options={"reset_mask": mask})
            assert_same(obs, ref_obs, f"masked reset obs at {t}")
            assert_same(info, ref_info, f"masked reset info at {t}")
            done[mask] = False
        if mode == "disabled" and done.any():
            obs, info = env.reset(options={"reset_mask": done.copy()})
            ref_obs, ref_info = ref.reset(options={"reset_mask": done.copy()})
            assert_same(obs, ref_obs, f"disabled-mode reset obs at {t}")
            assert_same(info, ref_info, f"disabled-mode reset info at {t}")
        actions = sample_actions(env.single_action_space, n, rng)
        ours, theirs = env.step(actions), ref.step(actions)
        for what, a, b in zip(("obs", "rewards", "terminations", "truncations", "info"),
                              ours, theirs):
            assert_same(a, b, f"{what} at step {t}")
        done = ours[2] | ours[3]


# ---- async mode: per-env trajectories ----------------------------------------------------
def _leaf_map(fn, tree: Any) -> Any:
    if isinstance(tree, dict):
        return {key: _leaf_map(fn, value) for key, value in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_leaf_map(fn, value) for value in tree)
    return fn(tree)


def env_info(info: dict, k: int, rows: int) -> dict:
    """Row k's own info out of a merged info dict of a result of `rows` rows
    (the inverse of gymnasium's _add_info): every key whose "_" mask is set
    at k (envd's env_id aside).  Every array and mask must be rows long (an
    async recv's: the batch's, row k being env env_id[k])."""
    out = {}
    for key, value in info.items():
        if not isinstance(value, dict):
            assert len(value) == rows, (key, len(value), rows)
        if key.startswith("_") or key == "env_id" or not info.get("_" + key, [False] * (k + 1))[k]:
            continue
        out[key] = env_info(value, k, rows) if isinstance(value, dict) else value[k]
    return out


def _record(obs: Any, rew, term, trunc, info: dict, k: int) -> tuple:
    """Row k of a result (compared with assert_same)."""
    row = _leaf_map(lambda leaf: leaf[k].copy(), obs)
    return (row, float(rew[k]), bool(term[k]), bool(trunc[k]), env_info(info, k, len(rew)))


def per_env_action_batches(space: spaces.Space, num_envs: int, steps: int, seed: int) -> Any:
    """A tree of (steps, num_envs, ...) arrays: env i's t-th action at [t, i]."""
    flat = sample_actions(space, steps * num_envs, np.random.default_rng(seed))
    return _leaf_map(lambda leaf: leaf.reshape(steps, num_envs, *leaf.shape[1:]), flat)


def sync_env_runs(ref: gym.vector.VectorEnv, actions: Any, steps: int, seed: int) -> list:
    """Per env of ref: [reset record, step records...] (gymnasium's own run)."""
    n = ref.num_envs
    obs, info = ref.reset(seed=seed)
    runs = [[_record(obs, np.zeros(n), np.zeros(n, bool), np.zeros(n, bool), info, i)]
            for i in range(n)]
    for t in range(steps):
        obs, rew, term, trunc, info = ref.step(_leaf_map(lambda leaf: leaf[t], actions))
        for i in range(n):
            runs[i].append(_record(obs, rew, term, trunc, info, i))
    return runs


def async_env_runs(env, actions: Any, steps: int, rng: np.random.Generator) -> list:
    """Per env: its records as async_reset/recv/send return them, sending each
    received env its next action in random orders and chunks."""
    n, batch = env.num_envs, env.batch_size
    sent = np.zeros(n, int)
    runs: list[list] = [[] for _ in range(n)]
    env.async_reset()
    outstanding, idle = n, []
    while outstanding >= batch:
        obs, rew, term, trunc, info = env.recv()
        ids = info["env_id"]
        outstanding -= len(ids)
        for k, i in enumerate(ids.tolist()):
            runs[i].append(_record(obs, rew, term, trunc, info, k))
            if sent[i] < steps:
                idle.append(i)
        rng.shuffle(idle)
        take = idle[:rng.integers(0, len(idle) + 1)] if outstanding >= batch else idle
        idle = idle[len(take):]
        for part in np.array_split(np.array(take, dtype=np.int64), rng.integers(1, 3)):
            if len(part):
                env.send(_leaf_map(lambda leaf: leaf[sent[part], part], actions), part)
                sent[part] += 1
                outstanding += len(part)
    return runs
