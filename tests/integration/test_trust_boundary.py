"""Copy, then check (docs/architecture.md, "Trust boundary"): the daemon acts
on the private copy of what it checked, never on the segment a client can
rewrite between the check and the use.

The ActionFlip-v0 test plugin (tests/native/action_flipper.c) rewrites every
action in the session's segment to 99 (out of Discrete(3)) inside its step
callback, before it reads its own action argument, and returns that action as
its observation: a host stepping from the segment hands it 99, one stepping
from its checked copy the action the trainer sent.  Deterministic, over the
socket step, the socket send, the fast-path step and the fast-path send."""
from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from support.daemon import DaemonProcess, segments_of
from support.plugin_checks import build_plugin

import envd
from envd.buffer_layout import buffer_layout
from envd.shm import plan

FLIPPER_SOURCE = Path(__file__).resolve().parents[1] / "native" / "action_flipper.c"
NUM_ENVS = 6


def actions_offset(num_envs: int, multi: bool = False) -> int:
    """Where the daemon puts ActionFlip-v0's (multi: ActionFlipMulti-v0's)
    actions array in the segment."""
    action_space = gym.spaces.MultiDiscrete([3, 3]) if multi else gym.spaces.Discrete(3)
    layout = buffer_layout(gym.spaces.Box(-np.inf, np.inf, (2 if multi else 1,), np.float32),
                           action_space, num_envs, AutoresetMode.NEXT_STEP)
    return plan(layout)[0]["actions"][0]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flip")
    plugin = build_plugin(FLIPPER_SOURCE, folder / "libaction_flipper.so")
    multi = build_plugin(FLIPPER_SOURCE, folder / "libaction_flipper_multi.so", "MULTI")
    with DaemonProcess(folder / "d", "--threads", "1", "--plugin", str(plugin),
                       "--plugin", str(multi)) as proc:
        yield proc
    assert proc.proc.returncode == 0, proc.log()
    assert segments_of(proc.pid) == []


def make_flipper(client: envd.Client, **kwargs) -> envd.VectorEnv:
    env = client.make("ActionFlip-v0", NUM_ENVS, seed=0, actions_offset=actions_offset(NUM_ENVS),
                      rows=NUM_ENVS, **kwargs)
    assert env.transport == "shm"
    # the offset the test gave the plugin is where the daemon put the actions
    # (else the plugin would flip nothing and the test prove nothing)
    base = np.frombuffer(env._segment.memory, np.uint8).ctypes.data
    assert env._segment.arrays["actions"].ctypes.data - base == actions_offset(NUM_ENVS)
    return env


@pytest.mark.parametrize("fast_path", [False, True], ids=["socket", "fast_path"])
def test_step_acts_on_the_checked_copy(daemon, fast_path):
    with daemon.connect() as client, make_flipper(client, fast_path=fast_path) as env:
        assert env.fast_path == fast_path
        env.reset()
        for round_ in range(4):
            actions = (np.arange(NUM_ENVS) + round_) % 3
            obs = env.step(actions)[0]
            assert obs[:, 0].tolist() == actions.tolist(), \
                f"the env saw {obs[:, 0].tolist()}, the trainer sent {actions.tolist()}"
            # the plugin did rewrite the segment: the copy is what protected the env
            assert (env._segment.arrays["actions"] == 99).all()
        # a step with a bad action is still refused, with the action the daemon checked
        bad = np.zeros(NUM_ENVS, np.int64)
        bad[2] = 7
        with pytest.raises(envd.InvalidActionError, match=r"7.*env 2|env 2.*7"):
            env.step(bad)


@pytest.mark.parametrize("fast_path", [False, True], ids=["socket", "fast_path"])
def test_send_acts_on_the_checked_copy(daemon, fast_path):
    # One batch in flight at a time (batch_size = num_envs): the plugin's
    # flips inside a batch must not land on actions written for the next
    # send before the daemon copies them (then the daemon would rightly
    # refuse the 99 it checked: a hostile writer, not what this test is about).
    rng = np.random.default_rng(0)
    with daemon.connect() as client, make_flipper(client, fast_path=fast_path) as env:
        assert env.fast_path == fast_path
        env.async_reset()
        sent: dict[int, int] = {}  # env id -> the action last sent to it
        for _ in range(5):
            obs, _, _, _, info = env.recv()
            ids = [int(i) for i in info["env_id"]]
            assert sorted(ids) == list(range(NUM_ENVS))
            for i, action in zip(ids, obs[:, 0].tolist()):  # -1: just reset
                assert action == sent.get(i, -1), f"env {i} saw {action}, was sent {sent.get(i)}"
            if sent:  # the plugin did rewrite the segment: the copy protected the envs
                assert (env._segment.arrays["actions"] == 99).all()
            order = rng.permutation(NUM_ENVS)  # the ids' order in the send varies
            sent = {int(i): int(rng.integers(3)) for i in order}
            env.send(np.array(list(sent.values()), np.int64), order)
        env.recv()  # nothing left in flight before close


@pytest.mark.parametrize("fast_path", [False, True], ids=["socket", "fast_path"])
def test_multi_discrete_step_acts_on_the_checked_copy(daemon, fast_path):
    """Every element of a MultiDiscrete action is checked in the daemon's copy
    and the env reads that copy (ABI 4 spaces)."""
    with daemon.connect() as client, \
            client.make("ActionFlipMulti-v0", NUM_ENVS, seed=0, fast_path=fast_path,
                        actions_offset=actions_offset(NUM_ENVS, multi=True),
                        rows=NUM_ENVS) as env:
        base = np.frombuffer(env._segment.memory, np.uint8).ctypes.data
        assert env._segment.arrays["actions"].ctypes.data - base == \
            actions_offset(NUM_ENVS, multi=True)
        env.reset()
        rng = np.random.default_rng(1)
        for _ in range(4):
            actions = rng.integers(0, 3, (NUM_ENVS, 2))
            obs = env.step(actions)[0]
            assert obs.tolist() == actions.tolist()
            assert (env._segment.arrays["actions"] == 99).all()
        bad = np.zeros((NUM_ENVS, 2), np.int64)
        bad[4, 1] = 3
        with pytest.raises(envd.InvalidActionError, match="env 4"):
            env.step(bad)


@pytest.mark.parametrize("transport", ["shm", "inline"])
def test_refused_step_is_worded_from_the_daemon_books(daemon, transport):
    """Review finding: the daemon chose "never reset" vs "done" for a refused
    step from the flags in the shared segment, which the client writes.  Flags
    scribbled before the refused step leave its message right (the socket
    path: the daemon words it; inline: the daemon's own buffers, as a check
    that both agree)."""
    with daemon.connect() as client:
        with client.make("CartPole-v1", 4, seed=0, autoreset_mode="disabled",
                         transport=transport, fast_path=False) as env:
            flags = env._segment.arrays if transport == "shm" else None
            if flags is not None:  # never reset, yet flagged done
                flags["terminations"][:] = True
                flags["truncations"][:] = True
            with pytest.raises(envd.EnvStateError, match="env 0 was never reset"):
                env.step(np.zeros(4, np.int64))
            env.reset()
            for _ in range(200):  # pushing left: every pole falls within 200 steps
                _, _, term, trunc, _ = env.step(np.zeros(4, np.int64))
                if (term | trunc).any():
                    break
            done = int(np.argmax(term | trunc))
            assert (term | trunc)[done]
            if flags is not None:  # done, yet flagged live
                flags["terminations"][:] = False
                flags["truncations"][:] = False
            with pytest.raises(envd.EnvStateError,
                               match=f"env {done} is done and autoreset_mode is 'disabled'"):
                env.step(np.zeros(4, np.int64))
        with client.make("CartPole-v1", 2, seed=0) as env:  # the daemon serves on
            env.reset()
            env.step(np.zeros(2, np.int64))
