"""The daemon on a sanitizer build of its native core (tests/support/sanitized_build.py):
AddressSanitizer (+UBSan) and ThreadSanitizer runs of the real daemon under a
representative workload -- sync steps on a 2-thread pool, async batches in
flight, resets, sessions closed and expired with batches in flight, a killed
client, a plugin (built with the same sanitizer), the SIGTERM drain -- must
end with exit 0 and no report.

The clients run in this process on the normal build; only the daemon is
sanitized.  Each kind's build is cached in /tmp by a hash of native/ (a few
seconds when the C changes, nothing otherwise).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from support import abi5_checks
from support.builtin_envs import random_actions
from support.daemon import DEADLINE, DaemonProcess, segments_of, wait_until
from support.plugin_checks import BUILD_LINE, EXAMPLE_SOURCE, check_against_reference
from support.sanitized_build import SANITIZERS, reports_in, runtime, sanitized_env

import envd

KINDS = ["asan", "tsan"]

pytestmark = pytest.mark.timeout(300)


def _usable(kind: str) -> bool:
    try:
        runtime(kind)
        return True
    except (OSError, RuntimeError, subprocess.CalledProcessError):
        return False


def assert_no_report(daemon: DaemonProcess) -> None:
    log = daemon.log_path.read_text(errors="replace")  # DaemonProcess.log() needs it running
    assert not reports_in(log), log[-20000:]


def sanitized_plugin(kind: str, folder: Path, source: Path = EXAMPLE_SOURCE) -> Path:
    """examples/plugins/guess_number.c (or source), built with the documented
    line plus the sanitizer's flags (its step runs on the pool's workers)."""
    out = folder / f"lib{source.stem}_{kind}.so"
    line = BUILD_LINE.format(python=sys.executable, source=source, out=out)
    line += " -Wall -Wextra -Werror " + " ".join(SANITIZERS[kind][0])
    proc = subprocess.run(["bash", "-c", line], check=False, capture_output=True, text=True,
                          cwd="/")
    assert proc.returncode == 0, f"{line}\n{proc.stderr}"
    return out


@pytest.fixture(scope="module", params=KINDS)
def sanitized(request, tmp_path_factory):
    """A daemon on the `kind` build (2 worker threads, the example plugin).
    Afterwards: SIGTERM drains it, it exits 0, frees every segment, and its
    log has no sanitizer report."""
    kind = request.param
    if not _usable(kind):
        pytest.skip(f"gcc has no {kind} runtime")
    env = sanitized_env(kind)
    folder = tmp_path_factory.mktemp(kind)
    plugin = sanitized_plugin(kind, folder)
    abi5 = sanitized_plugin(kind, folder, abi5_checks.SOURCE)
    daemon = DaemonProcess(folder / "d", "--threads", "2", "--lease-timeout", "3",
                           "--plugin", str(plugin), "--plugin", str(abi5), env=env)
    try:
        maps = Path(f"/proc/{daemon.pid}/maps").read_text()
        # the daemon really runs the sanitized extension, under its runtime
        assert env["ENVD_NATIVE_OVERRIDE"] in maps and env["LD_PRELOAD"] in maps, maps
        yield kind, daemon
    finally:
        rc = daemon.stop()
    assert rc == 0, daemon.log_path.read_text(errors="replace")[-20000:]
    assert_no_report(daemon)
    assert segments_of(daemon.pid) == []


SYNC_RUNS = [  # env id, num_envs, steps, make kwargs
    ("CartPole-v1", 64, 30, {}),
    ("CartPole-v1", 200, 60, {"autoreset_mode": "same_step"}),  # final_observations
    ("Pendulum-v1", 33, 20, {}),
    ("MountainCar-v0", 17, 20, {"autoreset_mode": "disabled"}),
    ("MountainCarContinuous-v0", 9, 20, {}),
    ("Acrobot-v1", 4096, 15, {}),  # big steps: both workers run chunks
    ("Snake-v0", 257, 40, {}),
    ("ConnectFour-v0", 129, 40, {"autoreset_mode": "same_step"}),  # info fields
]


def test_sync_steps_and_resets_of_every_builtin_env(sanitized):
    _, daemon = sanitized
    rng = np.random.default_rng(0)
    with daemon.connect(timeout=DEADLINE) as client:
        for env_id, num_envs, steps, kwargs in SYNC_RUNS:
            with client.make(env_id, num_envs, seed=3, **kwargs) as env:
                env.reset()
                for t in range(steps):
                    obs, _, term, trunc, info = env.step(
                        random_actions(env.single_action_space, num_envs, rng))
                    if env_id == "ConnectFour-v0":
                        assert info["action_mask"].shape == (num_envs, 7)
                    if t == steps // 3:  # a seeded reset mid-run
                        env.reset(seed=t)
                    elif t == 2 * steps // 3 or (kwargs.get("autoreset_mode") == "disabled" \
                            and (term | trunc).any()):  # a masked reset
                        env.reset(options={"reset_mask": rng.random(num_envs) < 0.5})
                assert obs.shape[0] == num_envs
    assert_no_report(daemon)


def test_render_every_builtin_env(sanitized):
    """Frames drawn by the daemon's native core (raster.c, each env's render
    function) on its executor, beside the doorbell thread of the session."""
    _, daemon = sanitized
    rng = np.random.default_rng(1)
    with daemon.connect(timeout=DEADLINE) as client:
        for env_id in sorted({run[0] for run in SYNC_RUNS}):
            with client.make(env_id, 2, seed=4, render_mode="rgb_array") as env:
                env.reset()
                for _ in range(3):
                    env.step(random_actions(env.single_action_space, 2, rng))
                    frames = env.render()
                    assert len(frames) == 2 and frames[0].ndim == 3
    assert_no_report(daemon)


def test_async_batches_in_flight(sanitized):
    _, daemon = sanitized
    rng = np.random.default_rng(1)
    with daemon.connect(timeout=DEADLINE) as client:
        for env_id, num_envs, batch_size, rounds, mode in [
                ("Acrobot-v1", 1024, 256, 12, "next_step"), ("Snake-v0", 96, 16, 20, "same_step"),
                ("ConnectFour-v0", 64, 8, 25, "next_step"), ("CartPole-v1", 512, 1, 40, "same_step")]:
            with client.make(env_id, num_envs, seed=5, batch_size=batch_size,
                             autoreset_mode=mode) as env:
                env.async_reset()
                for _ in range(rounds):
                    ids = env.recv()[4]["env_id"]
                    assert len(np.unique(ids)) == batch_size
                    # several sends per recv: batches of different sizes in flight
                    for part in np.array_split(rng.permutation(ids), 3):
                        if len(part):
                            env.send(random_actions(env.single_action_space, len(part), rng),
                                     part)
    assert_no_report(daemon)


def test_capped_sessions_stepping_at_once(sanitized):
    """Sessions under thread caps of 0 and 1 (and one uncapped) on the
    2-thread pool, stepped by three threads at once, sync and async, over
    the fast path and the socket: the cap's slots (pool.c C1-C3) and the
    inline runs race with each other's workers; results match in-process."""
    _, daemon = sanitized
    errors = []

    def drive(client, cap, fast_path, seed):
        try:
            with client.make("Acrobot-v1", 2048, seed=seed, max_threads=cap,
                             fast_path=fast_path) as env, \
                    envd.make("Acrobot-v1", 2048, seed=seed, num_threads=0) as twin:
                rng = np.random.default_rng(seed)
                assert env.reset()[0].tobytes() == twin.reset()[0].tobytes()
                for _ in range(8):
                    actions = random_actions(env.single_action_space, 2048, rng)
                    assert env.step(actions)[0].tobytes() == twin.step(actions)[0].tobytes()
            with client.make("ConnectFour-v0", 64, seed=seed, batch_size=16, max_threads=cap,
                             fast_path=fast_path) as env:
                env.async_reset()
                for _ in range(12):
                    ids = env.recv()[4]["env_id"]
                    for part in np.array_split(ids, 2):
                        env.send(np.zeros(len(part), np.int64), part)
        except BaseException as exc:  # noqa: BLE001  (re-raised by the test's thread)
            errors.append(exc)

    with daemon.connect(timeout=DEADLINE) as a, daemon.connect(timeout=DEADLINE) as b, \
            daemon.connect(timeout=DEADLINE) as c:
        threads = [threading.Thread(target=drive, args=args) for args in
                   ((a, 0, True, 1), (b, 1, False, 2), (c, None, True, 3))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
    assert not errors, errors
    assert_no_report(daemon)


def test_close_with_batches_in_flight(sanitized):
    _, daemon = sanitized
    with daemon.connect(timeout=DEADLINE) as client:
        for _ in range(3):
            env = client.make("Acrobot-v1", 1 << 14, seed=0, batch_size=1 << 12)
            env.async_reset()
            for _ in range(2):
                ids = env.recv()[4]["env_id"]
                env.send(np.zeros(len(ids), np.int64), ids)
            env.close()  # up to 4 batches still stepping on the pool
        wait_until(lambda: segments_of(daemon.pid) == [], what="the closed sessions' segments")
        assert client.status()["sessions"] == 0
    assert_no_report(daemon)


KILLED_CLIENT = textwrap.dedent("""
    import sys, time, numpy as np, envd
    client = envd.connect(sys.argv[1], timeout=60)
    sync = client.make("Snake-v0", 512, seed=1)
    sync.reset()
    env = client.make("Acrobot-v1", 1 << 14, seed=0, batch_size=1 << 12)
    env.async_reset()
    for _ in range(3):
        ids = env.recv()[4]["env_id"]
        env.send(np.zeros(len(ids), np.int64), ids)
    print("sent", flush=True)
    time.sleep(600)
""")


def test_a_killed_client_with_batches_in_flight_expires(sanitized):
    _, daemon = sanitized
    proc = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, daemon.endpoint],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        assert proc.stdout.readline() == "sent\n", proc.stderr.read()
        proc.kill()
    finally:
        proc.kill()
        proc.wait()
    # nobody renews the lease (3 s): the daemon frees both sessions
    wait_until(lambda: segments_of(daemon.pid) == [], what="the dead client's sessions to expire")
    assert_no_report(daemon)


def test_plugin_env_sync_and_async(sanitized):
    _, daemon = sanitized
    with daemon.connect(timeout=DEADLINE) as client:
        with client.make("GuessNumber-v0", 12, seed=5, penalty=0.5) as env:
            assert check_against_reference(env, 5, 0.5) > 12
        with client.make("GuessNumber-v0", 40, seed=2, batch_size=8) as env:
            env.async_reset()
            for _ in range(20):
                ids = env.recv()[4]["env_id"]
                env.send(np.full(len(ids), 50, np.int64), ids)
    assert_no_report(daemon)


def test_abi5_env_sync_and_async(sanitized):
    """ABI 5 (the described spaces' arena, the seed callback, the
    self-resetting step and its episode log) in the sanitized daemon."""
    _, daemon = sanitized
    with daemon.connect(timeout=DEADLINE) as client:
        with client.make(abi5_checks.ENV_ID, 5, seed=10, size=5, agents=2,
                         episode_len=3) as env:
            abi5_checks.check_episodes(env, 10, 5, 2, 3)
        with client.make(abi5_checks.ENV_ID, 4, seed=3, batch_size=2, episode_len=2) as env:
            abi5_checks.check_async(env, 2)
        with pytest.raises(envd.InvalidArgumentError, match="out of memory"):
            client.make(abi5_checks.ENV_ID, 2, size=8)  # past the describe bound
    assert_no_report(daemon)


def test_sigterm_drains_a_step_and_a_batch_in_flight(sanitized, tmp_path):
    """A second daemon of the same kind, stopped by SIGTERM while one session
    steps in a loop (sync) and another has a big batch in flight."""
    kind, _ = sanitized
    with DaemonProcess(tmp_path / "d", "--threads", "2", env=sanitized_env(kind)) as daemon:
        client, stepping = daemon.connect(timeout=DEADLINE), daemon.connect(timeout=DEADLINE)
        sync = stepping.make("Snake-v0", 1 << 12, seed=0)
        sync.reset()
        errors: list[BaseException] = []

        def step_until_refused():
            actions = np.zeros(sync.num_envs, np.int64)
            try:
                while True:
                    sync.step(actions)
            except BaseException as exc:  # noqa: BLE001 -- checked below
                errors.append(exc)

        stepper = threading.Thread(target=step_until_refused, daemon=True)
        stepper.start()
        env = client.make("Acrobot-v1", 1 << 15, seed=0, batch_size=1 << 14)
        env.async_reset()
        ids = env.recv()[4]["env_id"]
        env.send(np.zeros(len(ids), np.int64), ids)
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0, daemon.log_path.read_text(errors="replace")[-20000:]
        stepper.join(DEADLINE)
        assert not stepper.is_alive()
        assert isinstance(errors[0], (envd.ShuttingDownError, envd.ConnectionLostError)), errors
        assert segments_of(daemon.pid) == []
        for c in (client, stepping):
            c.timeout = 2.0
            c.close()
    assert_no_report(daemon)


@pytest.mark.parametrize("kind", KINDS)
def test_the_sanitizer_catches_a_bug_in_the_native_core(kind, tmp_path):
    """The control: the same build and environment report a real bug in
    envd's C (ASan: a vec whose observation buffer is half too small; TSan: two
    threads stepping one vec at once) -- so a clean run above means something."""
    if not _usable(kind):
        pytest.skip(f"gcc has no {kind} runtime")
    code = textwrap.dedent("""
        import sys, threading, numpy as np
        import envd
        sys.path.insert(0, sys.argv[2])  # (tests/: the tests' bare vec)
        from support.native_vec import NativeVec
        from envd.native.registry import get_spec
        from envd.buffer_layout import buffer_layout
        from gymnasium.vector import AutoresetMode
        spec, n = get_spec("CartPole-v1"), 4096
        layout = buffer_layout(spec.observation_space, spec.action_space, n,
                               AutoresetMode.NEXT_STEP,
                               spec.info_fields)
        buffers = {k: np.zeros(shape, dtype) for k, (shape, dtype) in layout.items()}
        if sys.argv[1] == "asan":
            buffers["observations"] = np.zeros((n // 2, 4), np.float32)
        vec = NativeVec(spec, n, autoreset_mode=0, max_episode_steps=500, params=None,
                        buffers=buffers, pool=None)
        vec.reset(False, False)
        def run():
            for _ in range(200):
                vec.step()
        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads: t.start()
        for t in threads: t.join()
        print("no report")
    """)
    proc = subprocess.run([sys.executable, "-c", code, kind, str(Path(__file__).parents[1])],
                          check=False, capture_output=True,
                          text=True,
                          cwd=tmp_path, env={**os.environ, **sanitized_env(kind)},
                          timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and reports_in(out), out[-8000:]
    # the report points into envd's own sources
    assert "native/src/" in out, out[-8000:]
