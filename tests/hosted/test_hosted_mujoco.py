"""gymnasium's MuJoCo envs hosted (py:HalfCheetah-v5, ...) step exactly as
gymnasium.make_vec(..., vectorization_mode="sync"): observations, rewards,
terminations, truncations and infos (their info columns and the reset
infos that deviate from them), for 0, 1 and 2 workers and through a daemon.
Skipped only where mujoco is not installed (the test extra brings it)."""
from __future__ import annotations

import functools
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from envs import DAEMON_ENV
from equivalence import MODES, compare_runs
from support.daemon import DaemonProcess, left_clean

import envd

pytest.importorskip("mujoco")

NUM_ENVS, STEPS, LIMIT = 4, 40, 15  # a short limit: truncations and autoresets
CASES = ([(e, w, "next_step") for e in ("HalfCheetah-v5", "Hopper-v5") for w in (0, 1, 2)]
         + [("Hopper-v5", w, "same_step") for w in (0, 2)]
         + [("Humanoid-v5", 2, "next_step")])


def _run(make, env_id: str, num_workers: int, mode: str) -> None:
    ref = gym.make_vec(env_id, NUM_ENVS, vectorization_mode="sync", max_episode_steps=LIMIT,
                       vector_kwargs={"autoreset_mode": MODES[mode]})
    env = make("py:" + env_id, NUM_ENVS, seed=11, num_workers=num_workers, autoreset_mode=mode,
               max_episode_steps=LIMIT, episode_statistics=False)
    try:
        compare_runs(env, ref, mode, STEPS, seed=11, masked_reset_at=20)
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("env_id,num_workers,mode", CASES)
def test_equal_to_sync_vector_env(env_id, num_workers, mode):
    _run(envd.make, env_id, num_workers, mode)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    proc = DaemonProcess(tmp_path_factory.mktemp("mujoco") / "daemon", "--threads", "1",
                         "--python-env", "HalfCheetah-v5", "--python-env", "Hopper-v5",
                         env=DAEMON_ENV)
    with left_clean([proc]):
        with proc.connect() as c:
            yield c


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("env_id,num_workers", [("HalfCheetah-v5", 1), ("Hopper-v5", 2)])
def test_through_the_daemon(client, env_id, num_workers, fast_path):
    make = functools.partial(client.make, transport="shm", fast_path=fast_path)
    _run(make, env_id, num_workers, "next_step")


def test_the_daemon_carries_the_info_columns(client):
    """The daemon's sessions carry HalfCheetah's step infos as columns in the
    client's segment (counted in its size), not as encoded slots."""
    with client.make("py:HalfCheetah-v5", 2, seed=0, num_workers=1, transport="shm") as env:
        assert {"info_column.x_position", "info_in_columns"} <= set(env._buffers)
        env.reset()
        info = env.step(env.action_space.sample())[4]
        assert env._buffers["info_in_columns"].all() and not env._buffers["info_lengths"].any()
        assert info["x_position"].dtype == np.float64 and info["_x_position"].all()


def _gymnasium_renders_mujoco() -> bool:
    """Whether gymnasium itself draws a MuJoCo frame here (an offscreen
    OpenGL: MUJOCO_GL=egl or osmesa with its library), asked in a process of
    its own (a failed OpenGL context may abort the next try in a process)."""
    probe = ("import gymnasium; e = gymnasium.make('HalfCheetah-v5', render_mode='rgb_array'); "
             "e.reset(seed=0); assert e.render().ndim == 3")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True,
                          timeout=300).returncode == 0


def test_rgb_array_renders_or_is_refused_clearly():
    """MuJoCo's rgb_array needs an offscreen OpenGL in the workers: without
    one, a clear refusal at make (naming MUJOCO_GL), not a crash."""
    if _gymnasium_renders_mujoco():
        with envd.make("py:HalfCheetah-v5", 2, render_mode="rgb_array", num_workers=1) as env:
            env.reset(seed=0)
            frames = env.render()
            assert len(frames) == 2 and frames[0].dtype == np.uint8 and frames[0].ndim == 3
    else:
        for workers in (0, 1):
            with pytest.raises(envd.InvalidArgumentError, match="MUJOCO_GL=egl"):
                envd.make("py:HalfCheetah-v5", 2, render_mode="rgb_array",
                          num_workers=workers)
    with envd.make("py:HalfCheetah-v5", 2, num_workers=0) as env:
        env.reset()
        with pytest.raises(envd.EnvStateError, match="made without a render mode"):
            env.render()
