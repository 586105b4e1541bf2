"""envd's vector envs as a Stable-Baselines3 ``VecEnv`` (``pip install 'envd-rl[sb3]'``).

    import envd
    from stable_baselines3 import PPO
    from envd.integrations.sb3 import EnvdVecEnv

    with envd.connect() as client:
        venv = EnvdVecEnv.make("CartPole-v1", num_envs=8, seed=0, client=client)
        PPO("MlpPolicy", venv).learn(100_000)    # ep_rew_mean comes from envd's statistics

``EnvdVecEnv.make(..., client=None)`` steps the envs in-process (``envd.make``);
``EnvdVecEnv(env)`` wraps a VecEnv you made yourself, in-process or daemon-served,
with ``autoreset_mode="same_step"``.

Why ``same_step``: SB3's VecEnv contract (what ``DummyVecEnv`` does) is that the
step which ends an episode already returns the *next* episode's first
observation, with the last one in ``infos[i]["terminal_observation"]``.  That is
exactly envd's ``same_step`` mode (the env resets inside the done step, in
native code, and puts the final observation in ``info["final_obs"]``).  envd's
default ``next_step`` mode returns the final observation and resets one step
later, ignoring that step's action and paying 0: under SB3 every episode end
would add a phantom transition to the rollout buffer and the first action of
each episode would be taken on the previous episode's last observation.
Emulating ``same_step`` over ``next_step`` or ``disabled`` would cost an extra
round trip to the daemon per done step, so the adapter refuses those modes.

Per step, ``step_wait`` returns ``(obs, rewards, dones, infos)`` as SB3 wants:
``dones = terminated | truncated``; ``infos[i]["TimeLimit.truncated"] = truncated
and not terminated`` in every info (as DummyVecEnv); for an env whose episode
ended, ``infos[i]["terminal_observation"]`` and, as SB3's ``Monitor`` would write
it, ``infos[i]["episode"] = {"r": return, "l": length, "t": seconds}`` taken from
envd's episode statistics (so SB3's logger reports ``rollout/ep_rew_mean``
without a Monitor wrapper; make the env with episode statistics on, the
default, under any key: the adapter reads ``venv.episode_statistics_key``).

Image observations: SB3's ``CnnPolicy`` wants a 3-D uint8 image in [0, 255],
channels first or last.  An env whose observation is a 2-D uint8 image in
[0, 255] (``Snake-v0``: 84x84) is presented with a channel axis, by default
first: ``(1, 84, 84)``, the layout SB3's CNN (PyTorch) consumes directly, so
SB3 adds no ``VecTransposeImage``; ``image_layout="channels_last"`` gives
``(84, 84, 1)`` (gymnasium's and Atari's layout; SB3 then transposes it), and
``image_layout=None`` keeps the env's own shape.  The axis is a reshape of the
same bytes: no transpose, no extra copy.

Dict observations (a hosted ``py:`` env's, say) reach SB3 as it wants them for
``MultiInputPolicy``: a dict of arrays, one per key, each ``(num_envs,
*shape)`` (a 2-D image entry gets its channel axis as above), and a dict per
env in ``terminal_observation``.  SB3 takes a flat Dict only: a Tuple, or a
Dict nested in a Dict, is refused when the adapter is made, as is a Dict or
Tuple action space.

The env's own info fields (e.g. ConnectFour-v0's ``action_mask``) are split
into the per-env dicts; on a done step they describe the new episode's
first state (envd has reset the env already), unlike DummyVecEnv where they
describe the final state.  Arrays returned are copies (envd's own are views of
its buffers, overwritten by the next step; SB3's replay buffers keep them).

``get_attr`` answers ``render_mode`` (None), ``observation_space``,
``action_space``, ``env_id`` and ``max_episode_steps`` (the same for every env
of the batch).  A hosted ``py:`` env's envs are gymnasium.Env objects in its
workers: ``get_attr``, ``set_attr`` and ``env_method`` reach them (its VecEnv's
``get_attr``/``set_attr``/``call``; ``env_method`` on every env only, as the
hosted call runs on every env).  A built-in env has no per-env Python object:
``set_attr`` and ``env_method`` raise ``NotImplementedError`` (env parameters
are fixed at make: pass them as ``make``'s keyword arguments) and ``get_attr``
raises ``AttributeError`` for other names;
``env_is_wrapped`` is True for SB3's ``Monitor`` while episode statistics are on
(the adapter writes Monitor's ``info["episode"]`` itself, so ``evaluate_policy``
reads the episode returns from it and does not warn) and False for every other
wrapper (there are no gymnasium.Env objects to wrap);
``render`` and ``get_images`` raise ``NotImplementedError``.  ``set_options``
is not supported: ``reset`` raises if options were set.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from envd.make_options import env_kind
from envd.vector_base import BatchedVecEnv

try:
    from stable_baselines3.common.vec_env import VecEnv
    from stable_baselines3.common.vec_env.base_vec_env import VecEnvIndices, VecEnvObs, VecEnvStepReturn
except ImportError as exc:  # pragma: no cover -- depends on the installation
    raise ImportError("envd.integrations.sb3 needs Stable-Baselines3: "
                      "pip install 'envd-rl[sb3]'") from exc

__all__ = ["EnvdVecEnv"]

#: Keys envd puts in info itself; the adapter translates them (the rest are the
#: env's own per-env fields, split row by row).
_ENVD_INFO_KEYS = frozenset({"final_obs", "final_info", "env_id"})

#: image_layout values: where the channel axis of a 2-D image observation goes.
IMAGE_LAYOUTS = ("channels_first", "channels_last", None)


def is_2d_image_space(space: spaces.Space) -> TypeGuard[spaces.Box]:
    """A 2-D uint8 Box bounded by [0, 255]: an image without a channel axis,
    which SB3's is_image_space refuses (it wants 3-D)."""
    return (isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 2
            and bool(np.all(space.low == 0)) and bool(np.all(space.high == 255)))


def image_observation_space(space: spaces.Space, layout: str | None) -> spaces.Space:
    """space as the adapter presents it: a channel axis added to a 2-D image
    (see the module docstring), to each such entry of a Dict, anything else
    unchanged."""
    if layout not in IMAGE_LAYOUTS:
        raise ValueError(f"image_layout must be one of {IMAGE_LAYOUTS}, got {layout!r}")
    if isinstance(space, spaces.Dict):
        return spaces.Dict({key: image_observation_space(sub, layout)
                            for key, sub in space.spaces.items()})
    if layout is None or not is_2d_image_space(space):
        return space
    shape = (1, *space.shape) if layout == "channels_first" else (*space.shape, 1)
    return spaces.Box(0, 255, shape, np.uint8)


def observation_shapes(space: spaces.Space) -> tuple[int, ...] | dict[str, tuple[int, ...]]:
    """One env's observation shape as SB3 gets it: a Dict's by key, any other
    space's its own.  SB3's MultiInputPolicy takes a flat Dict of Box,
    Discrete, MultiBinary and MultiDiscrete: anything else is refused here."""
    if not isinstance(space, spaces.Dict):
        if space.shape is None:
            raise ValueError(f"SB3 cannot take a {type(space).__name__} observation "
                             "(a Box, a discrete space, or a flat Dict of those)")
        return tuple(space.shape)
    shapes = {}
    for key, sub in space.spaces.items():
        if isinstance(sub, (spaces.Dict, spaces.Tuple)) or sub.shape is None:
            raise ValueError(f"SB3 takes a flat Dict observation: entry {key!r} is a "
                             f"{type(sub).__name__}")
        shapes[key] = tuple(sub.shape)
    return shapes


class EnvdVecEnv(VecEnv):
    """An envd VecEnv (in-process or daemon-served) as an SB3 VecEnv; see the
    module docstring for the conventions.  Closing it closes the envd env
    (not the client it came from)."""

    def __init__(self, venv: BatchedVecEnv, image_layout: str | None = "channels_first"):
        mode = venv.metadata.get("autoreset_mode")
        if mode != AutoresetMode.SAME_STEP:
            raise ValueError(
                f"EnvdVecEnv needs an env made with autoreset_mode='same_step' (got {mode}): "
                "SB3 expects the step that ends an episode to return the next episode's "
                "first observation; use EnvdVecEnv.make(...) or pass "
                "autoreset_mode='same_step' to make")
        # (batch_size counts envs; a multi-agent env has num_agents rows per env,
        # each an SB3 env: one policy over every agent, i.e. parameter sharing)
        envs = getattr(venv, "num_env_instances", venv.num_envs)
        if getattr(venv, "batch_size", envs) != envs:
            raise ValueError("EnvdVecEnv steps every env each step: make the env without "
                             "batch_size (async mode)")
        self.venv = venv
        self._action_space = venv.single_action_space
        if self._action_space.shape is None:  # a Dict or Tuple
            raise ValueError(f"SB3 cannot take a {type(self._action_space).__name__} action "
                             "(a Box or a discrete space)")
        self._action_shape = (venv.num_envs, *self._action_space.shape)
        self._actions: np.ndarray | None = None
        observation_space = image_observation_space(venv.single_observation_space, image_layout)
        # one env's observation shape as SB3 gets it (a Dict's by key)
        self._obs_shapes = observation_shapes(observation_space)
        self._episode_key = getattr(venv, "episode_statistics_key", "episode")
        super().__init__(venv.num_envs, observation_space, venv.single_action_space)

    @classmethod
    def make(cls, env_id: str, num_envs: int, *, client: Any = None,
             seed: int | Sequence[int] | None = None,
             image_layout: str | None = "channels_first", **kwargs: Any) -> EnvdVecEnv:
        """Make num_envs envs of env_id in autoreset mode ``same_step``: served by
        ``client`` (an ``envd.Client``), or in this process when client is None
        (``envd.make``; kwargs may then include num_threads).  image_layout as
        the class (see the module docstring).  Other kwargs go to make
        (max_episode_steps, env parameters, ...)."""
        if kwargs.pop("autoreset_mode", "same_step") not in ("same_step", AutoresetMode.SAME_STEP):
            raise ValueError("EnvdVecEnv.make always uses autoreset_mode='same_step'")
        if client is None:
            import envd
            venv = envd.make(env_id, num_envs, seed=seed, autoreset_mode="same_step", **kwargs)
        else:
            venv = client.make(env_id, num_envs, seed=seed, autoreset_mode="same_step", **kwargs)
        try:
            assert isinstance(venv, BatchedVecEnv)  # (every kind's, a PettingZoo env's too)
            return cls(venv, image_layout)
        except BaseException:
            venv.close()
            raise

    # ---- stepping ------------------------------------------------------------------
    def reset(self) -> VecEnvObs:
        """Reset every env; seeds set by ``seed()`` apply to this reset only."""
        if any(self._options):
            raise NotImplementedError("envd's envs take no reset options (set_options)")
        given = [int(s) for s in self._seeds if s is not None]
        seeds = given if len(given) == len(self._seeds) else None
        obs, info = self.venv.reset(seed=seeds)
        self.reset_infos = self._split_info(info)
        self._reset_seeds()
        self._reset_options()
        return self._batch(obs)

    def step_async(self, actions: np.ndarray) -> None:
        actions = np.asarray(actions)
        if isinstance(self._action_space, spaces.Discrete):
            # SB3 passes int64 (any integer dtype works); a float action is a bug upstream.
            if not np.issubdtype(actions.dtype, np.integer):
                raise TypeError(f"Discrete actions must be integers, got {actions.dtype}")
            actions = actions.reshape(self._action_shape)
        else:
            actions = actions.reshape(self._action_shape).astype(self._action_space.dtype,
                                                                 copy=False)
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        if self._actions is None:
            raise RuntimeError("step_wait() without step_async()")
        actions, self._actions = self._actions, None
        obs, rewards, terminated, truncated, info = self.venv.step(actions)
        dones = terminated | truncated
        if "agent_mask" in info:  # a multi-agent env: a dead agent's row repeats its final
            dones &= info["agent_mask"]  # flags; SB3 sees it done once, at the step it ended
        infos = self._split_info(info)
        time_limit = truncated & ~terminated
        for i, info_i in enumerate(infos):
            info_i["TimeLimit.truncated"] = bool(time_limit[i])
        if dones.any():
            # object array of copies, set where an env reset; an agent that
            # ended while its env goes on has none: its row is its final one
            final_obs = info.get("final_obs")
            episode = info.get(self._episode_key) if self._episode_key else None
            ended = info.get("_" + self._episode_key) if self._episode_key else None
            for i in np.flatnonzero(dones).tolist():
                final = final_obs[i] if final_obs is not None else None
                infos[i]["terminal_observation"] = self._row(obs, i) if final is None \
                    else self._one(final)
                if episode is not None and ended is not None and ended[i]:
                    infos[i]["episode"] = {"r": float(episode["r"][i]), "l": int(episode["l"][i]),
                                           "t": float(episode["t"][i])}
        return self._batch(obs), np.array(rewards), dones, infos

    def _batch(self, obs: Any) -> np.ndarray | dict[str, np.ndarray]:
        """The envs' observations as SB3 wants them: copies, shaped (an image's
        channel axis), a dict of arrays for a Dict space."""
        shapes = self._obs_shapes
        if isinstance(shapes, tuple):
            return np.array(obs).reshape(self.num_envs, *shapes)
        return {key: np.array(obs[key]).reshape(self.num_envs, *shape)
                for key, shape in shapes.items()}

    def _one(self, obs: Any) -> np.ndarray | dict[str, np.ndarray]:
        """One env's observation (a final one), shaped as SB3 wants it."""
        shapes = self._obs_shapes
        if isinstance(shapes, tuple):
            return np.asarray(obs).reshape(shapes)
        return {key: np.array(obs[key]).reshape(shape) for key, shape in shapes.items()}

    def _row(self, obs: Any, i: int) -> np.ndarray | dict[str, np.ndarray]:
        """Row i of the batch obs, shaped as SB3 wants it."""
        if isinstance(self._obs_shapes, tuple):
            return self._one(np.asarray(obs)[i])
        return self._one({key: np.asarray(obs[key])[i] for key in self._obs_shapes})

    def _split_info(self, info: dict[str, Any]) -> list[dict[str, Any]]:
        """The env's own info fields (arrays with one row per env, optionally
        masked by "_" + key), one dict per env."""
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for key, value in info.items():
            if key.startswith("_") or key in _ENVD_INFO_KEYS or key == self._episode_key:
                continue
            if not (isinstance(value, np.ndarray) and value.shape[:1] == (self.num_envs,)):
                continue
            mask = info.get("_" + key)
            for i in range(self.num_envs):
                if mask is None or mask[i]:
                    infos[i][key] = np.array(value[i])
        return infos

    def close(self) -> None:
        self.venv.close()

    # ---- what SB3's VecEnv also asks for ---------------------------------------------
    def _hosted(self) -> bool:
        """Whether the envs are hosted Python envs (the kinds registry's
        hosted kinds): gymnasium.Env objects in worker processes that
        call/get_attr/set_attr reach."""
        return env_kind(str(self.venv.env_id)).hosted

    def _hosted_indices(self, indices: VecEnvIndices, what: str) -> list[int]:
        """The env indices selected, for a hosted env; NotImplementedError
        saying so for a built-in one."""
        selected = list(self._get_indices(indices))
        if not self._hosted():
            raise NotImplementedError(
                f"{self.venv.env_id}: envd's built-in envs run in native code and have no "
                f"per-env Python object: cannot {what}; pass env parameters as keyword "
                "arguments to make (hosted py: envs have them)")
        return selected

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """render_mode (None: the adapter does not render), observation_space,
        action_space, env_id and max_episode_steps as the adapter sees them
        (the same for every env); any other attribute of a hosted env's envs
        (its VecEnv's get_attr); AttributeError for a built-in env's."""
        values = {"render_mode": lambda: None,
                  "observation_space": lambda: self.observation_space,
                  "action_space": lambda: self.venv.single_action_space,
                  "env_id": lambda: self.venv.env_id,
                  "max_episode_steps": lambda: self.venv.max_episode_steps}
        if attr_name in values:
            value = values[attr_name]()
            return [value for _ in self._get_indices(indices)]
        if not self._hosted():
            raise AttributeError(
                f"envd's envs run in native code and have no attribute {attr_name!r} "
                f"(EnvdVecEnv.get_attr knows {', '.join(sorted(values))}; a hosted env's "
                "envs have their own)")
        results = self.venv.get_attr(attr_name)
        return [results[i] for i in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set attribute attr_name of the envs of indices to value (a hosted
        env's, through its VecEnv's set_attr: the other envs keep the value
        they have, which they must then have); NotImplementedError for a
        built-in env's."""
        selected = self._hosted_indices(indices, f"set {attr_name!r}")
        if set(selected) == set(range(self.num_envs)):
            values = [value] * self.num_envs
        else:
            values = list(self.venv.get_attr(attr_name))
            for i in selected:
                values[i] = value
        self.venv.set_attr(attr_name, values)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        """Call method_name of every env of a hosted env (its VecEnv's call);
        a subset of indices is refused (the hosted call runs on every env,
        and a method may change an env), as is a built-in env's."""
        selected = self._hosted_indices(indices, f"call {method_name!r}")
        if selected != list(range(self.num_envs)):
            raise NotImplementedError(
                f"env_method({method_name!r}, indices={indices!r}): envd's hosted call runs "
                "on every env; call it without indices")
        return list(self.venv.call(method_name, *method_args, **method_kwargs))

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper],
                       indices: VecEnvIndices = None) -> list[bool]:
        """Whether each env is wrapped in wrapper_class.  There are no
        gymnasium.Env objects to wrap, but SB3's Monitor is what envd's
        episode statistics already do (the adapter writes ``info["episode"]``
        as Monitor would): True for Monitor while the env reports episodes;
        False for every other wrapper."""
        from stable_baselines3.common.monitor import Monitor
        monitored = bool(self._episode_key) and wrapper_class is Monitor
        return [monitored for _ in self._get_indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        raise NotImplementedError("envd's envs do not render")

    def render(self, mode: str | None = None) -> np.ndarray | None:
        raise NotImplementedError("envd's envs do not render")
