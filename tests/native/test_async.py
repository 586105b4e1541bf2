"""Async mode in-process (make(..., batch_size=B), async_reset/send/recv):
exactly-once and ready-order invariants, per-env trajectories equal to sync
mode, double-buffered results, and every misuse refused with the env intact."""
from __future__ import annotations

import numpy as np
import pytest
from support.async_steps import async_trajectories, envpool_loop_trajectories, per_env_actions, sync_trajectories
from support.builtin_envs import BUILTIN_ENV_IDS, MULTI_AGENT_ENV_IDS

import envd
from envd.native._envd_native import lib
from envd.vector_base import BatchedVecEnv

# Steps no episode can end within, whatever the actions: CartPole's pole falls
# in 8 steps at the soonest; Snake's head starts 5 cells from the nearest wall,
# but after two quick foods it can bite its body on its 3rd move; ConnectFour's
# agent connects four on its 4th move at the soonest; simple_spread's
# max_cycles (25) truncates every agent at once.
SAFE_STEPS = {"CartPole-v1": 8, "Snake-v0": 2, "ConnectFour-v0": 3,
              "simple_spread_v3": 24, "simple_spread_continuous_v3": 24}


@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS + MULTI_AGENT_ENV_IDS)
@pytest.mark.parametrize("numpy_gather", [False, True])
def test_envpool_loop_trajectories_equal_sync_mode(env_id, numpy_gather, monkeypatch):
    """Sending each recv's info["env_id"] straight back (ids not checked
    again; actions and, with the numpy gather the daemon's client uses, rows
    copied as slices for a run of envs) steps every env as sync mode does."""
    if numpy_gather:
        monkeypatch.setattr(envd.native.vector_env.VecEnv, "_row_copier",
                            BatchedVecEnv._row_copier)
    num_envs, steps = 12, 30
    spec = envd.native.get_spec(env_id)
    actions = per_env_actions(spec.action_space, num_envs, steps, seed=5, num_agents=spec.num_agents)
    reference = sync_trajectories(env_id, num_envs, steps, actions)
    for batch_size, threads, batches in [(6, 2, "run"), (5, 1, "other"), (12, 0, "run")]:
        runs, received, kinds = envpool_loop_trajectories(
            lambda **kw: envd.make(env_id, num_envs, seed=11, num_threads=threads, **kw),
            num_envs, steps, actions, batch_size)
        for i in range(num_envs):
            assert runs[i] == reference[i][:len(runs[i])], (env_id, batch_size, threads, i)
        assert received.min() >= 1 and kinds[batches] > 0, kinds


@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS + MULTI_AGENT_ENV_IDS)
@pytest.mark.parametrize("mode", ["next_step", "same_step", "disabled"])
def test_per_env_trajectories_equal_sync_mode(env_id, mode):
    num_envs, steps = 12, 60
    spec = envd.native.get_spec(env_id)
    actions = per_env_actions(spec.action_space, num_envs, steps, seed=5, num_agents=spec.num_agents)
    kwargs = {"autoreset_mode": mode}
    if mode == "disabled":
        # Without autoreset a done env may not be stepped again: run no
        # longer than the shortest episode (no time limit).
        kwargs["max_episode_steps"] = 0
        steps = min(steps, SAFE_STEPS.get(env_id, steps))
        actions = actions[:steps]
    reference = sync_trajectories(env_id, num_envs, steps, actions, **kwargs)
    rng = np.random.default_rng(hash((env_id, mode)) % 2**32)
    for batch_size, threads in [(1, 0), (5, 1), (12, 2), (7, 4)]:
        runs, received = async_trajectories(
            lambda **kw: envd.make(env_id, num_envs, seed=11, num_threads=threads, **kw),
            num_envs, steps, actions, batch_size, rng, **kwargs)
        for i in range(num_envs):
            got = runs[i]
            assert got == reference[i][:len(got)], (env_id, mode, batch_size, threads, i)
        assert received.min() >= 1


def test_exactly_once_and_ready_order():
    rng = np.random.default_rng(0)
    num_envs = 64
    with envd.make("Acrobot-v1", num_envs, seed=0, num_threads=2, batch_size=16) as env:
        env.async_reset()
        obs, *_, info = env.recv()
        assert info["env_id"].tolist() == list(range(16))  # async_reset: env order
        held = set(info["env_id"].tolist())
        in_flight_or_ready = set(range(16, num_envs))
        for _ in range(200):
            send = rng.permutation(sorted(held))[:rng.integers(1, len(held) + 1)]
            env.send(np.zeros(len(send), np.int64), send)
            held -= set(send.tolist())
            in_flight_or_ready |= set(send.tolist())
            if len(in_flight_or_ready) >= 16:
                ids = env.recv()[4]["env_id"].tolist()
                assert len(set(ids)) == 16 and set(ids) <= in_flight_or_ready
                in_flight_or_ready -= set(ids)
                held |= set(ids)
        # everything sent comes back exactly once
        while len(in_flight_or_ready) >= 16:
            ids = env.recv()[4]["env_id"].tolist()
            assert set(ids) <= in_flight_or_ready
            in_flight_or_ready -= set(ids)


def test_sends_come_back_in_the_order_they_finished():
    with envd.make("CartPole-v1", 8, seed=0, num_threads=0, batch_size=2) as env:
        env.async_reset()
        for _ in range(4):
            env.recv()
        for ids in ([6, 1], [3, 0], [7, 2]):  # serial: each send finishes as it is made
            env.send(np.zeros(2, np.int64), ids)
        assert [env.recv()[4]["env_id"].tolist() for _ in range(3)] == [[6, 1], [3, 0], [7, 2]]


def test_recv_results_live_until_the_second_recv_after():
    with envd.make("Pendulum-v1", 4, seed=0, batch_size=2) as env:
        env.async_reset()
        first = env.recv()
        kept = first[0].copy()
        env.send(np.zeros((2, 1), np.float32), first[4]["env_id"])
        second = env.recv()
        assert first[0].tobytes() == kept.tobytes()  # untouched by the next recv
        assert not np.shares_memory(first[0], second[0])
        env.send(np.zeros((2, 1), np.float32), second[4]["env_id"])
        third = env.recv()
        assert np.shares_memory(first[0], third[0])  # two buffers alternate
    with envd.make("Pendulum-v1", 4, seed=0, batch_size=2, copy=True) as env:
        env.async_reset()
        first, second = env.recv(), env.recv()
        assert not np.shares_memory(first[0], second[0])


def test_episode_statistics_reach_recv():
    def episodes(info) -> list[tuple[float, int]]:
        if "envd_episode" not in info:
            return []
        mask = info["_envd_episode"]
        return list(zip(info["envd_episode"]["r"][mask].tolist(), info["envd_episode"]["l"][mask].tolist()))

    expected = []
    with envd.make("CartPole-v1", 4, seed=0) as env:
        env.reset()
        for _ in range(300):
            expected += episodes(env.step(np.ones(4, np.int64))[4])
    got = []
    with envd.make("CartPole-v1", 4, seed=0, batch_size=4) as env:
        env.async_reset()
        ids = env.recv()[4]["env_id"]
        for _ in range(300):
            env.send(np.ones(4, np.int64), ids)
            obs, rew, term, trunc, info = env.recv()
            ids = info["env_id"]
            if "envd_episode" in info:
                assert ((term | trunc) == info["_envd_episode"]).all()
            got += episodes(info)
    assert len(expected) > 50 and sorted(got) == sorted(expected)


@pytest.mark.parametrize("ids,named", [([2, 3, 4, 5], 4), ([1, 2, 3, 4], 4), ([4, 5], 4)])
def test_a_run_of_ids_over_a_ready_env_is_refused_naming_it(ids, named):
    """A send whose ids are a run (session.c checks their states in one pass)
    is refused when one env of the run, anywhere in it, is not idle, naming
    that env; nothing is marked, and the idle envs can be sent after."""
    with envd.make("CartPole-v1", 8, seed=0, batch_size=4) as env:
        env.async_reset()
        got = env.recv()[4]["env_id"]
        assert got.tolist() == [0, 1, 2, 3]  # envs 4..7 stay ready
        with pytest.raises(envd.EnvStateError, match=f"env {named} is ready"):
            env.send(np.zeros(len(ids), np.int64), np.array(ids))
        env.send(np.zeros(4, np.int64), got)
        assert env.recv()[4]["env_id"].tolist() == [4, 5, 6, 7]
        assert sorted(env.recv()[4]["env_id"].tolist()) == [0, 1, 2, 3]


def test_misuse_is_refused_and_the_env_stays_usable():
    with envd.make("CartPole-v1", 6, seed=0, batch_size=3) as env:
        with pytest.raises(envd.EnvStateError, match="only 0 are in flight or ready"):
            env.recv()  # nothing sent: never blocks
        env.async_reset()
        ids = env.recv()[4]["env_id"]
        with pytest.raises(envd.EnvStateError, match="env 3 is ready"):
            env.send(np.zeros(1, np.int64), [3])
        with pytest.raises(envd.InvalidArgumentError, match="out of range|in \\[0, 6\\)"):
            env.send(np.zeros(1, np.int64), [6])
        with pytest.raises(envd.InvalidArgumentError, match="repeated"):
            env.send(np.zeros(2, np.int64), [0, 0])
        with pytest.raises(envd.InvalidArgumentError, match="1-D array of ints"):
            env.send(np.zeros(1, np.int64), [0.5])
        with pytest.raises(envd.InvalidActionError, match="shape"):
            env.send(np.zeros(2, np.int64), ids)
        with pytest.raises(envd.InvalidActionError, match="out of range"):
            env.send(np.array([0, 7, 1]), ids)
        env.send(np.zeros(3, np.int64), ids)  # nothing above moved anything
        with pytest.raises(envd.EnvStateError, match="is in flight|is ready"):
            env.send(np.zeros(1, np.int64), ids[:1])
        with pytest.raises(envd.EnvStateError, match="in flight|wait for recv"):
            env.step(np.zeros(6, np.int64))
        assert len(env.recv()[4]["env_id"]) == 3
        assert len(env.recv()[4]["env_id"]) == 3
        with pytest.raises(envd.EnvStateError, match="only 0"):
            env.recv()
        env.send(np.zeros(3, np.int64), [0, 1, 2])
        env.async_reset()  # waits for what is in flight, drops it, starts over
        assert env.recv()[4]["env_id"].tolist() == [0, 1, 2]
        env.reset()  # back to sync stepping
        env.step(np.zeros(6, np.int64))


@pytest.mark.parametrize("env_id,kwargs", [("CartPole-v1", {"num_threads": 1}),
                                            ("py:CartPole-v1", {"num_workers": 1})])
def test_async_reset_leaves_every_row_a_fresh_episodes(env_id, kwargs):
    """After an async reset every env's rows are a fresh episode's (reward
    0, no flags), written by the backend's reset itself (the pool's vec, or
    the workers backend and its workers): the env adds nothing in Python."""
    with envd.make(env_id, 4, seed=0, batch_size=2, **kwargs) as env:
        env.reset()
        for _ in range(200):  # (pushing left ends CartPole's episode within ~10 steps)
            env.step(np.zeros(4, np.int64))
            if env._dones.any():
                break
        assert env.rewards.tolist() == [1.0] * 4 and env._dones.any(), env._dones
        env.async_reset()
        assert env.rewards.tolist() == [0.0] * 4
        for flags in (env.terminations, env.truncations, env._dones):
            assert not flags.any(), flags
        assert env.recv()[1].tolist() == [0.0, 0.0]


def test_batch_size_is_checked():
    for bad in (0, 7, 2.0, True):
        with pytest.raises(envd.InvalidArgumentError, match="batch_size"):
            envd.make("CartPole-v1", 6, batch_size=bad)
    with envd.make("CartPole-v1", 6) as env:
        assert env.batch_size == 6


def test_spare_batches_stay_bounded():
    """Finished batches are kept for reuse, but sends of ever larger batches
    do not keep one of every size: at most 2 * num_envs ids in all."""
    n = 64
    with envd.make("CartPole-v1", n, seed=0, batch_size=1, num_threads=1) as env:
        env.async_reset()
        ids = np.array([env.recv()[4]["env_id"][0] for _ in range(n)])
        for k in range(1, n + 1):
            env.send(np.zeros(k, np.int64), ids[:k])
            back = sorted(int(env.recv()[4]["env_id"][0]) for _ in range(k))
            assert back == sorted(ids[:k].tolist())
        spare_ids = lib.envd_session_spare_capacity(env._native.handle)
        assert 0 < spare_ids <= 2 * n


@pytest.mark.parametrize("threads", [0, 2])
def test_send_copies_the_actions_it_is_given(threads):
    """send takes an action array of the exact dtype and shape without
    converting it; the envs still step with the values it held at the send,
    whatever the caller writes into it afterwards (before recv)."""
    num_envs = 8
    actions = np.array([0, 1, 1, 0, 1, 0, 0, 1], np.int64)
    with envd.make("CartPole-v1", num_envs, seed=3) as sync_env:
        sync_env.reset(seed=3)
        expected = sync_env.step(actions)[0].copy()
    with envd.make("CartPole-v1", num_envs, seed=3, num_threads=threads,
                   batch_size=num_envs) as env:
        env.async_reset(seed=3)
        ids = env.recv()[4]["env_id"]
        sent = actions[ids].copy()
        env.send(sent, ids)
        sent[:] = 1 - sent  # the caller reuses its array at once
        obs, _, _, _, info = env.recv()
        np.testing.assert_array_equal(obs, expected[info["env_id"]])


@pytest.mark.parametrize("copy", [False, True])
def test_episode_statistics_of_partial_batches(copy):
    """With batches of part of the envs, some with an episode end and some
    without, each recv's statistics are those of its own envs (recv gathers
    them only for a batch in which an episode ended)."""
    num_envs, steps = 6, 240
    actions = np.ones(num_envs, np.int64)
    expected: dict[int, list] = {i: [] for i in range(num_envs)}
    with envd.make("CartPole-v1", num_envs, seed=4) as env:
        env.reset()
        for _ in range(steps):
            info = env.step(actions)[4]
            for i in np.flatnonzero(info.get("_envd_episode", np.zeros(num_envs, bool))):
                expected[i].append((info["envd_episode"]["r"][i], info["envd_episode"]["l"][i]))
    got: dict[int, list] = {i: [] for i in range(num_envs)}
    batches_with_end = batches_without = 0
    with envd.make("CartPole-v1", num_envs, seed=4, batch_size=2, copy=copy) as env:
        env.async_reset()
        ids = env.recv()[4]["env_id"]
        for _ in range(steps):
            env.send(np.ones(len(ids), np.int64), ids)
            obs, rew, term, trunc, info = env.recv()
            ids = info["env_id"]
            if "envd_episode" not in info:
                batches_without += 1
                assert not (term | trunc).any()
                continue
            batches_with_end += 1
            mask = info["_envd_episode"]
            assert ((term | trunc) == mask).all()
            for k in np.flatnonzero(mask):
                got[int(ids[k])].append((info["envd_episode"]["r"][k],
                                         info["envd_episode"]["l"][k]))
    assert batches_with_end > 5 and batches_without > 5
    # (Which envs come back is first-finished order: under load a pool thread
    # holding a batch can be descheduled while the caller steps the others
    # itself, so an env may return rarely or never; what returns must match.)
    assert sum(len(episodes) for episodes in got.values()) > 5
    for i in range(num_envs):
        assert got[i] == expected[i][:len(got[i])], i
