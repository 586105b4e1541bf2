"""The client after things go wrong: a call that timed out while the daemon
still runs it, a make that timed out, a client garbage-collected unclosed,
messages over the daemon's limit; and the daemon's care with its endpoint."""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
from support.daemon import DEADLINE, DaemonProcess, segments_of, wait_until

import envd


@pytest.fixture
def stoppable(tmp_path):
    """A daemon the test may SIGSTOP; continued and stopped cleanly afterwards.
    Its lease (30 s) outlasts any stop of these tests, however slow the
    machine: a stopped daemon hears no heartbeat, and a short lease could
    expire the client as soon as it is continued."""
    proc = DaemonProcess(tmp_path / "daemon", "--threads", "1", "--lease-timeout", "30")
    try:
        yield proc
    finally:
        proc.signal(signal.SIGCONT)
        assert proc.stop() == 0, proc.log()
        assert segments_of(proc.pid) == []


def test_a_timed_out_step_keeps_the_buffers_until_the_daemon_finished_it(stoppable):
    with stoppable.connect(timeout=DEADLINE) as client, \
            envd.make("CartPole-v1", 8, seed=3) as local:
        remote = client.make("CartPole-v1", 8, seed=3)
        remote.reset()
        local.reset()
        requested = np.array([0, 1, 1, 0, 1, 0, 0, 1])
        stoppable.signal(signal.SIGSTOP)
        client.timeout = 1.0  # short only while the daemon cannot answer
        with pytest.raises(envd.EnvdTimeoutError):
            remote.step(requested)
        client.timeout = DEADLINE
        # The daemon may still run that step: a new call must not touch the
        # actions it reads, and says why.
        with pytest.raises(envd.EnvStateError, match="timed out or was interrupted and the daemon has not answered"):
            remote.step(1 - requested)
        assert remote._actions.tolist() == requested.tolist()
        stoppable.signal(signal.SIGCONT)
        # Once the late reply is in, the env is free again; the step that ran
        # is the one requested, and the env goes on normally.
        expected = local.step(requested)[0].copy()

        def free() -> bool:
            try:
                remote._check_buffers_free()
                return True
            except envd.EnvStateError:
                return False
        wait_until(free, what="the timed-out step's late reply")
        assert remote._obs.tobytes() == expected.tobytes()
        for _ in range(20):
            actions = local.action_space.sample()
            assert remote.step(actions)[0].tobytes() == local.step(actions)[0].tobytes()


def test_a_timed_out_make_is_closed_when_its_late_reply_comes(stoppable):
    with stoppable.connect(timeout=DEADLINE) as client:
        stoppable.signal(signal.SIGSTOP)
        client.timeout = 1.0  # short only while the daemon cannot answer
        with pytest.raises(envd.EnvdTimeoutError):
            client.make("CartPole-v1", 4, seed=0)
        client.timeout = DEADLINE
        stoppable.signal(signal.SIGCONT)
        # The daemon made the session after all; the client closes it with
        # its next requests instead of holding it against its limits.
        def late_reply_read() -> bool:
            client.status()  # reads what arrives before its own reply
            return not client.channel.unanswered
        wait_until(late_reply_read, what="the make's late reply")
        wait_until(lambda: client.status()["sessions"] == 0 and segments_of(stoppable.pid) == [],
                   what="the late session to close")
        env = client.make("CartPole-v1", 4, seed=0)
        env.reset()


def heartbeat_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "envd-heartbeat"}


def test_an_unclosed_client_stops_heartbeating_when_collected(tmp_path):
    with DaemonProcess(tmp_path / "daemon", "--threads", "1", "--lease-timeout", "2") as daemon:
        # (this client's thread, not a count: an earlier test's unclosed
        # client may stop its own when a collection comes)
        before = heartbeat_threads()
        env = envd.connect(daemon.endpoint, timeout=DEADLINE).make("CartPole-v1", 4, seed=0)
        env.reset()
        mine = heartbeat_threads() - before
        assert len(mine) == 1
        del env
        gc.collect()
        wait_until(lambda: not any(t.is_alive() for t in mine),
                   what="the heartbeat thread to stop")
        # Nobody keeps the lease alive: the daemon frees the session (2 s lease).
        wait_until(lambda: segments_of(daemon.pid) == [], what="the session to expire")
    assert daemon.proc.returncode == 0, daemon.log()


def test_a_message_over_the_limit_is_refused_by_the_client(tmp_path):
    with DaemonProcess(tmp_path / "small", "--max-message-bytes", "2000") as daemon, \
            daemon.connect(timeout=DEADLINE) as client:
        with pytest.raises(envd.LimitExceededError, match="--max-message-bytes"):
            client.make("CartPole-v1", 1000, seed=list(range(1000)))
        env = client.make("CartPole-v1", 4, seed=0)  # the connection is fine
        env.reset()
        assert client.status()["sessions"] == 1
    assert daemon.proc.returncode == 0


def test_the_daemon_refuses_to_bind_over_a_file_that_is_not_a_socket(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    run = subprocess.run([sys.executable, "-m", "envd", "--bind", f"ipc://{precious}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE)
    assert run.returncode == 1
    assert "is not a socket" in run.stderr
    assert precious.read_text() == "keep me"


def test_the_client_side_never_loads_the_native_core(tmp_path, daemon):
    # A trainer host that only talks to a daemon needs no compiled extension.
    code = (
        "import sys\n"
        "sys.modules['envd.native'] = None\n"
        "sys.modules['cffi'] = None\n"
        "import envd\n"
        f"with envd.connect({daemon.endpoint!r}, timeout=10) as client:\n"
        "    env = client.make('CartPole-v1', 2, seed=0)\n"
        "    env.reset()\n"
        "    print(env.step([0, 1])[1].tolist())\n"
        "assert not any(m.startswith('envd.native.') for m in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=DEADLINE, env={**os.environ})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[1.0, 1.0]"
