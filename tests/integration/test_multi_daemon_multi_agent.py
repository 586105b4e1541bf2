"""Multi-agent envs (agents as rows) over several daemons:
``envd.connect([ep1, ep2]).make("simple_spread_v3", N, batch_size=B)``.

Async mode works in whole envs as on one daemon (client/multi_async.py,
client/transports/): per-env trajectories equal sync stepping of the
same seeds, each env received exactly once with its num_agents rows together
(info["env_id"] each env's id per row), recv returns the envs of the daemon
that finished first, misuse refused with the one-daemon messages; over the
sockets (shm, inline) and through the doorbells.  Sync mode in ``disabled``
autoreset steps an env one of whose agents ended while the others go on
(review finding M2), and refuses an env every agent of which is done, as one
daemon does.  Seek-v0 (tests/native/multi_agent.c, loaded as a plugin) has
agents that end before their env; simple_spread_v3 is built in."""
from __future__ import annotations

import functools
import signal

import numpy as np
import pytest
from support.async_steps import async_trajectories, per_env_actions, sync_trajectories
from support.daemon import daemon_group
from support.multi_agent_checks import (
    AGENTS,
    FAILING,
    SOURCE,
    actions_for,
    check_failure_names_rows,
    check_step_failure_names_rows,
)

import envd
from envd.client.multi_async import ShardsStepper
from envd.client.transports.waiting import DoorbellWaiter, SocketWaiter

#: (transport, fast_path) of the shards: over the sockets with the arrays in
#: shared memory or in the messages, and through the doorbells
PATHS = [("shm", False), ("inline", False), ("shm", True)]


@pytest.fixture(scope="module")
def daemons(tmp_path_factory):
    """Two daemons of one thread each (so envs split evenly), both serving
    the Seek-v0 plugin; at the end every session must be closed and each
    must drain to exit 0, leaving no segment."""
    from support.plugin_checks import build_plugin
    folder = tmp_path_factory.mktemp("multi-agent-shards")
    library = build_plugin(SOURCE, folder / "libseek.so")
    failing = build_plugin(SOURCE, folder / "libseekfail.so", FAILING)
    flags = ("--threads", "1", "--lease-timeout", "30", "--plugin", str(library),
             "--plugin", str(failing))
    with daemon_group(folder, flags, flags) as procs:
        yield procs


@pytest.fixture(scope="module", params=PATHS, ids=["shm", "inline", "doorbell"])
def multi(daemons, request):
    """A MultiClient of both daemons whose shards take one path."""
    transport, fast_path = request.param
    with envd.connect([d.endpoint for d in daemons], timeout=30) as client:
        client.make = functools.partial(client.make, transport=transport, fast_path=fast_path)
        client.path = request.param
        yield client


def check_stepper(env, multi) -> None:
    """The async MultiVecEnv steps through the path the fixture asks for."""
    doorbell = multi.path[1]
    assert all(shard.fast_path == doorbell for shard in env.shards)
    assert type(env._stepper) is ShardsStepper
    assert type(env._stepper._waiter) is (DoorbellWaiter if doorbell else SocketWaiter)


def one_daemon_make(daemon, path):
    """make(env_id, num_envs, **kwargs) on one daemon (the reference of what
    the shards must give), over path (transport, fast_path)."""
    transport, fast_path = path

    def make(env_id, num_envs, **kwargs):
        client = daemon.connect()
        env = client.make(env_id, num_envs, transport=transport, fast_path=fast_path,
                          **kwargs)
        env.close_along(client)
        return env
    return make


@pytest.mark.parametrize("env_id", ["simple_spread_v3", "simple_spread_continuous_v3"])
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_per_env_trajectories_equal_sync_mode(multi, env_id, mode):
    """Built-in multi-agent envs: every env's rows, step by step (resets
    within: max_cycles=6), equal in-process sync stepping, whatever the
    batch size and the (random) send order and chunking."""
    num_envs, steps = 7, 20
    space = envd.native.get_spec(env_id).action_space
    actions = per_env_actions(space, num_envs, steps, seed=7, num_agents=3)
    reference = sync_trajectories(env_id, num_envs, steps, actions, autoreset_mode=mode,
                                  max_cycles=6)
    rng = np.random.default_rng(3)
    for batch_size in (1, 3, 5):
        def make(**kw):
            env = multi.make(env_id, num_envs, seed=11, **kw)
            assert env.num_agents == 3 and env.num_envs == 3 * num_envs
            assert env.batch_size == batch_size
            check_stepper(env, multi)
            return env
        runs, received = async_trajectories(make, num_envs, steps, actions, batch_size, rng,
                                            autoreset_mode=mode, max_cycles=6)
        for i in range(num_envs):
            assert len(runs[i]) > 1, (batch_size, i)
            assert runs[i] == reference[i][:len(runs[i])], (env_id, mode, batch_size, i)
        assert received.sum() > num_envs * steps // 2


def test_dead_rows_trajectories_equal_one_daemon(multi, daemons):
    """Seek-v0 (agents end before their env: dead rows, agent_mask, per-row
    episode statistics, per-env kwargs): async over both daemons equals sync
    stepping of the same envs on one daemon."""
    num_envs, steps, speeds = 6, 30, [1, 2, 3, 1, 2, 3]
    rng = np.random.default_rng(5)
    actions = np.stack([actions_for(num_envs * AGENTS, rng) for _ in range(steps)])
    reference = sync_trajectories(
        "Seek-v0", num_envs, steps, actions,
        make=lambda **kw: one_daemon_make(daemons[0], multi.path)("Seek-v0", num_envs, seed=11,
                                                             speed=speeds, **kw))
    for batch_size in (1, 4):
        runs, _ = async_trajectories(
            lambda **kw: multi.make("Seek-v0", num_envs, seed=11, speed=speeds, **kw),
            num_envs, steps, actions, batch_size, rng)
        for i in range(num_envs):
            assert runs[i] == reference[i][:len(runs[i])], (batch_size, i)


def test_per_env_kwargs_follow_their_envs(multi, daemons):
    """A per-env kwarg list over the shards: each daemon gets its envs'
    values, so sync steps equal the same envs made on one daemon; a list of
    the wrong length is refused with envd.make's words before any daemon
    makes anything."""
    speeds = [3, 1, 2, 1, 3]
    with multi.make("Seek-v0", 5, seed=4, speed=speeds) as env, \
            one_daemon_make(daemons[1], multi.path)("Seek-v0", 5, seed=4, speed=speeds) as one:
        assert [s.num_env_instances for s in env.shards] == [3, 2]
        np.testing.assert_array_equal(env.reset()[0], one.reset()[0])
        rng = np.random.default_rng(2)
        for _ in range(20):
            actions = actions_for(5 * AGENTS, rng)
            for want, got in zip(one.step(actions)[:4], env.step(actions)[:4]):
                np.testing.assert_array_equal(want, got)
    sessions = [status["sessions"] for status in multi.status()]
    with pytest.raises(envd.InvalidArgumentError,
                       match="'speed' has 4 values but num_envs=5; give one value per env"):
        multi.make("Seek-v0", 5, seed=4, speed=[1, 2, 3, 1])
    assert [status["sessions"] for status in multi.status()] == sessions


def test_exactly_once_with_many_sends_across_daemons(multi):
    rng = np.random.default_rng(1)
    with multi.make("simple_spread_v3", 64, seed=0, batch_size=16) as env:
        check_stepper(env, multi)
        assert [rows.stop - rows.start for rows in env.shard_slices] == [32, 32]
        env.async_reset()
        obs, _, _, _, info = env.recv()
        first = info["env_id"]
        assert obs.shape == (16 * 3, 18) and info["agent_mask"].shape == (48,)
        assert first.dtype == np.int32 and first.tolist() == [i for i in range(16)
                                                              for _ in range(3)]  # env order
        outstanding = set(range(16, 64))
        held = set(range(16))
        counts = np.zeros(64, int)
        counts[:16] += 1
        for _ in range(30):
            # every send spans both daemons: random parts of the held envs
            for part in np.array_split(rng.permutation(sorted(held)), 3):
                env.send(np.zeros(3 * len(part), np.int64), np.repeat(part, 3))
                outstanding |= set(part.tolist())
            held.clear()
            row_ids = env.recv()[4]["env_id"]
            ids = row_ids[::3].tolist()
            assert row_ids.tolist() == [i for i in ids for _ in range(3)]  # rows together
            assert len(ids) == 16 and len(set(ids)) == 16 and set(ids) <= outstanding
            outstanding -= set(ids)
            held |= set(ids)
            counts[ids] += 1
        assert counts.sum() == 31 * 16 and (counts > 0).sum() > 32  # both daemons served


def test_recv_returns_the_daemon_that_finished_first(multi, daemons):
    """Over the sockets: while daemon 0 is stopped its envs cannot finish:
    recv returns daemon 1's envs (all their rows) without waiting for daemon
    0, then daemon 0's once it runs."""
    if multi.path[1]:
        pytest.skip("through the doorbells a send waits for its daemon's answer")
    with multi.make("simple_spread_v3", 8, seed=0, batch_size=4) as env:
        assert env.shard_slices == (slice(0, 4), slice(4, 8))
        env.async_reset()
        env.recv(), env.recv()
        daemons[0].signal(signal.SIGSTOP)
        try:
            env.send(np.zeros(12, np.int64), np.repeat([2, 0, 3, 1], 3))  # posted
            env.send(np.zeros(6, np.int64), np.repeat([6, 7], 3))
            env.send(np.zeros(6, np.int64), np.repeat([4, 5], 3))
            ids = env.recv()[4]["env_id"]
            assert sorted(ids[::3].tolist()) == [4, 5, 6, 7], ids
        finally:
            daemons[0].signal(signal.SIGCONT)
        assert sorted(env.recv()[4]["env_id"][::3].tolist()) == [0, 1, 2, 3]
        with pytest.raises(envd.EnvStateError, match="only 0 are in flight or ready"):
            env.recv()


def test_misuse_is_refused_with_the_one_daemon_messages(multi):
    """Each misuse raises what envd.make's env raises (same type, same
    words), and the env goes on afterwards, each env received once."""
    with multi.make("simple_spread_v3", 6, seed=0, batch_size=3) as env, \
            envd.make("simple_spread_v3", 6, seed=0, batch_size=3) as local:
        assert len(env.shards) == 2

        def refused(call, error, pattern):
            for e in (env, local):
                with pytest.raises(error, match=pattern):
                    call(e)

        def rows(*envs):
            return np.repeat(envs, AGENTS)

        zeros = np.zeros(6 * AGENTS, np.int64)
        refused(lambda e: e.recv(), envd.EnvStateError, "only 0 are in flight or ready")
        for e in (env, local):
            e.async_reset()
        refused(lambda e: e.send(zeros[:3], rows(4)), envd.EnvStateError, "env 4 is ready")
        for e in (env, local):
            assert e.recv()[4]["env_id"].tolist() == rows(0, 1, 2).tolist()
        refused(lambda e: e.step(zeros), envd.EnvStateError, "wait for recv")
        refused(lambda e: e.send(zeros[:3], [0, 1, 2]), envd.InvalidArgumentError,
                "per row")  # ids not grouped per env
        refused(lambda e: e.send(zeros[:3], rows(6)), envd.InvalidArgumentError,
                r"env ids must be in \[0, 6\), got 6")
        refused(lambda e: e.send(zeros[:6], rows(1, 1)), envd.InvalidArgumentError, "repeated")
        bad = zeros[:6].copy()
        bad[4] = 5  # agent 1 of env 2 (row 7): out of Discrete(5)
        refused(lambda e: e.send(bad, rows(1, 2)), envd.InvalidActionError, "action 5 of env 7")
        for e in (env, local):
            e.send(zeros[:6], rows(2, 0))
        refused(lambda e: e.send(zeros[:3], rows(0)), envd.EnvStateError,
                "env 0 is (in flight|ready)")
        for e in (env, local):
            e.recv()  # 3 ready (3, 4, 5) + 2 in flight: fine, then 2 are out
        refused(lambda e: e.recv(), envd.EnvStateError, "recv returns 3 envs but only 2")
        for e in (env, local):
            e.send(zeros[:12], rows(1, 3, 4, 5))
            got = np.concatenate([e.recv()[4]["env_id"], e.recv()[4]["env_id"]])
            assert sorted(got[::AGENTS].tolist()) == [0, 1, 2, 3, 4, 5]  # each once
            e.reset(seed=0)  # nothing out: back to sync steps
            e.step(zeros)


def test_async_reset_seeds_each_env_on_every_daemon(multi):
    """async_reset(seed=s) over the shards: env i's rows are those of
    envd.make's env i reset with s + i (one seed per env, not per row),
    and envs in flight are dropped."""
    with multi.make("simple_spread_v3", 5, seed=0, batch_size=2) as env:
        env.async_reset()
        env.send(np.zeros(6, np.int64), env.recv()[4]["env_id"])
        env.async_reset(seed=3)  # 2 in flight on daemon 0
        got = [env.recv() for _ in range(2)]
        assert [r[4]["env_id"][::3].tolist() for r in got] == [[0, 1], [2, 3]]
        with envd.make("simple_spread_v3", 5, seed=0) as local:
            obs, _ = local.reset(seed=3)
        np.testing.assert_array_equal(np.concatenate([got[0][0], got[1][0]]), obs[:12])


@pytest.mark.parametrize("transport,fast_path", PATHS)
def test_disabled_mode_steps_an_env_whose_agents_are_not_all_done(daemons, transport,
                                                                  fast_path):
    """Review finding M2: in ``disabled`` autoreset a MultiVecEnv refused a
    step once any agent had ended (it looked at per-row dones), while one
    daemon steps on until every agent of the env is done.  Now both step the
    same, and both refuse an env all of whose agents are done, naming it."""
    one = one_daemon_make(daemons[0], (transport, fast_path))
    with envd.connect([d.endpoint for d in daemons], timeout=30) as multi, \
            multi.make("Seek-v0", 4, seed=2, speed=1, autoreset_mode="disabled",
                       transport=transport, fast_path=fast_path) as env, \
            one("Seek-v0", 4, seed=2, speed=1, autoreset_mode="disabled") as single:
        assert len(env.shards) == 2
        obs = env.reset()[0]
        np.testing.assert_array_equal(obs, single.reset()[0])
        partly_done_steps = 0
        for _ in range(40):
            # every agent heads for the target (obs row: its cell, the target),
            # so agents at different distances end at different steps
            actions = np.zeros((4 * AGENTS, 2), np.int64)
            actions[:, 0] = 1 + np.sign(obs[:, 1] - obs[:, 0]).astype(np.int64)
            flags = (single._terminations | single._truncations).reshape(4, AGENTS)
            if flags.all(axis=1).any():
                break
            partly_done_steps += int((flags.any(axis=1) & ~flags.all(axis=1)).any())
            want = [np.copy(x) for x in single.step(actions)[:4]]
            got = env.step(actions)[:4]
            for w, g in zip(want, got):
                np.testing.assert_array_equal(w, g)
            obs = got[0]
        assert partly_done_steps > 0  # some env stepped with one agent done, others live
        messages = []
        for e in (single, env):
            with pytest.raises(envd.EnvStateError, match="disabled") as refused:
                e.step(actions)
            messages.append(str(refused.value))
        assert messages[0] == messages[1]
        for e in (single, env):
            e.reset(options={"reset_mask": flags.all(axis=1).repeat(AGENTS)})
        np.testing.assert_array_equal(single.step(actions)[0].copy(), env.step(actions)[0])


def test_env_failure_names_its_global_first_row(multi):
    """Review finding: a shard's failure named the row in that daemon's
    numbering.  SeekFail-v0's env 3 of 4 fails (the second daemon's env 1,
    its rows 3..5): step and recv name this env's row 9, as one daemon does."""
    speeds = [1, 1, 1, 3]
    with multi.make("SeekFail-v0", 4, seed=0, speed=speeds) as env:
        check_step_failure_names_rows(env, 3)
    with multi.make("SeekFail-v0", 4, seed=0, speed=speeds, batch_size=1) as env:
        check_stepper(env, multi)
        check_failure_names_rows(env, 3)
