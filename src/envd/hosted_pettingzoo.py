"""PettingZoo ParallelEnvs hosted in worker processes, their agents as rows:
``envd.make("pz:<module>:<factory>", N, num_workers=K)`` or
``envd.make_pettingzoo(creator, N, ...)`` (native/hosted_pettingzoo.py, the
in-process maker), or a daemon's ``client.make("pz:...")``
(docs/python-envs.md, "PettingZoo").  This module is shared with the client:
it loads no native code.

How: each worker hosts ``ParallelAsEnv`` adapters, gymnasium envs over one
ParallelEnv each, through the gymnasium hosting path (hosted_env.py): the
adapter's observation is a Dict of the agents' stacked observations and their
per-agent rewards, flags and live mask ("agent-major" within the env), its
action the agents' stacked actions, and it ends its episode (terminated) when
every agent is done, so the hosted session's autoreset resets the whole env.
``PettingZooVecEnv`` views those (num_envs, A, ...) buffers as num_envs * A
rows (row i*A + a is agent a of env i) with the native multi-agent path's
semantics (docs/writing-envs.md, "Multi-agent envs"): per-row rewards and
flags, a done agent's later rows dead (zero observation, reward 0, its final
flags again) with info["agent_mask"], per-row episode statistics, one seed
per env.

Agents must be fixed and homogeneous: every possible agent has agent 0's
observation and action spaces, which must be one leaf (Box, Discrete,
MultiDiscrete, MultiBinary); others are refused at make, naming the agent and
the space.
"""
from __future__ import annotations

import importlib
import importlib.util
import time
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from envd.errors import InvalidArgumentError, UnknownEnvError
from envd.vec_info import episode_statistics_key
from envd.vector_base import possible_agents

#: The id prefix of a PettingZoo ParallelEnv factory: "pz:<module>:<factory>"
#: (gymnasium's envs are "py:<id>", envd's built-ins bare ids).
PETTINGZOO_PREFIX = "pz:"

#: The agent spaces hosted (one leaf each: a row of the native multi-agent layout).
AGENT_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def check_agents(env: Any) -> tuple[list[str], spaces.Space, spaces.Space]:
    """The possible agents of a ParallelEnv and their (shared) observation and
    action spaces; ValueError naming the agent and space when they are not
    homogeneous, or not one of AGENT_SPACES."""
    agents = list(getattr(env, "possible_agents", None) or [])
    if not agents:
        raise ValueError(f"{type(env).__name__} has no possible_agents: a hosted PettingZoo env "
                         "needs a fixed list of agents")
    obs, act = env.observation_space(agents[0]), env.action_space(agents[0])
    for what, space in (("observation", obs), ("action", act)):
        if not isinstance(space, AGENT_SPACES):
            raise ValueError(f"agent {agents[0]!r} has {what} space {space}; hosted PettingZoo "
                             "agents take Box, Discrete, MultiDiscrete or MultiBinary spaces")
    for agent in agents[1:]:
        for what, first, space in (("observation", obs, env.observation_space(agent)),
                                   ("action", act, env.action_space(agent))):
            if space != first:
                raise ValueError(f"agent {agent!r} has {what} space {space}, agent "
                                 f"{agents[0]!r} {first}: hosted PettingZoo envs need "
                                 "homogeneous agents (one space for all)")
    return agents, obs, act


def stack_space(space: spaces.Space, num_agents: int) -> spaces.Space:
    """num_agents of an agent space stacked on a first axis, of the same kind
    (a Discrete becomes a MultiDiscrete, whose bounds the hosted backend
    checks; gymnasium's batch_space would turn a MultiDiscrete into an
    unchecked Box).  unstack_space inverts it."""
    a = num_agents
    if isinstance(space, spaces.Discrete):
        return spaces.MultiDiscrete(np.full(a, space.n), space.dtype,
                                    start=np.full(a, space.start))
    if isinstance(space, spaces.MultiDiscrete):
        return spaces.MultiDiscrete(np.stack([space.nvec] * a), space.dtype,
                                    start=np.stack([space.start] * a))
    if isinstance(space, spaces.MultiBinary):
        return spaces.MultiBinary((a, *space.shape))
    assert isinstance(space, spaces.Box)  # (check_agents: one of AGENT_SPACES)
    return spaces.Box(np.stack([space.low] * a), np.stack([space.high] * a), dtype=space.dtype)


def unstack_space(space: spaces.Space) -> spaces.Space:
    """An agent's space from stack_space(space, A) (its first axis dropped)."""
    if isinstance(space, spaces.MultiDiscrete):
        if space.nvec.ndim == 1:  # (stacked Discretes; an agent's MultiDiscrete adds an axis)
            return spaces.Discrete(int(space.nvec[0]), start=int(space.start[0]))
        return spaces.MultiDiscrete(space.nvec[0], space.dtype, start=space.start[0])
    if isinstance(space, spaces.MultiBinary):
        return spaces.MultiBinary(space.shape[1:] if len(space.shape) > 2 else space.shape[1])
    assert isinstance(space, spaces.Box)  # (stack_space's only other kind)
    return spaces.Box(space.low[0], space.high[0], space.shape[1:], space.dtype)


class ParallelAsEnv(gymnasium.Env):
    """One ParallelEnv as a gymnasium env whose observation is a Dict:
    "obs" (A, *agent observation), "reward" (A,) float64, "terminated",
    "truncated" and "live" (A,) MultiBinary; its action the A actions
    stacked (stack_space).  A done agent's later rows are dead
    (zero observation, reward 0, its final flags again, live 0); the episode
    ends (terminated=True) when every agent is done."""

    def __init__(self, env: Any):
        self.env = env
        self.agents, obs, act = check_agents(env)
        #: the ParallelEnv's agent names, in row order (a trainer's possible_agents)
        self.possible_agents = list(self.agents)
        a = len(self.agents)
        self.agent_observation_space, self.agent_action_space = obs, act
        self.observation_space = spaces.Dict({
            "obs": stack_space(obs, a),
            "reward": spaces.Box(-np.inf, np.inf, (a,), np.float64),
            "terminated": spaces.MultiBinary(a), "truncated": spaces.MultiBinary(a),
            "live": spaces.MultiBinary(a)})
        self.action_space = stack_space(act, a)
        stacked = self.observation_space["obs"]
        # (stack_space's spaces, a Box, MultiDiscrete or MultiBinary, have both)
        assert stacked.shape is not None and stacked.dtype is not None
        self._obs = np.zeros(stacked.shape, stacked.dtype)
        self._final = np.zeros((2, a), np.int8)  # each agent's final (terminated, truncated)
        self._done = np.zeros(a, bool)
        # rendering is the ParallelEnv's own (render_mode "rgb_array": one
        # frame of the whole env, all its agents drawn)
        self.render_mode = getattr(env, "render_mode", None)
        self.metadata = {"render_fps": getattr(env, "metadata", {}).get("render_fps")}

    def render(self) -> Any:
        """The ParallelEnv's own render() (its frame, with render_mode "rgb_array")."""
        return self.env.render()

    def _holder(self, name: str) -> Any:
        # the ParallelEnv, or the env it wraps (PettingZoo's wrappers, e.g.
        # aec_to_parallel, do not forward attributes: gymnasium's
        # get_wrapper_attr looks through wrappers likewise)
        if hasattr(self.env, name):
            return self.env
        inner = getattr(self.env, "unwrapped", self.env)
        return inner if hasattr(inner, name) else self.env

    def get_wrapper_attr(self, name: str) -> Any:
        """The ParallelEnv's attribute name (or its unwrapped env's):
        call/get_attr on a hosted PettingZoo env reach the ParallelEnv, not
        this adapter."""
        return getattr(self._holder(name), name)

    def set_wrapper_attr(self, name: str, value: Any, *, force: bool = True) -> bool:
        """Set the ParallelEnv's attribute name (where get_wrapper_attr finds
        it; a new one on the ParallelEnv)."""
        setattr(self._holder(name), name, value)
        return True

    def _result(self, obs: dict, rewards: dict | None, live: np.ndarray) -> dict:
        self._obs[...] = 0
        for k, agent in enumerate(self.agents):
            if live[k] and agent in obs:
                self._obs[k] = obs[agent]
        reward = np.zeros(len(self.agents))
        if rewards is not None:
            for k, agent in enumerate(self.agents):
                reward[k] = rewards.get(agent, 0.0) if live[k] else 0.0
        return {"obs": self._obs.copy(), "reward": reward, "terminated": self._final[0].copy(),
                "truncated": self._final[1].copy(), "live": live.astype(np.int8)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, _ = self.env.reset(seed=seed, options=options)
        self._final[...] = 0
        # (an agent absent at reset is dead for the episode)
        self._done = np.array([agent not in obs for agent in self.agents])
        return self._result(obs, None, ~self._done), {}

    def step(self, action: np.ndarray):
        live = ~self._done
        actions = {agent: action[k] for k, agent in enumerate(self.agents) if live[k]}
        obs, rewards, terms, truncs, _ = self.env.step(actions)
        remaining = set(self.env.agents)  # (empty: the episode is over for everyone)
        for k, agent in enumerate(self.agents):
            if not live[k]:
                continue
            if terms.get(agent, False) or truncs.get(agent, False):
                self._final[:, k] = (bool(terms.get(agent)), bool(truncs.get(agent)))
                self._done[k] = True
            elif agent not in obs or agent not in remaining:
                # dropped without a flag (absent from the step's observations
                # or from env.agents): its episode was cut short, truncated,
                # so that every row that dies says so in its flags
                self._final[:, k] = (False, True)
                self._done[k] = True
        result = self._result(obs, rewards, live)
        return result, float(result["reward"].sum()), bool(self._done.all()), False, {}

    def close(self) -> None:
        self.env.close()


def make_from_id(module: str, factory: str, kwargs: dict[str, Any]) -> ParallelAsEnv:
    """The adapter over module.factory(**kwargs) (a "pz:" id, made in the worker)."""
    return ParallelAsEnv(getattr(importlib.import_module(module), factory)(**kwargs))


def make_from_creator(creator: bytes) -> ParallelAsEnv:
    """The adapter over a pickled creator's ParallelEnv."""
    return ParallelAsEnv(cloudpickle.loads(creator)())


class _Creator:
    """A picklable env creator for the gymnasium hosting path."""

    def __init__(self, function: Callable[..., ParallelAsEnv], *args: Any):
        self.function, self.args = function, args
        self.__qualname__ = "pettingzoo"

    def __call__(self) -> ParallelAsEnv:
        return self.function(*self.args)


def _rows(array: np.ndarray) -> np.ndarray:
    """(num_envs, A, ...) -> (num_envs * A, ...) (a view of contiguous buffers)."""
    return array.reshape(-1, *array.shape[2:])


class PettingZooVecEnv(gymnasium.vector.VectorEnv):
    """num_env_instances ParallelEnvs hosted in worker processes, num_agents
    rows each (see the module docstring): a view over the VecEnv of their
    adapters (in-process: a HostedVecEnv; a daemon's: a RemoteVecEnv).  This
    module loads no native code, so a client can use it."""

    def __init__(self, inner: Any, env_id: str, agent_obs: spaces.Space,
                 agent_act: spaces.Space, num_agents: int, episode_statistics: bool | str):
        self._inner = inner
        self.env_id = env_id
        self.num_agents = num_agents
        self.num_env_instances = inner.num_envs
        self.num_envs = inner.num_envs * num_agents
        self.single_observation_space, self.single_action_space = agent_obs, agent_act
        self.observation_space = batch_space(agent_obs, self.num_envs)
        self.action_space = batch_space(agent_act, self.num_envs)
        self.metadata = {"autoreset_mode": gymnasium.vector.AutoresetMode.NEXT_STEP,
                         **{key: inner.metadata[key] for key in ("render_modes", "render_fps")
                            if key in getattr(inner, "metadata", {})}}
        self.render_mode = getattr(inner, "render_mode", None)
        self.episode_statistics_key = episode_statistics_key(episode_statistics)
        self._return = np.zeros(self.num_envs)
        self._length = np.zeros(self.num_envs, np.int64)
        self._start = np.zeros(self.num_envs)
        self._reset_rows = np.zeros(self.num_envs, bool)  # rows whose env resets next step

    @property
    def num_agents_per_env(self) -> int:
        """Agents (rows) per env: num_envs == num_env_instances * num_agents_per_env."""
        return self.num_agents

    @property
    def possible_agents(self) -> list[str]:
        """The ParallelEnv's possible_agents, in row order: row r is agent
        possible_agents[r % num_agents_per_env] of env r // num_agents_per_env."""
        return possible_agents(getattr(self._inner, "agent_names", ()), self.num_agents)

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' pids (in-process)."""
        return self._inner.worker_pids

    @property
    def num_workers(self) -> int | None:
        return getattr(self._inner, "num_workers", None)

    @property
    def adapter_env(self) -> Any:
        """The VecEnv of the adapters (one row per env, Dict observations)."""
        return self._inner

    def _unpack(self, obs: dict) -> tuple[np.ndarray, ...]:
        return (_rows(obs["obs"]), obs["reward"].ravel(), obs["terminated"].ravel().astype(bool),
                obs["truncated"].ravel().astype(bool), obs["live"].ravel().astype(bool))

    def reset(self, *, seed: int | Sequence[int] | None = None, options: dict | None = None):
        """reset(seed=s) seeds env i with s + i (one seed per env, not per row);
        options={"reset_mask": mask} takes one bool per row (a row selects its
        whole env)."""
        options = dict(options or {})
        if "reset_mask" in options:
            mask = np.asarray(options["reset_mask"], bool)
            if mask.shape != (self.num_envs,):
                raise InvalidArgumentError(f"{self.env_id}: reset_mask must have one bool per "
                                           f"row ({self.num_envs}), got shape {mask.shape}")
            options["reset_mask"] = mask.reshape(-1, self.num_agents).any(1)
        obs, _ = self._inner.reset(seed=seed, options=options or None)
        rows, _, _, _, live = self._unpack(obs)
        selected = (np.ones(self.num_envs, bool) if "reset_mask" not in options
                    else np.repeat(options["reset_mask"], self.num_agents))
        self._return[selected], self._length[selected] = 0, 0
        self._start[selected] = time.perf_counter()
        self._reset_rows[selected] = False
        return rows, {"agent_mask": live}

    def _account(self, rows: np.ndarray | slice, rewards: np.ndarray, terms: np.ndarray,
                 truncs: np.ndarray, live: np.ndarray, all_done: np.ndarray,
                 info: dict[str, Any]) -> None:
        """The per-row episode books of rows (a step's or a recv's results):
        rows whose env was reset for this result (next_step autoreset, or an
        async reset) start an episode and count nothing; live rows add their
        reward and a step; rows that end now report their episode in info.
        all_done: per env of the result, every agent done (the env resets at
        its next step)."""
        now = time.perf_counter()
        restarted = self._reset_rows[rows]
        returns, lengths, starts = self._return[rows], self._length[rows], self._start[rows]
        returns[restarted], lengths[restarted], starts[restarted] = 0, 0, now
        counted = live & ~restarted
        returns[counted] += rewards[counted]
        lengths[counted] += 1
        ended = counted & (terms | truncs)
        self._return[rows], self._length[rows], self._start[rows] = returns, lengths, starts
        if self.episode_statistics_key is not None and ended.any():
            key = self.episode_statistics_key
            info[key] = {"r": np.where(ended, returns, 0.0), "l": np.where(ended, lengths, 0),
                         "t": np.where(ended, np.round(now - starts, 6), 0.0)}
            info["_" + key] = ended
        # an env whose agents are all done (the adapter's terminated) resets
        # at its next step (next_step autoreset), its rows' episodes with it
        self._reset_rows[rows] = np.repeat(np.asarray(all_done, bool), self.num_agents)

    def step(self, actions: Any):
        actions = np.asarray(actions)
        if actions.shape[:1] != (self.num_envs,):
            raise InvalidArgumentError(f"{self.env_id}: actions must have one row per agent "
                                       f"({self.num_envs} rows), got shape {actions.shape}")
        obs, _, all_done, _, _ = self._inner.step(
            actions.reshape(self.num_env_instances, self.num_agents, *actions.shape[1:]))
        rows, rewards, terms, truncs, live = self._unpack(obs)
        info: dict[str, Any] = {"agent_mask": live}
        self._account(slice(None), rewards, terms, truncs, live, all_done, info)
        return rows, rewards, terms, truncs, info

    # ---- async (whole envs: batch_size counts envs, ids per row) ----------------------
    @property
    def batch_size(self) -> int:
        """Envs per recv (each num_agents rows)."""
        return self._inner.batch_size

    def async_reset(self, *, seed: int | Sequence[int] | None = None) -> None:
        """Reset every env (seed: one per env, as reset's); the next recv
        returns the first batch_size envs' rows."""
        self._inner.async_reset(seed=seed)
        self._reset_rows[...] = True  # (their first recv starts their episodes)

    def send(self, actions: Any, env_ids: Any) -> None:
        """Step the envs of env_ids, given per row as recv's info["env_id"]
        (each env's id num_agents times in a row), with actions (one row per
        id)."""
        ids = np.asarray(env_ids)
        a = self.num_agents
        grouped = ids.reshape(-1, a) if ids.ndim == 1 and len(ids) % a == 0 else None
        if grouped is None or not (grouped == grouped[:, :1]).all():
            raise InvalidArgumentError(
                f"{self.env_id}: env_ids are per row, each env's id {a} times in a row (as "
                f"recv's info['env_id']), got {ids.tolist()[:3 * a]}")
        actions = np.asarray(actions)
        if actions.shape[:1] != ids.shape:
            raise InvalidArgumentError(f"{self.env_id}: actions must have one row per env id "
                                       f"({len(ids)}), got shape {actions.shape}")
        self._inner.send(actions.reshape(len(grouped), a, *actions.shape[1:]), grouped[:, 0])

    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """batch_size envs' rows: (obs, rewards, terminations, truncations,
        info) with info["env_id"] (each env's id per row) and
        info["agent_mask"]."""
        obs, _, all_done, _, inner_info = self._inner.recv()
        envs = np.asarray(inner_info["env_id"])
        rows = (envs[:, None] * self.num_agents + np.arange(self.num_agents)).ravel()
        obs_rows, rewards, terms, truncs, live = self._unpack(obs)
        info: dict[str, Any] = {"env_id": np.repeat(envs, self.num_agents), "agent_mask": live}
        self._account(rows, rewards, terms, truncs, live, all_done, info)
        return obs_rows, rewards, terms, truncs, info

    # ---- the ParallelEnvs themselves (one result per env, not per row) ----------------
    def render(self) -> tuple[np.ndarray, ...]:
        """Each env's frame, its ParallelEnv's own render() drawn in its
        worker (all its agents in one frame): a tuple of num_env_instances
        (height, width, 3) uint8 arrays.  Needs render_mode="rgb_array" at make."""
        return self._inner.render()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Each ParallelEnv's attribute name, called with args and kwargs if
        it is callable (gymnasium's VectorEnv.call): a tuple of
        num_env_instances results, one per env (not per row).  With workers
        the arguments and results travel as envd.info_codec carries them."""
        return self._inner.call(name, *args, **kwargs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Each ParallelEnv's attribute name (call(name)), one per env."""
        return self._inner.get_attr(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute name of each ParallelEnv: a list or tuple of
        num_env_instances values (one per env, not per row), or one value for all."""
        self._inner.set_attr(name, values)

    def close(self, **kwargs: Any) -> None:
        self._inner.close()

    def __enter__(self) -> PettingZooVecEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        """Close it (a context manager, as every envd VecEnv)."""
        self.close()

    def __repr__(self) -> str:
        return (f"envd.PettingZooVecEnv({self.env_id!r}, num_envs={self.num_envs}, "
                f"num_agents={self.num_agents}, num_workers={self.num_workers})")


def rows_view(inner: Any, name: str, episode_statistics: bool | str) -> PettingZooVecEnv:
    """The rows of a VecEnv of ParallelAsEnv adapters (closed if this fails)."""
    try:
        obs_space = inner.single_observation_space["obs"]
        return PettingZooVecEnv(inner, name, unstack_space(obs_space),
                                unstack_space(inner.single_action_space), obs_space.shape[0],
                                episode_statistics)
    except BaseException:
        inner.close()
        raise


def creator_of_id(env_id: str, env_kwargs: dict[str, Any]) -> _Creator:
    """The adapter creator of a "pz:<module>:<factory>" id (InvalidArgumentError
    for a malformed id, UnknownEnvError when its top-level module is missing)."""
    if not env_id.startswith(PETTINGZOO_PREFIX) or env_id.count(":") != 2 or \
            not all(env_id.split(":")[1:]):
        raise InvalidArgumentError(f"a PettingZoo env id is 'pz:<module>:<factory>', got "
                                   f"{env_id[:200]!r}")
    _, module, factory = env_id.split(":")
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise UnknownEnvError(f"{env_id}: no module {module!r}")
    return _Creator(make_from_id, module, factory, env_kwargs)

