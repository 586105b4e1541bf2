"""One envd env as a ``gymnasium.Env``: what ``gymnasium.make("envd/<id>")`` returns.

envd steps envs in batches; a single env is a batch of one with
``autoreset_mode="disabled"``: as for any gymnasium.Env, the caller resets
after an episode ends (stepping a finished episode raises envd.EnvStateError
saying so, instead of gymnasium's undefined behaviour).  ``reset(seed=s)`` seeds it as
gymnasium seeds its own env (env 0 of a batch seeded with s), so its episodes
equal gymnasium's bit for bit for the built-in classic-control envs.

Results are copies (a gymnasium.Env's caller may keep them); the reward is a
Python float, terminated and truncated Python bools.  The info holds the env's
own info fields (one row each) and, on the step that ends an episode, envd's
episode statistics as plain numbers under the env's statistics key
(``info["envd_episode"] = {"r": ..., "l": ..., "t": ...}`` by default), so
gymnasium's RecordEpisodeStatistics wrapper works on top.  This is for
libraries and checks that want a gymnasium.Env; for speed, step many envs with
``gymnasium.make_vec`` / ``envd.make``.
"""
from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode

from envd import leaves
from envd.errors import EnvStateError, InvalidArgumentError
from envd.vector_base import BatchedVecEnv
from envd.vector_make import make_vector_env


class EnvdEnv(gymnasium.Env):
    """A gymnasium.Env over an envd vector env of one env (see the module docstring)."""

    # (gymnasium's Env.metadata: __init__ gives each instance its own)
    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012

    def __init__(self, venv: BatchedVecEnv):
        agents = getattr(venv, "num_agents", 1)
        if agents > 1:
            # a gymnasium.Env is one agent; a multi-agent env is only rows of a vector env
            raise InvalidArgumentError(
                f"{venv.env_id} is a multi-agent env "
                f"({agents} agents, one row each): a single gymnasium.Env cannot hold it; "
                "use envd.make(env_id, num_envs) or gymnasium.make_vec")
        if venv.num_envs != 1 or venv.metadata.get("autoreset_mode") != AutoresetMode.DISABLED:
            raise InvalidArgumentError(
                "EnvdEnv wraps a vector env of num_envs=1 made with autoreset_mode='disabled' "
                f"(got num_envs={venv.num_envs}, {venv.metadata.get('autoreset_mode')}); "
                "use EnvdEnv.make(env_id)")
        self.venv = venv
        self.observation_space = venv.single_observation_space
        self.action_space = venv.single_action_space
        self.render_mode = venv.render_mode
        self.metadata = {key: venv.metadata[key] for key in ("render_modes", "render_fps")
                         if key in venv.metadata}
        # A Dict/Tuple space (no shape): its values go leaf by leaf (_batch_of_one, _row)
        self._action_shape = (None if self.action_space.shape is None
                              else (1, *self.action_space.shape))
        self._composite_obs = leaves.is_composite(self.observation_space)
        self._episode_over = False  # step() refuses until reset()

    @classmethod
    def make(cls, env_id: str, *, endpoint: Any = None, **kwargs: Any) -> EnvdEnv:
        """One env of env_id, in this process (endpoint None) or served by a
        daemon (endpoint as envd.vector_make.make_vector_env); kwargs go
        to envd.make / Client.make (seed, max_episode_steps, env parameters...)."""
        for fixed in ("num_envs", "autoreset_mode", "batch_size"):
            if fixed in kwargs:
                raise InvalidArgumentError(
                    f"a single envd env fixes {fixed}; use gymnasium.make_vec for a batch")
        venv = make_vector_env(1, envd_id=env_id, endpoint=endpoint,
                               autoreset_mode="disabled", **kwargs)
        try:
            # (make returns a PettingZoo env, its other kind, only without autoreset_mode)
            assert isinstance(venv, BatchedVecEnv)
            return cls(venv)
        except BaseException:
            venv.close()
            raise

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Start an episode; seed as gymnasium's (None continues the env's generator)."""
        super().reset(seed=seed)
        if options:
            raise InvalidArgumentError(f"{self.venv.env_id}: a single env takes no reset "
                                       f"options, got {sorted(options)}")
        obs, info = self.venv.reset(seed=seed)
        self._episode_over = False
        return self._row(obs), self._first_row(info)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """One step: (obs, reward, terminated, truncated, info)."""
        if self._episode_over:
            raise EnvStateError(f"{self.venv.env_id}: the episode has ended (terminated or "
                                "truncated); call reset() before stepping again")
        if self._action_shape is None:
            actions = self._batch_of_one(action)
        else:
            actions = np.asarray(action)
            if actions.shape == self.action_space.shape:
                actions = actions.reshape(self._action_shape)  # else the vec's shape error
        obs, rewards, terminations, truncations, info = self.venv.step(actions)
        self._episode_over = bool(terminations[0] or truncations[0])
        return (self._row(obs), float(rewards[0]), bool(terminations[0]), bool(truncations[0]),
                self._first_row(info))

    def _batch_of_one(self, action: Any) -> Any:
        """A Dict/Tuple action as the vec takes it: the same structure, each
        leaf with a batch axis of one (InvalidActionError for a structure not
        the space's; the vec checks each leaf's shape and dtype)."""
        space = self.action_space
        values = leaves.flatten(space, action, f"{self.venv.env_id}: action")
        return leaves.unflatten(space, [np.asarray(value)[np.newaxis] for value in values])

    def _row(self, obs: Any) -> Any:
        """The observation of the batch of one, a copy (a Dict/Tuple: as the
        env's space has it, each leaf its row)."""
        if self._composite_obs:
            return leaves.row_of(self.observation_space, obs, 0)
        return obs[0].copy()

    @staticmethod
    def _first_row(info: dict[str, Any]) -> dict[str, Any]:
        """The vector info of a batch of one, as one env's: arrays -> their row
        (a copy; an object array's: the value the env gave), dicts of arrays
        (episode statistics, a hosted env's nested info) -> their values
        (_nested_row); the masks ("_" + key) of its own keys dropped."""
        row: dict[str, Any] = {}
        for key, value in info.items():
            if key.startswith("_"):
                continue
            if isinstance(value, dict):
                row[key] = {k: EnvdEnv._nested_row(v) for k, v in value.items()}
            elif isinstance(value, np.ndarray):
                row[key] = value[0] if value.dtype == object else value[0].copy()
        return row

    @staticmethod
    def _nested_row(value: Any) -> Any:
        """Row 0 of a value in a dict of the vector info: a plain number from a
        column of numbers (episode statistics: "r", "l", "t"), a copy of an
        array's row, an object array's value, a nested dict's rows."""
        if isinstance(value, dict):
            return {k: EnvdEnv._nested_row(v) for k, v in value.items()}
        if value.dtype == object:
            return value[0]
        return value[0].item() if value.ndim == 1 else value[0].copy()

    def render(self) -> np.ndarray:
        """The env's frame, (height, width, 3) uint8 (needs render_mode="rgb_array")."""
        return self.venv.render()[0]

    def close(self) -> None:
        self.venv.close()

    def __repr__(self) -> str:
        return f"envd.EnvdEnv({self.venv!r})"
