"""Small PettingZoo ParallelEnvs for tests/hosted/test_hosted_pettingzoo.py
(a module of their own so that the workers import them by name)."""
from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class StaggeredEnv(ParallelEnv):
    """Three agents; agent k is done after k + 2 steps (agent 2 truncated,
    the others terminated), so rows die at different steps and the episode
    ends at step 4.  obs of agent k: (step, k, a draw of the env's RNG, the
    agent's last action); reward k + 1 + action / 10.  raise_seed: step()
    raises ValueError at step 2 of an env last reset with that seed (None:
    never; make's own trial steps do not seed it so)."""

    metadata = {"name": "staggered_v0"}  # noqa: RUF012 -- PettingZoo's class attribute, read only

    def __init__(self, raise_seed: int | None = None):
        self.possible_agents = ["a0", "a1", "a2"]
        self.raise_seed, self.seed_ = raise_seed, None
        self.rng = np.random.default_rng()

    def observation_space(self, agent):
        return spaces.Box(-1e9, 1e9, (4,), np.float64)

    def action_space(self, agent):
        return spaces.Discrete(3)

    def _obs(self, agent, action=0.0):
        k = self.possible_agents.index(agent)
        return np.array([self.t, k, self.rng.random(), action])

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.seed_ = seed
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        if self.t == 2 and self.raise_seed is not None and self.seed_ == self.raise_seed:
            raise ValueError(f"boom at step {self.t}")
        obs, rew, term, trunc = {}, {}, {}, {}
        for a in self.agents:
            k = self.possible_agents.index(a)
            obs[a] = self._obs(a, float(actions[a]))
            rew[a] = k + 1 + float(actions[a]) / 10
            done = self.t >= k + 2
            term[a], trunc[a] = done and k < 2, done and k == 2
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, {a: {} for a in obs}


class MixedSpacesEnv(StaggeredEnv):
    """Agent a1's action space differs from a0's: refused at make."""

    def action_space(self, agent):
        return spaces.Discrete(4 if agent == "a1" else 3)


class DroppingEnv(StaggeredEnv):
    """StaggeredEnv whose agent a1 leaves silently at step 2: absent from
    that step's dicts (no termination or truncation flag) and from
    ``agents``; with quit_all, every agent leaves so at step 3 (``agents``
    emptied, no flags).  PettingZoo's API asks for the flags; envs in the
    wild do not always give them."""

    def __init__(self, quit_all: bool = False):
        super().__init__()
        self.quit_all = quit_all

    def step(self, actions):
        obs, rew, term, trunc, infos = super().step(actions)
        if self.t == 2:
            for d in (obs, rew, term, trunc, infos):
                d.pop("a1", None)
            self.agents = [a for a in self.agents if a != "a1"]
        if self.quit_all and self.t == 3:
            for d in (term, trunc):
                d.clear()
            self.agents = []
        return obs, rew, term, trunc, infos


class LingeringEnv(StaggeredEnv):
    """StaggeredEnv whose done agents linger: every step's dicts hold every
    possible agent, a done one with an observation of its own and reward 99
    (flags false), as some envs in the wild do; its row is dead all the
    same, zeroed by the parent whatever the env says of it."""

    def step(self, actions):
        obs, rew, term, trunc, infos = super().step(actions)
        for a in self.possible_agents:
            if a not in obs:
                obs[a], rew[a], term[a], trunc[a] = self._obs(a, 7.0), 99.0, False, False
        return obs, rew, term, trunc, infos


def lingering() -> LingeringEnv:
    return LingeringEnv()


def dropping() -> DroppingEnv:
    return DroppingEnv()


def quitting() -> DroppingEnv:
    return DroppingEnv(quit_all=True)


def staggered(raise_seed: int | None = None) -> StaggeredEnv:
    return StaggeredEnv(raise_seed)


def mixed() -> MixedSpacesEnv:
    return MixedSpacesEnv()


def raising() -> StaggeredEnv:
    """Raises at step 2 of env 1 when made with seed=0 (a daemon's id takes no kwargs)."""
    return StaggeredEnv(raise_seed=1)


class LateEnv(StaggeredEnv):
    """StaggeredEnv whose agent a2 is absent from every other reset (the
    first included: from its observations and from ``agents``), so it is
    dead for that episode, which ends at step 3; step() refuses actions for
    agents not in ``agents``, as PettingZoo envs may (AssertionError)."""

    def __init__(self):
        super().__init__()
        self.episodes = 0

    def reset(self, seed=None, options=None):
        obs, infos = super().reset(seed, options)
        self.episodes += 1
        if self.episodes % 2:
            self.agents = ["a0", "a1"]
            obs.pop("a2"), infos.pop("a2")
        return obs, infos

    def step(self, actions):
        strangers = set(actions) - set(self.agents)
        assert not strangers, f"actions for agents not in agents: {sorted(strangers)}"
        return super().step(actions)


def late() -> LateEnv:
    return LateEnv()


class CountedEnv(StaggeredEnv):
    """StaggeredEnv whose instances after the first `same` ones (counted in
    the file at path, across processes) differ as `kind` says: "order"
    (possible_agents reversed), "count" (a fourth agent) or "space" (a
    wider observation space)."""

    def __init__(self, path: str, kind: str, same: int):
        super().__init__()
        with open(path, "a+") as f:
            f.seek(0)
            made = len(f.read())
            f.write("x")
        self.differs = made >= same
        if self.differs and kind == "order":
            self.possible_agents = self.possible_agents[::-1]
        elif self.differs and kind == "count":
            self.possible_agents = [*self.possible_agents, "a3"]
        self.wide = self.differs and kind == "space"

    def observation_space(self, agent):
        return spaces.Box(-1e9, 1e9, (5 if self.wide else 4,), np.float64)


class SoloEnv(StaggeredEnv):
    """StaggeredEnv of one agent, a0 (terminated at step 2)."""

    def __init__(self):
        super().__init__()
        self.possible_agents = ["a0"]


def solo() -> SoloEnv:
    return SoloEnv()
