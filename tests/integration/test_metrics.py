"""--metrics-port: a real daemon's Prometheus endpoint, scraped over HTTP while
envs are made, stepped (sync and async), misused and closed."""
from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families
from support.daemon import DaemonProcess, stop_daemon, wait_until

import envd
from envd import protocol


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def moved(before, after, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture
def metered(tmp_path):
    port = free_port()
    daemon = DaemonProcess(tmp_path / "d", "--threads", "2", "--lease-timeout", "10",
                           "--metrics-port", str(port))
    try:
        yield daemon, port
    finally:
        daemon.stop()


def test_the_counters_move_as_stepping_happens(metered, monkeypatch):
    # Socket path only: the latency histogram times steps over the socket.
    monkeypatch.setenv("ENVD_FAST_PATH", "0")
    daemon, port = metered
    start = scrape(port)
    assert value(start, "envd_pool_threads") == 2
    assert value(start, "envd_sessions") == value(start, "envd_envs") == 0
    assert value(start, "envd_env_steps_total") == 0
    assert value(start, "process_resident_memory_bytes") > 0  # the process collector
    client = daemon.connect()
    try:
        cartpole = client.make("CartPole-v1", 8, seed=1)
        pendulum = client.make("Pendulum-v1", 4, seed=2)
        opened = scrape(port)
        assert value(opened, "envd_sessions") == 2
        assert value(opened, "envd_envs") == 12
        assert value(opened, "envd_clients") == 1
        assert value(opened, "envd_shm_bytes") > 0
        assert value(opened, "envd_state_bytes") > 0
        cartpole.reset()
        pendulum.reset()
        for _ in range(5):
            cartpole.step(np.zeros(8, np.int64))
        for _ in range(3):
            pendulum.step(np.zeros((4, 1), np.float32))
        # a bad step: refused with invalid_action, counted as an error, not as steps
        with pytest.raises(envd.InvalidActionError):
            cartpole.step(np.array([0, 7, 0, 0, 0, 0, 0, 0]))
        with envd.connect(daemon.endpoint):  # a second client
            wait_until(lambda: value(scrape(port), "envd_clients") == 2, what="2 clients")
        # async: 4 sends of 3 envs each
        with client.make("CartPole-v1", 6, seed=3, batch_size=3) as batched:
            batched.async_reset()
            ids = batched.recv()[4]["env_id"]
            for _ in range(4):
                batched.send(np.zeros(3, np.int64), ids)
                ids = batched.recv()[4]["env_id"]
        stepped = scrape(port)
        assert moved(start, stepped, "envd_env_steps_total") == 8 * 5 + 4 * 3 + 4 * 3
        assert moved(start, stepped, "envd_env_steps_by_env_total", env_id="CartPole-v1") == 8 * 5 + 12
        assert moved(start, stepped, "envd_env_steps_by_env_total", env_id="Pendulum-v1") == 4 * 3
        assert value(stepped, "envd_env_steps_total") == client.status()["env_steps"]
        assert moved(start, stepped, "envd_step_latency_seconds_count") == 5 + 3  # sync steps
        assert moved(start, stepped, "envd_step_latency_seconds_sum") > 0
        assert value(stepped, "envd_step_latency_seconds_bucket", le="+Inf") == 8
        assert moved(start, stepped, "envd_errors_total", code="invalid_action") == 1
        jobs = (moved(start, stepped, "envd_inline_jobs_total")
                + moved(start, stepped, "envd_pooled_jobs_total"))
        assert jobs >= 5 + 3 + 4, jobs  # one job per sync step or send (resets may add some)
        assert value(stepped, "envd_sessions") == 2  # the async session is closed
        cartpole.close()
        pendulum.close()
        closed = scrape(port)
        assert value(closed, "envd_sessions") == value(closed, "envd_envs") == 0
        assert value(closed, "envd_shm_bytes") == 0
        assert value(closed, "envd_state_bytes") == 0
        # counters never go back: the jobs of closed sessions stay counted
        assert value(closed, "envd_inline_jobs_total") >= value(stepped, "envd_inline_jobs_total")
        assert value(closed, "envd_pooled_jobs_total") >= value(stepped, "envd_pooled_jobs_total")
        assert (value(closed, "envd_inline_jobs_total") + value(closed, "envd_pooled_jobs_total")
                >= jobs)
        assert value(closed, "envd_env_steps_total") == value(stepped, "envd_env_steps_total")
    finally:
        client.close()
    wait_until(lambda: value(scrape(port), "envd_clients") == 0, what="the client's bye")


def test_an_expired_lease_is_counted(tmp_path):
    port = free_port()
    # (a lease a loaded machine's stall between hello and make cannot outlast)
    with DaemonProcess(tmp_path / "d", "--threads", "1", "--lease-timeout", "2",
                       "--metrics-port", str(port)) as daemon:
        # a raw client (no heartbeat thread) that says hello, makes an env and goes silent
        context = zmq.Context()
        raw = context.socket(zmq.DEALER)
        try:
            raw.connect(daemon.endpoint)
            for header in ({"type": "hello", "id": 1, "version": protocol.PROTOCOL_VERSION},
                           {"type": "make", "id": 2, "env_id": "CartPole-v1", "num_envs": 3}):
                raw.send(protocol.pack(header))
                assert protocol.unpack(raw.recv_multipart()[0], 1 << 20)["ok"]
            wait_until(lambda: value(scrape(port), "envd_lease_expiries_total") == 1,
                       what="the silent client's lease to expire")
            samples = scrape(port)
            assert value(samples, "envd_lease_expired_sessions_total") == 1
            assert value(samples, "envd_sessions") == value(samples, "envd_clients") == 0
        finally:
            raw.close(0)
            context.term()


def test_a_taken_port_refuses_to_start(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "envd", "--bind",
                               f"ipc://{tmp_path}/envd.sock", "--metrics-port", str(port)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "--metrics-port" in done.stderr and str(port) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "envd.sock").exists()


def test_without_the_flag_nothing_listens(tmp_path):
    port = free_port()
    daemon = DaemonProcess(tmp_path / "d", "--threads", "1")
    try:
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    finally:
        stop_daemon(daemon)
