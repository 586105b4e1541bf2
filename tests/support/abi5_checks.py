"""Checks of the ABI 5 test plugin (tests/native/abi5_plugin.c), for an env
made in-process (run in a fresh interpreter: loading a plugin changes the
registry for good) or through a daemon.

What the plugin writes is known from its description (abi5_plugin.c): each
row's observation says which seed the env was last given, how often seed was
called, how many episodes ended and where the episode is; the checks derive
every expected value from the make's arguments, never from envd's output.
"""
from __future__ import annotations

import threading

import numpy as np
from gymnasium.vector import AutoresetMode

from support.fresh_interpreter import checker
from support.plugin_checks import ROOT

SOURCE = ROOT / "tests" / "native" / "abi5_plugin.c"
ENV_ID = "Abi5Test-v0"
FIELDS = ("episode_return", "episode_length", "score")
# observation columns (abi5_plugin.c)
SEED, SEED_CALLS, EPISODES, STEP, AGENT, SEED_AT_INIT, SIZE, BOUND = range(8)

#: run abi5_checks.<name>(*args) in a fresh interpreter
run_check = checker("abi5_checks")


def check_spaces(env, size: int, agents: int, num_envs: int) -> None:
    """The spaces and rows described for size and agents."""
    assert env.single_observation_space.shape == (size + 6,), env.single_observation_space
    assert env.single_observation_space.dtype == np.float64
    assert (env.single_observation_space.high == 1e15).all()
    assert env.single_action_space.nvec.tolist() == [size + 1, 2]
    assert env.num_envs == num_envs * agents and env.num_agents == agents
    assert env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    assert env.metadata["envd_autoreset"] == "the env resets itself"


def check_episodes(env, seed: int, size: int, agents: int, episode_len: int) -> None:
    """Seeds (before init with seed + i, at a seeded reset with t + i, never
    at an unseeded reset), no host reset or time limit, the env's own
    episode ends in info["envd_episode"] and info["envd_log"] for every row
    of the env.  env: num_envs envs of agents rows, made with seed."""
    rows = env.num_envs
    env_of = np.arange(rows) // agents
    obs, info = env.reset()
    assert obs[:, SEED].tolist() == (seed + env_of).tolist()
    assert obs[:, SEED_AT_INIT].tolist() == (seed + env_of).tolist()  # seed came before init
    assert (obs[:, SEED_CALLS] == 1).all()  # once, before init: not by the unseeded reset
    assert obs[:, AGENT].tolist() == (np.arange(rows) % agents).tolist()
    assert (obs[:, SIZE] == size).all()
    obs, _ = env.reset(seed=100)
    assert obs[:, SEED].tolist() == (100 + env_of).tolist() and (obs[:, SEED_CALLS] == 2).all()
    obs, _ = env.reset()
    assert (obs[:, SEED_CALLS] == 2).all() and obs[:, SEED].tolist() == (100 + env_of).tolist()
    actions = np.stack([np.arange(rows) % (size + 1), np.zeros(rows, np.int64)], axis=1)
    per_env_mean = (actions[:, 0].reshape(-1, agents).mean(axis=1) * episode_len)[env_of]
    for t in range(1, 3 * episode_len + 1):
        obs, rewards, terms, truncs, info = env.step(actions)
        assert rewards.tolist() == actions[:, 0].astype(np.float32).tolist()
        assert not truncs.any()  # the host adds no time limit
        ended = t % episode_len == 0
        assert (obs[:, STEP] == t % episode_len).all()  # the env restarted itself, no host reset
        assert (obs[:, EPISODES] == t // episode_len).all()
        assert (obs[:, SEED_CALLS] == 2).all()  # no seed on an autoreset
        assert terms.all() == ended and terms.any() == ended
        if not ended:
            assert "envd_log" not in info and "envd_episode" not in info, sorted(info)
            continue
        assert info["_envd_log"].all() and info["_envd_episode"].all()
        assert info["envd_log"].keys() == set(FIELDS)
        assert info["envd_log"]["score"].tolist() == [t // episode_len] * rows
        assert info["envd_log"]["episode_length"].tolist() == [episode_len] * rows
        assert np.allclose(info["envd_log"]["episode_return"], per_env_mean)
        # r and l from the env's own episode_return and episode_length
        assert np.allclose(info["envd_episode"]["r"], per_env_mean)
        assert info["envd_episode"]["l"].tolist() == [episode_len] * rows
        assert (info["envd_episode"]["t"] >= 0).all()


def check_raw_books(buffers: dict[str, np.ndarray], ended: np.ndarray) -> None:
    """The books as the vec writes them (native/src/vec.h), before the info
    masks them: dones on the rows whose episode ended in the step, and no
    truncation, statistic or log value on the others (a step clears only the
    rows an earlier episode end wrote: env_slot.h's rows_set)."""
    assert buffers["dones"].tolist() == ended.tolist()
    assert not buffers["truncations"].any()
    for name in ("episode_returns", "episode_lengths", "episode_times"):
        assert (buffers[name][~ended] == 0).all(), (name, buffers[name])
    assert (buffers["episode_log"][~ended] == 0).all(), buffers["episode_log"]
    assert (buffers["episode_lengths"][ended] > 0).all()
    if "agent_mask" in buffers:
        assert buffers["agent_mask"].all()


def check_staggered_log(env, episode_lens: list[int], agents: int, copy: bool) -> None:
    """Envs whose episodes end at different steps (per-env episode_len):
    each step's info["envd_log"] holds the log of the rows that ended in it
    and exactly 0 in every other row (whatever an earlier step left there);
    with copy=True the info's arrays are the caller's own (a later step
    changes none of them)."""
    rows = env.num_envs
    lens = np.repeat(episode_lens, agents)  # each row's env's episode_len
    actions = np.stack([np.arange(rows) % 2 + 1, np.zeros(rows, np.int64)], axis=1)
    env.reset()
    kept = []
    for t in range(1, 2 * int(np.lcm.reduce(episode_lens)) + 1):
        info = env.step(actions)[4]
        ended = t % lens == 0
        check_raw_books(env._buffers, ended)
        if not ended.any():
            assert "envd_log" not in info
            continue
        assert info["_envd_log"].tolist() == ended.tolist() == info["_envd_episode"].tolist()
        log = info["envd_log"]
        expected = {"episode_length": np.where(ended, lens, 0),
                    "score": np.where(ended, t // lens, 0),
                    # one agent per row here: the row's own summed rewards
                    "episode_return": np.where(ended, lens * actions[:, 0], 0)}
        for name in FIELDS if agents == 1 else ("episode_length", "score"):
            assert log[name].dtype == np.float64 and log[name].shape == (rows,)
            assert log[name].tolist() == expected[name].tolist(), (t, name, log[name])
        assert info["envd_episode"]["l"].tolist() == expected["episode_length"].tolist()
        kept.append((info, {name: log[name].copy() for name in FIELDS}))
    assert len(kept) > 3
    for info, values in kept if copy else ():  # (else valid until the next step only)
        for name in FIELDS:  # unchanged by the steps after it
            assert info["envd_log"][name].tolist() == values[name].tolist()


def check_async(env, episode_len: int) -> None:
    """async_reset/send/recv: the envd_log of an env's episode end comes back
    with that env's recv (batch_size 2 of 4 envs, one agent each)."""
    steps = dict.fromkeys(range(env.num_envs), 0)
    env.async_reset()
    ends = 0
    for _ in range(40):
        obs, rewards, terms, truncs, info = env.recv()
        ids = info["env_id"].tolist()
        mask = info.get("_envd_log", np.zeros(len(ids), bool))
        for k, i in enumerate(ids):
            ended = steps[i] > 0 and steps[i] % episode_len == 0
            assert bool(mask[k]) == ended, (i, steps[i], mask)
            assert obs[k, STEP] == steps[i] % episode_len
            assert obs[k, EPISODES] == steps[i] // episode_len
            if ended:
                ends += 1
                assert info["envd_log"]["score"][k] == steps[i] // episode_len
                assert info["envd_episode"]["l"][k] == episode_len
        assert not truncs.any()
        env.send(np.tile([[1, 1]], (len(ids), 1)), info["env_id"])
        for i in ids:
            steps[i] += 1
    env.recv()  # (the last batch sent)
    assert ends > 5


# ---- in-process checks (a fresh interpreter each) ---------------------------------------
def in_process(library: str, threads: str) -> None:
    import envd
    from envd.native import get_spec
    envd.load_plugin(library)
    spec = get_spec(ENV_ID)  # envd list's: the description at the defaults
    assert spec.observation_space.shape == (9,) and spec.action_space.nvec.tolist() == [4, 2]
    assert spec.num_agents == 1 and spec.resets_itself and spec.episode_fields == FIELDS
    for size, agents in ((5, 2), (2, 1), (1, 4)):
        with envd.make(ENV_ID, 3, seed=10, num_threads=int(threads), size=size,
                       agents=agents, episode_len=3) as env:
            check_spaces(env, size, agents, 3)
            # the description's arrays: Box low and high, MultiDiscrete nvec
            assert env.envd_spec.described_bytes == 2 * 8 * (size + 6) + 2 * 8
            check_episodes(env, 10, size, agents, 3)
    with envd.make(ENV_ID, 4, seed=3, num_threads=int(threads), batch_size=2,
                   episode_len=2) as env:
        check_async(env, 2)
    for copy in (False, True):
        with envd.make(ENV_ID, 3, seed=0, num_threads=int(threads), copy=copy,
                       episode_len=[2, 3, 5]) as env:
            check_staggered_log(env, [2, 3, 5], 1, copy)
        with envd.make(ENV_ID, 2, seed=0, num_threads=int(threads), copy=copy, agents=2,
                       episode_len=[2, 3]) as env:
            check_staggered_log(env, [2, 3], 2, copy)
    # no seed: the host draws a base, env i gets base + i (before init too)
    with envd.make(ENV_ID, 3, num_threads=int(threads)) as env:
        obs, _ = env.reset()
        assert (np.diff(obs[:, SEED]) % 2**32).tolist() == [1.0, 1.0]  # (seeds mod 2^32)
        assert (obs[:, SEED] == obs[:, SEED_AT_INIT]).all()
    # gymnasium's make_vec of the envd/ id makes the same env
    import gymnasium
    with gymnasium.make_vec(f"envd/{ENV_ID}", num_envs=2, seed=10, size=2,
                            num_threads=int(threads)) as env:
        check_spaces(env, 2, 1, 2)
        check_episodes(env, 10, 2, 1, 4)
    # per-env params that describe alike are fine
    with envd.make(ENV_ID, 2, seed=0, size=[4, 4], episode_len=[2, 3]) as env:
        check_spaces(env, 4, 1, 2)
        # heap_bytes may differ per env: the make is bounded by the largest
        assert env.envd_spec.heap_bytes == 3000
    from dataclasses import replace

    from envd.server.sessions import state_plan
    with envd.make(ENV_ID, 2, seed=0, episode_len=5) as env:
        spec = env.envd_spec
        assert spec.heap_bytes == 5000
        assert state_plan(spec, 7) - state_plan(replace(spec, keep=None), 7) \
            == 7 * 5000 + spec.described_bytes


def check_bound(env, bound: bool, agents: int = 1) -> None:
    """Column BOUND of every row, after resets, steps and async batches (the
    OBS_ROWS variants: whether the host bound each env to its rows; their
    reset and step abort when given any other obs).  env: made with size > 1
    and batch_size of half its envs."""
    obs, _ = env.reset(seed=5)
    assert (obs[:, BOUND] == bound).all(), obs
    actions = np.ones((env.num_envs, 2), np.int64)
    for t in range(1, 4):
        obs = env.step(actions)[0]
        assert (obs[:, BOUND] == bound).all() and (obs[:, STEP] == t % 4).all(), obs
    env.async_reset()
    for _ in range(6):  # batches of envs in a row and not: the rows never move
        obs, *_, info = env.recv()
        assert (obs[:, BOUND] == bound).all()
        envs = info["env_id"][::agents][::-1]  # (per row: each env's id agents times)
        env.send(np.ones((len(envs) * agents, 2), np.int64), np.repeat(envs, agents))
    env.recv()


def bound_rows(library: str, threads: str, bound: str) -> None:
    """In-process (private memory): an OBS_ROWS or OBS_ROWS_PRIVATE env is
    bound to its rows (bound "1"); an env without ENVD_ENV_OBS_ROWS never is,
    though its bind_obs is set (bound "0")."""
    import envd
    envd.load_plugin(library)
    for agents in (1, 3):
        with envd.make(ENV_ID, 4, seed=0, num_threads=int(threads), size=3, agents=agents,
                       batch_size=2) as env:
            check_bound(env, bound == "1", agents)


def refusals(library: str) -> None:
    import envd
    envd.load_plugin(library)
    cases = [
        ({"max_episode_steps": 10}, "resets itself"),
        ({"autoreset_mode": "next_step"}, "make it without autoreset_mode"),
        ({"autoreset_mode": "same_step", "max_episode_steps": 5},
         "without autoreset_mode and max_episode_steps"),
        ({"size": [4, 5]}, "envs of one vec must have the same spaces"),
        ({"agents": [1, 2]}, "the params of env 1 describe other spaces"),
        ({"size": 7}, "describe failed for the params of env 0: invalid argument"),
        ({"size": [3, 7]}, "describe failed for the params of env 1"),
        ({"size": 8}, "out of memory"),
        ({"size": 9}, "out of range"),
        ({"episode_len": [3, 50]}, "heap_bytes 4294967297 for the params of env 1, past"),
    ]
    for kwargs, expected in cases:
        try:
            envd.make(ENV_ID, 2, seed=0, **kwargs)
        except envd.InvalidArgumentError as e:
            assert expected in str(e), (kwargs, str(e))
        else:
            raise AssertionError(f"{kwargs} was accepted")
    with envd.make(ENV_ID, 2, seed=0) as env:  # the process is fine
        env.reset()


def failing_env(library: str, threads: str) -> None:
    """An env whose step fails (abi5_plugin.c: seeded FAILING_SEED) is named
    by the step's error; the others stepped, once each; a reseed makes the
    vec usable again.  With step_envs, the call resumes after the failed env."""
    import envd
    envd.load_plugin(library)
    with envd.make(ENV_ID, 5, seed=999999 - 2, num_threads=int(threads), agents=2) as env:
        obs, _ = env.reset()  # (a view of the env's buffer: copy=False)
        actions = np.ones((env.num_envs, 2), np.int64)
        for _ in range(2):
            try:
                env.step(actions)
            except envd.NativeError as e:
                assert "env 4 failed in its reset, step or write_info callback" in str(e), e
            else:
                raise AssertionError("the failing env's step was not refused")
        # rows 4 and 5 (env 2's agents) never stepped, every other env twice
        assert obs[:, STEP].tolist() == [2, 2, 2, 2, 0, 0, 2, 2, 2, 2]
        obs, _ = env.reset(seed=0)
        for t in range(1, 3):
            obs = env.step(actions)[0]
            assert (obs[:, STEP] == t).all()


def serial_init(library: str, expect_overlap: str = "") -> None:
    """Makes on several threads at once: the plugin's init fails if two of
    its inits overlap, so every make succeeds only if the host serialises
    them (ENVD_ENV_SERIAL_INIT).  expect_overlap (a plugin without the flag):
    some make must fail, or the check could not fail."""
    import envd
    envd.load_plugin(library)
    errors: list[BaseException] = []

    def make_some() -> None:
        try:
            for _ in range(3):
                with envd.make(ENV_ID, 40, seed=0, num_threads=0) as env:
                    env.reset()
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=make_some) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if expect_overlap:
        assert errors and all("init" in str(e) or "callback" in str(e) for e in errors), errors
    else:
        assert not errors, errors
