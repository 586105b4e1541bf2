"""Async mode over several daemons (envd.connect([ep1, ep2]).make(..., batch_size=B),
client/multi_async.py): per-env trajectories equal to sync stepping of the same
seeds, each env received exactly once, recv returns the envs of the daemon that
finished first, misuse refused with the one-daemon messages, a daemon killed
while a recv waits on it named in the error, and nothing left behind."""
from __future__ import annotations

import dataclasses
import functools
import gc
import os
import signal
import threading

import numpy as np
import pytest
from support.async_steps import _env_result as env_result
from support.async_steps import (
    async_trajectories,
    check_async_reset_zeroes_rewards,
    envpool_loop_trajectories,
    per_env_actions,
    sync_trajectories,
)
from support.builtin_envs import BUILTIN_ENV_IDS
from support.daemon import (
    DEADLINE,
    DaemonProcess,
    daemon_group,
    seconds_to_time_out,
    segments_of,
    wait_until,
)

import envd


@pytest.fixture(scope="module")
def daemons(tmp_path_factory):
    """Two daemons of one thread each (so N envs split evenly); at the end
    every session must be closed and each must drain to exit 0, leaving no segment."""
    folder = tmp_path_factory.mktemp("multi-async")
    with daemon_group(folder, *[("--threads", "1", "--lease-timeout", "30",
                                 "--python-env", "CartPole-v1")] * 2) as procs:
        yield procs


@pytest.fixture(scope="module", params=["shm", "inline"])
def multi(daemons, request):
    """A MultiClient of both daemons whose shards take one transport."""
    with envd.connect([d.endpoint for d in daemons], timeout=30) as client:
        client.make = functools.partial(client.make, transport=request.param)
        yield client


def shard_of(env, i):
    return next(k for k, rows in enumerate(env.shard_slices) if rows.start <= i < rows.stop)


@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS)
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_per_env_trajectories_equal_sync_mode(multi, env_id, mode):
    num_envs, steps = 10, 40
    space = envd.native.get_spec(env_id).action_space
    actions = per_env_actions(space, num_envs, steps, seed=7)
    reference = sync_trajectories(env_id, num_envs, steps, actions, autoreset_mode=mode)
    rng = np.random.default_rng(3)
    for batch_size in (1, 4, 7):
        runs, received = async_trajectories(
            lambda **kw: multi.make(env_id, num_envs, seed=11, **kw),
            num_envs, steps, actions, batch_size, rng, autoreset_mode=mode)
        for i in range(num_envs):
            assert runs[i] == reference[i][:len(runs[i])], (env_id, mode, batch_size, i)
        assert received.sum() > num_envs * steps // 2


@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS)
def test_envpool_loop_trajectories_equal_sync_mode(multi, env_id):
    """EnvPool's loop across daemons, each recv's info["env_id"] sent straight
    back: batches of one daemon's envs (gathered from its buffers, as slices
    when a run) and batches across both (batch 4 of 5 + 5 envs)."""
    num_envs, steps = 10, 30
    actions = per_env_actions(envd.native.get_spec(env_id).action_space, num_envs, steps, seed=7)
    reference = sync_trajectories(env_id, num_envs, steps, actions)
    for batch_size, batches in [(5, "run"), (4, "other")]:
        runs, received, kinds = envpool_loop_trajectories(
            lambda **kw: multi.make(env_id, num_envs, seed=11, **kw),
            num_envs, steps, actions, batch_size)
        for i in range(num_envs):
            assert runs[i] == reference[i][:len(runs[i])], (env_id, batch_size, i)
        assert received.min() >= 1 and kinds[batches] > 0, kinds


def test_exactly_once_with_many_sends_across_daemons(multi):
    rng = np.random.default_rng(1)
    with multi.make("Acrobot-v1", 256, seed=0, batch_size=64) as env:
        assert [rows.stop - rows.start for rows in env.shard_slices] == [128, 128]
        env.async_reset()
        first = env.recv()[4]["env_id"]
        assert first.dtype == np.int32 and first.tolist() == list(range(64))  # env order
        outstanding = set(range(64, 256))
        held = set(first.tolist())
        counts = np.zeros(256, int)
        counts[first] += 1
        for _ in range(40):
            # every send spans both daemons: random parts of the held envs
            for part in np.array_split(rng.permutation(sorted(held)), 3):
                env.send(np.zeros(len(part), np.int64), part)
                outstanding |= set(part.tolist())
            held.clear()
            ids = env.recv()[4]["env_id"].tolist()
            assert len(ids) == 64 and len(set(ids)) == 64 and set(ids) <= outstanding
            outstanding -= set(ids)
            held |= set(ids)
            counts[ids] += 1
        assert counts.sum() == 41 * 64 and (counts > 0).sum() > 128  # both daemons served


def test_recv_returns_the_daemon_that_finished_first(multi, daemons):
    """Over the sockets: while daemon 0 is stopped its envs cannot finish:
    recv must return daemon 1's without waiting for daemon 0, then daemon 0's
    once it runs.  (The doorbell's sends are answered by the daemon: see the
    next test.)"""
    with multi.make("CartPole-v1", 8, seed=0, batch_size=4, fast_path=False) as env:
        assert env.shard_slices == (slice(0, 4), slice(4, 8))
        assert not any(shard.fast_path for shard in env.shards)
        env.async_reset()
        assert env.recv()[4]["env_id"].tolist() == [0, 1, 2, 3]
        assert env.recv()[4]["env_id"].tolist() == [4, 5, 6, 7]
        daemons[0].signal(signal.SIGSTOP)
        try:
            env.send(np.zeros(4, np.int64), [2, 0, 3, 1])  # posted: no reply needed
            env.send(np.zeros(2, np.int64), [6, 7])
            env.send(np.zeros(2, np.int64), [4, 5])
            ids = env.recv()[4]["env_id"].tolist()
            assert sorted(ids) == [4, 5, 6, 7], ids
        finally:
            daemons[0].signal(signal.SIGCONT)
        obs, _, _, _, info = env.recv()
        assert sorted(info["env_id"].tolist()) == [0, 1, 2, 3]
        with pytest.raises(envd.EnvStateError, match="only 0 are in flight or ready"):
            env.recv()


def test_misuse_is_refused_with_the_one_daemon_messages(multi, daemons):
    with multi.make("CartPole-v1", 6, seed=0, batch_size=3) as env, \
            envd.make("CartPole-v1", 6, seed=0, batch_size=3) as local:
        for e in (env, local):
            with pytest.raises(envd.EnvStateError, match="only 0 are in flight or ready"):
                e.recv()  # nothing sent
            e.async_reset()
            with pytest.raises(envd.EnvStateError, match="env 4 is ready"):
                e.send(np.zeros(1, np.int64), [4])
            ids = e.recv()[4]["env_id"]
            assert ids.tolist() == [0, 1, 2]
            with pytest.raises(envd.EnvStateError, match="wait for recv"):
                e.step(np.zeros(6, np.int64))
            e.send(np.zeros(2, np.int64), [2, 0])
            with pytest.raises(envd.EnvStateError, match="env 0 is (in flight|ready)"):
                e.send(np.zeros(1, np.int64), [0])  # in flight (or finished, not received)
            with pytest.raises(envd.InvalidArgumentError, match=r"env ids must be in \[0, 6\), got 6"):
                e.send(np.zeros(1, np.int64), [6])  # no such env
            with pytest.raises(envd.InvalidArgumentError, match="repeated"):
                e.send(np.zeros(2, np.int64), [1, 1])
            with pytest.raises(envd.InvalidActionError, match="action 5 of env 1"):
                e.send(np.array([5]), [1])
            # 3 ready (3, 4, 5) + 2 in flight: a recv of 3 is fine, then 2 are out
            e.recv()
            with pytest.raises(envd.EnvStateError, match="recv returns 3 envs but only 2"):
                e.recv()
            e.send(np.zeros(4, np.int64), [1, 3, 4, 5])
            got = sorted(e.recv()[4]["env_id"].tolist() + e.recv()[4]["env_id"].tolist())
            assert got == [0, 1, 2, 3, 4, 5]  # each exactly once, after the refusals
            e.reset(seed=0)  # nothing out: back to sync steps
            e.step(np.zeros(6, np.int64))


def test_sync_steps_once_every_env_is_received_after_async_reset(multi):
    with multi.make("CartPole-v1", 6, seed=0, batch_size=3) as env, \
            envd.make("CartPole-v1", 6, seed=0, batch_size=3) as local:
        results = []
        for e in (env, local):
            e.async_reset()  # (never reset() before)
            e.recv(), e.recv()
            results.append(e.step(np.ones(6, np.int64))[0].copy())
        np.testing.assert_array_equal(results[0], results[1])


def test_recv_through_the_doorbells_returns_the_daemon_that_finished_first(daemons):
    """Through the doorbells (shm only: the inline transport has none): a
    batch sent to daemon 0, then one env sent to daemon 1: recv (batch 1)
    returns daemon 1's env first, since daemon 0 is stopped (SIGSTOP) before
    its batch is sent and cannot finish first whatever the machine's load;
    daemon 0's envs come once it is continued."""
    with envd.connect([d.endpoint for d in daemons], timeout=30) as multi, \
            multi.make("CartPole-v1", 8, seed=0, batch_size=1, transport="shm") as env:
        assert all(shard.fast_path for shard in env.shards)
        assert [len(range(8)[rows]) for rows in env.shard_slices] == [4, 4]
        env.async_reset()
        assert [int(env.recv()[4]["env_id"][0]) for _ in range(8)] == list(range(8))
        actions = np.zeros(4, np.int64)
        daemons[0].signal(signal.SIGSTOP)
        try:
            env.send(actions, np.arange(4))  # (rung: the send waits for no answer)
            env.send(actions[:1], [4])
            first = int(env.recv()[4]["env_id"][0])
        finally:
            daemons[0].signal(signal.SIGCONT)
        rest = sorted(int(env.recv()[4]["env_id"][0]) for _ in range(4))
        assert (first, rest) == (4, [0, 1, 2, 3])


def test_a_send_to_a_daemon_with_nothing_in_flight_rings_one_sendrecv(daemons, monkeypatch):
    """Through the doorbells, EnvPool's loop with each batch one daemon's
    envs: every send rings one SENDRECV (the send and its recv, answered
    once: no SEND, no RECV), and the trajectories stay those of sync mode."""
    from envd.client import doorbell
    rung = []
    ring = doorbell.Doorbell.ring
    monkeypatch.setattr(doorbell.Doorbell, "ring", lambda bell, kind=doorbell.STEP, count=0:
                        (rung.append(kind), ring(bell, kind, count))[1])
    num_envs, batches = 8, 24
    space = envd.native.get_spec("CartPole-v1").action_space
    # (a daemon may finish twice in a row: an env is received up to `batches` times)
    actions = per_env_actions(space, num_envs, batches, seed=5)
    reference = sync_trajectories("CartPole-v1", num_envs, batches, actions)
    runs = [[] for _ in range(num_envs)]
    with envd.connect([d.endpoint for d in daemons], timeout=30) as multi, \
            multi.make("CartPole-v1", num_envs, seed=11, batch_size=4, transport="shm") as env:
        assert all(shard.fast_path for shard in env.shards)
        env.async_reset()
        rung.clear()  # (each daemon's async reset: a RECV of all its envs)
        for _ in range(batches):
            obs, rew, term, trunc, info = env.recv()
            ids = info["env_id"].astype(np.int64)
            assert ids.tolist() in ([0, 1, 2, 3], [4, 5, 6, 7])  # one daemon's envs
            for k, i in enumerate(ids):
                runs[i].append(("reset", obs[k].tobytes()) if not runs[i]
                               else env_result(obs, rew, term, trunc, info, k, 1))
            env.send(np.array([actions[len(runs[i]) - 1, i] for i in ids]), ids)
        env.recv(), env.recv()
        # a daemon's thread sleeps after every SENDRECV: each ring woke it
        assert [shard._stepper.doorbell.missed_rings for shard in env.shards] == [0, 0]
    assert rung and set(rung) == {doorbell.SENDRECV}, sorted(set(rung))
    for i in range(num_envs):
        assert runs[i] == reference[i][:len(runs[i])], i


def test_a_send_of_part_of_a_daemons_envs_rings_a_send(daemons, monkeypatch):
    """A send of some of a daemon's envs rings SEND, answered at once: a
    SENDRECV there would make the next send to that daemon (its other envs)
    wait until the first batch finished."""
    from envd.client import doorbell
    rung = []
    ring = doorbell.Doorbell.ring
    monkeypatch.setattr(doorbell.Doorbell, "ring", lambda bell, kind=doorbell.STEP, count=0:
                        (rung.append(kind), ring(bell, kind, count))[1])
    with envd.connect([d.endpoint for d in daemons], timeout=30) as multi, \
            multi.make("CartPole-v1", 8, seed=0, batch_size=2, transport="shm") as env:
        env.async_reset()
        rung.clear()
        for _ in range(8):
            env.send(np.zeros(2, np.int64), env.recv()[4]["env_id"])
        for _ in range(4):
            env.recv()
    assert doorbell.SEND in rung and doorbell.SENDRECV not in rung, sorted(set(rung))


def test_a_send_the_daemon_refuses_is_raised_naming_it(multi, daemons):
    """A done env in disabled mode: the daemon refuses the send (all daemon
    1's envs: rung as a SENDRECV through its doorbell, posted over the
    socket; either raised by the next call), naming
    the daemon's endpoint, and those envs are idle again."""
    with multi.make("CartPole-v1", 4, seed=0, batch_size=2, autoreset_mode="disabled",
                    max_episode_steps=1) as env:
        env.async_reset()
        for _ in range(2):
            env.send(np.zeros(2, np.int64), env.recv()[4]["env_id"])
        env.recv(), env.recv()  # each env truncated now
        with pytest.raises(envd.EnvStateError, match="disabled") as refused:
            env.send(np.zeros(2, np.int64), [2, 3])  # daemon 1's
            env.recv()
        assert daemons[1].endpoint in str(refused.value)
        env.reset(options={"reset_mask": np.array([False, False, True, True])})
        env.reset(seed=0)  # the recv refused for want of those envs is no failure later
        env.async_reset()
        assert sorted(env.recv()[4]["env_id"].tolist() + env.recv()[4]["env_id"].tolist()) \
            == [0, 1, 2, 3]


def test_async_reset_drops_the_envs_in_flight_on_every_daemon(multi):
    with multi.make("Acrobot-v1", 12, seed=0, batch_size=5) as env:
        env.async_reset()
        ids = env.recv()[4]["env_id"]
        env.send(np.zeros(5, np.int64), ids)
        env.recv()
        env.async_reset(seed=3)  # 5 in flight on daemon 0, 2 ready on daemon 1
        got = [env.recv() for _ in range(2)]
        assert [r[4]["env_id"].tolist() for r in got] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
        with envd.make("Acrobot-v1", 12, seed=0) as local:
            obs, _ = local.reset(seed=3)
        np.testing.assert_array_equal(np.concatenate([got[0][0], got[1][0]]), obs[:10])


@pytest.mark.parametrize("doorbell", [False, True])
def test_a_daemon_killed_while_a_recv_waits_on_it_is_named(tmp_path, doorbell):
    """Daemon 0 stopped with envs in flight, then SIGKILLed while recv waits
    for them: the recv raises ConnectionLostError naming daemon 0, later calls
    too; close() closes daemon 1's session; nothing is left on either daemon.
    Daemon 0 is stopped before the send, which waits for no answer: posted
    over the socket, a SENDRECV through the doorbell (all of daemon 0's
    envs).  (Stopped just after it, a batch whose steps take a few ms, as
    ConnectFour's do once its boards fill, could finish first on a loaded
    machine.)"""
    victim = DaemonProcess(tmp_path / "victim", "--threads", "1")
    with DaemonProcess(tmp_path / "survivor", "--threads", "1") as survivor:
        fds_before, threads_before = len(os.listdir("/proc/self/fd")), threading.active_count()
        try:
            with envd.connect([victim.endpoint, survivor.endpoint], timeout=30) as multi:
                env = multi.make("ConnectFour-v0", 2048, seed=0, batch_size=1024, depth=6,
                                 fast_path=None if doorbell else False)
                assert all(shard.fast_path == doorbell for shard in env.shards)
                env.async_reset()
                actions = np.full(1024, 3, np.int64)
                for _ in range(2):  # (the first batches measure their cost: then pooled)
                    env.recv(), env.recv()
                    env.send(actions, np.arange(1024))
                    env.send(actions, np.arange(1024, 2048))
                env.recv(), env.recv()
                victim.signal(signal.SIGSTOP)
                env.send(actions, np.arange(1024))  # daemon 0's
                timer = threading.Timer(0.5, victim.signal, (signal.SIGKILL,))
                timer.start()
                with pytest.raises(envd.ConnectionLostError) as lost:
                    env.recv()
                timer.join()
                message = str(lost.value)
                del lost  # (its traceback's frames hold the shards)
                assert victim.endpoint in message and "envs 0..1023" in message
                with pytest.raises(envd.ConnectionLostError, match=victim.endpoint):
                    env.send(np.zeros(1, np.int64), [1500])
                with survivor.connect() as probe:
                    assert probe.status()["sessions"] == 1  # left open until close()
                    env.close()
                    wait_until(lambda: probe.status()["sessions"] == 0,
                               what="the survivor's session closed")
            wait_until(lambda: (gc.collect() or True) and len(os.listdir("/proc/self/fd")) <= fds_before
                       and threading.active_count() <= threads_before,
                       what="the client's sockets and threads gone")
            assert victim.proc.wait(DEADLINE) == -signal.SIGKILL
        finally:
            victim.stop()
        # a daemon restarted after kill -9 sweeps the victim's segments
        with DaemonProcess(tmp_path / "victim", "--threads", "1"):
            assert segments_of(victim.pid) == []
    assert survivor.proc.returncode == 0, survivor.log()
    assert segments_of(survivor.pid) == []


@pytest.mark.parametrize("doorbell", [False, True])
def test_a_recv_waiting_on_daemons_that_all_hang_takes_one_timeout(tmp_path, doorbell):
    """Both daemons stopped with envs in flight: recv raises EnvdTimeoutError
    after one Client timeout in all (one deadline per call, over every
    daemon's wait; the timeout as set after make), naming both; the env then
    refuses async calls until it is closed."""
    timeout = 3.0  # (the bound below has 2.5 s of margin over one timeout per daemon)
    with daemon_group(tmp_path, ("--threads", "1"), ("--threads", "1")) as daemons, \
            envd.connect([d.endpoint for d in daemons], timeout=30) as multi:
        env = multi.make("CartPole-v1", 8, seed=0, batch_size=4,
                         fast_path=None if doorbell else False)
        assert all(shard.fast_path == doorbell for shard in env.shards)
        env.async_reset()
        env.recv(), env.recv()

        def send_then_recv() -> None:  # (the daemons stopped before the send: no batch ends)
            env.send(np.zeros(8, np.int64), np.arange(8))  # (waits for no answer)
            env.recv()

        elapsed, error = seconds_to_time_out(daemons, multi.clients, timeout, send_then_recv)
        assert timeout <= elapsed < 2 * timeout - 0.5, f"the recv took {elapsed:.2f} s"
        message = str(error)
        assert all(d.endpoint in message for d in daemons)
        assert f"within {timeout:g} s (Client timeout)" in message
        with pytest.raises(envd.EnvStateError, match="timed out"):
            env.recv()
        env.close()


def test_make_refuses_async_where_a_daemon_does_not_serve_it(multi, monkeypatch):
    client = multi.clients[1]
    monkeypatch.setattr(client, "capabilities",
                        dataclasses.replace(client.capabilities, recv_min=False))
    with pytest.raises(envd.InvalidArgumentError, match="recv_min"):
        multi.make("CartPole-v1", 8, batch_size=4)


def test_an_env_failing_inside_batches_on_either_daemon(tmp_path):
    """TestPlugin-v0 built with INFO_FAILS (write_info fails from an env's
    third step on) on two daemons: the recv that notices a failure raises
    NativeError, and every env still comes back exactly once per send."""
    from support.plugin_checks import VARIANTS_SOURCE, build_plugin, check_async_failure
    plugin = build_plugin(VARIANTS_SOURCE, tmp_path / "libinfo_fails.so", "INFO_FAILS")
    daemons = [DaemonProcess(tmp_path / f"d{k}", "--threads", "1", "--plugin", str(plugin))
               for k in range(2)]
    try:
        with envd.connect([d.endpoint for d in daemons], timeout=30) as multi:
            with multi.make("TestPlugin-v0", 6, seed=0, batch_size=2) as env:
                assert len(env.shards) == 2
                check_async_failure(env)
    finally:
        codes = [d.stop() for d in daemons]
    assert codes == [0, 0]
    assert all(segments_of(d.pid) == [] for d in daemons)


def test_async_reset_right_after_a_refused_send_keeps_the_books(multi):
    """A send the daemon refuses (done env, disabled mode) followed at once by
    async_reset: the refusal's reply, read during the reset, must not make
    envs idle that the reset made ready (each is still received once)."""
    with multi.make("CartPole-v1", 4, seed=0, batch_size=2, autoreset_mode="disabled",
                    max_episode_steps=1) as env:
        for _ in range(5):
            env.async_reset()
            for _ in range(2):
                env.send(np.zeros(2, np.int64), env.recv()[4]["env_id"])
            env.recv(), env.recv()  # every env truncated now
            try:
                env.send(np.zeros(2, np.int64), [2, 3])  # refused by daemon 1
            except envd.EnvStateError:
                pass  # (a SENDRECV's answer or a posted send's reply, unread yet)
            env.async_reset()
            with pytest.raises(envd.EnvStateError, match="env 2 is ready"):
                env.send(np.zeros(1, np.int64), [2])
            got = env.recv()[4]["env_id"].tolist() + env.recv()[4]["env_id"].tolist()
            assert got == [0, 1, 2, 3]
            with pytest.raises(envd.EnvStateError, match="only 0 are in flight or ready"):
                env.recv()


def test_a_reset_or_step_after_async_sees_every_envs_last_results(multi):
    """A recv of one daemon's envs is gathered straight from its shard's
    buffers, leaving the MultiVecEnv's own behind: a step or reset after
    async must still read every env's last results there.  Envs 2 and 3
    (daemon 1) end after one step: the step is refused naming env 2 before
    any daemon steps, and a reset of envs 2 and 3 returns envs 0 and 1 as
    async_reset left them."""
    with multi.make("CartPole-v1", 4, seed=0, batch_size=2, autoreset_mode="disabled",
                    max_episode_steps=1) as env:
        env.async_reset()
        obs, _, _, _, info = env.recv()
        assert info["env_id"].tolist() == [0, 1]
        first_obs = obs.copy()
        assert env.recv()[4]["env_id"].tolist() == [2, 3]
        env.send(np.zeros(2, np.int64), [2, 3])
        _, _, _, truncations, info = env.recv()
        assert info["env_id"].tolist() == [2, 3] and truncations.all()
        with pytest.raises(envd.EnvStateError, match="env 2 is done"):
            env.step(np.zeros(4, np.int64))
        obs, _ = env.reset(options={"reset_mask": np.array([False, False, True, True])})
        np.testing.assert_array_equal(obs[:2], first_obs)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "py:CartPole-v1"])
def test_a_recv_after_a_second_async_reset_returns_zero_rewards(multi, env_id):
    """A fresh episode has earned nothing: the recvs after an async reset
    return rewards 0, as in-process, though the envs had earned 1 before
    (the daemon's reset zeroes them, a hosted env's worker too: recv reads
    the shard's rows)."""
    with multi.make(env_id, 4, seed=0, batch_size=2) as env, \
            envd.make("CartPole-v1", 4, seed=0, batch_size=2) as local:
        for e in (env, local):
            check_async_reset_zeroes_rewards(e)


def test_a_masked_reset_after_a_recv_across_daemons_returns_every_envs_state(daemons):
    """Envs 1 and 2 (one on each daemon) are received together, so their rows
    are copied into the MultiVecEnv's buffers; then env 0 is sent and
    finishes, not received: its rows are only in its shard's buffers.  A
    reset of the other daemon's envs must return env 0's current
    observation, as in-process (over the sockets: a recv keeps waiting on
    each daemon with envs in flight, so env 0 is seen finished without one)."""
    with envd.connect([d.endpoint for d in daemons], timeout=30) as client, \
            client.make("CartPole-v1", 4, seed=0, batch_size=2, transport="inline") as env, \
            envd.make("CartPole-v1", 4, seed=0, batch_size=2) as local:
        mask = np.array([False, False, True, True])  # daemon 1's envs
        observations = []
        for e in (env, local):
            e.reset(seed=0)
            e.send(np.zeros(1, np.int64), [1])
            e.send(np.zeros(1, np.int64), [2])
            assert sorted(e.recv()[4]["env_id"].tolist()) == [1, 2]  # (across daemons)
            e.send(np.ones(1, np.int64), [0])

            def reset_once_finished(e=e) -> bool:
                try:
                    observations.append(e.reset(options={"reset_mask": mask})[0].copy())
                    return True
                except envd.EnvStateError:  # (env 0 still in flight)
                    return False

            wait_until(reset_once_finished, what="env 0 to finish")
        mine, theirs = observations
        np.testing.assert_array_equal(mine[~mask], theirs[~mask])


def test_a_daemon_without_the_fast_path_turns_the_others_doorbells_off(tmp_path):
    """Daemon 1 serves no fast path (--fast-path-sessions 0): daemon 0's
    doorbell is stopped and every shard steps over its socket; the
    trajectories stay those of sync mode."""
    num_envs, steps = 8, 20
    space = envd.native.get_spec("CartPole-v1").action_space
    actions = per_env_actions(space, num_envs, steps, seed=2)
    reference = sync_trajectories("CartPole-v1", num_envs, steps, actions)
    with daemon_group(tmp_path, ("--threads", "1"),
                      ("--threads", "1", "--fast-path-sessions", "0")) as procs, \
            envd.connect([d.endpoint for d in procs], timeout=30) as multi:

        def make(**kwargs):
            env = multi.make("CartPole-v1", num_envs, seed=11, **kwargs)
            assert [shard.fast_path for shard in env.shards] == [False, False]
            return env

        for batch_size in (3, 4):
            runs, _ = async_trajectories(make, num_envs, steps, actions, batch_size,
                                         np.random.default_rng(batch_size))
            for i in range(num_envs):
                assert runs[i] == reference[i][:len(runs[i])], (batch_size, i)
