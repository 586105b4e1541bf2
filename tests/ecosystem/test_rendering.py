"""render_mode="rgb_array": every built-in draws its frames in C (native
raster.c and one render function per env file), render() returns them as
gymnasium's vector envs do (a tuple of (height, width, 3) uint8 frames, one per
env), the classic-control frames look like gymnasium's own after the same
seed and actions, and gymnasium's vector RecordVideo records a playable video
with one frame per rendered step."""
from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import vector as wrappers

import envd

pytest.importorskip("pygame")  # gymnasium's own frames (the reference) need it

#: A frame "looks like gymnasium's" when fewer than MAX_DIFFERENT of its
#: pixels differ from gymnasium's frame by more than LEVELS (of 255) in some
#: channel.  The differences are anti-aliased edges (gymnasium draws an
#: anti-aliased outline around each shape, envd does not), rounding of shape
#: edges, and for Pendulum-v1 the torque arrow image envd leaves out.
LEVELS = 32
MAX_DIFFERENT = 0.02

CLASSIC = {
    # id: (frame shape, render_fps, actions per step)
    "CartPole-v1": ((400, 600, 3), 50, [1, 1, 0, 1, 0, 0, 1, 1]),
    "Pendulum-v1": ((500, 500, 3), 30, [[1.5], [-2.0], [0.3]] * 3),
    "MountainCar-v0": ((400, 600, 3), 30, [2, 2, 2, 0, 1, 2] * 3),
    "MountainCarContinuous-v0": ((400, 600, 3), 30, [[1.0], [0.5], [-1.0]] * 4),
    "Acrobot-v1": ((500, 500, 3), 15, [0, 2, 2, 1, 0, 2] * 2),
}
OTHERS = {"Snake-v0": ((240, 240, 3), 15), "ConnectFour-v0": ((480, 560, 3), 2)}


def different_fraction(frame: np.ndarray, reference: np.ndarray) -> float:
    diff = np.abs(frame.astype(np.int16) - reference.astype(np.int16)).max(axis=2)
    return float((diff > LEVELS).mean())


@pytest.mark.parametrize("env_id", sorted(CLASSIC))
def test_classic_frames_look_like_gymnasium(env_id):
    shape, fps, actions = CLASSIC[env_id]
    seeds = [3, 11]
    env = envd.make(env_id, len(seeds), seed=seeds, render_mode="rgb_array")
    assert env.render_mode == "rgb_array"
    assert env.metadata["render_modes"] == ["rgb_array"] and env.metadata["render_fps"] == fps
    refs = [gym.make(env_id, render_mode="rgb_array") for _ in seeds]
    assert refs[0].metadata["render_fps"] == fps
    env.reset(seed=seeds)
    for ref, seed in zip(refs, seeds):
        ref.reset(seed=seed)
    dtype = env.single_action_space.dtype
    worst = 0.0
    for action in [None, *actions]:
        if action is not None:
            env.step(np.array([action] * len(seeds), dtype))
            for ref in refs:
                ref.step(np.array(action, dtype) if isinstance(action, list) else action)
        frames = env.render()
        assert isinstance(frames, tuple) and len(frames) == len(seeds)
        for frame, ref in zip(frames, refs):
            assert frame.shape == shape and frame.dtype == np.uint8
            expected = ref.render()
            assert expected.shape == shape
            worst = max(worst, different_fraction(frame, expected))
    assert worst < MAX_DIFFERENT, f"{env_id}: {worst:.2%} of pixels differ by > {LEVELS}"
    # the frames show the state: different seeds draw different frames
    assert not np.array_equal(frames[0], frames[1])
    env.close()
    for ref in refs:
        ref.close()


def test_the_comparison_can_fail():
    """The tolerance is tight enough to tell states apart: CartPole's frame of
    one seed is far from gymnasium's frame of another."""
    env = envd.make("MountainCar-v0", 1, seed=0, render_mode="rgb_array")
    env.reset(seed=0)
    for _ in range(40):
        env.step(np.array([2]))
    ref = gym.make("MountainCar-v0", render_mode="rgb_array")
    ref.reset(seed=0)
    assert different_fraction(env.render()[0], ref.render()) > MAX_DIFFERENT / 4
    env.close()
    ref.close()


@pytest.mark.parametrize("env_id", sorted(OTHERS))
def test_other_builtins_render(env_id):
    shape, fps = OTHERS[env_id]
    env = envd.make(env_id, 3, seed=0, render_mode="rgb_array")
    assert env.metadata["render_fps"] == fps
    env.reset(seed=0)
    first = env.render()
    assert len(first) == 3 and all(f.shape == shape and f.dtype == np.uint8 for f in first)
    assert len({f.tobytes() for f in first}) > 1 or env_id == "ConnectFour-v0"
    env.step(env.action_space.sample())
    second = env.render()
    assert not np.array_equal(np.stack(first), np.stack(second))  # the game moved
    assert first[0] is not second[0]  # new arrays each call
    env.close()


def test_render_needs_a_render_mode_and_a_reset():
    env = envd.make("CartPole-v1", 2, seed=0)
    # render_modes says what the env can render, even when it does not
    assert env.render_mode is None and env.metadata["render_modes"] == ["rgb_array"]
    with pytest.raises(envd.EnvStateError, match="render_mode='rgb_array'"):
        env.render()
    env.close()
    env = envd.make("CartPole-v1", 2, seed=0, render_mode="rgb_array")
    with pytest.raises(envd.EnvStateError, match="has not been reset"):
        env.render()
    env.close()


def test_bad_render_modes_are_refused():
    for mode in ("human", "ansi", 3, "RGB_ARRAY"):
        with pytest.raises(envd.InvalidArgumentError, match="render_mode must be None or"):
            envd.make("CartPole-v1", 1, render_mode=mode)


@pytest.mark.parametrize("num_threads", [0, 1, None])
def test_render_waits_for_no_send(num_threads):
    """render() refuses while envs sent (or async-reset) are not received,
    whether or not their batch has finished by then: with num_threads=0 it
    has (the send ran inline), with threads it may or may not have, which
    made the answer depend on the threads (refused 29 times in 30 with the
    default threads, never with 0)."""
    env = envd.make("CartPole-v1", 4, seed=0, batch_size=2, render_mode="rgb_array",
                    num_threads=num_threads)
    env.async_reset(seed=0)
    with pytest.raises(envd.EnvStateError, match="not received yet"):
        env.render()  # the async reset's envs wait for recv
    *_, info = env.recv()
    env.send(np.ones(2, np.int64), info["env_id"])
    for _ in range(3):
        with pytest.raises(envd.EnvStateError, match="recv"):
            env.render()
    env.recv()  # the other two envs of the reset
    with pytest.raises(envd.EnvStateError, match="recv"):
        env.render()  # the two sent: in flight or finished, not received
    env.recv()  # the two sent
    assert len(env.render()) == 4
    env.close()


def test_render_after_leftover_ready_envs_needs_a_reset():
    """Envs that no recv can take (fewer than batch_size) block render until
    a reset() forgets them, as the message says."""
    env = envd.make("CartPole-v1", 3, seed=0, batch_size=2, render_mode="rgb_array",
                    num_threads=0)
    env.async_reset(seed=0)
    env.recv()  # one env of the reset is left, ready
    with pytest.raises(envd.EnvStateError, match=r"reset\(\) once none is in flight"):
        env.render()
    env.reset(seed=0)
    assert len(env.render()) == 3
    env.close()


def test_gymnasium_make_passes_render_mode():
    with gym.make_vec("envd/CartPole-v1", num_envs=2, render_mode="rgb_array") as env:
        env.reset(seed=0)
        assert [f.shape for f in env.render()] == [(400, 600, 3)] * 2
    with gym.make("envd/CartPole-v1", render_mode="rgb_array") as single:
        single.reset(seed=0)
        assert single.render_mode == "rgb_array"
        assert single.render().shape == (400, 600, 3)


def video_frames(path: str) -> int:
    """Frames in a video file, counted by decoding it (imageio's ffmpeg, which
    moviepy brings)."""
    import imageio.v2 as imageio
    with imageio.get_reader(path, "ffmpeg") as reader:
        return sum(1 for _ in reader)


def test_record_video_writes_a_playable_video(tmp_path):
    pytest.importorskip("moviepy")
    num_envs, limit = 2, 30
    env = envd.make("CartPole-v1", num_envs, seed=0, render_mode="rgb_array",
                    max_episode_steps=limit)
    folder = tmp_path / "videos"
    env = wrappers.RecordVideo(env, str(folder), episode_trigger=lambda episode: episode == 0,
                               disable_logger=True)
    env.reset(seed=0)
    steps = 0
    while True:  # env 0 pushes right: its episode ends before the time limit or at it
        _, _, term, trunc, _ = env.step(np.ones(num_envs, np.int64))
        steps += 1
        if term[0] or trunc[0]:
            break
    env.step(np.ones(num_envs, np.int64))  # the next-step autoreset closes the video
    env.close()
    videos = sorted(f for f in os.listdir(folder) if f.endswith(".mp4"))
    assert videos == ["rl-video-episode-0.mp4"], os.listdir(folder)
    # one frame at the reset and one per step of the episode
    assert video_frames(str(folder / videos[0])) == steps + 1


# ---- through the daemon ------------------------------------------------------------------
def rollout_frames(env, steps: int = 5) -> list[np.ndarray]:
    """Frames after a seeded reset and each of a few fixed steps."""
    env.reset(seed=5)
    frames = [np.stack(env.render())]
    for t in range(steps):
        env.step(np.full(env.num_envs, t % 2, np.int64))
        frames.append(np.stack(env.render()))
    return frames


@pytest.mark.parametrize("transport, fast_path", [("shm", True), ("shm", False),
                                                  ("inline", False)])
def test_daemon_frames_equal_in_process_frames(daemon, transport, fast_path):
    """The daemon draws with the same native code: its frames are the
    in-process env's, byte for byte, over every transport."""
    local = envd.make("CartPole-v1", 3, seed=5, render_mode="rgb_array")
    expected = rollout_frames(local)
    local.close()
    with daemon.connect() as client:
        env = client.make("CartPole-v1", 3, seed=5, render_mode="rgb_array",
                          transport=transport, fast_path=fast_path)
        assert env.transport == transport and env.fast_path == fast_path
        assert env.render_mode == "rgb_array" and env.metadata["render_fps"] == 50
        got = rollout_frames(env)
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
        env.close()


def render_answers(env) -> list[str]:
    """Whether render() draws ("ok") or is refused ("refused") after an async
    reset, a send, and each of the two recvs that take every env back."""
    answers = []

    def render() -> None:
        try:
            env.render()
            answers.append("ok")
        except envd.EnvStateError:
            answers.append("refused")

    env.async_reset(seed=0)
    render()
    *_, info = env.recv()
    env.send(np.ones(2, np.int64), info["env_id"])
    render()
    env.recv()
    render()
    env.recv()
    render()
    return answers


@pytest.mark.parametrize("transport, fast_path", [("shm", True), ("shm", False),
                                                  ("inline", False)])
def test_daemon_render_refuses_what_in_process_refuses(daemon, transport, fast_path):
    """Every env received before a render, over every transport as in-process
    (the client's books know what was received; a daemon-served env drew
    right after an async reset before)."""
    with envd.make("CartPole-v1", 4, seed=0, batch_size=2, render_mode="rgb_array",
                   num_threads=0) as local:
        expected = render_answers(local)
    assert expected == ["refused", "refused", "refused", "ok"]
    with daemon.connect() as client, \
            client.make("CartPole-v1", 4, seed=0, batch_size=2, render_mode="rgb_array",
                        transport=transport, fast_path=fast_path) as env:
        assert render_answers(env) == expected


def test_daemon_render_errors_leave_the_session_usable(daemon):
    with daemon.connect() as client:
        with pytest.raises(envd.InvalidArgumentError, match="render_mode must be None or"):
            client.make("CartPole-v1", 2, render_mode="human")
        with pytest.raises(envd.InvalidArgumentError, match="render_mode must be None or"):
            client.make("CartPole-v1", 2, render_mode="x" * 10_000)
        plain = client.make("CartPole-v1", 2, seed=0)
        with pytest.raises(envd.EnvStateError, match="render_mode='rgb_array'"):
            plain.render()
        env = client.make("Acrobot-v1", 2, seed=0, render_mode="rgb_array", batch_size=1)
        with pytest.raises(envd.EnvStateError, match="has not been reset"):
            env.render()
        env.async_reset(seed=0)
        *_, info = env.recv()
        env.send(np.zeros(1, np.int64), info["env_id"])
        with pytest.raises(envd.EnvStateError, match="recv"):
            env.render()
        env.recv()
        env.recv()
        assert [f.shape for f in env.render()] == [(500, 500, 3)] * 2
        plain.reset(seed=0)
        plain.step(np.zeros(2, np.int64))


def test_daemon_refuses_a_render_over_its_message_limit(tmp_path):
    """A reply carries all the frames: more bytes than --max-message-bytes
    is refused by name before anything is drawn, and the session goes on."""
    from support.daemon import DaemonProcess
    limit = 2_000_000  # two 720,000-byte CartPole frames fit, three do not
    with DaemonProcess(tmp_path / "small", "--max-message-bytes", str(limit)) as daemon, \
            daemon.connect() as client:
        fits = client.make("CartPole-v1", 2, seed=0, render_mode="rgb_array")
        fits.reset(seed=0)
        assert len(fits.render()) == 2
        over = client.make("CartPole-v1", 3, seed=0, render_mode="rgb_array")
        over.reset(seed=0)
        with pytest.raises(envd.LimitExceededError,
                           match=r"2160000 bytes of frames .*--max-message-bytes.* at most 2 envs"):
            over.render()
        over.step(np.zeros(3, np.int64))
        assert len(fits.render()) == 2


def test_record_video_through_the_daemon(daemon, tmp_path):
    pytest.importorskip("moviepy")
    folder = tmp_path / "videos"
    with daemon.connect() as client:
        env = client.make("MountainCar-v0", 2, seed=0, render_mode="rgb_array",
                          max_episode_steps=20)
        env = wrappers.RecordVideo(env, str(folder), episode_trigger=lambda e: e == 0)
        env.reset(seed=0)
        for _ in range(21):  # 20 steps end episode 0 (time limit); the next autoresets
            env.step(np.full(2, 2, np.int64))
        env.close()
    assert video_frames(str(folder / "rl-video-episode-0.mp4")) == 21


def test_a_close_pipelined_behind_a_render_waits_for_it(daemon):
    """A close right behind a render of a fast-path session (a raw client
    pipelines them): the render runs on the executor holding the fast path's
    lock, so the fast path must be stopped only once the render has ended.
    Each render is answered (frames, or a clear error), never an internal
    error, and the daemon serves on."""
    import zmq

    from envd import protocol

    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(daemon.endpoint)
    ids = iter(range(1, 1 << 30))

    def ask(header: dict) -> dict:
        sock.send(protocol.pack({**header, "id": next(ids)}))
        assert sock.poll(60_000), f"no reply to {header}"
        return protocol.unpack(sock.recv_multipart()[0], 1 << 30)

    try:
        assert ask({"type": "hello", "version": protocol.PROTOCOL_VERSION})["ok"]
        for _ in range(20):
            made = ask({"type": "make", "env_id": "CartPole-v1", "num_envs": 32, "seed": 0,
                        "render_mode": "rgb_array"})
            assert made["ok"], made
            session = made["session"]
            assert ask({"type": "reset", "session": session})["ok"]
            assert ask({"type": "fast", "session": session})["ok"]
            render_id, close_id = next(ids), next(ids)
            sock.send(protocol.pack({"type": "render", "session": session, "id": render_id}))
            sock.send(protocol.pack({"type": "close", "session": session, "id": close_id}))
            replies = {}
            while len(replies) < 2:
                assert sock.poll(60_000), "a pipelined request got no reply"
                frames = sock.recv_multipart()
                reply = protocol.unpack(frames[0], 1 << 30)
                replies[reply["id"]] = reply
            assert replies[close_id]["ok"], replies[close_id]
            render = replies[render_id]
            assert render["ok"] or render["code"] != "internal", render
        assert daemon.proc.poll() is None
        assert "internal error" not in daemon.log(), daemon.log()[-3000:]
    finally:
        sock.close(0)
        context.term()
    with daemon.connect() as client, client.make("CartPole-v1", 2, seed=0) as env:
        env.reset()


def test_render_mode_across_several_daemons_is_refused_clearly(daemon):
    with envd.connect([daemon.endpoint, daemon.endpoint]) as client:
        with pytest.raises(envd.InvalidArgumentError, match="render_mode is not served"):
            client.make("CartPole-v1", 4, seed=0, render_mode="rgb_array")
        assert client.status()[0]["sessions"] == 0
