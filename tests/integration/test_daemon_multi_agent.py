"""Multi-agent envs (agents as rows) served by the daemon: simple_spread_v3 and
simple_spread_continuous_v3 through every transport (shm over the socket,
inline, the fast path) step bit-equal to mpe2's parallel API (the reference
of tests/native/test_simple_spread_vec.py); async per-env trajectories equal
the sync ones; bad input (wrong row counts, ids not grouped per env, an
out-of-range action of one agent) gets a clear error and leaves the daemon
and other sessions intact."""
from __future__ import annotations

import numpy as np
import pytest

import envd
from envd.errors import InvalidActionError, InvalidArgumentError

pytest.importorskip("mpe2.simple_spread_v3", reason="mpe2 is the reference")

from support.spread_reference import IDS, N_AGENTS, Reference, random_rows, run_equivalence

#: (transport, fast_path) of each path a RemoteVecEnv may step through
PATHS = [("shm", False), ("inline", False), ("shm", True)]


@pytest.fixture(scope="module")
def spread_daemon(tmp_path_factory):
    """One daemon for the module (2 threads, fast path on)."""
    from support.daemon import DaemonProcess, segments_of
    with DaemonProcess(tmp_path_factory.mktemp("ma") / "daemon", "--threads", "2",
                       "--lease-timeout", "10") as proc:
        yield proc
    assert proc.proc.returncode == 0, proc.log()
    assert segments_of(proc.pid) == []


@pytest.mark.parametrize("transport,fast_path", PATHS)
@pytest.mark.parametrize("num_envs,seed", [(1, 3), (7, 18), (64, 75)])
@pytest.mark.parametrize("env_id", sorted(IDS))
def test_daemon_matches_mpe2(spread_daemon, env_id, num_envs, seed, transport, fast_path):
    continuous, max_cycles = IDS[env_id], 25
    ref = Reference(num_envs, continuous, 0.5, max_cycles)
    with spread_daemon.connect() as client:
        with client.make(env_id, num_envs, seed=seed, transport=transport,
                         fast_path=fast_path) as env:
            assert env.num_envs == num_envs * N_AGENTS
            assert env.num_agents == N_AGENTS and env.num_env_instances == num_envs
            assert env.transport == transport and env.fast_path == fast_path
            ended = run_equivalence(env, ref, seed, continuous, steps=2 * max_cycles + 5)
    ref.close()
    assert ended == 2 * num_envs  # two episodes of every env, across an autoreset


@pytest.mark.parametrize("transport,fast_path", [("shm", True), ("inline", False)])
@pytest.mark.parametrize("max_threads", [0, 1, 2])
@pytest.mark.parametrize("env_id", sorted(IDS))
def test_daemon_matches_mpe2_at_every_thread_count(spread_daemon, env_id, max_threads,
                                                   transport, fast_path):
    """The daemon's pool (2 threads) stepping the envs serially
    (max_threads=0: inline on the thread serving the call), on one thread
    or on both: bit-equal to mpe2 whatever the thread count, as in-process
    (tests/native/test_simple_spread_vec.py)."""
    continuous, num_envs, seed, max_cycles = IDS[env_id], 64, 40 + max_threads, 25
    ref = Reference(num_envs, continuous, 0.5, max_cycles)
    with spread_daemon.connect() as client:
        with client.make(env_id, num_envs, seed=seed, max_threads=max_threads,
                         transport=transport, fast_path=fast_path) as env:
            assert env.fast_path == fast_path
            ended = run_equivalence(env, ref, seed, continuous, steps=2 * max_cycles + 5)
    ref.close()
    assert ended == 2 * num_envs


def _sync_trajectory(env_id: str, num_envs: int, seed: int, actions: np.ndarray) -> list:
    """Per env, the observation rows after reset and after each step of an
    in-process vec (actions[t, i]: env i's rows at step t), with the rewards."""
    out: list[list] = [[] for _ in range(num_envs)]
    with envd.make(env_id, num_envs, seed=seed, num_threads=0) as env:
        obs, _ = env.reset(seed=seed)
        rew = np.zeros(env.num_envs, np.float32)
        for t in range(len(actions) + 1):
            for i in range(num_envs):
                rows = slice(i * N_AGENTS, (i + 1) * N_AGENTS)
                out[i].append((obs[rows].copy(), rew[rows].copy()))
            if t < len(actions):
                obs, rew, *_ = env.step(np.concatenate(list(actions[t])))
    return out


@pytest.mark.parametrize("transport,fast_path", PATHS)
@pytest.mark.parametrize("env_id", sorted(IDS))
def test_async_per_env_trajectories_equal_sync(spread_daemon, env_id, transport, fast_path):
    """send/recv in whole envs (batch_size envs, num_agents rows each; send's
    env ids per row, as recv's info['env_id']): each env's trajectory is the
    in-process sync vec's, whatever order the envs come back in."""
    num_envs, batch, seed, recvs = 6, 2, 40, 45
    continuous = IDS[env_id]
    rng = np.random.default_rng(7)
    # at most `recvs` results of one env: actions for that many steps of each
    actions = np.stack([np.stack([random_rows(rng, N_AGENTS, continuous)
                                  for _ in range(num_envs)]) for _ in range(recvs)])
    expected = _sync_trajectory(env_id, num_envs, seed, actions)
    got: list[list] = [[] for _ in range(num_envs)]
    with spread_daemon.connect() as client:
        with client.make(env_id, num_envs, seed=seed, batch_size=batch, transport=transport,
                         fast_path=fast_path) as env:
            env.async_reset(seed=seed)
            for _ in range(recvs):
                obs, rew, _, _, info = env.recv()
                ids = info["env_id"]
                assert len(ids) == batch * N_AGENTS and obs.shape[0] == batch * N_AGENTS
                # each env's agents come back together, in agent order
                assert (ids.reshape(batch, N_AGENTS) == ids[::N_AGENTS, None]).all()
                for k, i in enumerate(ids[::N_AGENTS]):
                    rows = slice(k * N_AGENTS, (k + 1) * N_AGENTS)
                    got[i].append((obs[rows].copy(), rew[rows].copy()))
                step_rows = np.concatenate([actions[len(got[i]) - 1, i]
                                            for i in ids[::N_AGENTS]])
                env.send(step_rows, ids)
            env.recv()  # (the last batch sent; its results are not compared)
    assert sum(len(g) for g in got) == recvs * batch
    for i in range(num_envs):
        for t, ((obs, rew), (r_obs, r_rew)) in enumerate(zip(got[i], expected[i])):
            assert obs.tobytes() == r_obs.tobytes(), f"env {i}: observations differ at {t}"
            assert rew.tobytes() == r_rew.tobytes(), f"env {i}: rewards differ at {t}"


@pytest.mark.parametrize("transport,fast_path", PATHS)
def test_bad_input_leaves_daemon_and_sessions_intact(spread_daemon, transport, fast_path):
    with spread_daemon.connect() as client, spread_daemon.connect() as other:
        bystander = other.make("simple_spread_v3", 2, seed=1)
        bystander.reset(seed=1)
        with client.make("simple_spread_v3", 3, seed=2, batch_size=1, transport=transport,
                         fast_path=fast_path) as env:
            env.reset(seed=2)
            good = np.zeros(9, np.int64)
            with pytest.raises((InvalidArgumentError, InvalidActionError, ValueError)):
                env.step(np.zeros(8, np.int64))  # one row short
            bad = good.copy()
            bad[4] = 5  # agent 1 of env 1: out of Discrete(5)
            with pytest.raises(InvalidActionError, match="env 4"):
                env.step(bad)
            env.step(good)
            env.async_reset(seed=2)
            assert list(env.recv()[4]["env_id"]) == [0, 0, 0]  # env 0 is idle now
            with pytest.raises(InvalidArgumentError, match="3 times in a row"):
                env.send(np.zeros(3, np.int64), np.array([0, 1, 0]))  # not grouped
            with pytest.raises(InvalidArgumentError, match="3 times in a row"):
                env.send(np.zeros(2, np.int64), np.array([0, 0]))  # a short group
            with pytest.raises((InvalidArgumentError, InvalidActionError, ValueError)):
                env.send(np.zeros(2, np.int64), np.array([0, 0, 0]))  # rows short
            with pytest.raises(InvalidActionError, match="env 2"):
                env.send(np.array([0, 0, 7]), np.array([0, 0, 0]))
            with pytest.raises(InvalidArgumentError, match="env_ids must be in|env ids"):
                env.send(np.zeros(3, np.int64), np.array([3, 3, 3]))  # no env 3
            env.send(np.zeros(3, np.int64), np.array([0, 0, 0]))  # still works
            for expected in (1, 2, 0):  # the oldest ready first
                obs, *_, info = env.recv()
                assert list(info["env_id"]) == [expected] * 3 and obs.shape == (3, 18)
        obs, rew, *_ = bystander.step(np.zeros(6, np.int64))
        assert obs.shape == (6, 18) and np.isfinite(rew).all()
        bystander.close()
    with spread_daemon.connect() as client:  # the daemon still serves
        assert client.status()["sessions"] == 0


@pytest.mark.parametrize("env_id", sorted(IDS))
def test_multi_client_splits_by_env_and_matches_mpe2(spread_daemon, tmp_path, env_id):
    """A MultiVecEnv over two daemons: shards split by env (never inside one),
    each env's rows equal mpe2's (async mode over shards:
    tests/integration/test_multi_daemon_multi_agent.py)."""
    from support.daemon import DaemonProcess
    continuous, num_envs, seed, max_cycles = IDS[env_id], 7, 29, 25
    ref = Reference(num_envs, continuous, 0.5, max_cycles)
    with DaemonProcess(tmp_path / "second", "--threads", "1") as second:
        with envd.connect([spread_daemon.endpoint, second.endpoint]) as multi:
            with multi.make(env_id, num_envs, seed=seed) as env:
                assert env.num_envs == num_envs * N_AGENTS and env.num_agents == N_AGENTS
                assert len(env.shards) == 2
                assert sum(s.num_env_instances for s in env.shards) == num_envs
                ended = run_equivalence(env, ref, seed, continuous, steps=2 * max_cycles + 5)
                if not continuous:  # one agent's action out of range: refused, named by row
                    bad = np.zeros(env.num_envs, np.int64)
                    bad[13] = 5
                    with pytest.raises(InvalidActionError, match="env 13"):
                        env.step(bad)
                    env.step(np.zeros(env.num_envs, np.int64))
            assert all(status["sessions"] == 0 for status in multi.status())
    ref.close()
    assert ended == 2 * num_envs


def test_rows_above_the_cap_are_refused_and_the_daemon_serves_on(spread_daemon):
    """num_envs * num_agents rows above a vec's cap (ENVD_VEC_MAX_ENVS, a
    row count: native/src/vec.c check_args caps rows too) get a clear error
    naming the largest num_envs, through the daemon as in-process; the daemon
    and its other sessions carry on."""
    limit = envd.native.MAX_NUM_ENVS // N_AGENTS
    with spread_daemon.connect() as client, \
            client.make("simple_spread_v3", 2, seed=0) as bystander:
        bystander.reset()
        for make in (client.make, envd.make):
            with pytest.raises(InvalidArgumentError,
                               match=rf"rows, more than the .*make at most {limit} envs"):
                make("simple_spread_v3", limit + 1)
        bystander.step(np.zeros(6, np.int64))
        assert client.status()["sessions"] == 1


@pytest.fixture(scope="module")
def seek_daemon(tmp_path_factory):
    """A daemon serving the Seek-v0 test plugin (tests/native/multi_agent.c:
    3 agents, MultiDiscrete actions, agents that die before their env ends)."""
    from support.daemon import DaemonProcess, segments_of
    from support.multi_agent_checks import SOURCE
    from support.plugin_checks import build_plugin
    folder = tmp_path_factory.mktemp("seek")
    from support.multi_agent_checks import FAILING
    library = build_plugin(SOURCE, folder / "libseek.so")
    failing = build_plugin(SOURCE, folder / "libseekfail.so", FAILING)
    with DaemonProcess(folder / "daemon", "--threads", "2", "--lease-timeout", "10",
                       "--plugin", str(library), "--plugin", str(failing)) as proc:
        yield proc
    assert proc.proc.returncode == 0, proc.log()
    assert segments_of(proc.pid) == []


@pytest.mark.parametrize("transport,fast_path", PATHS)
def test_plugin_through_the_daemon_matches_reference(seek_daemon, transport, fast_path):
    """Dead rows, agent_mask, per-row episode statistics and per-env kwargs
    of a multi-agent plugin through every path, against its Python reference
    (support/multi_agent_checks.py); async recv/send in whole envs too."""
    from support.multi_agent_checks import AGENTS, Seek, actions_for, compare
    speeds = [1, 2, 3, 1, 2, 3, 1]
    with seek_daemon.connect() as client:
        with client.make("Seek-v0", 7, seed=3, speed=speeds, transport=transport,
                         fast_path=fast_path) as env:
            seen = compare(env, 3, speeds, steps=60)
        assert seen["dead_rows"] > 0 and seen["ended_rows"] > 0 and seen["env_resets"] > 0
        with client.make("Seek-v0", 6, seed=9, batch_size=2, transport=transport,
                         fast_path=fast_path) as env:
            refs = [Seek(9 + i, 1) for i in range(6)]
            expected = {i: {"obs": r.reset(), "mask": [True] * AGENTS}
                        for i, r in enumerate(refs)}
            env.async_reset()
            rng = np.random.default_rng(3)
            for _ in range(80):
                obs, rewards, _, _, info = env.recv()
                envs = info["env_id"].tolist()[::AGENTS]
                assert info["env_id"].tolist() == [i for i in envs for _ in range(AGENTS)]
                assert obs.tolist() == [row for i in envs for row in expected[i]["obs"]]
                assert info["agent_mask"].tolist() == [m for i in envs
                                                       for m in expected[i]["mask"]]
                if "reward" in expected[envs[0]]:
                    assert rewards.tolist() == [float(np.float32(x)) for i in envs
                                                for x in expected[i]["reward"]]
                actions = actions_for(len(envs) * AGENTS, rng)
                for k, i in enumerate(envs):
                    expected[i] = refs[i].step(actions[k * AGENTS:(k + 1) * AGENTS])
                env.send(actions, info["env_id"])
            env.recv()
            bad = actions_for(2 * AGENTS, rng)
            bad[4, 0] = 3  # agent 1 of the second env sent: out of MultiDiscrete([3 2])
            ids = np.repeat(env.recv()[4]["env_id"][::AGENTS], AGENTS)
            with pytest.raises(InvalidActionError):
                env.send(bad, ids)
            env.send(actions_for(2 * AGENTS, rng), ids)  # the env is still usable
            env.recv()


def test_status_shows_agents_and_sb3_adapter_steps_the_rows(spread_daemon):
    """status (and `envd status`'s table) counts a multi-agent session's envs
    and rows; the SB3 adapter sees every agent row as an env (parameter
    sharing) and matches the same env stepped in-process."""
    from envd.tools.cli import status_table
    with spread_daemon.connect() as client:
        with client.make("simple_spread_v3", 4, seed=5) as env:
            status = client.status()
            [row] = status["session_table"]
            assert row["num_envs"] == 4 and row["num_agents"] == N_AGENTS
            assert status["envs"] == 4 and status["rows"] == 4 * N_AGENTS
            assert "4x3" in status_table(status)
            assert env.single_action_space.n == 5
        listed = {e["id"]: e for e in client.describe_envs()}
        assert listed["simple_spread_v3"]["num_agents"] == N_AGENTS
        assert listed["CartPole-v1"]["num_agents"] == 1
        sb3 = pytest.importorskip("envd.integrations.sb3")
        venv = sb3.EnvdVecEnv.make("simple_spread_v3", 2, client=client, seed=8)
        local = sb3.EnvdVecEnv.make("simple_spread_v3", 2, seed=8, num_threads=0)
        try:
            assert venv.num_envs == 2 * N_AGENTS
            np.testing.assert_array_equal(venv.reset(), local.reset())
            rng = np.random.default_rng(0)
            for _ in range(30):  # across the 25-step episodes' ends
                actions = rng.integers(0, 5, venv.num_envs)
                got, want = venv.step(actions), local.step(actions)
                for a, b in zip(got[:3], want[:3]):
                    np.testing.assert_array_equal(a, b)
        finally:
            venv.close()
            local.close()


def test_daemon_refuses_crafted_inline_rows(spread_daemon):
    """A client bypassing the official one: an inline send whose actions
    frame holds one row per env instead of num_agents, or an inline step
    described with the wrong row count, is refused with a clear error; the
    session and the daemon stay usable."""
    with spread_daemon.connect() as client:
        with client.make("simple_spread_v3", 2, seed=1, batch_size=1,
                         transport="inline") as env:
            channel, session = env._stepper.channel, env.session
            env.async_reset()
            [env_id] = env.recv()[4]["env_id"][::N_AGENTS]
            ids = np.array([env_id], np.int64)
            with pytest.raises(InvalidActionError, match="3 row\\(s\\) per env"):
                channel.request({"type": "send", "session": session, "inline": True},
                                [ids.tobytes(), np.zeros(1, np.int64).tobytes()])
            env.send(np.zeros(N_AGENTS, np.int64), np.repeat(ids, N_AGENTS))  # still fine
            env.recv()
            env.recv()
            env.reset(seed=1)
            with pytest.raises(InvalidActionError, match="inline actions must be described"):
                channel.request({"type": "step", "session": session, "inline": True,
                                 "actions": {"dtype": "<i8", "shape": [2]}},
                                [np.zeros(2, np.int64).tobytes()])
            obs, rew, *_ = env.step(np.zeros(2 * N_AGENTS, np.int64))
            assert obs.shape == (6, 18)


@pytest.mark.parametrize("transport,fast_path", PATHS)
def test_env_failure_names_the_env_first_row(seek_daemon, transport, fast_path):
    """Review finding: a recv's failure named the env (1) while a step's
    names its first row (3), over the socket and through the doorbell; both
    name the row now, as in-process."""
    from support.multi_agent_checks import check_failure_names_rows, check_step_failure_names_rows
    with seek_daemon.connect() as client:
        with client.make("SeekFail-v0", 3, seed=0, speed=[1, 3, 1], transport=transport,
                         fast_path=fast_path) as env:
            check_step_failure_names_rows(env, 1)
        with client.make("SeekFail-v0", 3, seed=0, speed=[1, 3, 1], batch_size=1,
                         transport=transport, fast_path=fast_path) as env:
            check_failure_names_rows(env, 1)
        # the daemon serves on
        with client.make("Seek-v0", 2, seed=0) as env:
            env.reset()
            env.step(np.ones((6, 2), np.int64))
