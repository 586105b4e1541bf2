"""mpe2's simple_spread_v3 parallel envs as the reference of envd's built-in
simple_spread_v3 and simple_spread_continuous_v3 (agents as rows, agent-major
within an env): one mpe2 env per envd env, stepped as envd steps them
(next_step autoreset).  Shared by tests/native/test_simple_spread_vec.py (the
in-process vec) and tests/integration/test_daemon_multi_agent.py (the daemon)."""
from __future__ import annotations

import warnings

import mpe2.simple_spread_v3 as mpe2_spread
import numpy as np

N_AGENTS = 3
IDS = {"simple_spread_v3": False, "simple_spread_continuous_v3": True}


def random_rows(rng: np.random.Generator, rows: int, continuous: bool) -> np.ndarray:
    """Actions for every row; continuous ones go beyond [0, 1] now and then
    (mpe2's wrapper clips them, and so does the env)."""
    if not continuous:
        return rng.integers(0, 5, rows, dtype=np.int64)
    return (rng.random((rows, 5), dtype=np.float32) * np.float32(1.4) - np.float32(0.2))


class Reference:
    """n mpe2 parallel envs stepped as envd steps its n envs (next_step autoreset)."""

    def __init__(self, num_envs: int, continuous: bool, local_ratio, max_cycles: int):
        ratios = np.broadcast_to(np.asarray(local_ratio, np.float64), (num_envs,))
        self.envs = [mpe2_spread.parallel_env(N=N_AGENTS, local_ratio=float(r),
                                              max_cycles=max_cycles,
                                              continuous_actions=continuous)
                     for r in ratios]
        self.agents = self.envs[0].possible_agents
        self.ended = np.zeros(num_envs, bool)

    def reset(self, seed: int) -> np.ndarray:
        self.ended[:] = False
        return np.concatenate([self._stack(e.reset(seed=seed + i)[0])
                               for i, e in enumerate(self.envs)])

    def step(self, actions: np.ndarray):
        obs, rew, term, trunc = [], [], [], []
        for i, e in enumerate(self.envs):
            if self.ended[i]:  # next_step autoreset: reset, actions ignored
                obs.append(self._stack(e.reset()[0]))
                rew.append(np.zeros(N_AGENTS))
                term.append(np.zeros(N_AGENTS, bool))
                trunc.append(np.zeros(N_AGENTS, bool))
                self.ended[i] = False
                continue
            rows = actions[i * N_AGENTS:(i + 1) * N_AGENTS]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # mpe2's out-of-bounds warnings
                o, r, te, tr, _ = e.step({a: rows[k] for k, a in enumerate(self.agents)})
            obs.append(self._stack(o))
            rew.append(self._stack(r).astype(np.float64))
            term.append(self._stack(te))
            trunc.append(self._stack(tr))
            self.ended[i] = bool(np.all(term[-1] | trunc[-1]))
        return tuple(np.concatenate(x) for x in (obs, rew, term, trunc))

    def step_reset(self) -> np.ndarray:
        """same_step autoreset: reset the envs whose episode just ended, now."""
        obs = []
        for i, e in enumerate(self.envs):
            assert self.ended[i]
            obs.append(self._stack(e.reset()[0]))
        self.ended[:] = False
        return np.concatenate(obs)

    def _stack(self, values: dict) -> np.ndarray:
        return np.array([values[a] for a in self.agents])

    def close(self) -> None:
        for e in self.envs:
            e.close()


def assert_same(step: int, ours, expected) -> None:
    obs, rew, term, trunc = ours
    r_obs, r_rew, r_term, r_trunc = expected
    assert obs.dtype == np.float32 and obs.shape == r_obs.shape
    assert obs.tobytes() == r_obs.tobytes(), f"observations differ at step {step}"
    np.testing.assert_array_equal(rew, r_rew.astype(np.float32), err_msg=f"rewards, step {step}")
    np.testing.assert_array_equal(term, r_term, err_msg=f"terminations, step {step}")
    np.testing.assert_array_equal(trunc, r_trunc, err_msg=f"truncations, step {step}")


def run_equivalence(env, ref: Reference, seed: int, continuous: bool, steps: int) -> int:
    """Step env and ref with the same random actions; the number of episodes ended."""
    obs, info = env.reset(seed=seed)
    assert obs.tobytes() == ref.reset(seed).tobytes()
    rng = np.random.default_rng(seed + 1000)
    ended = 0
    for step in range(steps):
        actions = random_rows(rng, env.num_envs, continuous)
        obs, rew, term, trunc, info = env.step(actions)
        assert_same(step, (obs, rew, term, trunc), ref.step(actions))
        assert info["agent_mask"].all()  # the agents of an env end together
        ended += int(np.sum(trunc)) // N_AGENTS
    return ended


