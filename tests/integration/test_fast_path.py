"""The same-host fast path: steps, sends and recvs rung at a doorbell in the
session's shared memory and served by a native thread of the daemon.

Bit-identity over every env and mode is also covered by the equivalence and
faults tests, whose shared-memory sessions take the fast path by default;
here: when it is taken, that its errors and counters are those of the other
paths, and that crashes, freezes, drains, timeouts and closes on either side
end with the documented error instead of a hang."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from support.builtin_envs import BUILTIN_ENV_IDS, MULTI_AGENT_ENV_IDS, random_actions
from support.daemon import DEADLINE, segments_of, wait_until

import envd
from envd.client import doorbell

MODES = ["next_step", "same_step", "disabled"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from support.daemon import DaemonProcess
    with DaemonProcess(tmp_path_factory.mktemp("fast") / "daemon", "--threads", "2",
                       "--lease-timeout", "10") as daemon, daemon.connect() as client:
        yield daemon, client
    assert daemon.proc.returncode == 0, daemon.log()
    assert segments_of(daemon.pid) == []


def assert_same(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), what


# ---- when it is taken ---------------------------------------------------------------------
def test_taken_by_default_for_shared_memory_sessions(served):
    _, client = served
    with client.make("CartPole-v1", 4, seed=0) as env:
        assert env.fast_path and env.transport == "shm"
        assert "fast_path=True" in repr(env)
    with client.make("CartPole-v1", 4, seed=0, fast_path=False) as env:
        assert not env.fast_path
    with client.make("CartPole-v1", 4, seed=0, batch_size=2) as env:
        assert env.fast_path  # sends and recvs too
    with client.make("CartPole-v1", 4, seed=0, transport="inline") as env:
        assert not env.fast_path
    assert env.fast_path is False  # closed: no stepper, no fast path (not an AttributeError)


def test_required_but_impossible_says_why_and_leaves_no_session(served):
    _, client = served
    before = client.status()["sessions"]
    with pytest.raises(envd.InvalidArgumentError, match="fast_path=True: .*shared memory"):
        client.make("CartPole-v1", 4, transport="inline", fast_path=True)
    wait_until(lambda: client.status()["sessions"] == before, what="the sessions to be closed")


def test_envd_fast_path_variable_and_the_daemon_flag(harness, monkeypatch):
    daemon = harness.daemon("--threads", "1", "--fast-path-sessions", "1")
    client = harness.connect(daemon)
    first = client.make("CartPole-v1", 2, seed=0)
    assert first.fast_path
    second = client.make("CartPole-v1", 2, seed=0)  # over the daemon's limit: the socket
    assert not second.fast_path
    with pytest.raises(envd.InvalidArgumentError, match="--fast-path-sessions"):
        client.make("CartPole-v1", 2, fast_path=True)
    first.close()
    assert client.make("CartPole-v1", 2, seed=0).fast_path  # the slot is free again
    monkeypatch.setenv("ENVD_FAST_PATH", "0")
    assert not client.make("Pendulum-v1", 2, seed=0).fast_path


# ---- the same results and errors as in-process -----------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS + MULTI_AGENT_ENV_IDS)
def test_trajectories_bit_identical_to_in_process(served, env_id, mode):
    _, client = served
    rng = np.random.default_rng(5)
    with client.make(env_id, 9, seed=7, autoreset_mode=mode, max_episode_steps=30) as remote, \
            envd.make(env_id, 9, seed=7, autoreset_mode=mode, max_episode_steps=30,
                      num_threads=0) as local:
        assert remote.fast_path
        assert_same(remote.reset()[0], local.reset()[0], "reset")
        for t in range(80):
            actions = random_actions(local.single_action_space, local.num_envs, rng)  # (rows)
            r, q = remote.step(actions), local.step(actions)
            for name, a, b in zip(("obs", "rewards", "terminations", "truncations"), r, q):
                assert_same(a, b, f"{env_id} {mode} step {t} {name}")
            if mode == "disabled" and (q[2] | q[3]).any():
                mask = q[2] | q[3]
                assert_same(remote.reset(options={"reset_mask": mask})[0],
                            local.reset(options={"reset_mask": mask})[0], "masked reset")
            if t == 40:  # a reseed in between (over the socket, with the doorbell held)
                assert_same(remote.reset(seed=3)[0], local.reset(seed=3)[0], "reseed")


def test_errors_match_in_process(served):
    _, client = served
    cases = [
        (dict(), lambda e: e.step(np.array([0, 2, 1])), envd.InvalidActionError),  # out of range
        (dict(), None, envd.EnvStateError),  # never reset
        (dict(autoreset_mode="disabled", max_episode_steps=1),
         lambda e: e.step(np.zeros(3, np.int64)), envd.EnvStateError),  # done, disabled
    ]
    for kwargs, first, error in cases:
        with client.make("CartPole-v1", 3, seed=1, **kwargs) as remote, \
                envd.make("CartPole-v1", 3, seed=1, **kwargs) as local:
            messages = []
            for env in (remote, local):
                if first is not None:
                    env.reset()
                    if error is envd.EnvStateError:
                        first(env)  # the episode ends: the next step is refused
                with pytest.raises(error) as caught:
                    (first or (lambda e: e.step(np.zeros(3, np.int64))))(env)
                messages.append(str(caught.value))
            assert messages[0] == messages[1]
            if first is not None:  # the env stays usable
                remote.reset(seed=2), local.reset(seed=2)
                assert_same(remote.step(np.ones(3, np.int64))[0], local.step(np.ones(3, np.int64))[0],
                            "after the error")


def test_a_socket_step_on_a_fast_session_is_refused(served):
    _, client = served
    with client.make("CartPole-v1", 2, seed=0) as env:
        env.reset()
        with pytest.raises(envd.EnvStateError, match="the fast path serves"):
            client.channel.request({"type": "step", "session": env.session})
        env.step(np.zeros(2, np.int64))  # still served


def test_status_counts_fast_path_steps(served):
    _, client = served
    before = client.status()["env_steps"]
    with client.make("Acrobot-v1", 5, seed=0) as env:
        env.reset()
        for _ in range(20):
            env.step(np.zeros(5, np.int64))
        wait_until(lambda: client.status()["env_steps"] - before == 100,
                   what="the 100 env steps to be counted")
    assert client.status()["env_steps"] - before == 100  # closed: counted once


# ---- sends and recvs ----------------------------------------------------------------------
def async_trajectories(env, rounds: int, mode: str) -> dict[int, list]:
    """EnvPool's loop (recv a batch, send it back) for rounds steps per env;
    each env's action at its k-th step comes from a table, so the trajectory
    of every env (obs, reward, flags) does not depend on the order in which
    envs come back (which depends on the threads).  How far each env gets
    may: the loop ends once fewer than batch_size envs are out (recv takes
    exactly batch_size), and in 'disabled' mode, where done envs drop out,
    which envs those last ones are depends on the order (see
    assert_same_trajectories)."""
    n, space = env.num_envs, env.single_action_space
    table = [random_actions(space, n, np.random.default_rng(k)) for k in range(rounds)]
    steps = np.zeros(n, np.int64)
    trajectories: dict[int, list] = {i: [] for i in range(n)}
    env.async_reset(seed=7)
    out = n  # envs in flight or ready
    while out >= env.batch_size:
        obs, rewards, terms, truncs, info = env.recv()
        ids = info["env_id"]
        out -= len(ids)
        for j, i in enumerate(ids.tolist()):
            trajectories[i].append((obs[j].tobytes(), float(rewards[j]), bool(terms[j]),
                                    bool(truncs[j])))
        keep = steps[ids] < rounds
        if mode == "disabled":  # a done env may not be sent until reset
            keep &= ~(terms | truncs)
        send = ids[keep]
        if len(send):
            env.send(np.stack([table[k][i] for i, k in zip(send, steps[send])]), send)
            steps[send] += 1
            out += len(send)
    return trajectories


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "Snake-v0"])
def test_async_trajectories_match_in_process_without_the_socket(served, env_id, mode):
    _, client = served
    kwargs = dict(seed=7, batch_size=4, autoreset_mode=mode, max_episode_steps=25)
    with client.make(env_id, 12, **kwargs) as remote, \
            envd.make(env_id, 12, num_threads=0, **kwargs) as local:
        assert remote.fast_path
        socket_calls = []
        real_request, real_post = client.channel.request, client.channel.post
        client.channel.request = lambda header, *a, **k: (socket_calls.append(header["type"]),
                                                          real_request(header, *a, **k))[1]
        client.channel.post = lambda header, *a, **k: (socket_calls.append(header["type"]),
                                                       real_post(header, *a, **k))[1]
        try:
            got = async_trajectories(remote, 40, mode)
        finally:
            client.channel.request, client.channel.post = real_request, real_post
        assert socket_calls == ["reset"]  # async_reset; every send and recv rang the doorbell
        want = async_trajectories(local, 40, mode)
        assert_same_trajectories(got, want, mode, batch_size=4, what=env_id)


def ended(trajectory: list, rounds: int) -> bool:
    """The env's last result was received: it reached a done, or rounds steps
    (the async reset's observation is the first entry)."""
    return bool(trajectory) and (trajectory[-1][2] or trajectory[-1][3]
                                 or len(trajectory) == rounds + 1)


def assert_same_trajectories(got: dict, want: dict, mode: str, batch_size: int,
                             what: str, rounds: int = 40) -> None:
    """What async_trajectories must give whatever the order envs come back
    in.  In 'next_step' and 'same_step' modes every env is sent rounds
    times in the same batches of batch_size (recv returns exactly one whole
    batch, so the groups never mix), and every result is received: equal.
    In 'disabled' mode a done env drops out, batches shrink and mix, and the
    loop stops with up to batch_size - 1 envs out, mid-episode: which ones
    depends on the order, which depends on the threads (in-process with
    num_threads=2 against num_threads=0 as well; a test that asked for
    equal lengths failed about 1 run in 5 under load).  So there: every
    env's two trajectories agree as far as both go, those that ended are
    equal, and all but at most batch_size - 1 envs ended on each side."""
    for i in want:
        label = f"{what} {mode} env {i}"
        if mode != "disabled":
            assert got[i] == want[i], label
            continue
        common = min(len(got[i]), len(want[i]))
        assert common > 0 and got[i][:common] == want[i][:common], label
        for a, b in ((got[i], want[i]), (want[i], got[i])):
            if ended(a, rounds):  # its last result was a done: no further on the other side
                assert len(b) <= len(a), label
        if ended(got[i], rounds) and ended(want[i], rounds):
            assert got[i] == want[i], label
    if mode == "disabled":
        for side in (got, want):
            assert sum(not ended(t, rounds) for t in side.values()) < batch_size


def test_async_refusals_match_in_process_and_are_raised_by_the_next_call(served):
    """Sending a done env in 'disabled' mode: the send is posted through the
    doorbell (as over the socket), so the next call (here a recv) raises the
    daemon's refusal, with the message in-process send raises; the env stays
    usable."""
    _, client = served
    kwargs = dict(seed=0, batch_size=2, autoreset_mode="disabled", max_episode_steps=1)
    with client.make("CartPole-v1", 4, **kwargs) as remote, \
            envd.make("CartPole-v1", 4, **kwargs) as local:
        assert remote.fast_path
        messages = []
        for env in (remote, local):
            env.async_reset()
            ids = env.recv()[4]["env_id"]
            env.send(np.zeros(2, np.int64), ids)  # their episodes end (time limit 1)
            env.recv()
            done = env.recv()[4]["env_id"]
            with pytest.raises(envd.EnvStateError) as caught:
                env.send(np.zeros(1, np.int64), done[:1])
                env.recv()  # (through the daemon: raised here, before it asks anything)
            messages.append(str(caught.value))
            env.reset(options={"reset_mask": np.ones(4, bool)})  # usable: reset, then step
            env.step(np.zeros(4, np.int64))
        assert messages[0] == messages[1]
        assert "is done and autoreset_mode is 'disabled'" in messages[0]


def test_async_books_stay_with_the_doorbell(served):
    """While envs sent through the doorbell are out, the daemon refuses socket
    sends and recvs (the doorbell serves them) and turning the fast path off.
    Once they are received, all is allowed again.  (A reset follows the
    session's one rule, as in-process: refused while envs are in flight, and
    it forgets ready ones; test_daemon_async covers it.)"""
    _, client = served
    with client.make("CartPole-v1", 4, seed=0, batch_size=2) as env:
        env.async_reset()
        ids = env.recv()[4]["env_id"]
        env.send(np.zeros(2, np.int64), ids)
        for request in ({"type": "send", "session": env.session},
                        {"type": "recv", "session": env.session, "count": 1}):
            with pytest.raises(envd.EnvStateError, match="the fast path serves"):
                client.channel.request(request, [ids.tobytes()] if request["type"] == "send" else ())
        with pytest.raises(envd.EnvStateError, match="recv them first"):
            client.channel.request({"type": "fast", "session": env.session, "enable": False})
        env.recv(), env.recv()  # everything back
        assert env.reset()[0].shape == (4, 4)
        client.channel.request({"type": "fast", "session": env.session, "enable": False})


def test_the_fast_path_is_not_turned_on_over_envs_sent_through_the_socket(served):
    """Envs sent over the socket are collected by the daemon's event loop: a
    doorbell turned on over them would make a close free the session at once,
    on the loop, waiting there for their batch.  So it is refused until they
    are received, and allowed after."""
    _, client = served
    with client.make("CartPole-v1", 4, seed=0, batch_size=2, fast_path=False) as env:
        env.async_reset()
        ids = env.recv()[4]["env_id"]
        env.send(np.zeros(2, np.int64), ids)
        with pytest.raises(envd.EnvStateError, match="turning the fast path on"):
            client.channel.request({"type": "fast", "session": env.session})
        env.recv(), env.recv()  # everything back
        reply = client.channel.request({"type": "fast", "session": env.session})
        assert reply["doorbell"]["offset"] > 0


def test_a_doorbell_recv_takes_exactly_count_and_the_session_keeps_the_rest(served):
    """The client keeps no books: a recv through the doorbell takes exactly
    batch_size ids, the rest stay ready in the daemon's session (so turning
    the fast path off is refused until they are received), and the session's
    refusals come back through the doorbell with the in-process messages."""
    _, client = served
    with client.make("CartPole-v1", 6, seed=0, batch_size=2) as env, \
            envd.make("CartPole-v1", 6, seed=0, batch_size=2) as local:
        assert env.fast_path
        for e in (env, local):
            e.async_reset()
            assert e.recv()[4]["env_id"].tolist() == [0, 1]
            with pytest.raises(envd.EnvStateError, match="step\\(\\) while 4 envs wait for recv"):
                e.step(np.zeros(6, np.int64))
            with pytest.raises(envd.EnvStateError, match="env 2 is ready, not received yet"):
                e.send(np.zeros(1, np.int64), [2])
                e.recv()  # (through the daemon the send is posted: the next call raises)
        with pytest.raises(envd.EnvStateError, match="recv them first"):
            client.channel.request({"type": "fast", "session": env.session, "enable": False})
        for e in (env, local):
            e.send(np.zeros(2, np.int64), [0, 1])
            with pytest.raises(envd.EnvStateError, match="env 1 is (in flight|ready)"):
                e.send(np.zeros(1, np.int64), [1])
                e.recv()
            got = [e.recv()[4]["env_id"].tolist() for _ in range(3)]
            assert got[:2] == [[2, 3], [4, 5]] and sorted(got[2]) == [0, 1]
            with pytest.raises(envd.EnvStateError, match="only 0 are in flight or ready"):
                e.recv()
        client.channel.request({"type": "fast", "session": env.session, "enable": False})


def test_status_counts_async_env_steps(served):
    _, client = served
    before = client.status()["env_steps"]
    with client.make("Acrobot-v1", 6, seed=0, batch_size=3) as env:
        env.async_reset()
        sent = 0
        for _ in range(10):
            ids = env.recv()[4]["env_id"]
            env.send(np.zeros(3, np.int64), ids)
            sent += 3
        env.recv(), env.recv()  # everything sent is back
        wait_until(lambda: client.status()["env_steps"] - before == sent,
                   what=f"the {sent} env steps to be counted")
    assert client.status()["env_steps"] - before == sent  # closed: counted once


# ---- failures on either side --------------------------------------------------------------
#: An env whose steps take long enough to be caught in flight (how long
#: depends on the machine: a test that needs a length measures it, see
#: sized_slow_async_env).
SLOW = dict(env_id="ConnectFour-v0", num_envs=256, depth=8)


def slow_env(client, **kwargs):
    env = client.make(SLOW["env_id"], SLOW["num_envs"], seed=0, depth=SLOW["depth"], **kwargs)
    env.reset()
    return env


def slow_async_env(client, num_envs: int = SLOW["num_envs"]):
    """A slow env in async mode (batches of half its envs), all envs ready
    (async_reset)."""
    env = client.make(SLOW["env_id"], num_envs, seed=0, depth=SLOW["depth"],
                      batch_size=num_envs // 2)
    env.async_reset()
    return env


def batch_seconds(env) -> float:
    """The shortest of three wall times of one batch (half the envs, sent
    and received) of async env env, all of whose envs are ready: a
    measurement of this machine now, which load can only lengthen.  Leaves
    every env received (idle)."""
    half = env.num_envs // 2
    ids = env.recv()[4]["env_id"].copy()
    env.recv()
    took = []
    for _ in range(3):
        started = time.perf_counter()
        env.send(ids % 7, ids)
        assert len(env.recv()[4]["env_id"]) == half
        took.append(time.perf_counter() - started)
    return min(took)


def sized_slow_async_env(client, batch_s: float = 0.5):
    """A slow async env (all envs ready) with so many envs that one batch
    takes about batch_s seconds here: sized from a batch of SLOW timed on
    this machine, so that what a test catches in flight is in flight
    whatever the machine's speed.  (A busy machine made the measured batch
    longer, so the sized one shorter: at worst batch_s / the slowdown; and
    at most 2**17 envs, some 20 MiB of segment, which any machine steps
    in far more than the milliseconds the tests need.)"""
    with slow_async_env(client) as probe:
        scale = math.ceil(batch_s / batch_seconds(probe))
    return slow_async_env(client, min(SLOW["num_envs"] * scale, 1 << 17))


def fast_threads(pid: int) -> list[int]:
    """The daemon's doorbell threads (named envd-fast)."""
    tids = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as comm:
            if comm.read().strip() == "envd-fast":
                tids.append(int(tid))
    return tids


def cpu_ns(pid: int, tid: int) -> int:
    """The time thread tid of process pid has run on a CPU, in ns."""
    with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
        return int(stat.read().split()[0])


def test_daemon_killed_mid_recv_raises_connection_lost_at_once(harness):
    daemon = harness.daemon("--threads", "1")
    client = harness.connect(daemon, timeout=60)
    env = slow_async_env(client)
    assert env.fast_path
    env.recv(), env.recv()
    started = time.monotonic()
    killer = subprocess.Popen(["sh", "-c", f"sleep 0.03; kill -9 {daemon.pid}"])
    with pytest.raises(envd.ConnectionLostError, match="fast-path request"):
        # Until the kill lands, however long the killer takes to start: a
        # recv waiting for its batch when the daemon dies (batches are most
        # of each round's time).
        while time.monotonic() - started < DEADLINE:
            ids = np.arange(SLOW["num_envs"] // 2)
            env.send(ids % 7, ids)
            env.recv()
            env.send(ids % 7, ids + SLOW["num_envs"] // 2)
            env.recv()
    killer.wait()
    # (a ConnectionLostError, not the EnvdTimeoutError of the 60 s timeout)


def test_a_recv_timeout_says_so_and_the_env_refuses_async_calls_after_it(harness):
    daemon = harness.daemon("--threads", "1")
    client = harness.connect(daemon, timeout=60)
    env = slow_async_env(client)
    ids = env.recv()[4]["env_id"]
    env.recv()
    env.send(ids % 7, ids)
    # The send is posted, not awaited: stopped before it answered the send,
    # the daemon would time out the send instead (a loaded host did that).
    wait_until(lambda: env._stepper.doorbell.answered, what="the send's answer")
    # Stopped, the daemon cannot answer however fast the batch steps: the
    # timeout does not depend on how long a batch takes on this machine.
    daemon.signal(signal.SIGSTOP)
    client.timeout = 0.2
    try:
        with pytest.raises(envd.EnvdTimeoutError, match="fast-path recv"):
            env.recv()
    finally:
        daemon.signal(signal.SIGCONT)
    client.timeout = 60
    with pytest.raises(envd.EnvStateError, match="timed out"):
        env.recv()
    wait_until(lambda: env._stepper.doorbell.answered, what="the late answer")
    env.close()  # its session goes, the daemon serves on
    with client.make("CartPole-v1", 4, seed=0, batch_size=2) as fresh:
        fresh.async_reset()
        assert len(fresh.recv()[4]["env_id"]) == 2


def test_sigterm_while_a_recv_waits_answers_it_then_refuses(harness):
    """A recv waiting for its batch when the daemon drains gets its envs;
    new async work then fails with a clear error, and the daemon exits 0."""
    daemon = harness.daemon("--threads", "1")
    client = harness.connect(daemon, timeout=60)
    env = sized_slow_async_env(client)  # a batch of half a second or more here
    ids = env.recv()[4]["env_id"]
    env.recv()
    [server] = fast_threads(daemon.pid)
    env.send(ids % 7, ids)
    got: list = []
    before = cpu_ns(daemon.pid, server)
    receiver = threading.Thread(target=lambda: got.append(env.recv()[4]["env_id"].copy()))
    receiver.start()
    # Serving the recv, the thread runs the batch's chunks: once it has run
    # for 2 ms (far more than a spin), the recv is in service, not just rung.
    wait_until(lambda: got or cpu_ns(daemon.pid, server) - before > 2e6,
               what="the doorbell thread to serve the recv")
    assert not got, "the batch ended before the SIGTERM: the test did not catch a recv waiting"
    daemon.signal(signal.SIGTERM)
    receiver.join(DEADLINE)
    assert got and sorted(got[0].tolist()) == sorted(ids.tolist())

    def draining() -> bool:  # the signal lands asynchronously: wait for the drain
        try:
            return client.status()["draining"]
        except envd.ConnectionLostError:
            return True
    wait_until(draining, what="the daemon to drain")
    with pytest.raises((envd.ShuttingDownError, envd.ConnectionLostError)):
        env.send(ids % 7, ids)
    assert daemon.wait() == 0, daemon.log()
    assert segments_of(daemon.pid) == []


def test_daemon_killed_mid_step_raises_connection_lost_at_once(harness):
    daemon = harness.daemon("--threads", "1")
    client = harness.connect(daemon, timeout=60)
    env = slow_env(client)
    assert env.fast_path
    actions = np.arange(SLOW["num_envs"]) % 7
    env.step(actions)
    started = time.monotonic()
    killer = subprocess.Popen(["sh", "-c", f"sleep 0.03; kill -9 {daemon.pid}"])
    with pytest.raises(envd.ConnectionLostError, match="fast-path request"):
        # until the kill lands: a step in flight when the daemon dies
        while time.monotonic() - started < DEADLINE:
            env.step(actions)
    killer.wait()
    # (a ConnectionLostError, not the EnvdTimeoutError of the 60 s timeout)


TRAINER = textwrap.dedent("""
    import sys, numpy as np, envd
    client = envd.connect(sys.argv[1], timeout=60)
    if sys.argv[2] == "sync":
        env = client.make("ConnectFour-v0", 256, seed=0, depth=8)
        env.reset()
        print("ready", env.fast_path, flush=True)
        while True:
            env.step(np.arange(256) % 7)
    env = client.make("ConnectFour-v0", 256, seed=0, depth=8, batch_size=128)
    env.async_reset()
    print("ready", env.fast_path, flush=True)
    while True:  # a send, and a recv waiting for it
        ids = env.recv()[4]["env_id"]
        env.send(ids % 7, ids)
""")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_trainer_killed_mid_step_wedges_nothing(harness, tmp_path, mode):
    daemon = harness.daemon("--threads", "1", "--lease-timeout", "2")
    bystander = harness.connect(daemon)
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    trainer = subprocess.Popen([sys.executable, str(script), daemon.endpoint, mode],
                               stdout=subprocess.PIPE, text=True)
    harness.procs.append(trainer)
    assert trainer.stdout.readline().split() == ["ready", "True"]
    # Killed in its stepping loop, once the daemon has served it two steps'
    # worth (steps of ConnectFour are most of the loop's time: mid-step)
    wait_until(lambda: bystander.status()["env_steps"] >= 2 * 256, what="the trainer to step")
    trainer.kill()
    trainer.wait()
    # its session goes with the lease; the daemon's pool and threads keep serving
    wait_until(lambda: bystander.status()["sessions"] == 0, what="the killed trainer's session")
    with bystander.make("CartPole-v1", 4, seed=0) as env, \
            envd.make("CartPole-v1", 4, seed=0) as local:
        assert env.fast_path
        assert_same(env.reset()[0], local.reset()[0], "reset")
        for _ in range(50):
            assert_same(env.step(np.ones(4, np.int64))[0], local.step(np.ones(4, np.int64))[0],
                        "step")
    assert segments_of(daemon.pid) == []


FROZEN = textwrap.dedent("""
    import sys, numpy as np, envd
    client = envd.connect(sys.argv[1], timeout=30)
    env = client.make("CartPole-v1", 4, seed=0)
    env.reset()
    env.step(np.zeros(4, np.int64))
    print("ready", env.fast_path, flush=True)
    sys.stdin.readline()  # SIGSTOPped here, past the lease, then SIGCONTed
    try:
        env.step(np.zeros(4, np.int64))
    except envd.SessionExpiredError as exc:
        print("expired", type(exc).__name__, flush=True)
    else:
        print("stepped", flush=True)
""")


def test_a_client_frozen_past_its_lease_gets_session_expired(harness, tmp_path):
    daemon = harness.daemon("--threads", "1", "--lease-timeout", "1")
    observer = harness.connect(daemon)
    script = tmp_path / "frozen.py"
    script.write_text(FROZEN)
    proc = subprocess.Popen([sys.executable, str(script), daemon.endpoint],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    harness.procs.append(proc)
    assert proc.stdout.readline().split() == ["ready", "True"]
    proc.send_signal(signal.SIGSTOP)
    wait_until(lambda: observer.status()["sessions"] == 0, what="the lease to expire")
    proc.send_signal(signal.SIGCONT)
    out, _ = proc.communicate("go\n", timeout=DEADLINE)
    assert out.split() == ["expired", "SessionExpiredError"], out


def test_sigterm_mid_step_answers_it_then_refuses(harness):
    daemon = harness.daemon("--threads", "1")
    client = harness.connect(daemon, timeout=60)
    env = slow_env(client)
    actions = np.arange(SLOW["num_envs"]) % 7
    env.step(actions)
    killer = subprocess.Popen(["sh", "-c", f"sleep 0.03; kill -TERM {daemon.pid}"])
    outcomes = []
    started = time.monotonic()
    while time.monotonic() - started < DEADLINE:  # until the drain refuses, however late it lands
        try:
            env.step(actions)
            outcomes.append("ok")
        except (envd.ShuttingDownError, envd.ConnectionLostError) as exc:
            outcomes.append(type(exc).__name__)
            break
    killer.wait()
    assert outcomes[-1] in ("ShuttingDownError", "ConnectionLostError"), outcomes
    assert daemon.wait() == 0, daemon.log()
    assert segments_of(daemon.pid) == []


def test_a_timeout_keeps_the_buffers_off_limits_until_the_answer(harness):
    daemon = harness.daemon("--threads", "1")
    client = harness.connect(daemon, timeout=60)
    env = client.make(SLOW["env_id"], SLOW["num_envs"], seed=0, depth=SLOW["depth"])
    env.reset()
    # Stopped, the daemon answers the step only once continued: the timeout
    # does not depend on how long a step takes on this machine.
    daemon.signal(signal.SIGSTOP)
    try:
        client.timeout = 0.2
        with pytest.raises(envd.EnvdTimeoutError, match="fast-path step"):
            env.step(np.arange(SLOW["num_envs"]) % 7)
        client.timeout = 60
        with pytest.raises(envd.EnvStateError, match="timed out"):
            env.step(np.zeros(SLOW["num_envs"], np.int64))  # the daemon will step the buffers
        assert not env._stepper.doorbell.answered
    finally:
        daemon.signal(signal.SIGCONT)
    wait_until(lambda: env._stepper.doorbell.answered, what="the late answer")
    env.step(np.zeros(SLOW["num_envs"], np.int64))  # usable again


def _policy_becomes(tid: int, want: int) -> None:
    """Thread tid's scheduling policy is (or soon becomes) want: it changes
    it as it falls asleep."""
    wait_until(lambda: os.sched_getscheduler(tid) == want, what=f"thread {tid}'s policy {want}")


def test_the_thread_sleeps_under_sched_batch_after_a_sendrecv_only(served):
    """Woken by a SENDRECV (its trainer goes on after ringing), the thread
    must not preempt that trainer: it sleeps under SCHED_BATCH after one.
    After a step (its trainer waits for the answer) it sleeps under
    SCHED_OTHER, so that a busy machine's next tick does not delay it."""
    daemon, client = served
    may_batch = subprocess.run(  # (a throwaway process: the sandbox may refuse it)
        [sys.executable, "-c", "import os; os.sched_setscheduler(0, os.SCHED_BATCH, "
                               "os.sched_param(0))"], capture_output=True).returncode == 0
    if os.sched_getscheduler(daemon.pid) != os.SCHED_OTHER or not may_batch:
        pytest.skip("the thread switches policy only from SCHED_OTHER, where allowed")
    before = set(fast_threads(daemon.pid))
    with client.make("CartPole-v1", 4, seed=0, batch_size=2) as env:
        env.async_reset()
        env.recv(), env.recv()
        [added] = set(fast_threads(daemon.pid)) - before
        stepper = env._stepper
        for _ in range(2):
            stepper._ids[:4] = np.arange(4)
            stepper.doorbell.ring(doorbell.SENDRECV, 4)
            status, result, _ = stepper.doorbell.wait(time.monotonic() + DEADLINE, lambda: None)
            assert (status, result, stepper.doorbell.sent) == (0, 4, True)
            _policy_becomes(added, os.SCHED_BATCH)
            env.step(np.zeros(4, np.int64))  # (every env received: a sync step)
            _policy_becomes(added, os.SCHED_OTHER)


def _sleeps_in_futex(pid: int, tid: int) -> bool:
    """Thread tid of process pid is blocked in futex(2) (x86-64: 202); True
    where /proc does not say (a sandbox): server_asleep alone then stands
    for it, and a ring may come before the thread's FUTEX_WAIT (still
    answered at once: the kernel compares req_seq)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall") as syscall:
            return syscall.read().split()[0] == "202"
    except (OSError, IndexError):
        return True


def test_a_ring_wakes_the_thread_asleep_on_its_doorbell(served):
    """The client wakes the daemon's thread only when the thread said it
    sleeps (server_asleep, native/src/doorbell.h): the ring of a thread asleep
    on req_seq wakes it, so the step is answered at once; a ring that did
    not would be answered only when the thread's 200 ms sleep slice ran out,
    and the thread counts that in missed_rings.  (Between setting
    server_asleep and clearing it, the thread blocks on no futex but
    req_seq's.)"""
    daemon, client = served
    before = set(fast_threads(daemon.pid))
    with client.make("CartPole-v1", 4, seed=0) as env:
        env.reset(seed=0)
        [tid] = set(fast_threads(daemon.pid)) - before
        bell = env._stepper.doorbell
        wakes = []
        wake = bell._wake_server
        bell._wake_server = lambda: (wakes.append(bell.seq), wake())
        for _ in range(5):
            wait_until(lambda: bell._server_asleep[0] == 1 and _sleeps_in_futex(daemon.pid, tid),
                       what="the daemon's thread asleep on its doorbell")
            env.step(np.zeros(4, np.int64))
        assert len(wakes) == 5
        assert bell.missed_rings == 0


def test_close_stops_the_thread_and_a_later_step_says_closed(served):
    daemon, client = served
    before = fast_threads(daemon.pid)
    env = client.make("CartPole-v1", 2, seed=0)
    env.reset()
    [added] = set(fast_threads(daemon.pid)) - set(before)  # the session's thread
    bell = env._stepper.doorbell
    client.channel.request({"type": "close", "session": env.session})  # behind the env's back
    assert bell.closed and fast_threads(daemon.pid) == before  # stopped and joined
    assert not os.path.exists(f"/proc/{daemon.pid}/task/{added}")
    with pytest.raises(envd.UnknownSessionError):
        env.step(np.zeros(2, np.int64))
