"""Hosted Python envs served by a daemon (--python-env, --import): the same
trajectories as gymnasium's SyncVectorEnv over both transports, sync and
async; only the ids the operator allowed; env failures as envd.EnvError with
the daemon and its other sessions intact; and no process left behind when the
daemon is stopped (SIGTERM) or killed (SIGKILL) with hosted sessions open."""
from __future__ import annotations

import functools
import os
import signal
from pathlib import Path

import daemon_envs  # noqa: F401  (registers the fixtures' ids for the reference envs)
import gymnasium as gym
import numpy as np
import pytest
from envs import DAEMON_ENV, alive, children, descendants, wait_until
from equivalence import MODES, assert_same, async_env_runs, compare_runs, per_env_action_batches, sync_env_runs
from support.daemon import DaemonProcess, left_clean

import envd

HERE = Path(__file__).parent
FIXTURES = ("envd-test/DictObs-v0", "envd-test/MultiDiscrete-v0")
ALLOWED = ("CartPole-v1", "Acrobot-v1", "Pendulum-v1", "envd-test/Raising-v0",
           "envd-test/Exiting-v0", "envd-test/Hanging-v0", "envd-test/ColumnInfo-v0", *FIXTURES)
FLAGS = ("--threads", "1", "--lease-timeout", "20", "--import", "daemon_envs",
         *(arg for env_id in ALLOWED for arg in ("--python-env", env_id)))
ENV = DAEMON_ENV
NUM_ENVS, STEPS = 5, 40


def start(folder: Path, *extra: str, variables: dict[str, str] | None = None) -> DaemonProcess:
    """A daemon serving the test envs, with `variables` added to its environment."""
    return DaemonProcess(folder, *FLAGS, *extra, env={**ENV, **(variables or {})})



@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    proc = start(tmp_path_factory.mktemp("hosted") / "daemon")
    with left_clean([proc]):
        yield proc


#: how a client's envs step: the doorbell (the fast path), the socket over
#: shared memory, the socket with the arrays in the messages
PATHS = {"fast": {"transport": "shm", "fast_path": True},
         "socket": {"transport": "shm", "fast_path": False},
         "inline": {"transport": "inline"}}


@pytest.fixture(scope="module", params=list(PATHS))
def client(daemon, request):
    with daemon.connect() as c:
        c.make = functools.partial(c.make, **PATHS[request.param])
        yield c


@pytest.mark.parametrize("env_id,num_workers,mode",
                         [("CartPole-v1", w, "next_step") for w in (1, 2, 3)]
                         + [("CartPole-v1", 2, m) for m in ("same_step", "disabled")]
                         + [("Acrobot-v1", w, "next_step") for w in (1, 2, 3)]
                         + [("Pendulum-v1", w, "next_step") for w in (1, 2)]
                         + [(e, w, "next_step") for e in FIXTURES for w in (1, 3)]
                         + [(e, 2, "same_step") for e in FIXTURES])
def test_equal_to_sync_vector_env(client, env_id, num_workers, mode):
    """Every result (observations of any space, float64 rewards, flags,
    infos) equals SyncVectorEnv's, over both transports (worker count 0 is
    the in-process tests': the daemon never steps envs in its own process)."""
    ref = gym.make_vec(env_id, NUM_ENVS, vectorization_mode="sync", max_episode_steps=15,
                       vector_kwargs={"autoreset_mode": MODES[mode]})
    env = client.make("py:" + env_id, NUM_ENVS, seed=7, num_workers=num_workers,
                      autoreset_mode=mode, max_episode_steps=15, episode_statistics=False)
    try:
        compare_runs(env, ref, mode, STEPS, seed=7, action_seed=3, masked_reset_at=20)
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("num_workers,mode", [(2, "next_step"), (1, "same_step")])
def test_info_columns_and_deviating_infos_equal_sync(client, num_workers, mode):
    """An env's infos as columns of the client's segment, and those that
    deviate from them (past each env's 64th step) as encoded slots, merge
    as SyncVectorEnv's (tests/hosted/test_hosted_info_columns.py)."""
    env_id = "envd-test/ColumnInfo-v0"
    ref = gym.make_vec(env_id, 4, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": MODES[mode]})
    env = client.make("py:" + env_id, 4, seed=5, num_workers=num_workers, autoreset_mode=mode,
                      episode_statistics=False)
    try:
        assert "info_column.vec" in env._buffers
        compare_runs(env, ref, mode, 110, seed=5, masked_reset_at=40)
    finally:
        env.close()
        ref.close()


def test_async_send_recv_matches_each_env_stepped_alone(client):
    """batch_size < num_envs: each env's trajectory (its actions a function of
    the env and its step count) equals the same env in a SyncVectorEnv."""
    num_envs, batch, rounds = 6, 2, 30
    env = client.make("py:CartPole-v1", num_envs, seed=11, num_workers=2, batch_size=batch)
    seen = {i: [] for i in range(num_envs)}
    try:
        env.async_reset()
        for _ in range(rounds):
            obs, _, _, _, info = env.recv()
            ids = info["env_id"]
            for row, i in zip(obs, ids):
                seen[int(i)].append(row.copy())
            env.send(np.array([(int(i) + len(seen[int(i)])) % 2 for i in ids]), ids)
        env.recv()  # the last batch sent
    finally:
        env.close()
    ref = gym.make_vec("CartPole-v1", num_envs, vectorization_mode="sync")
    expected = {i: [] for i in range(num_envs)}
    obs, _ = ref.reset(seed=11)
    for k in range(1, max(map(len, seen.values())) + 1):
        for i in range(num_envs):
            expected[i].append(obs[i].copy())
        obs = ref.step(np.array([(i + k) % 2 for i in range(num_envs)]))[0]
    assert sum(map(len, seen.values())) == rounds * batch
    for i in range(num_envs):
        for k, row in enumerate(seen[i]):
            assert np.array_equal(row, expected[i][k]), (i, k)


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_async_dict_spaces_and_infos_equal_sync(client, mode):
    """Dict observations, Tuple actions and infos through async send/recv:
    each env's records equal its records in gymnasium's SyncVectorEnv."""
    env_id, num_envs, steps = "envd-test/DictObs-v0", 6, 30
    ref = gym.make_vec(env_id, num_envs, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": MODES[mode]})
    actions = per_env_action_batches(ref.single_action_space, num_envs, steps, seed=4)
    expected = sync_env_runs(ref, actions, steps, seed=11)
    ref.close()
    with client.make("py:" + env_id, num_envs, seed=11, num_workers=2, autoreset_mode=mode,
                     batch_size=2, episode_statistics=False) as env:
        runs = async_env_runs(env, actions, steps, np.random.default_rng(1))
    assert sum(map(len, runs)) >= num_envs * steps
    for i in range(num_envs):
        assert_same(runs[i], expected[i][:len(runs[i])], f"env {i}")


def test_spaces_infos_and_limits_over_the_wire(client):
    """The make reply's spaces rebuild the env's (Dict order kept); a leaf out
    of range is refused naming it, on step (by the daemon) and on send (by
    the client); an info over its slot is an EnvError naming env and size;
    info_bytes is refused for the daemon's native envs."""
    with client.make("py:envd-test/DictObs-v0", 2, seed=0, num_workers=1) as env:
        ref = gym.make("envd-test/DictObs-v0")
        assert env.single_observation_space == ref.observation_space
        assert list(env.single_observation_space) == list(ref.observation_space)
        assert env.single_action_space == ref.action_space
        ref.close()
        env.reset()
        bad = (np.array([0, 2]), np.zeros((2, 2), np.int8), np.zeros((2, 2), np.float32))
        with pytest.raises(envd.InvalidActionError, match=r"action\[0\] 2 of env 1"):
            env.step(bad)
        env.step((np.array([0, 1]), *bad[1:]))  # the session goes on
    with client.make("py:envd-test/MultiDiscrete-v0", 4, seed=0, num_workers=1,
                     batch_size=2) as env:
        env.async_reset()
        ids = env.recv()[4]["env_id"]
        with pytest.raises(envd.InvalidActionError, match=r"action\[2\] 7 of env"):
            env.send(np.array([[0, 0, 7], [0, 0, 5]]), ids)
        env.send(np.array([[0, 0, 5], [1, 3, 6]]), ids)
        env.recv()
    with client.make("py:envd-test/DictObs-v0", 2, seed=0, num_workers=1,
                     info_bytes=16) as env:
        with pytest.raises(envd.EnvError, match=r"info of env \d is \d+ bytes encoded, "
                                                r"over its 16-byte slot"):
            env.reset()
            for _ in range(6):
                env.step(env.action_space.sample())
    with pytest.raises(envd.InvalidArgumentError, match="info_bytes is for hosted"):
        client.make("CartPole-v1", 2, info_bytes=64)


def test_integers_that_do_not_fit_a_narrow_leaf_are_refused(client):
    """An integer too wide for its leaf's dtype (MultiBinary's int8) is
    refused naming the leaf, the value and the env, on step and send, by
    every path; it never wraps into a valid value (256 -> 0)."""
    box = np.zeros((2, 2), np.float32)
    with client.make("py:envd-test/DictObs-v0", 2, seed=0, num_workers=1) as env:
        env.reset()
        with pytest.raises(envd.InvalidActionError,
                           match=r"action\[1\] 256 of env 0 is out of range; "
                                 r"MultiBinary\(2\) accepts 0\.\.1"):
            env.step((np.zeros(2, np.int64), np.array([[256, 257], [1, 1]]), box))
        with pytest.raises(envd.InvalidActionError, match=r"action\[1\] -255 of env 1"):
            env.step((np.zeros(2, np.int64), np.array([[0, 1], [1, -255]]), box))
        env.step((np.zeros(2, np.int64), np.array([[0, 1], [1, 0]]), box))  # it goes on
    with client.make("py:envd-test/DictObs-v0", 4, seed=0, num_workers=1,
                     batch_size=2) as env:
        env.async_reset()
        ids = env.recv()[4]["env_id"]
        with pytest.raises(envd.InvalidActionError,
                           match=rf"action\[1\] 256 of env {ids[1]} is out of range"):
            env.send((np.zeros(2, np.int64), np.array([[1, 1], [0, 256]]), box), ids)
        env.send((np.zeros(2, np.int64), np.array([[1, 1], [0, 1]]), box), ids)
        env.recv()


def test_only_the_allowed_ids_and_arguments(client):
    with pytest.raises(envd.UnknownEnvError, match="py:CartPole-v1"):
        client.make("py:MountainCar-v0", 2)
    with pytest.raises(envd.UnknownEnvError, match="does not host"):
        client.make("py:os:system", 2)  # a module path: never imported
    with pytest.raises(envd.InvalidArgumentError, match="num_workers"):
        client.make("py:CartPole-v1", 2, num_workers=0)
    with pytest.raises(envd.InvalidArgumentError, match="num_workers"):
        client.make("py:CartPole-v1", 2, num_workers=3)
    with pytest.raises(envd.InvalidArgumentError, match="env kwargs"):
        client.make("py:Pendulum-v1", 2, g=3.0)
    with pytest.raises(envd.InvalidArgumentError, match="num_workers"):
        client.make("CartPole-v1", 2, num_workers=1)  # the C env: the daemon's pool
    with client.make("py:CartPole-v1", 2) as env:  # still serving
        assert env.reset(seed=0)[0].shape == (2, 4)


@pytest.mark.parametrize("env_id,options", [
    ("CartPole-v1", {"num_workers": 1}),
    ("CartPole-v1", {"info_bytes": 64}),
    ("CartPole-v1", {"max_episode_steps": -1}),
    ("py:CartPole-v1", {"max_threads": 0}),
    ("py:CartPole-v1", {"max_episode_steps": 0}),
    ("py:CartPole-v1", {"num_workers": 0}),
    ("py:CartPole-v1", {"info_bytes": 2**21}),
    ("py:CartPole-v1", {"autoreset_mode": "sideways"}),
    ("py:CartPole-v1", {"batch_size": 3}),
])
def test_the_daemon_refuses_what_the_client_refuses_with_its_message(daemon, env_id, options):
    """Each make option is defined once (envd.make_options): a make the
    client refuses before sending gets, sent raw past the client's checks,
    the daemon's invalid_argument with the very same message, and nothing
    is made."""
    with daemon.connect() as c:
        with pytest.raises(envd.InvalidArgumentError) as by_client:
            c.make(env_id, 2, **options)
        with pytest.raises(envd.InvalidArgumentError) as by_daemon:
            c.channel.request({"type": "make", "env_id": env_id, "num_envs": 2, **options})
        assert str(by_daemon.value) == str(by_client.value)
        assert c.status()["sessions"] == 0


def test_raising_env_is_an_env_error_and_the_rest_goes_on(client):
    good = client.make("py:CartPole-v1", 3, seed=0, num_workers=1)
    bad = client.make("py:envd-test/Raising-v0", 4, seed=0, num_workers=2)
    try:
        good.reset()
        bad.reset()
        actions = np.zeros(4, np.int64)
        for _ in range(2):
            bad.step(actions)
        with pytest.raises(envd.EnvError, match="env 2 raised ValueError: boom at step 3") as info:
            bad.step(actions)
        assert info.value.env_index == 2
        obs = bad.reset()[0]  # the session says what to do: reset the env, go on
        assert obs.shape == (4, 2)
        assert good.step(np.ones(3, np.int64))[0].shape == (3, 4)
    finally:
        bad.close()
        good.close()


def test_worker_that_exits_fails_the_call_not_the_daemon(client):
    good = client.make("py:Acrobot-v1", 2, seed=0, num_workers=1)
    bad = client.make("py:envd-test/Exiting-v0", 4, seed=0, num_workers=2)
    try:
        good.reset()
        bad.reset()
        bad.step(np.zeros(4, np.int64))
        with pytest.raises(envd.EnvError, match="died"):
            bad.step(np.zeros(4, np.int64))
        with pytest.raises(envd.EnvError, match="died"):
            bad.step(np.zeros(4, np.int64))
        assert good.step(np.zeros(2, np.int64))[0].shape == (2, 6)
    finally:
        bad.close()
        good.close()


def test_max_workers_limit(tmp_path):
    proc = start(tmp_path / "d", "--max-workers", "3")
    try:
        with proc.connect() as c:
            first = c.make("py:CartPole-v1", 4, num_workers=2)
            status = c.status()
            assert status["workers"] == 2 and status["limits"]["max_workers"] == 3
            assert [row["workers"] for row in status["session_table"]] == [2]
            assert "py:CartPole-v1" in status["python_envs"]
            with pytest.raises(envd.LimitExceededError, match="--max-workers"):
                c.make("py:CartPole-v1", 4, num_workers=2)
            first.close()
            # a closed session's workers count until they exited (issue 38)
            assert wait_until(lambda: c.status()["workers"] == 0, 60)
            c.make("py:CartPole-v1", 4, num_workers=3).close()  # exited workers count no more
    finally:
        assert proc.stop() == 0, proc.log()


def test_info_slots_count_against_the_shared_memory_limit(tmp_path):
    """info_bytes grows both segments: a make whose slots are over
    --max-shm-bytes is refused before anything is made; the daemon goes on."""
    proc = start(tmp_path / "d", "--max-shm-bytes", str(1 << 20))
    try:
        with proc.connect() as c:
            with pytest.raises(envd.LimitExceededError, match="--max-shm-bytes"):
                c.make("py:envd-test/DictObs-v0", 4, num_workers=1, info_bytes=1 << 20)
            with pytest.raises(envd.InvalidArgumentError, match="info_bytes"):
                c.make("py:envd-test/DictObs-v0", 4, num_workers=1, info_bytes=(1 << 20) + 1)
            assert c.status()["sessions"] == 0
            with c.make("py:envd-test/DictObs-v0", 4, num_workers=1, info_bytes=256) as env:
                assert env.buffers["infos"].shape == (4, 256)
                env.reset(seed=0)
    finally:
        assert proc.stop() == 0, proc.log()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", "lease"])
def test_no_process_left_after_the_daemon_ends(tmp_path, how):
    extra = ("--lease-timeout", "1") if how == "lease" else ()
    proc = start(tmp_path / "d", *extra)
    try:
        c = proc.connect()
        envs = [c.make("py:CartPole-v1", 4, num_workers=2),
                c.make("py:Acrobot-v1", 3, num_workers=3, batch_size=1)]
        envs[0].reset(seed=1)
        envs[1].async_reset()
        tree = descendants(proc.pid)
        assert len(tree) == 1 + 2 + 3, tree  # the template and the workers
        if how == "lease":  # the client goes silent: its sessions' workers go
            c.channel.close()  # no bye, no heartbeat: silence
            assert wait_until(lambda: len(descendants(proc.pid)) == 1, 60), descendants(proc.pid)
            return
        os.kill(proc.pid, getattr(signal, how))
        proc.proc.wait(60)
        assert wait_until(lambda: not any(map(alive, tree)), 30), [p for p in tree if alive(p)]
        if how == "SIGTERM":
            assert proc.proc.returncode == 0, proc.log()
    finally:
        proc.stop()


def test_worker_killed_from_outside(tmp_path):
    """SIGKILL of one worker (the OOM killer's way): the pending call raises
    envd.EnvError within the call, the daemon's other sessions go on, and
    closing the session reaps its other workers."""
    proc = start(tmp_path / "d")
    try:
        with proc.connect() as c:
            other = c.make("py:CartPole-v1", 2, seed=0, num_workers=1)
            other.reset()
            before = set(descendants(proc.pid))
            env = c.make("py:Acrobot-v1", 4, seed=0, num_workers=2)
            workers = sorted(set(descendants(proc.pid)) - before)
            assert len(workers) == 2, workers
            env.reset()
            os.kill(workers[1], signal.SIGKILL)
            with pytest.raises(envd.EnvError, match=r"worker 1 \(pid \d+, envs 2\.\.3\) died"):
                for _ in range(1000):  # (a step may finish before the kill lands)
                    env.step(np.zeros(4, np.int64))
            assert other.step(np.zeros(2, np.int64))[0].shape == (2, 4)
            env.close()
            assert wait_until(lambda: not any(map(alive, workers)), 30)
            other.close()
    finally:
        assert proc.stop() == 0, proc.log()


def test_hanging_env_is_bounded_by_the_timeout_and_reclaimed_at_close(tmp_path):
    """A step that hangs raises EnvdTimeoutError after the client's timeout;
    closing the env kills its workers after the grace period (the daemon's
    loop never waits for them) and the daemon serves its other sessions."""
    proc = start(tmp_path / "d")
    try:
        with proc.connect() as c, proc.connect(timeout=3) as impatient:
            other = c.make("py:CartPole-v1", 2, seed=0, num_workers=1)
            other.reset()
            before = set(descendants(proc.pid))
            env = impatient.make("py:envd-test/Hanging-v0", 2, seed=0, num_workers=1)
            workers = sorted(set(descendants(proc.pid)) - before)
            env.reset()
            env.step(np.zeros(2, np.int64))
            with pytest.raises(envd.EnvdTimeoutError):
                env.step(np.zeros(2, np.int64))  # env 0's second step sleeps an hour
            assert other.step(np.zeros(2, np.int64))[0].shape == (2, 4)  # not blocked
            env.close()
            assert wait_until(lambda: not any(map(alive, workers)), 60), workers
            assert wait_until(lambda: c.status()["sessions"] == 1, 60)
            assert other.step(np.zeros(2, np.int64))[0].shape == (2, 4)
            other.close()
    finally:
        assert proc.stop() == 0, proc.log()


def test_readme_hosted_quick_start_runs_as_written(tmp_path):
    """README's Quick start: the hosted-env daemon command and trainer, as written."""
    import re
    import subprocess
    import sys
    readme = (HERE.parents[1] / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    command = next(c for c in re.findall(r"```bash\n(.*?)\n```", section, re.S)
                   if "--python-env" in c).split()
    code = next(c for c in re.findall(r"```python\n(.*?)```", section, re.S) if "py:" in c)
    assert command[0] == "envd"
    proc = DaemonProcess(tmp_path / "d", *command[1:])
    try:
        (tmp_path / "trainer.py").write_text(code)
        trainer = subprocess.run([sys.executable, "trainer.py"], cwd=tmp_path,
                                 env={**os.environ, "ENVD_ENDPOINT": proc.endpoint},
                                 capture_output=True, text=True, timeout=300)
        assert trainer.returncode == 0, trainer.stderr
        assert trainer.stdout.strip() == "(16, 6) float64"  # (SyncVectorEnv's rewards)
    finally:
        assert proc.stop() == 0, proc.log()


def test_metrics_show_workers_per_session(tmp_path):
    import socket
    import urllib.request
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = start(tmp_path / "d", "--metrics-port", str(port))

    def scrape() -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            text = r.read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}
    try:
        with proc.connect() as c:
            env = c.make("py:CartPole-v1", 4, num_workers=2)
            samples = scrape()
            assert samples[("envd_workers", ())] == 2
            rows = {k: v for k, v in samples.items() if k[0] == "envd_session_workers"}
            assert list(rows.values()) == [2]
            assert dict(next(iter(rows))[1])["env_id"] == "py:CartPole-v1"
            env.close()
            assert wait_until(lambda: scrape()[("envd_workers", ())] == 0, 60)
    finally:
        assert proc.stop() == 0, proc.log()


def test_a_dead_template_is_started_again(tmp_path):
    """The template killed (the OOM killer's choice): the next make starts a
    new one, with the --import modules imported again."""
    proc = start(tmp_path / "d")
    try:
        (template,) = [p for p in children(proc.pid) if alive(p)]
        os.kill(template, signal.SIGKILL)
        assert wait_until(lambda: not alive(template), 30)
        with proc.connect() as c:
            with c.make("py:envd-test/Raising-v0", 2, seed=5, num_workers=1) as env:
                assert env.reset()[0].shape == (2, 2)
            with c.make("py:CartPole-v1", 2, num_workers=1) as env:
                assert env.reset()[0].shape == (2, 4)
    finally:
        assert proc.stop() == 0, proc.log()


def test_worker_death_answers_a_parked_recv(client):
    """Async mode: a recv waiting for envs of a worker that exits gets
    envd.EnvError (the worker's pidfd wakes the daemon), not a timeout."""
    env = client.make("py:envd-test/Exiting-v0", 4, seed=0, num_workers=2, batch_size=4)
    try:
        env.async_reset()
        env.recv()
        with pytest.raises(envd.EnvError, match="died"):
            for _ in range(3):  # env 1 (worker 0) exits in its second step
                env.send(np.zeros(4, np.int64), np.arange(4))
                env.recv()
    finally:
        env.close()


def test_episode_statistics_equal_in_process(client):
    """Every output array reaches the client, whatever the path: the episode
    statistics (return and length; the time is wall-clock) equal those of
    the in-process hosted env, step by step."""
    ours = client.make("py:CartPole-v1", 3, seed=2, num_workers=2, max_episode_steps=7)
    local = envd.make("py:CartPole-v1", 3, seed=2, num_workers=1, max_episode_steps=7)
    try:
        ours.reset()
        local.reset()
        rng, ended = np.random.default_rng(5), 0
        for t in range(30):
            actions = rng.integers(0, 2, 3)
            got, want = ours.step(actions)[4], local.step(actions)[4]
            assert set(got) == set(want), t
            if "envd_episode" in want:
                ended += 1
                assert np.array_equal(got["_envd_episode"], want["_envd_episode"]), t
                for field in ("r", "l"):
                    assert np.array_equal(got["envd_episode"][field],
                                          want["envd_episode"][field]), (t, field)
        assert ended >= 3
    finally:
        ours.close()
        local.close()


def test_an_out_of_range_action_over_two_daemons_steps_no_shard(tmp_path):
    """A MultiDiscrete env split over two daemons: one action out of range in
    the second daemon's rows refuses the whole step (and a send) before any
    daemon steps, as one daemon refuses it; found by review: the multi-daemon
    env checked Discrete actions only, so the first daemon stepped."""
    procs = [start(tmp_path / f"d{k}") for k in range(2)]
    try:
        with envd.connect([p.endpoint for p in procs], timeout=60) as multi:
            env_id = "py:envd-test/MultiDiscrete-v0"
            with multi.make(env_id, 4, seed=0, num_workers=1) as env:
                assert [s.stop - s.start for s in env.shard_slices] == [2, 2]
                env.reset()
                actions = np.tile(np.array([0, 1, 5]), (4, 1))
                env.step(actions)
                before = [s["env_steps"] for s in multi.status()]
                bad = actions.copy()
                bad[3, 2] = 7  # env 3 (the second daemon's): its third leaf accepts 5..6
                with pytest.raises(envd.InvalidActionError, match="env 3"):
                    env.step(bad)
                assert [s["env_steps"] for s in multi.status()] == before
            with multi.make(env_id, 4, seed=0, num_workers=1, batch_size=2) as env:
                env.async_reset()
                ids = env.recv()[4]["env_id"]
                with pytest.raises(envd.InvalidActionError):
                    env.send(np.array([[0, 1, 5], [0, 1, 9]]), ids)
    finally:
        for proc in procs:
            assert proc.stop() == 0, proc.log()
