"""Test fixtures for hosted Python envs: small gymnasium envs that fail on
purpose, and the process checks the failure and leak tests share."""
from __future__ import annotations

import ctypes
import os
import time

import gymnasium
import numpy as np
from gymnasium import spaces


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


class MultiDiscreteEnv(gymnasium.Env):
    observation_space = spaces.Box(0, 1, (1,), np.float32)
    action_space = spaces.MultiDiscrete([2, 3])

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}


def alive(pid: int) -> bool:
    """Whether pid names a process that is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


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


class HangingEnv(FailingEnv):
    """A FailingEnv whose failure is to hang (sleep for an hour)."""

    def _maybe_fail(self) -> None:
        if self.seed_ == self.fail_seed and self.t == self.at_step:
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
