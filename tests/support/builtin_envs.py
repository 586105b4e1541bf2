"""The built-in envs the tests step and random actions for them: a module of
its own, not tests/conftest.py, because pytest imports every conftest.py as
the module "conftest" (tests/ocean has one too), so `from support.builtin_envs import`
could reach the wrong one."""
from __future__ import annotations

import numpy as np

# The built-ins gymnasium has, each matched against gymnasium bit for bit.
GYMNASIUM_ENV_IDS = ["CartPole-v1", "Pendulum-v1", "MountainCar-v0",
                     "MountainCarContinuous-v0", "Acrobot-v1"]
# Every single-agent built-in env: the others are checked against their own
# independent references (tests/native/test_snake.py, test_connect_four.py).
BUILTIN_ENV_IDS = GYMNASIUM_ENV_IDS + ["Snake-v0", "ConnectFour-v0"]
# The multi-agent built-ins (agents as rows), checked against mpe2
# (tests/native/test_simple_spread.py, test_simple_spread_vec.py); apart
# because their actions are rows (num_envs * num_agents of them): a test
# takes them where it builds its actions per row (the async and daemon
# trajectory tests do).
MULTI_AGENT_ENV_IDS = ["simple_spread_v3", "simple_spread_continuous_v3"]


def random_actions(space, num_envs: int, rng: np.random.Generator) -> np.ndarray:
    """A batch of actions for a single-env space.  Box actions go 50% beyond the
    bounds, so the envs' clipping is exercised too."""
    from gymnasium import spaces
    if isinstance(space, spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=num_envs, dtype=np.int64)
    low = np.broadcast_to(space.low, space.shape) * 1.5
    high = np.broadcast_to(space.high, space.shape) * 1.5
    return rng.uniform(low, high, size=(num_envs, *space.shape)).astype(space.dtype)


def listed_builtins() -> list[str]:
    """envd.list_envs() less the Ocean envs that other tests of this process
    made (envd.make loads a puffer:<env> build on first use, and it stays
    listed): the built-ins, whatever ran before."""
    import envd
    return [env_id for env_id in envd.list_envs() if not env_id.startswith("puffer:")]
