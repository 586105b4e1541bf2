"""The Ocean envs the tests step, with their kwargs and C action dtypes.

EXACT envs equal PufferLib's own binding bit for bit; terraform and checkers
seed their streams from the clock in PufferLib, so in envd they are only
reproducible.
The C action dtype is what PufferLib's class hands its binding (breakout and
pong cast even Discrete actions to float32); test_ocean_manifest.py checks
it against the class.
"""
from __future__ import annotations

import numpy as np

# env -> (PufferLib class name, kwargs of the trajectory tests, C action dtype)
EXACT = {
    "breakout": ("Breakout", {}, np.float32),
    "pong": ("Pong", {"max_score": 3}, np.float32),
    "go": ("Go", {}, np.int32),
    "enduro": ("Enduro", {}, np.int32),
    "pacman": ("Pacman", {}, np.int32),
    "snake": ("Snake", {"width": 40, "height": 32, "num_snakes": 4, "num_food": 40}, np.int32),
    "connect4": ("Connect4", {}, np.int32),
    "tetris": ("Tetris", {}, np.int32),
    "cartpole": ("Cartpole", {}, np.float32),
    "squared": ("Squared", {}, np.int32),
    "tripletriad": ("TripleTriad", {}, np.int32),
    "target": ("Target", {"num_agents": 3, "num_goals": 2}, np.int32),
}
REPRODUCIBLE = {
    "terraform": ("Terraform", {"num_agents": 2}, np.int32),
    "checkers": ("Checkers", {}, np.int32),
}
ALL = {**EXACT, **REPRODUCIBLE}
# The envs whose manifests let them write their observation rows directly
# (ENVD_ENV_OBS_ROWS), audited in docs/ocean.md -> whether they read their
# observations back (ENVD_ENV_OBS_ROWS_PRIVATE: bound only in-process).
OBS_ROWS = {"squared": True, "checkers": True, "pong": False, "cartpole": False,
            "breakout": False, "go": False, "enduro": False, "connect4": False,
            "pacman": False, "snake": False, "target": False, "terraform": False,
            "tetris": False, "tripletriad": False}


def random_actions(desc: dict, steps: int, rng: np.random.Generator) -> np.ndarray:
    """steps x agents x action-numel int64 (Discrete, MultiDiscrete) or
    float32 (Box) actions for an env of the described spaces."""
    act, agents = desc["act"], desc["agents"]
    if act["kind"] == 1:
        return rng.integers(0, act["n"], size=(steps, agents, 1))
    if act["kind"] == 2:
        return rng.integers(0, np.array(act["nvec"]), size=(steps, agents, len(act["nvec"])))
    return rng.uniform(-1.5, 1.5, size=(steps, agents, max(1, int(np.prod(act["shape"])))))
