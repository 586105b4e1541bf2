"""Drivers shared by the async-mode tests, in-process and through the daemon:
per-env trajectories of a sync run and of an async run with random send
orders, to compare env by env.  A multi-agent env (agents as rows) is driven
in whole envs: env i's actions are its num_agents rows, and each step's
result of env i is the bytes of its rows."""
from __future__ import annotations

import numpy as np

import envd
from support.builtin_envs import random_actions


def per_env_actions(space, num_envs: int, steps: int, seed: int,
                    num_agents: int = 1) -> np.ndarray:
    """actions[t, r]: row r's t-th action (env i's rows: i*A .. i*A+A-1)."""
    rng = np.random.default_rng(seed)
    return np.stack([random_actions(space, num_envs * num_agents, rng) for _ in range(steps)])


def _env_result(obs, rew, term, trunc, info, k: int, agents: int) -> tuple:
    """Env k's step result (k: its place in the batch): a single-agent env's
    row as values, a multi-agent env's rows as bytes."""
    rows = slice(k * agents, (k + 1) * agents)
    done = info.get("_final_obs", np.zeros(len(rew), bool))
    if agents == 1:
        final = info["final_obs"][k].tobytes() if done[k] else None
        return obs[k].tobytes(), float(rew[k]), bool(term[k]), bool(trunc[k]), final
    final = (np.stack(list(info["final_obs"][rows])).tobytes() if done[rows].any() else None)
    return (obs[rows].tobytes(), rew[rows].tobytes(), term[rows].tobytes(),
            trunc[rows].tobytes(), final)


def sync_trajectories(env_id, num_envs, steps, actions, make=None, **kwargs):
    """Per env, its reset observation and then (obs, reward, term, trunc) per
    step, of envd.make(env_id, num_envs, seed=11, **kwargs) in-process (or of
    make(**kwargs), an env of the same envs and seed made elsewhere)."""
    env = (envd.make(env_id, num_envs, seed=11, num_threads=0, **kwargs) if make is None
           else make(**kwargs))
    with env:
        agents = env.num_agents
        obs, _ = env.reset()
        runs = [[("reset", obs[i * agents:(i + 1) * agents].tobytes() if agents > 1
                  else obs[i].tobytes())] for i in range(num_envs)]
        for t in range(steps):
            obs, rew, term, trunc, info = env.step(actions[t])
            for i in range(num_envs):
                runs[i].append(_env_result(obs, rew, term, trunc, info, i, agents))
    return runs


def async_trajectories(make, num_envs, steps, actions, batch_size, rng, **kwargs):
    """Drive the env make(batch_size=..., **kwargs) returns (seed 11) with
    random send orders and chunking; every env gets its t-th action on its
    t-th send and stops after `steps` sends."""
    sent = np.zeros(num_envs, int)
    runs: list[list] = [[] for _ in range(num_envs)]
    received = np.zeros(num_envs, int)
    with make(batch_size=batch_size, **kwargs) as env:
        agents = env.num_agents
        # actions[t, i]: env i's rows at its t-th send
        per_env = actions.reshape(len(actions), num_envs, agents, *actions.shape[2:])

        def send(part: np.ndarray) -> None:
            rows = per_env[sent[part], part].reshape(-1, *actions.shape[2:])
            env.send(rows, np.repeat(part, agents))  # (ids per row, as recv gives them)
            sent[part] += 1

        env.async_reset()
        idle: list[int] = []
        outstanding = num_envs  # ready or in flight
        while outstanding >= batch_size:
            obs, rew, term, trunc, info = env.recv()
            row_ids = info["env_id"]
            assert row_ids.dtype == np.int32 and len(row_ids) == batch_size * agents
            ids = row_ids[::agents]
            assert (row_ids == np.repeat(ids, agents)).all()  # each env's rows together
            assert len(np.unique(ids)) == batch_size
            outstanding -= batch_size
            _record_batch(runs, received, (obs, rew, term, trunc, info), ids, agents)
            idle += [int(i) for i in ids if sent[i] < steps]
            rng.shuffle(idle)
            # send a random part of the idle envs, in 1-3 sends
            take = idle[:rng.integers(0, len(idle) + 1)] if outstanding >= batch_size else idle
            idle = idle[len(take):]
            for part in np.array_split(np.array(take, dtype=np.int64), rng.integers(1, 4)):
                if len(part):
                    send(part)
                    outstanding += len(part)
            if outstanding < batch_size and idle:
                send(np.array(idle, dtype=np.int64))
                outstanding += len(idle)
                idle = []
    return runs, received


def _record_batch(runs: list[list], received: np.ndarray, result: tuple, ids: np.ndarray,
                  agents: int) -> None:
    """Append each env's entry of a recv's result (its reset observation the
    first time the env is received) to its run."""
    obs, rew, term, trunc, info = result
    for k, i in enumerate(ids):
        if received[i] == 0:
            runs[i].append(("reset", obs[k * agents:(k + 1) * agents].tobytes()
                            if agents > 1 else obs[k].tobytes()))
        else:
            runs[i].append(_env_result(obs, rew, term, trunc, info, k, agents))
        received[i] += 1


def envpool_loop_trajectories(make, num_envs, steps, actions, batch_size, **kwargs):
    """As async_trajectories, in EnvPool's loop: every recv's envs are sent
    straight back with info["env_id"] itself, the array recv returned (the
    send of the last batch: its ids not checked again, its actions written
    as a slice when the batch is a run of envs); stops at the first batch
    holding an env whose `steps` actions were all sent.  Returns the runs,
    the recvs of each env and how many batches were runs of envs (consecutive,
    increasing ids) and how many were not."""
    sent = np.zeros(num_envs, int)
    runs: list[list] = [[] for _ in range(num_envs)]
    received = np.zeros(num_envs, int)
    kinds = {"run": 0, "other": 0}
    with make(batch_size=batch_size, **kwargs) as env:
        agents = env.num_agents
        per_env = actions.reshape(len(actions), num_envs, agents, *actions.shape[2:])
        env.async_reset()
        while True:
            *result, info = env.recv()
            ids = info["env_id"][::agents]
            _record_batch(runs, received, (*result, info), ids, agents)
            kinds["run" if (np.diff(ids) == 1).all() else "other"] += 1
            if (sent[ids] >= steps).any():
                return runs, received, kinds
            env.send(per_env[sent[ids], ids].reshape(-1, *actions.shape[2:]), info["env_id"])
            sent[ids] += 1


def check_async_reset_zeroes_rewards(env) -> None:
    """env (4 envs of CartPole, batch 2): after steps in which every env
    earned 1 and every env was received (a hosted session refuses an async
    reset with envs out), the recvs after an async reset return rewards 0:
    a fresh episode has earned nothing."""
    env.async_reset()
    for _ in range(3):
        env.send(np.zeros(2, np.int64), env.recv()[4]["env_id"])
    assert env.recv()[1].tolist() == [1.0, 1.0]
    assert env.recv()[1].tolist() == [1.0, 1.0]
    env.async_reset()
    assert env.recv()[1].tolist() == [0.0, 0.0], env
    assert env.recv()[1].tolist() == [0.0, 0.0], env
