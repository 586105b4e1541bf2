"""A hosted PettingZoo env's worker side: each env of a slice is one
ParallelEnv (``ParallelRows``), its agents rows i*A .. i*A + A - 1 of the
session's output buffers (envd/hosted_pettingzoo.py).

``AgentSlice.run_pending`` is EnvSlice's loop (native/hosted_worker.py) for
such envs: it runs every env of its slice whose request word differs from
its ack as its kind word says and writes the raw outputs of its A rows (the
observations, rewards in float64, terminated and truncated flags), then
acks it.  The per-row rules are the parent's (backend_workers.c keeps them
as the pool vec keeps a C multi-agent env's: a dead agent's row masked and
zeroed, its final flags repeated, the env done once every agent is, the
episode statistics); a SAME_STEP step that ends every agent writes the final
observations and resets the env at once, by the rule the parent applies to
the same flag bytes.  Infos are not carried.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np
from gymnasium.vector import AutoresetMode

from envd.hosted_pettingzoo import check_agents
from envd.native._envd_native import lib
from envd.native.hosted_segment import Segment
from envd.native.hosted_worker import (
    EENV,
    RESET,
    RESET_IF_DONE,
    close_envs,
    env_flag,
    pending_requests,
    report,
)


class ParallelRows:
    """One ParallelEnv as its worker steps it (AgentSlice, below): its
    agents' raw outputs as rows, agent k of possible_agents in row k.
    The per-row rules (dead rows, episode statistics, autoreset) are the
    parent's, in C (native/src/env_slot.h); this adapter only runs the env:
    a reset's observations, a step's observations, rewards (float64) and
    flags of the agents it still steps, each agent's actions given to it
    while it lives and is in ``env.agents``.  An agent absent from a reset
    (from its observations or from ``env.agents``) is dead for the episode
    (``absent``: the parent's C marks its row so); an agent that leaves
    without a flag (absent from the step's observations or from
    ``env.agents``) ends truncated; an agent's row it does not fill (an
    agent that is not in the step) holds zeros."""

    def __init__(self, env: Any):
        self.env = env
        self.possible_agents, self.observation_space, self.action_space = check_agents(env)
        self.num_agents = a = len(self.possible_agents)
        shape, dtype = self.observation_space.shape, self.observation_space.dtype
        assert shape is not None and dtype is not None  # (one of AGENT_SPACES: both set)
        self._obs = np.zeros((a, *shape), dtype)
        self._rewards = np.zeros(a)
        self._flags = np.zeros((2, a), bool)  # (terminated, truncated)
        self._ended = [False] * a  # ended in this episode (a flag, left, or absent)
        self.absent = np.zeros(a, np.uint8)  # per agent: absent from the last reset
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
        call/get_attr on a hosted PettingZoo env reach the ParallelEnv."""
        return getattr(self._holder(name), name)

    def set_wrapper_attr(self, name: str, value: Any, *, force: bool = True) -> bool:
        """Set the ParallelEnv's attribute name (where get_wrapper_attr finds
        it; a new one on the ParallelEnv)."""
        setattr(self._holder(name), name, value)
        return True

    def _observe(self, obs: dict) -> np.ndarray:
        self._obs[...] = 0
        for k, agent in enumerate(self.possible_agents):
            if agent in obs:
                self._obs[k] = obs[agent]
        return self._obs

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Reset the env: its agents' observations, (A, *obs shape); an
        agent absent from them or from ``env.agents`` is dead for the
        episode (``absent``)."""
        obs, _ = self.env.reset(seed=seed)
        present = set(self.env.agents)
        self._ended = [agent not in obs or agent not in present
                       for agent in self.possible_agents]
        self.absent[...] = self._ended
        return self._observe(obs)

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
        """Step the env with actions (A rows; those of agents that ended in
        this episode are not passed): (observations, rewards, terminated,
        truncated, whether every agent has now ended)."""
        agents = self.possible_agents
        live = [k for k in range(self.num_agents) if not self._ended[k]]
        present = set(self.env.agents)  # (a live agent not in it leaves in this step)
        obs, rewards, terms, truncs, _ = self.env.step(
            {agents[k]: actions[k] for k in live if agents[k] in present})
        remaining = set(self.env.agents)  # (empty: the episode is over for everyone)
        self._rewards[...] = 0.0
        self._flags[...] = False
        for k in live:
            agent = agents[k]
            self._rewards[k] = float(rewards.get(agent, 0.0))
            term = env_flag(terms.get(agent, False), f"agent {agent!r}'s terminated")
            trunc = env_flag(truncs.get(agent, False), f"agent {agent!r}'s truncated")
            if not (term or trunc) and (agent not in obs or agent not in remaining):
                # dropped without a flag: its episode was cut short, truncated,
                # so that every row that dies says so in its flags
                trunc = True
            self._flags[:, k] = term, trunc
            self._ended[k] = term or trunc
        return (self._observe(obs), self._rewards, self._flags[0], self._flags[1],
                all(self._ended))

    def close(self) -> None:
        self.env.close()


def make_from_id(module: str, factory: str, kwargs: dict[str, Any]) -> ParallelRows:
    """The adapter over module.factory(**kwargs) (a "pz:" id, made in the worker)."""
    return ParallelRows(getattr(importlib.import_module(module), factory)(**kwargs))


def make_from_creator(creator: bytes) -> ParallelRows:
    """The adapter over a pickled creator's ParallelEnv."""
    return ParallelRows(cloudpickle.loads(creator)())


def check_described(env: ParallelRows, i: int, described: tuple) -> None:
    """ValueError unless env (env i of its session) has the described
    possible agents (names, in order) and agent spaces: its agents' rows are
    the session's, laid out by the description."""
    names, observation_space, action_space = described
    mine = [str(agent) for agent in env.possible_agents]
    if mine != list(names):
        raise ValueError(f"env {i} has possible_agents {mine}, but the session was made for "
                         f"{list(names)} (as described by its first env): every env must "
                         "have the same agents, in the same order")
    for what, space, theirs in (("observation", env.observation_space, observation_space),
                                ("action", env.action_space, action_space)):
        if space != theirs:
            raise ValueError(f"env {i}'s agents have {what} space {space}, but the session "
                             f"was made for {theirs} (as described by its first env)")


class _Creator:
    """A picklable adapter creator (a "parallel" maker of
    native/hosted_template.py)."""

    def __init__(self, function: Callable[..., ParallelRows], *args: Any):
        self.function, self.args = function, args
        self.__qualname__ = "pettingzoo"

    def __call__(self) -> ParallelRows:
        return self.function(*self.args)


class AgentSlice:
    """Envs [begin, end) of a hosted PettingZoo session over segment, A rows
    each (worker: its control block's index, where messages go)."""

    def __init__(self, make_env: Callable[[], ParallelRows], begin: int, end: int,
                 segment: Segment, worker: int, autoreset_mode: AutoresetMode,
                 inline: bool = False, described: tuple | None = None):
        """inline: stepped in the caller (num_workers=0; no infos either way).
        described: the session's (possible agents' names, an agent's
        observation space, its action space), as the description found
        them; every env made must have them (its rows are laid out by
        them), else ValueError naming the env."""
        self.begin, self.end, self.worker = begin, end, worker
        self.segment = segment
        a = segment.arrays
        self._kind, self._req, self._ack, self._status = a["kind"], a["req"], a["ack"], a["status"]
        self._seeds, self._seed_pending = a["seeds"], a["seed_pending"]
        self._actions, self._absent = a["checked_actions"], a["absent"]
        # (one observation leaf: check_agents)
        self._obs, self._rewards = a["observations"], a["rewards"]
        self._terms, self._truncs = a["terminations"], a["truncations"]
        self._final = (a["final_observations"] if autoreset_mode is AutoresetMode.SAME_STEP
                       else None)
        self.inline_infos: list[Any] | None = None  # (HostedSession reads it: no infos)
        self.envs: list[ParallelRows] = []
        try:
            for i in range(begin, end):
                self.envs.append(make_env())
                if described is not None:
                    check_described(self.envs[-1], i, described)
        except BaseException:
            self.close()
            raise
        self.num_agents = self.envs[0].num_agents if self.envs else 1

    def run_pending(self) -> None:
        """Run every requested env of the slice, then ack them."""
        b = self.begin
        pending = pending_requests(self._req[b:self.end], self._ack[b:self.end])
        if not pending:
            return
        agents = self.num_agents
        for k in pending:
            i = b + k
            rows = slice(i * agents, (i + 1) * agents)
            kind = int(self._kind[i])
            env = self.envs[k]
            try:
                if kind == RESET:
                    seed = None
                    if self._seed_pending[i]:
                        seed, self._seed_pending[i] = int(self._seeds[i]), 0
                    self._obs[rows] = env.reset(seed)
                    self._absent[rows] = env.absent
                    self._rewards[rows], self._terms[rows], self._truncs[rows] = 0.0, False, False
                    continue
                obs, rewards, terms, truncs, done = env.step(self._actions[rows].copy())
                if kind & RESET_IF_DONE and done:
                    assert self._final is not None  # (RESET_IF_DONE: SAME_STEP mode)
                    self._final[rows] = obs
                    obs = env.reset()
                    self._absent[rows] = env.absent
                self._obs[rows] = obs
                self._rewards[rows], self._terms[rows], self._truncs[rows] = rewards, terms, truncs
            except Exception as exc:  # noqa: BLE001 -- the env's own code: reported, never fatal
                self._status[i] = EENV
                report(self.segment, self.worker, i, f"{type(exc).__name__}: {exc}")
        lib.envd_worker_fence()  # the outputs before the acks (backend_workers.h)
        ids = np.array(pending) + b
        self._ack[ids] = self._req[ids]

    def close(self) -> None:
        """Close the envs (errors in an env's close are ignored: it is going)."""
        envs, self.envs = self.envs, []
        close_envs(envs)
