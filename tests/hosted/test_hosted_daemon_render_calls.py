"""Hosted envs served by a daemon beyond stepping: render_mode "rgb_array"
(frames drawn in the daemon's workers, equal to gymnasium's SyncVectorEnv's;
frames over --max-message-bytes refused cleanly), RecordVideo, and
call/get_attr/set_attr (msgpack both ways, never pickle; a hanging call ends
after --hosted-timeout), on every client path."""
from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import daemon_envs  # noqa: F401  (registers the fixtures' ids)
import gymnasium
import numpy as np
import pytest
from envs import DAEMON_ENV, alive, descendants, wait_until
from support.daemon import DaemonProcess, left_clean

from envd.errors import EnvError, EnvStateError, InvalidArgumentError, LimitExceededError

HERE = Path(__file__).parent
#: two CartPole frames (400 x 600 x 3 bytes each) fit, three do not
MAX_MESSAGE_BYTES = 2_000_000
FLAGS = ("--threads", "1", "--lease-timeout", "20", "--import", "daemon_envs",
         "--hosted-timeout", "5", "--max-message-bytes", str(MAX_MESSAGE_BYTES),
         "--python-env", "CartPole-v1", "--python-env", "envd-test/HangingCall-v0")
PATHS = {"fast": {"transport": "shm", "fast_path": True},
         "socket": {"transport": "shm", "fast_path": False},
         "inline": {"transport": "inline"}}


class Opaque:
    """A value msgpack cannot carry."""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    proc = DaemonProcess(tmp_path_factory.mktemp("hosted-calls") / "daemon", *FLAGS,
                         env=DAEMON_ENV)
    with left_clean([proc]):
        yield proc


@pytest.fixture(scope="module", params=list(PATHS))
def client(daemon, request):
    with daemon.connect() as c:
        c.make = functools.partial(c.make, **PATHS[request.param])
        yield c


def test_frames_equal_gymnasiums_and_the_message_bound_holds(client):
    env = client.make("py:CartPole-v1", 2, seed=3, num_workers=2, render_mode="rgb_array")
    ref = gymnasium.make_vec("CartPole-v1", 2, vectorization_mode="sync",
                             render_mode="rgb_array")
    try:
        assert env.render_mode == "rgb_array"
        assert env.metadata["render_fps"] == ref.metadata["render_fps"]
        env.reset()
        ref.reset(seed=3)
        for t in range(6):
            frames, expected = env.render(), ref.render()
            assert type(frames) is tuple and len(frames) == 2
            for frame, want in zip(frames, expected):
                np.testing.assert_array_equal(frame, want)
            actions = np.array([t % 2, 1 - t % 2])
            env.step(actions)
            ref.step(actions)
    finally:
        env.close()
        ref.close()
    # three frames are over --max-message-bytes: refused, the session goes on
    with client.make("py:CartPole-v1", 3, seed=0, num_workers=1,
                     render_mode="rgb_array") as big:
        big.reset()
        with pytest.raises(LimitExceededError, match="max-message-bytes"):
            big.render()
        big.step(np.zeros(3, np.int64))
        assert big.get_attr("gravity") == (9.8,) * 3


def test_render_refusals(client):
    with client.make("py:CartPole-v1", 1) as env:
        env.reset()
        with pytest.raises(EnvStateError, match="render_mode='rgb_array'"):
            env.render()
    with pytest.raises(InvalidArgumentError, match="rgb_array"):
        client.make("py:CartPole-v1", 1, render_mode="human")


def test_record_video_writes_a_video(client, tmp_path):
    pytest.importorskip("moviepy")
    env = client.make("py:CartPole-v1", 2, seed=0, render_mode="rgb_array")
    recorder = gymnasium.wrappers.vector.RecordVideo(env, str(tmp_path / "videos"),
                                                     episode_trigger=lambda e: e == 0,
                                                     video_length=8)
    try:
        recorder.reset(seed=0)
        for _ in range(12):
            recorder.step(np.ones(2, np.int64))
    finally:
        recorder.close()
    videos = [f for f in os.listdir(tmp_path / "videos") if f.endswith(".mp4")]
    assert videos and os.path.getsize(tmp_path / "videos" / videos[0]) > 1000


def test_call_get_attr_set_attr(client):
    with client.make("py:CartPole-v1", 3, seed=0, num_workers=2) as env:
        ref = gymnasium.make_vec("CartPole-v1", 3, vectorization_mode="sync")
        env.reset()
        ref.reset(seed=0)
        for vec in (env, ref):
            assert vec.get_attr("gravity") == (9.8,) * 3
            vec.set_attr("force_mag", [1.0, 5.0, 20.0])
            assert vec.get_attr("force_mag") == (1.0, 5.0, 20.0)
            with pytest.raises(ValueError, match="length equal"):
                vec.set_attr("gravity", [1.0])
        assert env.call("np_random_seed") == ref.call("np_random_seed") == (0, 1, 2)
        obs, *_ = env.step(np.ones(3, np.int64))
        ref.step(np.ones(3, np.int64))
        np.testing.assert_array_equal(obs, np.stack(ref.get_attr("state")).astype(np.float32))
        for mine, theirs in zip(env.get_attr("state"), ref.get_attr("state")):
            np.testing.assert_array_equal(mine, theirs)
        ref.close()
        # clear errors; the session goes on after each
        with pytest.raises(AttributeError, match="no_such_attribute"):
            env.get_attr("no_such_attribute")
        with pytest.raises(ValueError, match="use `step` directly"):
            env.call("step", 0)
        with pytest.raises(TypeError, match="msgpack"):
            env.get_attr("np_random")
        with pytest.raises(TypeError, match="msgpack"):
            env.set_attr("gravity", Opaque())
        env.step(np.zeros(3, np.int64))
        assert env.get_attr("force_mag") == (1.0, 5.0, 20.0)
    with pytest.raises(EnvStateError, match="closed"):
        env.get_attr("gravity")


def test_a_built_in_env_refuses_calls_clearly(client):
    with client.make("CartPole-v1", 2) as env:
        with pytest.raises(InvalidArgumentError, match="hosted Python envs only"):
            env.get_attr("gravity")


def test_a_hanging_call_ends_after_the_hosted_timeout(daemon):
    with daemon.connect() as c:
        other = c.make("py:CartPole-v1", 2)
        before = set(descendants(daemon.pid))
        env = c.make("py:envd-test/HangingCall-v0", 2, num_workers=2)
        pids = set(descendants(daemon.pid)) - before
        assert len(pids) == 2
        env.reset()
        other.reset()
        started = time.monotonic()
        with pytest.raises(EnvError, match="longer than 5 s"):
            env.call("hang")
        assert time.monotonic() - started < 120
        assert all(wait_until(lambda p=p: not alive(p)) for p in pids)
        with pytest.raises(EnvError):
            env.get_attr("gravity")  # its workers are gone
        other.step(np.zeros(2, np.int64))  # the daemon and other sessions are intact
        assert other.get_attr("gravity") == (9.8, 9.8)
        env.close()
        other.close()


def test_malformed_call_requests_are_refused_and_never_unpickled(client, tmp_path):
    import pickle

    from envd import info_codec
    from envd.errors import ProtocolError

    marker = tmp_path / "unpickled"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    with client.make("py:CartPole-v1", 2, num_workers=1) as env:
        env.reset()
        for blob in (b"\xc1", pickle.dumps(Evil()), pickle.dumps({"op": "call"}),
                     info_codec.encode({"op": "render"}),
                     info_codec.encode({"op": "call", "name": 3}),
                     info_codec.encode({"op": "call", "name": "x", "args": {}}),
                     info_codec.encode({"op": "set_attr", "name": "gravity", "values": [1.0]}),
                     info_codec.encode([1, 2])):
            with pytest.raises(ProtocolError):
                env._stepper.env_call(blob)
        assert not marker.exists()
        env.step(np.zeros(2, np.int64))  # the session and the daemon are intact
        assert env.get_attr("gravity") == (9.8, 9.8)


def _vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/PID/status")


def _nested_tuples(depth: int) -> bytes:
    import msgpack

    from envd import info_codec
    inner = msgpack.packb([])
    for _ in range(depth):
        inner = msgpack.packb(msgpack.ExtType(info_codec.EXT_TUPLE, inner))
    return inner


def test_call_request_bombs_are_refused_before_they_are_built(daemon, client):
    """A call's arguments nested a thousand tuples deep (3.9 KB: each level a
    msgpack unpacker on the C stack, which crashed the daemon), a frame of
    empty lists (one byte each, ~64 bytes each decoded), a private name: each
    refused, the daemon's peak memory flat, the session and daemon intact."""
    import msgpack

    from envd import info_codec
    from envd.errors import ProtocolError

    deep = msgpack.packb({"op": "call", "name": "render", "args": [
        msgpack.ExtType(info_codec.EXT_TUPLE, _nested_tuples(1000))]})
    lists = msgpack.packb({"op": "call", "name": "render",
                           "args": [[[] for _ in range(MAX_MESSAGE_BYTES - 4096)]]})
    many = msgpack.packb({"op": "set_attr", "name": "gravity",
                          "values": [[[1] * 60_000] * 2, [[1] * 60_000] * 2]})
    with client.make("py:CartPole-v1", 2, num_workers=1) as env:
        env.reset()
        before = _vm_hwm_kib(daemon.pid)
        for blob, words in ((deep, "more than 32 deep"), (lists, "exceeds max_array_len"),
                            (many, "too many objects")):
            with pytest.raises(ProtocolError, match=words):
                env._stepper.env_call(blob)
        for private in ("__class__", "_elapsed_steps"):
            with pytest.raises(ProtocolError, match="private to the env"):
                env._stepper.env_call(info_codec.encode({"op": "call", "name": private}))
        # (the frames themselves are copied a few times: 2 MB each)
        assert _vm_hwm_kib(daemon.pid) - before < 32 << 10
        env.step(np.zeros(2, np.int64))
        assert env.get_attr("gravity") == (9.8, 9.8)
