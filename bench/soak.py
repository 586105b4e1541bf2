"""Soak test of the daemon: several clients stepping every built-in env, in
sync and async mode, for minutes, with faults injected; every result checked
against an in-process replay.

    python bench/soak.py [--minutes 5 | --seconds S] [--clients 3] [--endpoint E]
                         [--threads 2] [--lease 3] [--seed 0] [--rss-growth-mib 64]

Without --endpoint it starts its own daemon (--threads, --lease-timeout
--lease) on a temporary ipc socket and stops it at the end (it must drain to
exit 0 and leave no segment).  With --endpoint, the daemon must be on this
host for the leak counters and the fault checks that look at /dev/shm; its
lease should be short (a few seconds), or the SIGKILL/SIGSTOP faults wait long,
and it should serve no one else meanwhile (its client count and leak counters
are compared before and after).

What runs:

  - ``--clients`` worker processes, each with its own connection, loop over
    rounds: a random single-agent built-in env (``soak_envs()``), num_envs 1..256,
    a random seed, autoreset mode, time limit and env kwargs, copy or views,
    sync mode (``step``, with reseeding resets and, in ``disabled`` mode,
    masked resets) or async mode (random ``batch_size``, random send orders and
    chunking), over shared memory or (a third of the sessions) the inline
    transport a trainer on another host uses.  Every result is compared bit for bit with an in-process
    ``envd.make`` twin stepped with the same actions: observations, rewards,
    terminations, truncations, the env's own info fields (ConnectFour's
    ``action_mask``), episode statistics r/l and their mask, final
    observations.  Async results are compared env by env with a sync twin
    (each env's t-th send carries its t-th action).
  - faults, counted by kind:
      client_sigkilled      a client process SIGKILLed while it steps: its
                            segments must go within the lease (+ slack)
      client_frozen         a client process SIGSTOPped past the lease, then
                            SIGCONTed: its segments must go, no sooner than
                            0.9 x the lease after SIGSTOP (the lease counts
                            from its last request on any path, fast path
                            included, which it sent just before the stop:
                            docs/protocol.md, "Leases"), and its next call
                            must raise SessionExpiredError; it may start over
      hostile_message       malformed/mistyped/out-of-order raw messages on a
                            raw DEALER socket: each must get an error reply
                            with the expected code and no traceback
      socket_abandoned      a raw socket makes and steps a session, then
                            vanishes without ``bye``: its segment must go
                            within the lease
      client_closed_in_flight  a worker closes its client with async sends
                            in flight: the segment is gone at once
      env_closed_mid_async  a worker closes an async env with sends in flight
      rejected_action       an out-of-range action: the same error class and
                            message as in-process, and nothing changed
  - leak counters of the daemon (RSS, fds, threads, /dev/shm segments,
    mappings of segments) after a warm-up, and again after every client is
    gone and every lease expired: fds, threads, segments and mappings must
    come back exactly, RSS may grow by at most --rss-growth-mib.

It ends with one summary block and exits 1 on any mismatch, leak, failed
fault check or unexpected error (0 otherwise).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

import msgpack
import numpy as np
import zmq
from gymnasium import spaces

import envd
from envd import protocol

MODES = ("next_step", "same_step", "disabled")
ENV_INFO_EXCLUDED = {"envd_episode", "_envd_episode", "final_obs", "_final_obs", "final_info", "_final_info"}
SHM = "/dev/shm"
#: Each mismatch/error message kept in the report is cut to this many characters.
DETAIL_CHARS = 600


# ---- small helpers ---------------------------------------------------------------------------
def soak_envs() -> list[str]:
    """The built-ins the rounds pick from: the single-agent ones (a round
    counts one row per env; multi-agent envs, whose agents are rows, have
    their own daemon tests: tests/integration/test_daemon_multi_agent.py)."""
    return [env_id for env_id in envd.list_envs() if envd.native.get_spec(env_id).num_agents == 1]


def random_actions(space, num_envs: int, rng: np.random.Generator) -> np.ndarray:
    """As tests/conftest.py: box actions go 50% beyond the bounds (clipping is exercised)."""
    if isinstance(space, spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=num_envs, dtype=np.int64)
    low = np.broadcast_to(space.low, space.shape) * 1.5
    high = np.broadcast_to(space.high, space.shape) * 1.5
    return rng.uniform(low, high, size=(num_envs, *space.shape)).astype(space.dtype)


def wait_until(condition, timeout: float, poll: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(poll)


def segment_exists(name: str) -> bool:
    return os.path.exists(os.path.join(SHM, name))


def short(text: str, tail: bool = False) -> str:
    if len(text) <= DETAIL_CHARS:
        return text
    return "... " + text[-DETAIL_CHARS:] if tail else text[:DETAIL_CHARS] + " ..."


class Stats:
    """What one process verified and injected; merged by the main process."""

    def __init__(self):
        self.steps = 0          # step/reset/recv results compared
        self.env_steps = 0      # env rows in them
        self.by_mode = Counter()
        self.episodes = 0       # episode ends among the verified results
        self.mismatches = 0
        self.details: list[str] = []
        self.faults = Counter()
        self.errors: list[str] = []

    def verified(self, problems: list[str], rows: int, where: str, mode: str, episodes: int = 0) -> bool:
        if problems:
            self.mismatches += 1
            if len(self.details) < 20:
                self.details.append(short(f"{where}: " + "; ".join(problems[:4])))
            return False
        self.steps += 1
        self.env_steps += rows
        self.by_mode[mode] += 1
        self.episodes += int(episodes)
        return True

    def error(self, where: str, exc: BaseException | str) -> None:
        text = exc if isinstance(exc, str) else "".join(traceback.format_exception(exc))
        if len(self.errors) < 20:
            self.errors.append(f"{where}: " + short(text, tail=not isinstance(exc, str)))
        else:
            self.errors.append("...")

    def as_dict(self) -> dict:
        return {"steps": self.steps, "env_steps": self.env_steps, "by_mode": dict(self.by_mode),
                "episodes": self.episodes,
                "mismatches": self.mismatches, "details": self.details,
                "faults": dict(self.faults), "errors": self.errors}

    def merge(self, other: dict) -> None:
        self.steps += other.get("steps", 0)
        self.env_steps += other.get("env_steps", 0)
        self.by_mode.update(other.get("by_mode", {}))
        self.episodes += other.get("episodes", 0)
        self.mismatches += other.get("mismatches", 0)
        self.details += other.get("details", [])
        self.faults.update(other.get("faults", {}))
        self.errors += other.get("errors", [])


# ---- comparisons -----------------------------------------------------------------------------
def diff_array(a, b, what: str, problems: list[str]) -> None:
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        problems.append(f"{what}: {type(a).__name__} vs {type(b).__name__}")
    elif a.dtype != b.dtype or a.shape != b.shape:
        problems.append(f"{what}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}")
    elif a.tobytes() != b.tobytes():
        bad = np.flatnonzero(rows_differ(a, b)) if a.ndim else [0]
        problems.append(f"{what} differ at rows {list(bad[:8])}")


def rows_differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row (first axis), whether the bytes differ (bitwise: NaN == NaN, -0 != 0)."""
    a = np.ascontiguousarray(a).reshape(len(a), -1).view(np.uint8)
    b = np.ascontiguousarray(b).reshape(len(b), -1).view(np.uint8)
    return (a != b).any(axis=1)


def diff_info(ri: dict, li: dict, where: str, problems: list[str]) -> None:
    """As assert_same_info of tests/integration/test_daemon_equivalence.py."""
    if ri.keys() != li.keys():
        problems.append(f"info keys {sorted(ri)} vs {sorted(li)}")
        return
    for name in set(li) - ENV_INFO_EXCLUDED:
        diff_array(ri[name], li[name], f"info[{name!r}]", problems)
    if "envd_episode" in li:
        if not (ri["envd_episode"].keys() == li["envd_episode"].keys() == {"r", "l", "t"}):
            problems.append(f"episode keys {sorted(ri['envd_episode'])}")
        else:
            for key in "rl":  # t is wall time
                diff_array(ri["envd_episode"][key], li["envd_episode"][key], f"episode[{key!r}]", problems)
        diff_array(ri["_envd_episode"], li["_envd_episode"], "_envd_episode", problems)
    if "final_obs" in li:
        diff_array(ri["_final_obs"], li["_final_obs"], "_final_obs", problems)
        diff_array(ri["_final_info"], li["_final_info"], "_final_info", problems)
        if not (ri["final_info"] == li["final_info"] == {}):
            problems.append("final_info not {}")
        for i, (a, b) in enumerate(zip(ri["final_obs"], li["final_obs"])):
            if b is None:
                if a is not None:
                    problems.append(f"final_obs[{i}] is not None")
            else:
                diff_array(a, b, f"final_obs[{i}]", problems)


def diff_step(remote, local) -> list[str]:
    problems: list[str] = []
    for name, a, b in zip(("obs", "rewards", "terminations", "truncations"), remote[:4], local[:4]):
        diff_array(a, b, name, problems)
    diff_info(remote[4], local[4], "", problems)
    return problems


# ---- a random make -----------------------------------------------------------------------------
def random_kwargs(env_id: str, rng: np.random.Generator) -> dict:
    if rng.random() < 0.5:
        return {}
    if env_id == "CartPole-v1":
        return {"sutton_barto_reward": bool(rng.random() < 0.5)}
    if env_id == "Pendulum-v1":
        return {"g": float(rng.uniform(0.0, 20.0))}
    if env_id in ("MountainCar-v0", "MountainCarContinuous-v0"):
        return {"goal_velocity": float(rng.uniform(-0.05, 0.05))}
    if env_id == "ConnectFour-v0":
        return {"depth": int(rng.integers(0, 5))}
    return {}


def random_make(env_id: str, rng: np.random.Generator, async_mode: bool, min_envs: int = 1,
                max_envs: int = 256) -> tuple[int, dict]:
    """(num_envs, kwargs common to client.make and envd.make)."""
    num_envs = int(rng.integers(1, 257)) if rng.random() < 0.7 else int(rng.integers(1, 9))
    num_envs = min(max(num_envs, min_envs), max_envs)
    mode = str(rng.choice(MODES[:2] if async_mode else MODES))
    limit = None if rng.random() < 0.4 else int(rng.integers(1, 80))
    if rng.random() < 0.15:
        seed = [int(s) for s in rng.integers(0, 2**63, size=num_envs)]
    else:
        seed = int(rng.integers(0, 2**62))
    kwargs = dict(seed=seed, autoreset_mode=mode, max_episode_steps=limit,
                  copy=bool(rng.random() < 0.2), episode_statistics=bool(rng.random() < 0.9),
                  **random_kwargs(env_id, rng))
    return num_envs, kwargs


def random_transport(rng: np.random.Generator) -> str:
    """Shared memory mostly; the inline transport (arrays in the messages, as
    for a trainer on another host) for a third of the sessions."""
    return "inline" if rng.random() < 1 / 3 else "shm"


def step_cost(env_id: str, kwargs: dict) -> float:
    """Relative cost of one env step (budget of a round)."""
    if env_id == "ConnectFour-v0":
        return 2.0 + 3.0 * kwargs.get("depth", 5)
    return 4.0 if env_id == "Snake-v0" else 1.0


# ---- a sync round ----------------------------------------------------------------------------
def sync_round(client, rng, stats: Stats, deadline: float, budget: float) -> None:
    env_id = str(rng.choice(soak_envs()))
    num_envs, kwargs = random_make(env_id, rng, async_mode=False)
    steps = int(np.clip(budget / (num_envs * step_cost(env_id, kwargs)), 8, 200))
    transport = random_transport(rng)
    where = f"sync {env_id} n={num_envs} {transport} {kwargs}"
    remote = client.make(env_id, num_envs, transport=transport, **kwargs)
    try:
        with envd.make(env_id, num_envs, num_threads=0, **kwargs) as local:
            r, l = remote.reset(), local.reset()  # noqa: E741 -- r, l: remote, local
            problems = []
            diff_array(r[0], l[0], "reset obs", problems)
            diff_info(r[1], l[1], "reset", problems)
            if not stats.verified(problems, num_envs, f"{where} reset", "sync"):
                return
            space = local.single_action_space
            for t in range(steps):
                if time.monotonic() > deadline:
                    return
                if rng.random() < 0.02:  # reseed mid-run (every env, or some)
                    seed = int(rng.integers(0, 2**62))
                    options = None
                    if rng.random() < 0.5:
                        mask = rng.random(num_envs) < 0.5
                        mask[rng.integers(num_envs)] = True
                        options = {"reset_mask": mask}
                    r, l = remote.reset(seed=seed, options=options), local.reset(seed=seed, options=options)  # noqa: E741 -- r, l: remote, local
                    problems = []
                    diff_array(r[0], l[0], "reseed obs", problems)
                    diff_info(r[1], l[1], "reseed", problems)
                    if not stats.verified(problems, num_envs, f"{where} reseed at {t}", "sync"):
                        return
                if isinstance(space, spaces.Discrete) and rng.random() < 0.01:
                    rejected_action(remote, local, space, rng, stats, where)
                actions = random_actions(space, num_envs, rng)
                expected = local.step(actions)
                got = remote.step(actions)
                done = expected[2] | expected[3]
                if not stats.verified(diff_step(got, expected), num_envs, f"{where} step {t}", "sync",
                                      done.sum()):
                    return
                if kwargs["autoreset_mode"] == "disabled" and done.any():
                    mask = np.array(done, dtype=bool, copy=True)
                    r = remote.reset(options={"reset_mask": mask})
                    l = local.reset(options={"reset_mask": mask})  # noqa: E741 -- r, l: remote, local
                    problems = []
                    diff_array(r[0], l[0], "masked reset obs", problems)
                    diff_info(r[1], l[1], "masked reset", problems)
                    if not stats.verified(problems, num_envs, f"{where} masked reset {t}", "sync"):
                        return
    finally:
        remote.close()


def rejected_action(remote, local, space, rng, stats: Stats, where: str) -> None:
    """An out-of-range discrete action: the same error, class and message; nothing changes
    (the next steps are compared as usual)."""
    actions = rng.integers(0, space.n, size=remote.num_envs)
    actions[rng.integers(remote.num_envs)] = space.n + int(rng.integers(0, 3))
    errors = []
    for env in (local, remote):
        try:
            env.step(actions)
            errors.append(None)
        except envd.EnvdError as exc:
            errors.append((type(exc), str(exc)))
    stats.faults["rejected_action"] += 1
    if errors[0] is None or errors[0] != errors[1]:
        stats.mismatches += 1
        stats.details.append(short(f"{where}: rejected action: in-process {errors[0]} vs daemon {errors[1]}"))


# ---- an async round --------------------------------------------------------------------------
#: The sync twin's trajectory is kept whole: at most this many bytes of observations.
ASYNC_TWIN_BYTES = 48 << 20


class SyncTwin:
    """An in-process sync env stepped T times with actions[t] (all envs), every
    result stored per step: step 0 is the reset."""

    def __init__(self, env_id, num_envs, kwargs, actions):
        steps = len(actions)
        with envd.make(env_id, num_envs, num_threads=0, **kwargs) as local:
            obs, info = local.reset()
            self.env_fields = sorted(set(info) - ENV_INFO_EXCLUDED)
            self.obs = np.empty((steps + 1, *obs.shape), obs.dtype)
            self.info = {k: np.empty((steps + 1, *info[k].shape), info[k].dtype)
                         for k in self.env_fields}
            self.rewards = self.terms = self.truncs = None
            self.ep_r = np.zeros((steps + 1, num_envs), np.float32)
            self.ep_l = np.zeros((steps + 1, num_envs), np.int32)
            self.ep_dtypes = None
            self.same_step = kwargs["autoreset_mode"] == "same_step"
            self.final = np.zeros_like(self.obs) if self.same_step else None
            self.obs[0] = obs
            for k in self.env_fields:
                self.info[k][0] = info[k]
            for t in range(1, steps + 1):
                obs, rew, term, trunc, info = local.step(actions[t - 1])
                if self.rewards is None:
                    self.rewards = np.zeros((steps + 1, *rew.shape), rew.dtype)
                    self.terms = np.zeros((steps + 1, *term.shape), term.dtype)
                    self.truncs = np.zeros((steps + 1, *trunc.shape), trunc.dtype)
                self.obs[t], self.rewards[t], self.terms[t], self.truncs[t] = obs, rew, term, trunc
                for k in self.env_fields:
                    self.info[k][t] = info[k]
                done = term | trunc
                if "envd_episode" in info:
                    if self.ep_dtypes is None:
                        self.ep_dtypes = (info["envd_episode"]["r"].dtype, info["envd_episode"]["l"].dtype)
                        self.ep_r = self.ep_r.astype(self.ep_dtypes[0])
                        self.ep_l = self.ep_l.astype(self.ep_dtypes[1])
                    self.ep_r[t][done] = info["envd_episode"]["r"][done]
                    self.ep_l[t][done] = info["envd_episode"]["l"][done]
                if self.same_step and done.any():
                    for i in np.flatnonzero(done):
                        self.final[t, i] = info["final_obs"][i]
        self.dones = self.terms | self.truncs


def verify_recv(result, twin: SyncTwin, k: np.ndarray, ids: np.ndarray, statistics: bool) -> list[str]:
    """The rows of one recv against the twin: env ids[j] at its k[j]-th result."""
    obs, rew, term, trunc, info = result
    problems: list[str] = []
    batch = len(ids)

    def rows(name, got, expected, select=None):
        if not isinstance(got, np.ndarray) or got.dtype != expected.dtype or got.shape != expected.shape:
            problems.append(f"{name}: {getattr(got, 'dtype', type(got))}{getattr(got, 'shape', '')} "
                            f"vs {expected.dtype}{expected.shape}")
            return
        bad = rows_differ(got, expected)
        if select is not None:
            bad &= select
        if bad.any():
            j = np.flatnonzero(bad)
            problems.append(f"{name} differ for envs {ids[j[:6]].tolist()} at their results "
                            f"{k[j[:6]].tolist()}")

    stepped = k > 0
    rows("obs", obs, twin.obs[k, ids])
    rows("rewards", rew, twin.rewards[k, ids], stepped)
    if (rew[~stepped] != 0).any():
        problems.append("a reset row has a reward")
    rows("terminations", term, twin.terms[k, ids], stepped)
    rows("truncations", trunc, twin.truncs[k, ids], stepped)
    keys = set(info) - {"env_id"}
    fields = keys - ENV_INFO_EXCLUDED
    if fields != set(twin.env_fields):
        problems.append(f"env info fields {sorted(fields)} vs {twin.env_fields}")
    else:
        for name in twin.env_fields:
            rows(f"info[{name!r}]", info[name], twin.info[name][k, ids])
    done = twin.dones[k, ids]
    if done.any() and statistics:
        if "envd_episode" not in info:
            problems.append(f"no info['envd_episode'] though envs {ids[done][:6].tolist()} ended")
        else:
            diff_array(info["_envd_episode"], done, "_envd_episode", problems)
            if twin.ep_dtypes is not None:
                rows("episode['r']", info["envd_episode"]["r"], twin.ep_r[k, ids], done)
                rows("episode['l']", info["envd_episode"]["l"], twin.ep_l[k, ids], done)
    elif not done.any() and ("envd_episode" in info or "final_obs" in info):
        problems.append("info['envd_episode'] or final_obs in a batch where no episode ended")
    if done.any() and not statistics and "envd_episode" in info:
        problems.append("info['envd_episode'] with episode_statistics=False")
    if twin.same_step and done.any():
        if "final_obs" not in info:
            problems.append("no final_obs though episodes ended (same_step)")
        else:
            diff_array(info["_final_obs"], done, "_final_obs", problems)
            for j in range(batch):
                a = info["final_obs"][j]
                if not done[j]:
                    if a is not None:
                        problems.append(f"final_obs of env {ids[j]} is not None")
                else:
                    diff_array(a, twin.final[k[j], ids[j]], f"final_obs of env {ids[j]} at {k[j]}",
                               problems)
    return problems


def async_round(client, rng, stats: Stats, deadline: float, budget: float, fault: str | None):
    """Returns the client to go on with (a new one after a client_closed_in_flight fault)."""
    env_id = str(rng.choice(soak_envs()))
    # with a fault: something worth having in flight
    num_envs, kwargs = random_make(env_id, rng, async_mode=True, min_envs=16 if fault else 1)
    batch_size = int(rng.integers(1, num_envs + 1))
    with envd.make(env_id, 1, num_threads=0, **{**kwargs, "seed": 0}) as tiny:
        space = tiny.single_action_space
        obs_space = tiny.single_observation_space
        obs_bytes = int(np.prod(obs_space.shape)) * obs_space.dtype.itemsize
    factor = 2 if kwargs["autoreset_mode"] == "same_step" else 1
    steps = int(np.clip(budget / (num_envs * step_cost(env_id, kwargs)), 4, 60))
    steps = max(2, min(steps, ASYNC_TWIN_BYTES // (factor * num_envs * max(obs_bytes, 1)) - 1))
    transport = random_transport(rng)
    where = f"async {env_id} n={num_envs} batch={batch_size} {transport} {kwargs}"
    # env i's t-th send carries actions[t, i]; one spare row for the fault's last sends
    actions = np.stack([random_actions(space, num_envs, rng) for _ in range(steps + 1)])
    twin = SyncTwin(env_id, num_envs, kwargs, actions[:steps])
    sent = np.zeros(num_envs, np.int64)
    received = np.zeros(num_envs, np.int64)
    remote = client.make(env_id, num_envs, batch_size=batch_size, transport=transport, **kwargs)
    try:
        remote.async_reset()
        idle: list[int] = []
        outstanding = num_envs  # ready or in flight
        stop_after = int(rng.integers(1, 2 * steps)) if fault else None
        recvs = 0
        while outstanding >= batch_size:
            if time.monotonic() > deadline or (stop_after is not None and recvs >= stop_after):
                break
            result = remote.recv()
            recvs += 1
            ids = result[4]["env_id"]
            if ids.dtype != np.int32 or len(ids) != batch_size or len(np.unique(ids)) != batch_size:
                stats.verified([f"bad env_id {ids!r}"], 0, f"{where} recv {recvs}", "async")
                return client
            ids = ids.astype(np.int64)
            if (received[ids] != sent[ids]).any():
                unsent = ids[received[ids] != sent[ids]][:6].tolist()
                stats.verified([f"envs {unsent} came back without being sent"], 0,
                               f"{where} recv {recvs}", "async")
                return client
            k = received[ids].copy()
            problems = verify_recv(result, twin, k, ids, kwargs["episode_statistics"])
            if not stats.verified(problems, batch_size, f"{where} recv {recvs}", "async",
                                  twin.dones[k, ids].sum()):
                return client
            received[ids] += 1
            outstanding -= batch_size
            idle.extend(int(i) for i in ids if sent[i] < steps)
            rng.shuffle(idle)
            # send a random part of the idle envs, in 1-3 sends
            take = idle[:rng.integers(0, len(idle) + 1)] if outstanding >= batch_size else idle
            idle = idle[len(take):]
            for part in np.array_split(np.array(take, dtype=np.int64), rng.integers(1, 4)):
                if len(part):
                    remote.send(actions[sent[part], part], part)
                    sent[part] += 1
                    outstanding += len(part)
            if outstanding < batch_size and idle:
                part = np.array(idle, dtype=np.int64)
                remote.send(actions[sent[part], part], part)
                sent[part] += 1
                outstanding += len(part)
                idle = []
        if fault is not None:
            return inject_async_fault(client, remote, fault, stats, where, idle, actions, sent,
                                      outstanding)
        return client
    finally:
        remote.close()


def inject_async_fault(client, remote, fault, stats: Stats, where, idle, actions, sent,
                       outstanding: int):
    """Close the env, or its client, with sends in flight: the segment is gone when
    close returns, later calls raise EnvStateError, the client (or a new one) goes on."""
    if idle:  # something more in flight
        part = np.array(idle, dtype=np.int64)
        remote.send(actions[sent[part], part], part)
        outstanding += len(part)
    in_flight = outstanding  # sent and not received: in flight or ready
    segment = remote._segment.name
    if fault == "client_closed_in_flight":
        endpoint, timeout = client.endpoint, client.timeout
        client.close()
        client = envd.connect(endpoint, timeout=timeout)
    else:
        remote.close()
    problems = []
    if not remote.closed:
        problems.append("the env is not closed")
    if not wait_until(lambda: not segment_exists(segment), 10.0):
        problems.append(f"segment {segment} still there 10 s after the close")
    try:
        remote.recv()
        problems.append("recv on the closed env did not raise")
    except envd.EnvStateError:
        pass
    if in_flight:
        stats.faults[fault] += 1
    if problems:
        stats.error(f"{where} {fault}", "; ".join(problems))
    return client


# ---- a worker process --------------------------------------------------------------------------
def worker_main(args) -> None:
    rng = np.random.default_rng(args.seed)
    stats = Stats()
    deadline = time.monotonic() + args.seconds
    client = envd.connect(args.endpoint, timeout=60)
    rounds = 0
    try:
        while time.monotonic() < deadline:
            rounds += 1
            fault = None
            if rounds % 4 == 3:
                fault = ("client_closed_in_flight", "env_closed_mid_async")[(rounds // 4) % 2]
            budget = float(rng.choice([2_000, 8_000, 20_000]))
            try:
                if fault or rng.random() < 0.5:
                    client = async_round(client, rng, stats, deadline, budget, fault)
                else:
                    sync_round(client, rng, stats, deadline, budget)
            except Exception as exc:  # noqa: BLE001 - reported, then a fresh client
                stats.error(f"worker {args.worker} round {rounds}", exc)
                with contextlib.suppress(Exception):
                    client.close()
                client = envd.connect(args.endpoint, timeout=60)
    finally:
        client.close()
        out = stats.as_dict()
        out["rounds"] = rounds
        print("RESULT " + json.dumps(out), flush=True)


# ---- victim processes (SIGKILL, SIGSTOP) -------------------------------------------------------
class Stepper:
    """One env through the daemon and its in-process twin, stepped one call at a
    time: sync step, or in async mode a send of every env and a recv of all."""

    def __init__(self, client, rng):
        self.rng = rng
        self.env_id = str(rng.choice(soak_envs()))
        self.async_mode = bool(rng.random() < 0.5)
        num_envs, kwargs = random_make(self.env_id, rng, self.async_mode, max_envs=64)
        kwargs["copy"] = True
        self.num_envs = num_envs
        extra = {"batch_size": num_envs} if self.async_mode else {}
        self.remote = client.make(self.env_id, num_envs, **kwargs, **extra)
        self.local = envd.make(self.env_id, num_envs, num_threads=0, **kwargs)
        self.where = f"victim {self.env_id} n={num_envs} async={self.async_mode} {kwargs}"
        self.disabled = kwargs["autoreset_mode"] == "disabled"
        self.local.reset()
        if self.async_mode:
            self.remote.async_reset()
            self.remote.recv()
        else:
            self.remote.reset()

    def step(self) -> list[str]:
        actions = random_actions(self.local.single_action_space, self.num_envs, self.rng)
        expected = self.local.step(actions)
        if self.async_mode:
            self.remote.send(actions, np.arange(self.num_envs))
            obs, rew, term, trunc, info = self.remote.recv()
            order = np.argsort(info["env_id"])
            problems = []
            for name, a, b in zip(("obs", "rewards", "terminations", "truncations"),
                                  (obs, rew, term, trunc), expected[:4]):
                diff_array(a[order], b, name, problems)
            for name in set(expected[4]) - ENV_INFO_EXCLUDED:
                diff_array(info[name][order], expected[4][name], f"info[{name!r}]", problems)
        else:
            problems = diff_step(self.remote.step(actions), expected)
        done = expected[2] | expected[3]
        if self.disabled and done.any():
            mask = done.copy()
            self.remote.reset(options={"reset_mask": mask})
            self.local.reset(options={"reset_mask": mask})
        return problems


def victim_main(args) -> None:
    """--victim kill: step until SIGKILLed.  --victim freeze: step; once SIGCONTed
    (after a SIGSTOP past the lease), every call started must raise
    SessionExpiredError; then start over on the same client.  Prints JSON lines."""
    resumed = threading.Event()
    if args.victim == "freeze":
        signal.signal(signal.SIGCONT, lambda *_: resumed.set())
    rng = np.random.default_rng(args.seed)
    client = envd.connect(args.endpoint, timeout=60)
    steppers = [Stepper(client, rng) for _ in range(int(rng.integers(1, 3)))]
    print(json.dumps({"segments": [s.remote._segment.name for s in steppers],
                      "where": [s.where for s in steppers]}), flush=True)
    steps = 0
    problems_seen: list[str] = []
    while True:
        for stepper in steppers:
            started_after_resume = resumed.is_set()
            try:
                problems = stepper.step()
            except envd.SessionExpiredError as exc:
                if not resumed.is_set():
                    print(json.dumps({"error": f"session expired before SIGCONT: {exc}"}), flush=True)
                    sys.exit(3)
                finish_frozen(client, rng, steps, problems_seen)
                return
            if started_after_resume:
                print(json.dumps({"error": "a call started after the freeze succeeded "
                                           f"({stepper.where})"}), flush=True)
                sys.exit(4)
            if problems:
                problems_seen.append(short(f"{stepper.where} step {steps}: {problems[:3]}"))
                print(json.dumps({"mismatch": problems_seen[-1]}), flush=True)
            steps += 1
            if steps == 5:
                print("stepping", flush=True)


def finish_frozen(client, rng, steps, problems_seen) -> None:
    """The expired connection starts over: a new env, stepped and verified."""
    again = Stepper(client, rng)
    new_problems = []
    for _ in range(5):
        new_problems += again.step()
    again.remote.close()
    again.local.close()
    client.close()
    print(json.dumps({"expired": True, "steps": steps, "mismatches": problems_seen + new_problems}),
          flush=True)
    sys.exit(0)


# ---- the hostile socket ----------------------------------------------------------------------
def pack(value) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


class Raw:
    """A raw DEALER socket speaking the protocol by hand."""

    def __init__(self, context, endpoint):
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.ROUTING_ID, b"\x01" + os.urandom(15))
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.next_id = 1000

    def ask(self, header, blobs=(), timeout: float = 30.0) -> dict:
        if isinstance(header, dict) and "id" not in header:
            self.next_id += 1
            header = {**header, "id": self.next_id}
        frame = header if isinstance(header, bytes) else pack(header)
        self.socket.send_multipart([frame, *blobs])
        if not self.socket.poll(timeout * 1000):
            raise AssertionError(f"no reply within {timeout:g} s to {short(repr(header))}")
        frames = self.socket.recv_multipart()
        reply = msgpack.unpackb(frames[0], raw=False)
        if not isinstance(reply, dict) or len(frames) != 1:
            raise AssertionError(f"a malformed reply {frames!r}")
        expected = header.get("id") if isinstance(header, dict) else None
        expected = expected if type(expected) is int else None  # the daemon echoes an int id
        if isinstance(header, dict) and reply.get("id") != expected:
            raise AssertionError(f"reply id {reply.get('id')} to request {header.get('id')!r}")
        return reply

    def ok(self, header, blobs=()) -> dict:
        reply = self.ask(header, blobs)
        if reply.get("ok") is not True:
            raise AssertionError(f"{short(repr(header))} refused: {reply}")
        return reply

    def close(self):
        self.socket.close(linger=0)


def hostile_cases(rng: random.Random, session: str, other_session: str | None):
    """(header or raw bytes, blobs, expected error code)."""
    cases = [
        (rng.randbytes(rng.choice([0, 1, 7, 100, 5000])), (), "bad_request"),
        (b"\xc1", (), "bad_request"),
        (pack({"type": "status", "id": 1})[:-1], (), "bad_request"),
        (b"\x91" * 5000 + b"\xc0", (), "bad_request"),
        (b"\xdd\xff\xff\xff\xff", (), "bad_request"),
        (pack([1, 2, 3]), (), "bad_request"),
        (pack({"type": "status"}), (), "bad_request"),
        ({"type": "status", "id": True}, (), "bad_request"),
        ({"type": "bogus"}, (), "unknown_type"),
        ({"type": "x" * 5000}, (), "unknown_type"),
        ({"type": "hello", "version": 99}, (), "unsupported_version"),
        ({"type": "make", "env_id": "CartPole-v1", "num_envs": "3"}, (), "bad_request"),
        ({"type": "make", "env_id": "NoSuchEnv-v0", "num_envs": 1}, (), "unknown_env"),
        ({"type": "make", "env_id": "CartPole-v1", "num_envs": 0}, (), "invalid_argument"),
        ({"type": "make", "env_id": "CartPole-v1", "num_envs": 2**40}, (), "invalid_argument"),
        ({"type": "make", "env_id": "Pendulum-v1", "num_envs": 2, "env_kwargs": {"g": -1.0}}, (),
         "invalid_argument"),
        ({"type": "make", "env_id": "CartPole-v1", "num_envs": 2, "seed": -1}, (), "invalid_argument"),
        ({"type": "status", "bogus": 1}, (), "bad_request"),
        ({"type": "status"}, (bytes(16),), "bad_request"),
        ({"type": "step", "session": "nope"}, (), "unknown_session"),
        ({"type": "close", "session": "0" * 32}, (), "unknown_session"),
        ({"type": "recv", "session": "nope", "count": 1}, (), "unknown_session"),
        ({"type": "step", "session": session, "actions": {"dtype": "<i8", "shape": [3]}},
         (bytes(8 * 3),), "invalid_action"),
        ({"type": "step", "session": session, "actions": {"dtype": "<f4", "shape": [4]}},
         (bytes(16),), "invalid_action"),
        ({"type": "step", "session": session, "actions": {"dtype": "<i8", "shape": [4]}},
         (np.array([0, 1, 2, 0], np.int64).tobytes(),), "invalid_action"),
        ({"type": "step", "session": session}, (bytes(32),), "bad_request"),
        ({"type": "recv", "session": session, "count": 1}, (), "env_state"),
        ({"type": "send", "session": session}, (np.array([0, 99], np.int64).tobytes(),),
         "invalid_argument"),
        ({"type": "send", "session": session}, (np.array([-1], np.int64).tobytes(),),
         "invalid_argument"),
        ({"type": "send", "session": session}, (np.array([1, 1], np.int64).tobytes(),), "env_state"),
        ({"type": "send", "session": session}, (b"abc",), "bad_request"),
        ({"type": "recv", "session": session, "count": 0}, (), "invalid_argument"),
        ({"type": "heartbeat", "client": b"\x01" + bytes(15)}, (), "unknown_session"),
    ]
    if other_session is not None:  # another client's session: never touched
        cases.append(({"type": "step", "session": other_session}, (), "unknown_session"))
        cases.append(({"type": "close", "session": other_session}, (), "unknown_session"))
    return cases


def hostile_fault(endpoint: str, rng: random.Random, stats: Stats, pending: list,
                  lease: float, other_session: str | None) -> None:
    context = zmq.Context()
    attacker = Raw(context, endpoint)
    try:
        # before hello: refused
        reply = attacker.ask({"type": "status"})
        if reply.get("ok") is not False or reply.get("code") != "bad_request":
            stats.error("hostile", f"a request before hello: {reply}")
        stats.faults["hostile_message"] += 1
        attacker.ok({"type": "hello", "version": protocol.PROTOCOL_VERSION, "client_name": "soak attacker"})
        made = attacker.ok({"type": "make", "env_id": "CartPole-v1", "num_envs": 4, "seed": 1})
        session = made["session"]
        attacker.ok({"type": "reset", "session": session})
        cases = hostile_cases(rng, session, other_session)
        for header, blobs, code in rng.sample(cases, k=min(len(cases), rng.randint(8, 20))):
            reply = attacker.ask(header, blobs)
            stats.faults["hostile_message"] += 1
            message = reply.get("message", "")
            if reply.get("ok") is not False or reply.get("code") != code or not isinstance(message, str) \
                    or "Traceback" in message or 'File "' in message:
                stats.error("hostile", f"{short(repr(header))} -> {reply} (expected code {code})")
        # still served, and the session untouched by the refused steps: it steps
        attacker.ok({"type": "step", "session": session, "actions": {"dtype": "<i8", "shape": [4]}},
                    (np.array([0, 1, 1, 0], np.int64).tobytes(),))
        attacker.ok({"type": "status"})
        if rng.random() < 0.5:  # vanish without bye: the lease frees the session
            pending.append((made["shm"]["name"].lstrip("/"), time.monotonic() + 3 * lease + 10,
                            "socket_abandoned"))
            stats.faults["socket_abandoned"] += 1
        else:
            attacker.ok({"type": "close", "session": session})
            attacker.ok({"type": "bye"})
    finally:
        attacker.close()
        context.term()


# ---- the fault injector (a thread of the main process) ---------------------------------------
class Faults(threading.Thread):
    def __init__(self, endpoint, lease, deadline, seed, folder, other_session):
        super().__init__(name="faults", daemon=True)
        self.endpoint, self.lease, self.deadline = endpoint, lease, deadline
        self.rng = random.Random(seed)
        self.folder = folder
        self.other_session = other_session
        self.stats = Stats()
        self.pending: list[tuple[str, float, str]] = []  # segment, deadline, fault kind
        self.children: list[subprocess.Popen] = []
        self.reclaim_seconds: list[float] = []

    def run(self):
        try:
            kinds: list[str] = []
            cycles = 0
            # every kind at least once (the first cycle ends even past the deadline)
            while time.monotonic() < self.deadline or (cycles == 1 and kinds):
                if not kinds:
                    cycles += 1
                    kinds = ["hostile", "kill", "freeze"]
                    self.rng.shuffle(kinds)
                kind = kinds.pop()
                try:
                    {"hostile": self.hostile, "kill": self.kill, "freeze": self.freeze}[kind]()
                except Exception as exc:  # noqa: BLE001
                    self.stats.error(f"fault {kind}", exc)
                self.check_pending(final=False)
                time.sleep(self.rng.uniform(0.0, 1.0))
            self.check_pending(final=True)
        except BaseException as exc:  # noqa: BLE001
            self.stats.error("fault thread", exc)
        finally:
            for child in self.children:
                if child.poll() is None:
                    child.kill()
                    child.wait()

    def check_pending(self, final: bool):
        now = time.monotonic()
        for item in list(self.pending):
            segment, until, kind = item
            if not segment_exists(segment):
                self.pending.remove(item)
            elif final:
                if not wait_until(lambda segment=segment: not segment_exists(segment),
                                  max(0.0, until - now)):
                    self.stats.error(kind, f"segment {segment} not freed within the lease (+ slack)")
                self.pending.remove(item)
            elif now > until:
                self.stats.error(kind, f"segment {segment} not freed within the lease (+ slack)")
                self.pending.remove(item)

    def hostile(self):
        hostile_fault(self.endpoint, self.rng, self.stats, self.pending, self.lease, self.other_session)

    def spawn(self, kind: str):
        seed = self.rng.randrange(2**32)
        out = self.folder / f"victim-{kind}-{seed}.out"
        # The child gets its own append-mode descriptor and the parent reads the path
        # afresh: a shared descriptor shares its offset, and a parent seek(0) would make
        # the child's next line overwrite the file's start.
        with open(out, "ab") as stdout:
            child = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--victim", kind, "--endpoint",
                 self.endpoint, "--seed", str(seed)],
                cwd=self.folder, stdout=stdout, stderr=subprocess.STDOUT)
        self.children.append(child)
        return child, out

    @staticmethod
    def lines(out: Path) -> list[str]:
        return out.read_bytes().decode(errors="replace").splitlines()

    def wait_stepping(self, child, out, kind) -> list[str] | None:
        """The victim's segments once it steps, or None (reported) if it died."""
        def stepping():
            return "stepping" in self.lines(out) or child.poll() is not None
        if not wait_until(stepping, 120) or child.poll() is not None:
            self.stats.error(f"victim {kind}", "did not start stepping:\n" + "\n".join(self.lines(out)[-20:]))
            if child.poll() is None:
                child.kill()
                child.wait()
            return None
        first = next(json.loads(line) for line in self.lines(out) if line.startswith("{"))
        return first["segments"]

    def victim_mismatches(self, out, kind):
        for line in self.lines(out):
            if line.startswith("{"):
                record = json.loads(line)
                if "mismatch" in record:
                    self.stats.mismatches += 1
                    self.stats.details.append(f"victim {kind}: {record['mismatch']}")

    def kill(self):
        child, out = self.spawn("kill")
        segments = self.wait_stepping(child, out, "kill")
        if segments is None:
            return
        time.sleep(self.rng.uniform(0.0, 0.5))
        child.send_signal(signal.SIGKILL)
        child.wait()
        self.stats.faults["client_sigkilled"] += 1
        self.victim_mismatches(out, "kill")
        killed = time.monotonic()
        for segment in segments:
            self.pending.append((segment, killed + 3 * self.lease + 10, "client_sigkilled"))

    def freeze(self):
        child, out = self.spawn("freeze")
        segments = self.wait_stepping(child, out, "freeze")
        if segments is None:
            return
        time.sleep(self.rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            freed = wait_until(lambda: not any(map(segment_exists, segments)), 3 * self.lease + 10)
            waited = time.monotonic() - stopped
        finally:
            child.send_signal(signal.SIGCONT)
        if not freed:
            self.stats.error("client_frozen", f"segments {segments} not freed {waited:.1f} s after SIGSTOP")
        elif waited < self.lease * 0.9:
            # (the victim stepped until the stop: its last request, on any
            # path, renewed the lease at most one step before)
            self.stats.error("client_frozen", f"freed {waited:.1f} s after SIGSTOP, before the lease")
        self.reclaim_seconds.append(waited)
        try:
            rc = child.wait(120)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            rc = "hung"
        self.stats.faults["client_frozen"] += 1
        self.victim_mismatches(out, "freeze")
        records = [json.loads(line) for line in self.lines(out) if line.startswith("{")]
        final = records[-1] if records else {}
        if rc != 0 or not final.get("expired"):
            self.stats.error("client_frozen", f"victim exit {rc}: " + "\n".join(self.lines(out)[-20:]))
        for problem in final.get("mismatches", []):
            self.stats.mismatches += 1
            self.stats.details.append(f"victim freeze: {problem}")


# ---- the daemon and its counters -------------------------------------------------------------
def start_daemon(folder: Path, threads: int, lease: float) -> tuple[subprocess.Popen, str, Path]:
    endpoint = f"ipc://{folder}/envd.sock"
    log = folder / "envd.log"
    with open(log, "ab") as out:  # the daemon keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "envd", "--bind", endpoint, "--threads", str(threads),
             "--lease-timeout", str(lease), "--log-level", "warning"],
            cwd=folder, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            envd.connect(endpoint, timeout=2).close()
            return proc, endpoint, log
        except envd.EnvdError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the daemon did not start:\n" + log.read_text()) from None
            time.sleep(0.05)


def thread_names(pid: int) -> list[str]:
    names = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except OSError:
            pass
    return sorted(names)


def counters(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as status:
        fields = dict(line.split(":", 1) for line in status if ":" in line)
    rss, rss_anon = (int(fields[name].split()[0]) for name in ("VmRSS", "RssAnon"))
    with open(f"/proc/{pid}/maps") as maps:
        mappings = sum("/dev/shm/envd-" in line for line in maps)
    return {"rss_kib": rss, "rss_anon_kib": rss_anon, "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": len(os.listdir(f"/proc/{pid}/task")),
            "segments": sum(n.startswith(f"envd-{pid}-") for n in os.listdir(SHM)),
            "shm_mappings": mappings}


def warm_up(endpoint: str, rng: np.random.Generator, clients: int) -> None:
    """Lazily created threads and caches of the daemon, before the baseline.  The
    daemon's make/reset executor starts a thread per overlapping operation (up
    to its max_workers), so several clients make big envs at the same time."""
    def one_client(index: int) -> None:
        local_rng = np.random.default_rng(index)
        with envd.connect(endpoint, timeout=60) as client:
            for env_id in soak_envs():
                for n in (1, 256):
                    with client.make(env_id, n, seed=0) as env:
                        env.reset()
                        space = env.single_action_space
                        for _ in range(3):
                            env.step(random_actions(space, n, local_rng))
                    with client.make(env_id, n, seed=0, batch_size=max(1, n // 2)) as env:
                        env.async_reset()
                        for _ in range(3):
                            _, _, _, _, info = env.recv()
                            env.send(random_actions(space, len(info["env_id"]), local_rng),
                                     info["env_id"])

    for _ in range(2):
        errors = []
        threads = [threading.Thread(target=_catch, args=(errors, one_client, i))
                   for i in range(max(3, clients))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        context = zmq.Context()
        raw = Raw(context, endpoint)
        raw.ask(b"\xc1")
        raw.ok({"type": "hello", "version": protocol.PROTOCOL_VERSION})
        # makes posted back to back overlap on the executor: it starts all its threads
        for request_id in range(4):
            raw.socket.send(pack({"type": "make", "id": request_id, "env_id": "CartPole-v1",
                                  "num_envs": 4096, "seed": 0}))
        sessions = []
        for _ in range(4):
            if not raw.socket.poll(60_000):
                raise RuntimeError("no reply to a warm-up make")
            sessions.append(msgpack.unpackb(raw.socket.recv(), raw=False)["session"])
        for session in sessions:
            raw.ok({"type": "close", "session": session})
        raw.ok({"type": "bye"})
        raw.close()
        context.term()


def _catch(errors: list, fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)


def settle(observer, pid: int | None, lease: float, baseline: dict | None) -> None:
    """Wait until only the observer is left, every lease expired, and (when
    counted) the counters are back to the baseline."""
    limit = 3 * lease + 30
    def only_the_observer() -> bool:
        status = observer.status()
        return status["sessions"] == 0 and status["clients"] == 1

    wait_until(only_the_observer, limit, 0.2)
    if pid is None:
        return
    wait_until(lambda: counters(pid)["segments"] == 0 and counters(pid)["shm_mappings"] == 0, 30, 0.1)
    if baseline is not None:
        keys = ("fds", "threads")
        wait_until(lambda: all(counters(pid)[k] == baseline[k] for k in keys), 30, 0.1)


# ---- main ------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=None, help="overrides --minutes")
    parser.add_argument("--clients", type=int, default=3, help="worker client processes")
    parser.add_argument("--endpoint", default=None, help="a running daemon (default: start one)")
    parser.add_argument("--threads", type=int, default=2, help="threads of the daemon started")
    parser.add_argument("--lease", type=float, default=3.0,
                        help="--lease-timeout of the daemon started (or of --endpoint's)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--rss-growth-mib", type=float, default=64.0)
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--victim", choices=("kill", "freeze"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = args.minutes * 60
    if args.worker is not None:
        worker_main(args)
        return 0
    if args.victim is not None:
        victim_main(args)
        return 0
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    started = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="envd-soak-"))
    daemon = log = None
    if args.endpoint is None:
        daemon, endpoint, log = start_daemon(folder, args.threads, args.lease)
    else:
        endpoint = args.endpoint
    stats = Stats()
    leaks: list[str] = []
    before = after = None
    exit_problems: list[str] = []
    try:
        observer = envd.connect(endpoint, timeout=60)
        info = observer.server_info
        pid = observer.status()["pid"]
        lease = float(info.get("lease_timeout", args.lease))
        same_host = info.get("hostname", socket.gethostname()) == socket.gethostname() \
            and os.path.exists(f"/proc/{pid}/status")
        count_pid = pid if same_host else None
        print(f"soak: daemon pid {pid} at {endpoint}, lease {lease:g} s, {args.clients} clients, "
              f"{args.seconds:g} s, seed {seed}", flush=True)
        warm_up(endpoint, np.random.default_rng(seed), args.clients)
        settle(observer, count_pid, lease, None)
        if count_pid is not None:
            before = counters(count_pid)
            threads_before = thread_names(count_pid)
        # a session of the observer the attackers try to touch
        guarded = observer.make("CartPole-v1", 4, seed=3)
        guarded_twin = envd.make("CartPole-v1", 4, seed=3, num_threads=0)
        guarded.reset(), guarded_twin.reset()

        soak_start = time.monotonic()
        deadline = soak_start + args.seconds
        workers = []
        for i in range(args.clients):
            out = open(folder / f"worker-{i}.out", "a+b")  # noqa: SIM115 - the child's stdout (append: see spawn)
            workers.append((subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", str(i), "--endpoint", endpoint,
                 "--seconds", str(args.seconds), "--seed", str(seed * 1000 + i)],
                cwd=folder, stdout=out, stderr=subprocess.STDOUT), out))
        faults = Faults(endpoint, lease, deadline, seed, folder, guarded.session)
        faults.start()
        # meanwhile: the guarded session keeps stepping bit-identically
        rng = np.random.default_rng(seed + 1)
        while time.monotonic() < deadline and any(w.poll() is None for w, _ in workers):
            actions = rng.integers(0, 2, 4)
            stats.verified(diff_step(guarded.step(actions), guarded_twin.step(actions)), 4,
                           "guarded session", "sync")
            time.sleep(0.05)
        for i, (worker, out) in enumerate(workers):
            try:
                worker.wait(args.seconds + 300)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            out.seek(0)
            text = out.read().decode(errors="replace")
            results = [line for line in text.splitlines() if line.startswith("RESULT ")]
            if worker.returncode != 0 or not results:
                stats.error(f"worker {i}", f"exit {worker.returncode}:\n{text[-3000:]}")
            if results:
                stats.merge(json.loads(results[-1][len("RESULT "):]))
        faults.join(600)
        stats.merge(faults.stats.as_dict())
        soak_seconds = time.monotonic() - soak_start
        guarded.close()
        guarded_twin.close()
        settle(observer, count_pid, lease, before)
        if count_pid is not None:
            after = counters(count_pid)
            for key in ("fds", "threads", "segments", "shm_mappings"):
                if after[key] != before[key]:
                    leaks.append(f"{key} {before[key]} -> {after[key]}")
            if after["threads"] != before["threads"]:
                leaks.append(f"thread names {threads_before} -> {thread_names(count_pid)}")
            growth = (after["rss_kib"] - before["rss_kib"]) / 1024
            if growth > args.rss_growth_mib:
                leaks.append(f"rss grew {growth:.1f} MiB (> {args.rss_growth_mib:g})")
        status = observer.status()
        if status["sessions"] != 0:
            leaks.append(f"{status['sessions']} sessions left")
        observer.close()
    except Exception as exc:  # noqa: BLE001
        stats.error("soak", exc)
        soak_seconds = time.monotonic() - started
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            try:
                rc = daemon.wait(60)
            except subprocess.TimeoutExpired:
                daemon.kill()
                rc = daemon.wait()
            if rc != 0:
                exit_problems.append(f"the daemon exited {rc} on SIGTERM")
            left = [n for n in os.listdir(SHM) if n.startswith(f"envd-{daemon.pid}-")]
            if left:
                exit_problems.append(f"the daemon left segments {left}")
            text = log.read_text(errors="replace")
            if "Traceback" in text or "internal" in text.lower():
                exit_problems.append("the daemon log has a traceback/internal error:\n" + text[-3000:])

    faults_total = sum(stats.faults.values())
    failed = stats.mismatches or leaks or stats.errors or exit_problems
    lines = ["", "==== envd soak summary ====",
             (f"duration: {soak_seconds:.1f} s of soak, {time.monotonic() - started:.1f} s in all; "
              f"{args.clients} clients; seed {seed}"),
             f"steps verified: {stats.steps} (env steps {stats.env_steps}; "
             + ", ".join(f"{k} {v}" for k, v in sorted(stats.by_mode.items()))
             + f"; episode ends {stats.episodes})",
             f"mismatches: {stats.mismatches}"]
    lines += [f"  {d}" for d in stats.details[:10]]
    lines.append(f"faults injected: {faults_total} ("
                 + ", ".join(f"{k}={v}" for k, v in sorted(stats.faults.items())) + ")")
    lines.append(f"errors: {len(stats.errors)}")
    lines += [f"  {e}" for e in stats.errors[:10]]
    if before is not None and after is not None:
        lines.append(f"leak counters: {'':8}{'before':>10}{'after':>10}")
        for key in before:
            lines.append(f"  {key:20}{before[key]:>10}{after[key]:>10}")
    else:
        lines.append("leak counters: not measured (the daemon is not on this host, or the soak failed early)")
    lines.append(f"leaks: {', '.join(leaks) if leaks else 'none'}")
    lines += exit_problems
    if failed:
        lines.append(f"logs kept in {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    lines.append(f"result: {'FAIL' if failed else 'PASS'}")
    print("\n".join(lines), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
