"""Drivers shared by the async-mode tests, in-process and through the daemon:
per-env trajectories of a sync run and of an async run with random send
orders, to compare env by env."""
from __future__ import annotations

import numpy as np

import envd
from conftest import random_actions


def per_env_actions(space, num_envs: int, steps: int, seed: int) -> np.ndarray:
    """actions[t, i]: env i's t-th action."""
    rng = np.random.default_rng(seed)
    return np.stack([random_actions(space, num_envs, rng) for _ in range(steps)])


def sync_trajectories(env_id, num_envs, steps, actions, **kwargs):
    """Per env, its reset observation and then (obs, reward, term, trunc) per step."""
    with envd.make(env_id, num_envs, seed=11, num_threads=0, **kwargs) as env:
        obs, _ = env.reset()
        runs = [[("reset", obs[i].tobytes())] for i in range(num_envs)]
        for t in range(steps):
            obs, rew, term, trunc, info = env.step(actions[t])
            for i in range(num_envs):
                final = info["final_obs"][i].tobytes() if info.get("_final_obs", np.zeros(num_envs, bool))[i] else None
                runs[i].append((obs[i].tobytes(), float(rew[i]), bool(term[i]), bool(trunc[i]), final))
    return runs


def async_trajectories(make, num_envs, steps, actions, batch_size, rng, **kwargs):
    """Drive the env make(batch_size=..., **kwargs) returns (seed 11) with
    random send orders and chunking; every env gets its t-th action on its
    t-th send and stops after `steps` sends."""
    sent = np.zeros(num_envs, int)
    runs: list[list] = [[] for _ in range(num_envs)]
    received = np.zeros(num_envs, int)
    with make(batch_size=batch_size, **kwargs) as env:
        env.async_reset()
        idle: list[int] = []
        outstanding = num_envs  # ready or in flight
        while outstanding >= batch_size:
            obs, rew, term, trunc, info = env.recv()
            ids = info["env_id"]
            assert ids.dtype == np.int32 and len(ids) == batch_size
            assert len(np.unique(ids)) == batch_size
            outstanding -= batch_size
            for k, i in enumerate(ids):
                if received[i] == 0:
                    runs[i].append(("reset", obs[k].tobytes()))
                else:
                    final = (info["final_obs"][k].tobytes()
                             if info.get("_final_obs", np.zeros(batch_size, bool))[k] else None)
                    runs[i].append((obs[k].tobytes(), float(rew[k]), bool(term[k]),
                                    bool(trunc[k]), final))
                received[i] += 1
                if sent[i] < steps:
                    idle.append(int(i))
            rng.shuffle(idle)
            # send a random part of the idle envs, in 1-3 sends
            take = idle[:rng.integers(0, len(idle) + 1)] if outstanding >= batch_size else idle
            idle = idle[len(take):]
            for part in np.array_split(np.array(take, dtype=np.int64), rng.integers(1, 4)):
                if len(part):
                    env.send(actions[sent[part], part], part)
                    sent[part] += 1
                    outstanding += len(part)
            if outstanding < batch_size and idle:
                part = np.array(idle, dtype=np.int64)
                env.send(actions[sent[part], part], part)
                sent[part] += 1
                outstanding += len(part)
                idle = []
    return runs, received
