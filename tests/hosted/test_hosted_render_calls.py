"""Hosted envs as gymnasium's vector envs beyond stepping: render_mode
"rgb_array" (frames drawn in the workers, compared with gymnasium's own
SyncVectorEnv), RecordVideo, call/get_attr/set_attr (and their refusals),
and a gymnasium id registered after the template started."""
from __future__ import annotations

import os
import time

import gymnasium
import numpy as np
import pytest
from envs import HangingCallEnv, alive, wait_until
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

import envd
from envd.errors import EnvError, EnvStateError, InvalidArgumentError
from envd.native import hosted_calls

WORKERS = [0, 2]


class LateCartPole(CartPoleEnv):
    """A CartPole registered only after the template process started."""
    marker = "late"


class BigFrameEnv(CartPoleEnv):
    """Renders a frame of over half the calls' reply bound (two are over it;
    np.zeros maps no memory until it is read)."""

    def render(self):
        return np.zeros(hosted_calls.MAX_REPLY_BYTES // 2 + 1, np.uint8)


class Opaque:
    """A value msgpack cannot carry."""


@pytest.mark.parametrize("num_workers", WORKERS)
def test_rgb_array_frames_equal_gymnasiums_sync_vector_env(num_workers):
    n = 3
    env = envd.make("py:Acrobot-v1", n, num_workers=num_workers, seed=5,
                    render_mode="rgb_array")
    ref = gymnasium.make_vec("Acrobot-v1", n, vectorization_mode="sync",
                             render_mode="rgb_array")
    try:
        assert env.render_mode == ref.render_mode == "rgb_array"
        assert env.metadata["render_fps"] == ref.metadata["render_fps"]
        env.reset()
        ref.reset(seed=5)  # (env i seeded with 5 + i, as envd's seed=5)
        rng = np.random.default_rng(0)
        for _ in range(12):
            frames, expected = env.render(), ref.render()
            assert type(frames) is type(expected) is tuple and len(frames) == n
            for frame, want in zip(frames, expected):
                assert frame.dtype == np.uint8 and frame.shape == want.shape
                np.testing.assert_array_equal(frame, want)
            assert not np.array_equal(frames[0], np.zeros_like(frames[0]))
            actions = rng.integers(0, 3, n)
            env.step(actions)
            ref.step(actions)
        # each call returns new arrays (a recorder keeps them)
        first, second = env.render(), env.render()
        assert first[0] is not second[0]
        first[0][...] = 0
        assert env.render()[0].any()
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("num_workers", WORKERS)
def test_record_video_writes_a_video(tmp_path, num_workers):
    pytest.importorskip("moviepy")
    env = envd.make("py:CartPole-v1", 2, num_workers=num_workers, seed=0,
                    render_mode="rgb_array")
    recorder = gymnasium.wrappers.vector.RecordVideo(env, str(tmp_path / "videos"),
                                                     episode_trigger=lambda e: e == 0,
                                                     video_length=10)
    try:
        recorder.reset(seed=0)
        for _ in range(15):
            recorder.step(np.zeros(2, np.int64))
    finally:
        recorder.close()
    videos = [f for f in os.listdir(tmp_path / "videos") if f.endswith(".mp4")]
    assert videos, os.listdir(tmp_path / "videos")
    assert os.path.getsize(tmp_path / "videos" / videos[0]) > 1000


def test_render_refusals():
    with pytest.raises(InvalidArgumentError, match="rgb_array"):
        envd.make("py:CartPole-v1", 2, num_workers=0, render_mode="human")
    with envd.make("py:CartPole-v1", 2, num_workers=0) as env:
        with pytest.raises(EnvStateError, match="render_mode='rgb_array'"):
            env.render()
    # a creator's env brings its own render mode: a mismatch is named
    with pytest.raises(InvalidArgumentError, match="render_mode"):
        envd.make(lambda: CartPoleEnv(), 2, num_workers=0, render_mode="rgb_array")
    with envd.make(lambda: CartPoleEnv(render_mode="rgb_array"), 2, num_workers=2,
                   render_mode="rgb_array") as env:
        env.reset(seed=1)
        assert [f.shape for f in env.render()] == [(400, 600, 3)] * 2
        env.send(np.zeros(2, np.int64), np.arange(2))  # (envs out: render refused)
        with pytest.raises(Exception, match="render"):
            env.render()
        env.recv()
        assert len(env.render()) == 2


def test_a_frame_over_the_bound_is_refused_cleanly():
    with envd.make(lambda: BigFrameEnv(render_mode="rgb_array"), 2, num_workers=1,
                   render_mode="rgb_array") as env:
        env.reset()
        with pytest.raises(ValueError, match="bound"):
            env.render()
        env.step(np.zeros(2, np.int64))  # the env goes on
        assert env.get_attr("gravity") == (9.8, 9.8)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_call_get_attr_set_attr_as_sync_vector_env(num_workers):
    n = 4
    env = envd.make("py:CartPole-v1", n, num_workers=num_workers, seed=0)
    ref = gymnasium.make_vec("CartPole-v1", n, vectorization_mode="sync")
    try:
        env.reset()
        ref.reset(seed=0)
        for vec in (env, ref):
            assert vec.get_attr("gravity") == (9.8,) * n
            vec.set_attr("gravity", 3.5)
            assert vec.get_attr("gravity") == (3.5,) * n
            vec.set_attr("force_mag", [1.0, 2.0, 3.0, 4.0])
            assert vec.get_attr("force_mag") == (1.0, 2.0, 3.0, 4.0)
            with pytest.raises(ValueError, match="length equal"):
                vec.set_attr("gravity", [1.0, 2.0])
        # a method is called with its arguments; numpy values keep their dtype
        assert env.call("np_random_seed") == ref.call("np_random_seed") == (0, 1, 2, 3)
        state = env.get_attr("state")
        for mine, theirs in zip(state, ref.get_attr("state")):
            np.testing.assert_array_equal(mine, theirs)
            assert mine.dtype == theirs.dtype
        obs, *_ = env.step(np.ones(n, np.int64))
        ref.step(np.ones(n, np.int64))
        # set_attr reached the envs' physics (force_mag differs per env)
        np.testing.assert_array_equal(obs, np.stack(ref.get_attr("state")).astype(np.float32))
        assert env.call("get_wrapper_attr", "force_mag") == (1.0, 2.0, 3.0, 4.0)
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("num_workers", WORKERS)
def test_call_errors_are_clear(num_workers):
    env = envd.make("py:CartPole-v1", 2, num_workers=num_workers, seed=0)
    env.reset()
    with pytest.raises(AttributeError, match="no_such_attribute"):
        env.get_attr("no_such_attribute")
    with pytest.raises(ValueError, match="use `step` directly"):
        env.call("step", 0)
    if num_workers:
        # never pickled: what msgpack cannot carry is refused both ways
        with pytest.raises(TypeError, match="msgpack"):
            env.get_attr("np_random")
        with pytest.raises(TypeError, match="msgpack"):
            env.set_attr("gravity", Opaque())
        with pytest.raises(TypeError, match="msgpack"):
            env.call("get_wrapper_attr", Opaque())
    assert env.get_attr("gravity") == (9.8, 9.8)  # the env is intact
    env.step(np.zeros(2, np.int64))
    env.close()
    with pytest.raises(EnvStateError, match="closed"):
        env.get_attr("gravity")
    with pytest.raises(EnvStateError, match="closed"):
        env.set_attr("gravity", 1.0)


def test_a_hanging_call_is_bounded_by_the_session_timeout():
    env = envd.make(HangingCallEnv, 2, num_workers=2, seed=0)
    try:
        env.reset()
        pids = env.worker_pids
        env._session.timeout = 2.0  # (the daemon's --hosted-timeout; in-process: none)
        started = time.monotonic()
        with pytest.raises(EnvError, match="longer than 2 s"):
            env.call("hang")
        assert time.monotonic() - started < 60
        assert wait_until(lambda: not any(alive(p) for p in pids))
    finally:
        env.close()


@pytest.mark.parametrize("num_workers", WORKERS)
def test_an_id_registered_after_the_template_started_is_found(num_workers):
    envd.make("py:CartPole-v1", 2, num_workers=2).close()  # the template exists
    late_id = f"envd-test/LateCartPole{num_workers}-v0"
    gymnasium.register(late_id, entry_point=LateCartPole, max_episode_steps=7)
    try:
        env = envd.make("py:" + late_id, 2, num_workers=num_workers, seed=0)
        ref = gymnasium.make_vec(late_id, 2, vectorization_mode="sync")
        try:
            assert env.max_episode_steps == 7
            assert env.get_attr("marker") == ("late", "late")
            obs, _ = env.reset()
            want, _ = ref.reset(seed=0)
            np.testing.assert_array_equal(obs, want)
            for _ in range(8):
                obs, _, _, trunc, _ = env.step(np.ones(2, np.int64))
                want, _, _, want_trunc, _ = ref.step(np.ones(2, np.int64))
                np.testing.assert_array_equal(obs, want)
                np.testing.assert_array_equal(trunc, want_trunc)
        finally:
            env.close()
            ref.close()
    finally:
        gymnasium.registry.pop(late_id)


def test_a_built_in_env_refuses_calls_clearly():
    with envd.make("CartPole-v1", 2) as env:
        for attempt in (lambda: env.get_attr("gravity"), lambda: env.call("render"),
                        lambda: env.set_attr("gravity", 1.0)):
            with pytest.raises(InvalidArgumentError, match="hosted Python envs only"):
                attempt()
        assert env.single_observation_space.shape == (4,)
