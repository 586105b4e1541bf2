"""PettingZoo ParallelEnvs hosted as rows: what the client shares with the
hosting code (it loads no native code): the "pz:" id prefix and the agents a
hosted PettingZoo env may have.

``envd.make("pz:<module>:<factory>", N, num_workers=K)``,
``envd.make_pettingzoo(creator, N, ...)`` (native/hosted_pettingzoo.py) or a
daemon's ``client.make("pz:...")`` host N ParallelEnvs, their agents as
rows (docs/python-envs.md, "PettingZoo"): the ordinary hosted VecEnv with
num_envs = N * A rows, each worker running its envs through
native/hosted_agent_slice.py, the per-row rules kept in C as a C
multi-agent env's (native/src/backend_workers.c).

Agents must be fixed and homogeneous: every possible agent has agent 0's
observation and action spaces, which must be one leaf (Box, Discrete,
MultiDiscrete, MultiBinary); others are refused at make, naming the agent and
the space.
"""
from __future__ import annotations

from typing import Any

from gymnasium import spaces

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
