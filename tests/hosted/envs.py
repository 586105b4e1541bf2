"""Test fixtures for hosted Python envs: small gymnasium envs that fail on
purpose, and the process checks the failure and leak tests share."""
from __future__ import annotations

import ctypes
import os
import time

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class FailingEnv(gymnasium.Env):
    """A counter env that fails when it was reset with seed fail_seed (env i
    of envd.make(..., seed=0) gets seed i) at its at_step-th step (0: in that
    reset), the way `how` says: "raise" (ValueError("boom at step N")),
    "exit" (os._exit(3)) or "segfault" (a ctypes read of address 0)."""

    def __init__(self, fail_seed: int, at_step: int, how: str = "raise"):
        self.observation_space = spaces.Box(-1e9, 1e9, (2,), np.float64)
        self.action_space = spaces.Discrete(3, start=-1)
        self.fail_seed, self.at_step, self.how = fail_seed, at_step, how
        self.seed_, self.t = None, 0

    def _maybe_fail(self) -> None:
        if self.seed_ != self.fail_seed or self.t != self.at_step:
            return
        if self.how == "exit":
            os._exit(3)
        if self.how == "segfault":
            ctypes.string_at(0)
        raise ValueError(f"boom at step {self.t}")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.seed_ = seed
        self.t = 0
        self._maybe_fail()
        return np.zeros(2), {}

    def step(self, action):
        self.t += 1
        self._maybe_fail()
        return np.array([self.t, action], np.float64), 1.0, False, False, {}


def failing_creator(fail_seed: int, at_step: int, how: str = "raise"):
    return lambda: FailingEnv(fail_seed, at_step, how)


class FailsAfterDoneEnv(gymnasium.Env):
    """Episodes of 3 steps, reward 1 each.  Once `armed` (a file) exists, the
    worker fails right after env.step ends an episode: the reset that
    follows the done step raises (in SAME_STEP mode: the reset at once), or
    (big_info) the done step's info is too big for its slot (a worker's
    info_bytes); the file goes.  (A file: make's probe of the env steps and
    resets it before the test arms it, in another process.)  obs: (step in
    the episode, 0)."""
    observation_space = spaces.Box(-1e9, 1e9, (2,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self, armed: str, big_info: bool = False):
        self.armed, self.big_info, self.t = armed, big_info, 0

    def _fire(self) -> bool:
        try:
            os.unlink(self.armed)
        except FileNotFoundError:
            return False
        return True

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if not self.big_info and self.t == 3 and self._fire():
            raise ValueError("reset boom")
        self.t = 0
        return np.array([self.t, 0], np.float64), {}

    def step(self, action):
        self.t += 1
        done = self.t == 3
        info = {"x": "y" * 100_000} if self.big_info and done and self._fire() else {}
        return np.array([self.t, 0], np.float64), 1.0, done, False, info


class UnsupportedSpaceEnv(gymnasium.Env):
    """A Dict observation with a Text leaf deep inside: refused at make, naming
    the space and its path."""
    observation_space = spaces.Dict({"ok": spaces.Box(0, 1, (1,), np.float32),
                                     "inner": spaces.Tuple((spaces.Discrete(2),
                                                            spaces.Text(5)))})
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


class DictObsEnv(gymnasium.Env):
    """Dict observations (a float32 Box, a Discrete with a negative start, a
    MultiBinary and a nested Tuple of a 0-d float64 Box and a Discrete), Tuple
    actions (Discrete(3, start=-1), MultiBinary(2), a Box), episodes that end
    at random, and infos on some steps only: plain values, numpy scalars and
    arrays, strings, a nested dict."""
    observation_space = spaces.Dict({
        "pos": spaces.Box(-5, 5, (2,), np.float32),
        "mode": spaces.Discrete(4, start=-2),
        "flags": spaces.MultiBinary(3),
        "inner": spaces.Tuple((spaces.Box(0, 100, (), np.float64), spaces.Discrete(2)))})
    action_space = spaces.Tuple((spaces.Discrete(3, start=-1), spaces.MultiBinary(2),
                                 spaces.Box(-1, 1, (2,), np.float32)))

    def _obs(self):
        return {"pos": self.pos.copy(), "mode": np.int64(self.t % 4 - 2),
                "flags": (self.np_random.random(3) < 0.5).astype(np.int8),
                "inner": (np.array(float(self.t), np.float64), np.int64(self.t % 2))}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.t = 0
        info = {"start": self.pos.copy()} if self.np_random.random() < 0.5 else {}
        return self._obs(), info

    def step(self, action):
        move, buttons, push = action
        self.t += 1
        self.pos = np.clip(self.pos + 0.5 * push + 0.1 * move, -5, 5).astype(np.float32)
        reward = float(move) + 0.25 * float(buttons.sum()) + float(self.np_random.normal())
        terminated = bool(self.np_random.random() < 0.08)
        info = {}
        if self.t % 3 == 0:
            info["t"] = self.t
            info["energy"] = np.float32(self.pos @ self.pos)
        if buttons.all():
            info["combo"] = {"count": int(buttons.sum()), "at": self.pos.copy()}
        if terminated:
            info["why"] = "fell"
        return self._obs(), reward, terminated, False, info


class MultiDiscreteActionEnv(gymnasium.Env):
    """MultiDiscrete actions (with starts, one negative), Tuple observations
    (a float64 Box, a MultiDiscrete, a Dict of a 2-D MultiBinary), float32
    rewards (batched as float64, as SyncVectorEnv does) and an info on
    every other step."""
    observation_space = spaces.Tuple((
        spaces.Box(-np.inf, np.inf, (3,), np.float64),
        spaces.MultiDiscrete([3, 5]),
        spaces.Dict({"hot": spaces.MultiBinary((2, 2))})))
    action_space = spaces.MultiDiscrete([3, 4, 2], start=[-1, 0, 5])

    def _obs(self):
        return (self.state.copy(), np.array([self.t % 3, self.t % 5], np.int64),
                {"hot": (self.np_random.random((2, 2)) < 0.3).astype(np.int8)})

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = self.np_random.normal(size=3)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.state = self.state * 0.9 + np.asarray(action, np.float64)
        reward = np.float32(-np.abs(self.state).sum() / 10)
        terminated = bool(np.abs(self.state).max() > 12)
        info = {"tick": np.int32(self.t), "action": np.asarray(action).copy()} \
            if self.t % 2 else {}
        return self._obs(), reward, terminated, False, info


class ColumnInfoEnv(gymnasium.Env):
    """Step infos of every type an info column holds (Python float, int and
    bool, numpy float32 and int16 scalars, a float32 array), the same keys
    and types for the env's first 64 steps (its description's, which picks
    the columns), then now and then not: a key's type changes (int to
    float, bool to numpy bool, the array's dtype), a key goes or comes.
    Reset infos have other keys; episodes end at random."""
    observation_space = spaces.Box(-10, 10, (2,), np.float64)
    action_space = spaces.Discrete(3)

    def __init__(self):
        self.total = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2)
        return self.pos.copy(), {"start": float(self.pos[0])}

    def step(self, action):
        self.total += 1
        self.pos = np.clip(self.pos + 0.1 * (int(action) - 1), -10, 10)
        x = float(self.np_random.normal())
        info = {"x": x, "n": self.total, "ok": x > 0, "f32": np.float32(x / 3),
                "i16": np.int16(self.total % 300), "vec": np.array([x, -x], np.float32)}
        if self.total > 64:
            how = self.total % 7
            if how == 1:
                info["n"] = float(self.total)
            elif how == 2:
                del info["ok"]
            elif how == 3:
                info["ok"] = np.bool_(x > 0)
            elif how == 4:
                info["vec"] = info["vec"].astype(np.float64)
            elif how == 5:
                info["extra"] = "words"
        terminated = bool(self.np_random.random() < 0.06)
        return self.pos.copy(), x, terminated, False, info


def alive(pid: int) -> bool:
    """Whether pid names a process that is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # (reaped before the open, or the read)
        return False


#: The environment of a daemon whose --import / --python-env modules live in
#: this folder (daemon_envs.py, pz_envs.py): they import it by name.
DAEMON_ENV = {"PYTHONPATH": os.pathsep.join(
    filter(None, [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH")]))}


def descendants(pid: int) -> list[int]:
    """Every live process under pid (a daemon's template and its workers)."""
    out, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            if alive(child):
                out.append(child)
                todo.append(child)
    return out


def children(pid: int) -> list[int]:
    """The pids whose parent is pid (zombies included)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return out


def wait_until(condition, deadline_s: float = 60.0) -> bool:
    """Poll condition until it holds or a generous deadline passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


#: an environment variable naming a file a HangingEnv creates as it starts
#: to hang: a test waits for that event instead of sleeping "long enough"
HANG_MARKER_VARIABLE = "ENVD_TEST_HANG_MARKER"


class HangingEnv(FailingEnv):
    """A FailingEnv whose failure is to hang (sleep for an hour).  It first
    creates the file $ENVD_TEST_HANG_MARKER names, when that is set."""

    def _maybe_fail(self) -> None:
        if self.seed_ == self.fail_seed and self.t == self.at_step:
            marker = os.environ.get(HANG_MARKER_VARIABLE)
            if marker:
                with open(marker, "w") as file:
                    file.write(str(os.getpid()))
            time.sleep(3600)


class HangingMakeEnv(FailingEnv):
    """A FailingEnv whose second construction in one process hangs: the
    daemon describes it (one env, in a child of the template) at startup,
    and a worker making two of them hangs."""

    made = 0

    def __init__(self):
        super().__init__(fail_seed=-1, at_step=-1)
        HangingMakeEnv.made += 1
        if HangingMakeEnv.made == 2:
            time.sleep(3600)


class HangingConstructorEnv(FailingEnv):
    """Hangs in its constructor, every time (the daemon's startup describes it)."""

    def __init__(self):
        super().__init__(fail_seed=-1, at_step=-1)
        time.sleep(3600)


class SlowCloseEnv(FailingEnv):
    """A FailingEnv whose close hangs once it was reset with a seed (the
    daemon's startup description resets it unseeded and closes it): its
    worker does not exit when told to."""

    def __init__(self):
        super().__init__(fail_seed=-1, at_step=-1)
        self.seeded = False

    def reset(self, *, seed=None, options=None):
        self.seeded = self.seeded or seed is not None
        return super().reset(seed=seed, options=options)

    def close(self):
        if self.seeded:
            time.sleep(3600)


class ExitingConstructorEnv(FailingEnv):
    """Raises SystemExit in its constructor (sys.exit in an env's code)."""

    def __init__(self):
        raise SystemExit(7)


class PidRecordingEnv(FailingEnv):
    """Appends the pid of each process that constructs it to a file."""

    def __init__(self, path: str):
        super().__init__(fail_seed=-1, at_step=-1)
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")


class InterruptingEnv(FailingEnv):
    """Raises KeyboardInterrupt in its step (Ctrl-C while it steps) once it
    was reset with a seed (make's description steps it unseeded)."""

    def step(self, action):
        if self.seed_ is not None:
            raise KeyboardInterrupt
        return super().step(action)


class HangingCallEnv(CartPoleEnv):
    """A CartPole whose hang() never returns (an hour): a call that hangs."""

    def hang(self):
        time.sleep(3600)
