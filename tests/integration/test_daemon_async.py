"""Async mode through the daemon (client.make(..., batch_size=B)): per-env
trajectories equal to sync mode in-process, exactly once, misuse refused, and
sessions with batches in flight closed and drained cleanly."""
from __future__ import annotations

import functools
import signal

import numpy as np
import pytest
from support.async_steps import (
    async_trajectories,
    check_async_reset_zeroes_rewards,
    envpool_loop_trajectories,
    per_env_actions,
    sync_trajectories,
)
from support.builtin_envs import BUILTIN_ENV_IDS, MULTI_AGENT_ENV_IDS
from support.daemon import DaemonProcess, segments_of, wait_until

import envd
from envd.errors import ProtocolError


@pytest.fixture(scope="module", params=["shm", "inline"])
def served(tmp_path_factory, request):
    """A daemon and a client whose makes take one transport: every async test
    runs over shared memory and over the inline transport."""
    with DaemonProcess(tmp_path_factory.mktemp("async") / "daemon", "--threads", "2",
                       "--lease-timeout", "10", "--python-env", "CartPole-v1") as daemon, \
            daemon.connect() as client:
        client.make = functools.partial(client.make, transport=request.param)
        yield daemon, client
    assert daemon.proc.returncode == 0, daemon.log()
    assert segments_of(daemon.pid) == []


@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS + MULTI_AGENT_ENV_IDS)
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_per_env_trajectories_equal_sync_mode(served, env_id, mode):
    _, client = served
    num_envs, steps = 10, 40
    spec = envd.native.get_spec(env_id)
    actions = per_env_actions(spec.action_space, num_envs, steps, seed=7,
                              num_agents=spec.num_agents)
    reference = sync_trajectories(env_id, num_envs, steps, actions, autoreset_mode=mode)
    rng = np.random.default_rng(3)
    for batch_size in (1, 4, 10):
        runs, received = async_trajectories(
            lambda **kw: client.make(env_id, num_envs, seed=11, **kw),
            num_envs, steps, actions, batch_size, rng, autoreset_mode=mode)
        for i in range(num_envs):
            assert runs[i] == reference[i][:len(runs[i])], (env_id, mode, batch_size, i)
        assert received.sum() > num_envs * steps // 2


@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS)
@pytest.mark.parametrize("copy", [False, True])
def test_envpool_loop_trajectories_equal_sync_mode(served, env_id, copy):
    """EnvPool's loop, each recv's info["env_id"] (or, with copy=True, its
    copy) sent straight back (its ids not checked again; actions and rows
    copied as slices for a run of envs), steps every env as sync mode does,
    for batches that are runs and not."""
    _, client = served
    num_envs, steps = 10, 30
    actions = per_env_actions(envd.native.get_spec(env_id).action_space, num_envs, steps, seed=7)
    reference = sync_trajectories(env_id, num_envs, steps, actions)
    for batch_size, batches in [(5, "run"), (4, "other")]:
        runs, received, kinds = envpool_loop_trajectories(
            lambda **kw: client.make(env_id, num_envs, seed=11, copy=copy, **kw),
            num_envs, steps, actions, batch_size)
        for i in range(num_envs):
            assert runs[i] == reference[i][:len(runs[i])], (env_id, batch_size, i)
        assert received.min() >= 1 and kinds[batches] > 0, kinds


def test_a_recv_batch_changed_in_place_is_checked_as_any_send(served, monkeypatch):
    """recv's own env_id array skips a send's id checks (none is made) only
    while it holds the ids recv returned: changed in place, it is checked
    (repeats, range) and its envs get their own rows, in-process and through
    the daemon."""
    _, client = served
    with client.make("CartPole-v1", 6, seed=0, batch_size=3) as env, \
            envd.make("CartPole-v1", 6, seed=0, batch_size=3) as local, \
            envd.make("CartPole-v1", 6, seed=0) as reference:
        checks = []
        for cls in {type(env), type(local)}:
            def counted(self, ids, checked=cls._checked_ids):
                checks.append(len(ids))
                return checked(self, ids)
            monkeypatch.setattr(cls, "_checked_ids", counted)
        start = reference.reset()[0].copy()
        for e in (env, local):
            e.async_reset()
            ids = e.recv()[4]["env_id"]
            first = ids.copy()
            ids[1] = ids[0]
            with pytest.raises(envd.InvalidArgumentError, match="repeated ids"):
                e.send(np.zeros(3, np.int64), ids)
            ids[1] = 6
            with pytest.raises(envd.InvalidArgumentError, match=r"in \[0, 6\), got 6"):
                e.send(np.zeros(3, np.int64), ids)
            ids[:] = first[::-1]  # the same envs, another order: each its own action
            e.send(np.array([0, 1, 1]), ids)
            e.recv()  # (the envs async_reset readied and not received)
            obs, _, _, _, info = e.recv()
            expected = np.zeros(6, np.int64)
            expected[first[::-1]] = [0, 1, 1]
            reference.reset(seed=0)
            after, *_ = reference.step(expected)
            assert sorted(info["env_id"].tolist()) == sorted(first.tolist())
            np.testing.assert_array_equal(obs, after[info["env_id"]])
            made = len(checks)
            assert made > 0  # (the three sends above were checked)
            e.send(np.zeros(3, np.int64), info["env_id"])  # as recv returned it
            assert len(checks) == made
    assert not np.array_equal(start[first], after[first])


def test_exactly_once_with_many_sends_in_flight(served):
    _, client = served
    rng = np.random.default_rng(1)
    with client.make("Acrobot-v1", 256, seed=0, batch_size=64) as env:  # pooled batches
        env.async_reset()
        held: set[int] = set()
        outstanding = set(range(256))
        for _ in range(40):
            ids = env.recv()[4]["env_id"].tolist()
            assert len(set(ids)) == 64 and set(ids) <= outstanding
            outstanding -= set(ids)
            held |= set(ids)
            for part in np.array_split(rng.permutation(sorted(held)), 3):
                env.send(np.zeros(len(part), np.int64), part)
                outstanding |= set(part.tolist())
            held.clear()


def test_misuse_is_refused_and_the_env_stays_usable(served):
    _, client = served
    with client.make("CartPole-v1", 6, seed=0, batch_size=3) as env, \
            envd.make("CartPole-v1", 6, seed=0, batch_size=3) as local:
        for e in (env, local):
            with pytest.raises(envd.EnvStateError, match="only 0 are in flight or ready"):
                e.recv()
            e.async_reset()
            ids = e.recv()[4]["env_id"]
            with pytest.raises(envd.EnvStateError, match="env 3 is ready"):
                e.send(np.zeros(1, np.int64), [3])
                if e is env:
                    # through the daemon the send is posted and its session
                    # refuses it: raised by the next call once its answer is
                    # read (over the socket, status's reply comes after it),
                    # and nothing changed
                    client.status()
                    e.recv()
            with pytest.raises(envd.InvalidActionError, match="out of range"):
                e.send(np.array([0, 7, 1]), ids)
            e.send(np.zeros(3, np.int64), ids)
            with pytest.raises(envd.EnvStateError, match="in flight|wait for recv"):
                e.step(np.zeros(6, np.int64))
        for _ in range(2):
            r, l = env.recv(), local.recv()  # noqa: E741 -- r, l: remote, local
            assert r[4]["env_id"].tolist() == l[4]["env_id"].tolist()
            assert r[0].tobytes() == l[0].tobytes()
    # the daemon refuses raw misuse too: a recv of more than was sent (over
    # the socket: the fast path's recv is covered in test_fast_path)
    with client.make("CartPole-v1", 4, seed=0, batch_size=2, fast_path=False) as env:
        with pytest.raises(envd.EnvStateError, match="only 0 are in flight or ready"):
            client.channel.request({"type": "recv", "session": env.session, "count": 2})


def test_close_and_drain_with_batches_in_flight(tmp_path):
    with DaemonProcess(tmp_path / "d", "--threads", "1") as daemon:
        client = daemon.connect()
        env = client.make("Acrobot-v1", 1 << 18, seed=0, batch_size=1 << 17)
        env.async_reset()
        ids = env.recv()[4]["env_id"]
        env.send(np.zeros(len(ids), np.int64), ids)  # a big batch, still running
        env.close()
        wait_until(lambda: segments_of(daemon.pid) == [], what="the closed session's segment")
        env = client.make("Acrobot-v1", 1 << 18, seed=0, batch_size=1 << 17)
        env.async_reset()
        ids = env.recv()[4]["env_id"]
        env.send(np.zeros(len(ids), np.int64), ids)
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0, daemon.log()
        assert segments_of(daemon.pid) == []
        client.timeout = 2.0
        client.close()


def test_drain_answers_a_waiting_recv_then_refuses_new_async_work(tmp_path):
    """SIGTERM while a recv waits for a big batch: the batch finishes and the
    recv gets its envs; new async work then fails with a clear error.  Over
    the socket (raw requests); the fast path's twin is in test_fast_path."""
    with DaemonProcess(tmp_path / "d", "--threads", "1") as daemon, \
            daemon.connect(timeout=60) as client:
        env = client.make("Acrobot-v1", 1 << 18, seed=0, batch_size=1 << 17, fast_path=False)
        env.async_reset()
        ids = env.recv()[4]["env_id"]
        env.send(np.zeros(len(ids), np.int64), ids)  # a big batch, still stepping
        env.recv()  # the other half, ready since the reset
        # A raw recv for the big batch, posted; the daemon answers one
        # connection in order, so once status is answered the recv waits.
        replies: list[dict] = []
        request = {"type": "recv", "session": env.session, "count": len(ids)}
        client.channel.post(request, (), replies.append)
        client.status()
        daemon.signal(signal.SIGTERM)

        def answered() -> bool:
            client.channel.read_late_replies()
            return bool(replies)
        wait_until(answered, what="the answer to the waiting recv")
        assert replies[0]["ok"], replies[0]
        got = np.frombuffer(replies[0]["_blobs"][0], np.int64)
        assert sorted(got.tolist()) == sorted(ids.tolist())
        with pytest.raises((envd.ShuttingDownError, envd.ConnectionLostError)):
            client.channel.request(dict(request, count=1))  # nothing new while draining
        assert daemon.wait() == 0, daemon.log()
        assert segments_of(daemon.pid) == []
        client.timeout = 2.0


def test_a_send_the_daemon_refuses_is_reported_by_the_next_recv(served):
    """Sending a done env in 'disabled' mode: in-process send raises; through
    the daemon the send is posted, so a later recv (the first that asks the
    daemon) raises the same error, the refused env is idle again (sendable),
    and no env is lost or doubled.
    batch_size 1: which env falls first depends on the order batches finish,
    and with one env per recv every accepted send can be received back."""
    _, client = served
    kwargs = dict(seed=0, batch_size=1, autoreset_mode="disabled", max_episode_steps=0)
    with client.make("CartPole-v1", 4, **kwargs) as remote, \
            envd.make("CartPole-v1", 4, **kwargs) as local:
        messages = []
        for env in (remote, local):
            env.async_reset()
            done_id, received, sent = None, np.zeros(4, int), np.ones(4, int)
            while done_id is None:  # push the poles over until one falls
                _, _, terms, _, info = env.recv()
                [env_id] = info["env_id"].tolist()
                received[env_id] += 1
                if terms[0]:
                    done_id = env_id
                else:
                    env.send(np.zeros(1, np.int64), [env_id])
                    sent[env_id] += 1
            with pytest.raises(envd.EnvStateError, match="is done and autoreset_mode") as error:
                env.send(np.zeros(1, np.int64), [done_id])
                # through the daemon: raised by the first recv that asks it
                # (envs already ready are returned without a round trip)
                for _ in range(4):
                    received[env.recv()[4]["env_id"]] += 1
            messages.append(str(error.value).replace(f"env {done_id} ", "env N "))
            while (sent - received).sum():  # every accepted send comes back once
                _, _, _, _, info = env.recv()
                received[info["env_id"]] += 1
            assert sent.tolist() == received.tolist()
            # the refused env is idle again: sendable (and refused again)
            # rather than "already in flight"
            with pytest.raises(envd.EnvStateError, match="is done and autoreset_mode"):
                env.send(np.zeros(1, np.int64), [done_id])
                env.recv()
            env.reset()  # nothing in flight: back to sync mode
        assert messages[0] == messages[1]  # the same error, naming each its own env


def test_async_reset_over_the_socket_drops_the_envs_in_flight(served):
    """async_reset is a socket request (reset with async: true) served by the
    daemon's session: the envs in flight are waited for and dropped, every
    env comes back once, in env order, with the in-process env's results."""
    _, client = served
    kwargs = dict(seed=0, batch_size=3)
    with client.make("CartPole-v1", 6, fast_path=False, **kwargs) as remote, \
            envd.make("CartPole-v1", 6, **kwargs) as local:
        for env in (remote, local):
            env.async_reset()
            ids = env.recv()[4]["env_id"]
            env.send(np.ones(3, np.int64), ids)  # in flight (or ready) at the reset
            env.async_reset(seed=5)
        for _ in range(2):
            r, l = remote.recv(), local.recv()  # noqa: E741 -- r, l: remote, local
            assert r[4]["env_id"].tolist() == l[4]["env_id"].tolist()
            assert r[0].tobytes() == l[0].tobytes()
        with pytest.raises(envd.EnvStateError, match="only 0 are in flight or ready"):
            remote.recv()  # every env was returned once: none is left
    # the daemon refuses a masked async reset (it resets every env)
    with client.make("CartPole-v1", 4, seed=0, batch_size=2, fast_path=False) as env:
        with pytest.raises(ProtocolError, match="takes no mask"):
            client.channel.request({"type": "reset", "session": env.session, "async": True,
                                    "mask": True})


@pytest.mark.parametrize("fast_path", [False, None])
def test_a_refused_send_is_raised_by_the_next_call(served, fast_path):
    """A send is posted, over the socket and through the doorbell (fast_path
    None: where the transport has one), and the daemon's session refuses an
    env that is not idle: the refusal is raised by the first call that
    starts after its reply was read (through the doorbell: the next call,
    before it asks anything), and changes nothing; a reset forgets it."""
    _, client = served
    with client.make("CartPole-v1", 6, seed=0, batch_size=3, fast_path=fast_path) as env:
        env.async_reset()
        first = env.recv()[4]["env_id"].tolist()
        assert first == [0, 1, 2]
        env.send(np.zeros(1, np.int64), [4])  # ready, not received: refused
        client.status()  # its reply comes after the send's: that one is read now
        with pytest.raises(envd.EnvStateError, match="env 4 is ready, not received yet"):
            env.step(np.zeros(6, np.int64))
        assert env.recv()[4]["env_id"].tolist() == [3, 4, 5]  # nothing changed
        env.send(np.zeros(3, np.int64), [0, 1, 2])
        env.send(np.zeros(1, np.int64), [1])  # in flight (or ready): refused
        client.status()
        with pytest.raises(envd.EnvStateError, match="env 1 is (in flight|ready)"):
            env.send(np.zeros(3, np.int64), [3, 4, 5])  # raised here, not sent
        assert sorted(env.recv()[4]["env_id"].tolist()) == [0, 1, 2]
        with pytest.raises(envd.EnvStateError, match="only 0 are in flight or ready"):
            env.recv()  # [3, 4, 5] were never sent
        env.send(np.zeros(1, np.int64), [0])
        env.send(np.zeros(1, np.int64), [0])  # refused: in flight
        client.status()
        env.async_reset()  # forgets the refusal, as a reset forgets a failed batch
        assert env.recv()[4]["env_id"].tolist() == [0, 1, 2]


def test_recv_min_and_a_send_served_beside_a_waiting_recv(tmp_path):
    """recv {count, min} (capability recv_min, what async over several
    daemons needs): answered once min envs are ready, with those ready up to
    count; while it waits, a send of the same session is served (the send's
    reply comes before the recv's) instead of being refused as busy."""
    with DaemonProcess(tmp_path / "daemon", "--threads", "1") as daemon, \
            daemon.connect() as client:
        assert client.capabilities.recv_min
        # ~45 us per step at depth 6: a batch of 512 keeps the one worker ~20 ms
        env = client.make("ConnectFour-v0", 1024, seed=0, batch_size=512, fast_path=False,
                          depth=6)
        channel, session = client.channel, env.session

        def recv(count, least=None):
            header = {"type": "recv", "session": session, "count": count}
            if least is not None:
                header["min"] = least
            return np.frombuffer(channel.request(header)["_blobs"][0], np.int64)

        env.async_reset()
        assert recv(600, 1).tolist() == list(range(600))  # all ready: up to count
        assert recv(424).tolist() == list(range(600, 1024))  # no min: exactly count
        env.buffers["actions"][:] = 3
        channel.post({"type": "send", "session": session},
                     [np.arange(1024, dtype=np.int64).tobytes()], lambda reply: None)
        recv(1024)  # (the vec has measured its cost by now: the batches below are pooled)
        with pytest.raises(envd.InvalidArgumentError, match="min"):
            recv(2, 3)
        replies = []

        def post(header, blobs=()):
            channel.post({**header, "session": session}, list(blobs),
                         lambda reply, kind=header["type"]: replies.append((kind, reply)))

        post({"type": "send"}, [np.arange(512, dtype=np.int64).tobytes()])
        post({"type": "recv", "count": 1024, "min": 1})
        post({"type": "send"}, [np.arange(512, 1024, dtype=np.int64).tobytes()])
        wait_until(lambda: channel.read_late_replies(0.05) or len(replies) == 3,
                   what="three replies")
        assert [kind for kind, _ in replies] == ["send", "send", "recv"], replies
        assert all(reply["ok"] for _, reply in replies), replies
        got = set(np.frombuffer(replies[2][1]["_blobs"][0], np.int64).tolist())
        # answered once a batch finished: whole batches (whichever came first)
        batches = [set(range(512)), set(range(512, 1024))]
        assert got in batches or got == batches[0] | batches[1], sorted(got)
        rest = 1024 - len(got)
        if rest:
            assert set(recv(rest, rest).tolist()) == set(range(1024)) - got
        env.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "py:CartPole-v1"])
def test_a_recv_after_a_second_async_reset_returns_zero_rewards(served, env_id):
    """A fresh episode has earned nothing: after an async reset the recvs
    return rewards 0, as in-process, though the envs had earned 1 before
    (the inline transport's reply carries the daemon's rows as they are;
    a hosted Python env's worker writes its own)."""
    _, client = served
    with client.make(env_id, 4, seed=0, batch_size=2) as env, \
            envd.make("CartPole-v1", 4, seed=0, batch_size=2) as local:
        for e in (env, local):
            check_async_reset_zeroes_rewards(e)
