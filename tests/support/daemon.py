"""Start real daemon processes for tests, and wait for things without flakiness.

Every wait polls with a generous deadline (a loaded 2-core machine may be slow;
a fast one does not wait longer).  A daemon runs on a temporary ipc endpoint,
from a temporary working directory (so that no file of the test's cwd ever
shadows the installed package), and logs to a file the failing test prints.
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

import envd

#: Deadline of every wait in the integration tests (seconds).
DEADLINE = 60.0


def wait_until(condition: Callable[[], bool], timeout: float = DEADLINE, what: str = "condition") -> None:
    """Poll condition every 20 ms until it is true; AssertionError after timeout."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def segments_of(pid: int) -> list[str]:
    """The shared-memory segments of the daemon with this pid (in its
    --shm-namespace, if it has one)."""
    mine = re.compile(rf"envd-(?:[a-z][a-z0-9]*-)?{pid}-")
    return sorted(n for n in os.listdir("/dev/shm") if mine.match(n))


def private_namespace() -> str:
    """A --shm-namespace no other test's daemon has: a test whose daemon must
    sweep what an earlier one left is not raced by other daemons starting on
    the machine (each sweeps its own namespace only)."""
    return "t" + secrets.token_hex(6)


def status_bytes(pid: int, field: str) -> int:
    """A memory field of /proc/<pid>/status (VmRSS, VmHWM...), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) << 10
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def rss_bytes(pid: int) -> int:
    """The process's resident memory now, in bytes."""
    return status_bytes(pid, "VmRSS")


def peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM), in bytes."""
    return status_bytes(pid, "VmHWM")


def skip_unless_envd_runs_as(setpriv: Sequence[str]) -> None:
    """Skip (saying why) when the user setpriv switches to cannot import envd
    from this interpreter (e.g. a virtualenv in a private folder; .ci/run
    makes its own readable, so CI runs these tests)."""
    import pytest
    done = subprocess.run([*setpriv, sys.executable, "-c", "import envd.tools.cli"], cwd="/",
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"another user cannot run {sys.executable} with envd: "
                    f"{done.stderr.strip()[-200:]}")


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat (R, S, T for stopped, Z...)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def all_threads_stopped(pid: int) -> bool:
    """Every thread of process pid is stopped (state T).  The main thread's
    state alone says too little: a group stop reaches each thread in turn,
    and a thread running on another CPU (the doorbell thread, a pool
    worker) may still answer a request until its own stop lands."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:  # a thread that exited meanwhile
            continue
    # (a thread on its way out, Z or X, runs nothing either)
    return "T" in states and all(state in "TtZX" for state in states)


class DaemonProcess:
    """An `envd` daemon subprocess serving ipc://<folder>/envd.sock."""

    def __init__(self, folder: Path, *args: str, env: dict[str, str] | None = None,
                 prefix: Sequence[str] = ()):
        """prefix: a command that execs the daemon's argv (e.g. unshare ...
        sh -c '... && exec "$0" "$@"'), so that the pid is still the daemon's."""
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.endpoint = f"ipc://{folder}/envd.sock"
        self.log_path = folder / "envd.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 -- the daemon's, closed by close()
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "envd", "--bind", self.endpoint, *args],
            cwd=folder, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})})
        self.pid = self.proc.pid
        try:
            wait_until(self._answers, what=f"the daemon at {self.endpoint} to answer")
        except BaseException:
            self.stop()
            raise

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the daemon exited with {self.proc.returncode}:\n{self.log()}")
        try:
            with envd.connect(self.endpoint, timeout=2):
                return True
        except (envd.ConnectionLostError, envd.EnvdTimeoutError):
            return False

    def connect(self, timeout: float = 30.0) -> envd.Client:
        return envd.connect(self.endpoint, timeout=timeout)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        """Send signum; for SIGSTOP, return once every thread of the daemon
        is stopped (the signal lands asynchronously, thread by thread, and a
        fast-path request is answered within microseconds: a test that means
        "stopped" must not race it)."""
        self.proc.send_signal(signum)
        if signum == signal.SIGSTOP:
            wait_until(lambda: all_threads_stopped(self.pid), what="every daemon thread to stop")

    def wait(self, timeout: float = DEADLINE) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> int:
        """SIGTERM, wait for the drain; SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def seconds_to_time_out(daemons: Sequence[DaemonProcess], clients: Sequence, timeout: float,
                        call: Callable[[], object]) -> tuple[float, BaseException]:
    """With every daemon stopped (SIGSTOP) and the clients' timeout set to
    timeout: the seconds call() took to raise EnvdTimeoutError, and the
    error.  The daemons are continued and the clients' timeouts put back
    afterwards, whatever call() did."""
    for daemon in daemons:
        daemon.signal(signal.SIGSTOP)
    before = [client.timeout for client in clients]
    try:
        for client in clients:
            client.timeout = timeout
        started = time.monotonic()
        try:
            call()
        except envd.EnvdTimeoutError as error:
            return time.monotonic() - started, error
        raise AssertionError("the call did not time out")
    finally:
        for daemon in daemons:
            daemon.proc.send_signal(signal.SIGCONT)
        for client, seconds in zip(clients, before):
            client.timeout = seconds


@contextlib.contextmanager
def left_clean(procs: Sequence[DaemonProcess]) -> Iterator[None]:
    """On leaving (procs may grow meanwhile): every session must be closed
    (polled), then each daemon is stopped whatever happened and must drain
    to exit 0 leaving no segment."""
    try:
        yield
        for proc in procs:
            with proc.connect() as probe:
                wait_until(lambda: probe.status()["sessions"] == 0, what="every session closed")
    finally:
        codes = [proc.stop() for proc in procs]
    for proc, code in zip(procs, codes):
        assert code == 0, proc.log()
        assert segments_of(proc.pid) == []


@contextlib.contextmanager
def daemon_group(folder: Path, *flag_lists: Sequence[str]) -> Iterator[list[DaemonProcess]]:
    """Daemons started with each of flag_lists (in folder/daemon<k>), for the
    tests that drive several at once (a MultiClient's), left clean (left_clean)."""
    procs: list[DaemonProcess] = []
    with left_clean(procs):
        for k, flags in enumerate(flag_lists):
            procs.append(DaemonProcess(folder / f"daemon{k}", *flags))
        yield procs


def start_daemon(folder: Path, *args: str) -> DaemonProcess:
    """A daemon with 2 threads and a 10 s lease (tests add flags in args)."""
    return DaemonProcess(folder, "--threads", "2", "--lease-timeout", "10", *args)


def stop_daemon(proc: DaemonProcess) -> None:
    """Stop it: it must exit 0 and leave no segment."""
    code = proc.stop()
    assert code == 0, proc.log()
    assert segments_of(proc.pid) == [], proc.log()


class Bystander:
    """A well-behaved client with envs made before an attack (or before limits
    are hit), and in-process twins to compare every step with."""

    ENVS = (("CartPole-v1", 8, 11), ("Pendulum-v1", 4, 12))

    def __init__(self, daemon: DaemonProcess, envs=ENVS):
        self.daemon = daemon
        self.rng = np.random.default_rng(2024)
        self.client = daemon.connect()
        self.pairs = []
        try:
            for env_id, num_envs, seed in envs:
                local = envd.make(env_id, num_envs, seed=seed)
                self.pairs.append((self.client.make(env_id, num_envs, seed=seed), local))
            for remote, local in self.pairs:
                assert remote.reset()[0].tobytes() == local.reset()[0].tobytes()
            self.step_and_compare(3)
        except BaseException:
            self.close()
            raise

    def step_and_compare(self, steps: int) -> None:
        for _ in range(steps):
            for remote, local in self.pairs:
                space = local.single_action_space
                if hasattr(space, "n"):
                    actions = self.rng.integers(0, space.n, size=local.num_envs)
                else:
                    actions = self.rng.uniform(-3, 3, (local.num_envs, *space.shape)).astype(space.dtype)
                for a, b in zip(remote.step(actions)[:4], local.step(actions)[:4]):
                    assert a.dtype == b.dtype and a.shape == b.shape
                    assert a.tobytes() == b.tobytes()

    def check(self) -> None:
        """The daemon survived and still serves this client correctly."""
        assert self.daemon.proc.poll() is None, self.daemon.log()
        self.step_and_compare(20)
        status = self.client.status()
        assert status["pid"] == self.daemon.pid and status["sessions"] >= len(self.pairs)

    def close(self) -> None:
        for _remote, local in self.pairs:
            local.close()
        self.client.close()


class Harness:
    """Daemons, clients, processes and stray files of one test, all cleaned
    up after it (see the `harness` fixture in conftest.py)."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.daemons: list[DaemonProcess] = []
        self.clients: list[envd.Client] = []
        self.procs: list = []  # subprocess.Popen or multiprocessing.Process
        self.files: list[str] = []

    def daemon(self, *args: str, env: dict[str, str] | None = None,
               folder: Path | None = None) -> DaemonProcess:
        proc = DaemonProcess(folder or self.tmp_path / f"daemon{len(self.daemons)}", *args, env=env)
        self.daemons.append(proc)
        return proc

    def connect(self, daemon: DaemonProcess, timeout: float = 30.0) -> envd.Client:
        client = daemon.connect(timeout)
        self.clients.append(client)
        return client

    def popen(self, *args, **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(*args, **kwargs)
        self.procs.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.procs:
            if isinstance(proc, subprocess.Popen):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)  # a test may have stopped it
                    proc.kill()
                proc.wait()
            elif proc.is_alive():
                proc.kill()
                proc.join(DEADLINE)
        for daemon in self.daemons:
            if daemon.proc.poll() is None:
                daemon.proc.send_signal(signal.SIGCONT)  # a test may have stopped it
        for client in self.clients:
            # A client whose daemon is gone waits its whole timeout on every
            # request after the first: keep closing short.
            client.timeout = 2.0
            client.close()
        for daemon in self.daemons:
            daemon.stop()
            for name in segments_of(daemon.pid):
                os.unlink(f"/dev/shm/{name}")
        for path in self.files:
            if os.path.exists(path):
                os.unlink(path)


def in_bounds_actions(space, num_envs: int, rng: np.random.Generator) -> np.ndarray:
    """A batch of actions inside the space (conftest.random_actions also
    goes beyond Box bounds)."""
    from gymnasium import spaces
    if isinstance(space, spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=num_envs, dtype=np.int64)
    return rng.uniform(space.low, space.high, size=(num_envs, *space.shape)).astype(space.dtype)


def same_results(got, want) -> bool:
    """Two step results are equal: arrays bit for bit, the same info keys,
    and the same episode returns and lengths (their times are wall clock)."""
    if not all(a.tobytes() == b.tobytes() for a, b in zip(got[:4], want[:4])):
        return False
    if sorted(got[4]) != sorted(want[4]):
        return False
    if "envd_episode" in want[4]:
        return all(got[4]["envd_episode"][k].tobytes() == want[4]["envd_episode"][k].tobytes()
                   for k in ("r", "l"))
    return True


class TwinStepper(threading.Thread):
    """Steps a daemon env and an in-process twin (same id, seed, actions) in
    lockstep until halted; remembers the first mismatch or error."""

    def __init__(self, client: envd.Client, env_id: str, num_envs: int, seed: int, **kwargs):
        super().__init__(daemon=True)
        self.remote = client.make(env_id, num_envs, seed=seed, **kwargs)
        self.local = envd.make(env_id, num_envs, seed=seed, num_threads=0, **kwargs)
        self.rng = np.random.default_rng(seed)
        self.steps = 0
        self.error: BaseException | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            if self.remote.reset()[0].tobytes() != self.local.reset()[0].tobytes():
                raise AssertionError("reset differs from the twin")
            space = self.remote.single_action_space
            while not self.halt.is_set():
                actions = in_bounds_actions(space, self.remote.num_envs, self.rng)
                if not same_results(self.remote.step(actions), self.local.step(actions)):
                    raise AssertionError(f"step {self.steps + 1} differs from the twin")
                self.steps += 1
        except BaseException as exc:  # noqa: BLE001 -- reported by finish()
            self.error = exc

    def finish(self, expect_error: bool = False) -> None:
        self.halt.set()
        self.join(DEADLINE)
        assert not self.is_alive(), "the stepping thread hangs"
        self.local.close()
        if self.error is not None and not expect_error:
            raise AssertionError(f"the stepping client noticed: {self.error!r}") from self.error
