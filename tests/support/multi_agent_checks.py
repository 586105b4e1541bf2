"""An independent Python reference of tests/native/multi_agent.c (Seek-v0,
3 agents per env, MultiDiscrete actions) under envd's multi-agent rules
(envd.h "Multi-agent envs", docs/writing-envs.md): rows agent-major, dead
rows zeroed with their final flags repeated, info["agent_mask"], the whole
env reset when every agent is done (next_step), per-agent episode
statistics, one RNG stream per env.  Written from those descriptions, not
from envd's output; the checks run in a fresh interpreter (run_check).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from support.fresh_interpreter import checker

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "native" / "multi_agent.c"
AGENTS, CELLS, TIME_LIMIT = 3, 10, 8


class Seek:
    """One Seek-v0 env with its AGENTS rows, as envd's vec presents it."""

    def __init__(self, seed: int, speed: int):
        self.rng = np.random.default_rng(seed)
        self.speed = speed
        self.needs_reset = False

    def _obs(self) -> list[list[float]]:
        return [[float(c), float(self.target)] for c in self.cells]

    def reset(self) -> list[list[float]]:
        self.target = int(CELLS * self.rng.random())
        self.cells = [int(CELLS * self.rng.random()) for _ in range(AGENTS)]
        self.done = [False] * AGENTS
        self.final = [(False, False)] * AGENTS
        self.returns = [0.0] * AGENTS
        self.lengths = [0] * AGENTS
        self.elapsed = 0
        self.needs_reset = False
        return self._obs()

    def step(self, actions) -> dict:
        """Rows of one step: obs, reward, term, trunc, mask, ended, return, length."""
        if self.needs_reset:  # next_step autoreset: actions ignored, every row live
            obs = self.reset()
            return {"obs": obs, "reward": [0.0] * AGENTS, "term": [False] * AGENTS,
                    "trunc": [False] * AGENTS, "mask": [True] * AGENTS,
                    "ended": [False] * AGENTS, "r": [0.0] * AGENTS, "l": [0] * AGENTS}
        reward, term = [0.0] * AGENTS, [False] * AGENTS
        everyone_ends = False
        for a in range(AGENTS):
            if self.done[a]:
                continue
            move = (int(actions[a][0]) - 1) * self.speed * (2 if actions[a][1] else 1)
            self.cells[a] = min(max(self.cells[a] + move, 0), CELLS - 1)
            if self.cells[a] == self.target:
                reward[a], term[a] = 1.0, True
            elif self.cells[a] == 0:
                reward[a], everyone_ends = -1.0, True
            else:
                reward[a] = -0.1
        self.elapsed += 1
        out = {k: [] for k in ("obs", "reward", "term", "trunc", "mask", "ended", "r", "l")}
        obs = self._obs()
        for a in range(AGENTS):
            if self.done[a]:  # a dead row
                row = ([0.0, 0.0], 0.0, *self.final[a], False, False)
            else:
                t = term[a] or everyone_ends
                u = self.elapsed >= TIME_LIMIT
                self.returns[a] += reward[a]
                self.lengths[a] += 1
                ended = t or u
                if ended:
                    self.done[a], self.final[a] = True, (t, u)
                row = (obs[a], reward[a], t, u, True, ended)
            for key, value in zip(("obs", "reward", "term", "trunc", "mask", "ended"), row):
                out[key].append(value)
            out["r"].append(self.returns[a] if out["ended"][a] else 0.0)
            out["l"].append(self.lengths[a] if out["ended"][a] else 0)
        self.needs_reset = all(self.done)
        return out


def actions_for(n_rows: int, rng: np.random.Generator) -> np.ndarray:
    return np.stack([rng.integers(0, 3, n_rows), rng.integers(0, 2, n_rows)], axis=1)


def rows(want: list[dict], key: str) -> list:
    return [value for w in want for value in w[key]]


def compare(env, seed: int, speeds, steps: int = 50) -> dict[str, int]:
    """Step env (fresh; num_env_instances envs made with seed and speeds)
    beside the reference; every output equal; counts of what happened."""
    n = env.num_env_instances
    speeds = np.broadcast_to(np.asarray(speeds), (n,))
    refs = [Seek(seed + i, int(speeds[i])) for i in range(n)]
    obs, info = env.reset()
    assert obs.tolist() == [row for r in refs for row in r.reset()]
    assert info["agent_mask"].all()
    rng = np.random.default_rng(seed + 77)
    seen = {"dead_rows": 0, "ended_rows": 0, "env_resets": 0}
    for _ in range(steps):
        actions = actions_for(env.num_envs, rng)
        obs, rewards, terms, truncs, info = env.step(actions)
        want = [r.step(actions[i * AGENTS:(i + 1) * AGENTS]) for i, r in enumerate(refs)]
        assert obs.tolist() == rows(want, "obs")
        assert rewards.tolist() == [float(np.float32(x)) for x in rows(want, "reward")]
        assert terms.tolist() == rows(want, "term")
        assert truncs.tolist() == rows(want, "trunc")
        assert info["agent_mask"].tolist() == rows(want, "mask")
        ended = rows(want, "ended")
        if any(ended):
            assert info["_envd_episode"].tolist() == ended
            assert info["envd_episode"]["r"].tolist() == rows(want, "r")
            assert info["envd_episode"]["l"].tolist() == rows(want, "l")
        else:
            assert "envd_episode" not in info
        seen["dead_rows"] += rows(want, "mask").count(False)
        seen["ended_rows"] += sum(ended)
        seen["env_resets"] += sum(w["reward"] == [0.0] * AGENTS and all(w["mask"])
                                  and w["l"] == [0] * AGENTS for w in want)
    return seen


#: run multi_agent_checks.<name>(*args) in a fresh interpreter (support/fresh_interpreter.py)
run_check = checker("multi_agent_checks")


# ---- checks run in a fresh interpreter ------------------------------------------------

def rows_and_spaces(library: str) -> None:
    from gymnasium import spaces

    import envd
    assert envd.load_plugin(library) == ["Seek-v0"]
    assert envd.native.get_spec("Seek-v0").num_agents == AGENTS
    with envd.make("Seek-v0", 4, seed=0) as env:
        assert (env.num_envs, env.num_agents, env.num_env_instances) == (12, AGENTS, 4)
        assert env.single_action_space == spaces.MultiDiscrete([3, 2])
        assert env.action_space.shape == (12, 2) and env.observation_space.shape == (12, 2)


def matches_reference(library: str) -> None:
    import envd
    envd.load_plugin(library)
    for threads, chunk in ((0, None), (2, 1), (2, None)):
        with envd.make("Seek-v0", 7, seed=3, num_threads=threads, speed=[1, 2, 3, 1, 2, 3, 1]) as env:
            if chunk:
                env.set_chunk_size(chunk)
            seen = compare(env, 3, [1, 2, 3, 1, 2, 3, 1])
        # the semantics were exercised: dead rows, ended rows and whole-env resets
        assert seen["dead_rows"] > 10 and seen["ended_rows"] > 20 and seen["env_resets"] > 5, seen


def per_env_speed_matches_separate_envs(library: str) -> None:
    import envd
    envd.load_plugin(library)
    speeds = [3, 1, 2]
    rng = np.random.default_rng(5)
    with envd.make("Seek-v0", 3, seed=20, speed=speeds) as vec:
        singles = [envd.make("Seek-v0", 1, seed=20 + i, speed=s) for i, s in enumerate(speeds)]
        assert vec.reset()[0].tolist() == [row for s in singles for row in s.reset()[0].tolist()]
        for _ in range(40):
            actions = actions_for(9, rng)
            got = [a.copy() for a in vec.step(actions)[:4]]
            want = [s.step(actions[3 * i:3 * i + 3])[:4] for i, s in enumerate(singles)]
            for k in range(4):
                assert np.array_equal(got[k], np.concatenate([w[k] for w in want])), k
        for s in singles:
            s.close()


def reset_mask_and_seeds_are_per_env(library: str) -> None:
    """reset(seed=list) takes one seed per env; a reset mask row selects its
    whole env."""
    import envd
    envd.load_plugin(library)
    with envd.make("Seek-v0", 3, seed=0) as env:
        obs, _ = env.reset(seed=[40, 41, 42])
        assert obs.tolist() == [row for s in (40, 41, 42) for row in Seek(s, 1).reset()]
        env.step(np.ones((9, 2), np.int64))
        before = env.step(np.ones((9, 2), np.int64))[0].copy()
        mask = np.zeros(9, bool)
        mask[4] = True  # agent 1 of env 1: env 1 resets, with its stream going on
        ref = Seek(41, 1)
        ref.reset()
        obs, info = env.reset(options={"reset_mask": mask})
        assert obs[3:6].tolist() == ref.reset()
        assert obs[:3].tolist() == before[:3].tolist() and obs[6:].tolist() == before[6:].tolist()
        try:
            env.reset(seed=[1, 2, 3, 4, 5, 6, 7, 8, 9])
        except envd.InvalidArgumentError:
            pass
        else:
            raise AssertionError("a seed per row was accepted")


def out_of_range_action_names_the_row(library: str) -> None:
    import envd
    envd.load_plugin(library)
    with envd.make("Seek-v0", 3, seed=0, num_threads=0) as env:
        env.reset()
        actions = np.ones((9, 2), np.int64)
        actions[5] = [3, 0]
        try:
            env.step(actions)
        except envd.InvalidActionError as error:
            assert "of env 5" in str(error), error
        else:
            raise AssertionError("accepted")

        try:
            envd.make("Seek-v0", envd.native.MAX_NUM_ENVS // AGENTS + 1)
        except envd.InvalidArgumentError as error:
            assert "rows, more than the" in str(error), error
        else:
            raise AssertionError("too many rows accepted")


def async_matches_reference(library: str) -> None:
    """batch_size counts envs: recv returns whole envs (batch_size * 3 rows,
    info["env_id"] each row's env), send takes rows and ids in that form;
    every row as the reference's."""
    import envd
    envd.load_plugin(library)
    for threads in (0, 2):
        with envd.make("Seek-v0", 6, seed=9, batch_size=2, num_threads=threads) as env:
            refs = [Seek(9 + i, 1) for i in range(6)]
            expected = {i: {"obs": r.reset(), "mask": [True] * AGENTS} for i, r in enumerate(refs)}
            env.async_reset()
            rng = np.random.default_rng(3)
            ended = 0
            for _ in range(120):
                obs, rewards, terms, truncs, info = env.recv()
                row_envs = info["env_id"].tolist()
                assert len(row_envs) == 2 * AGENTS
                envs = row_envs[::AGENTS]
                assert row_envs == [i for i in envs for _ in range(AGENTS)]
                assert obs.tolist() == [row for i in envs for row in expected[i]["obs"]]
                assert info["agent_mask"].tolist() == [m for i in envs for m in expected[i]["mask"]]
                if "reward" in expected[envs[0]]:
                    assert rewards.tolist() == [float(np.float32(x)) for i in envs
                                                for x in expected[i]["reward"]]
                    assert terms.tolist() == [t for i in envs for t in expected[i]["term"]]
                actions = actions_for(len(row_envs), rng)
                for k, i in enumerate(envs):
                    expected[i] = refs[i].step(actions[k * AGENTS:(k + 1) * AGENTS])
                    ended += sum(expected[i]["ended"])
                env.send(actions, info["env_id"])
            assert ended > 20
            env.recv()
            try:  # ids not grouped per env
                env.send(actions_for(6, rng), [0, 1, 0, 1, 0, 1])
            except envd.InvalidArgumentError as error:
                assert "each env's id 3 times in a row" in str(error), error
            else:
                raise AssertionError("ungrouped ids accepted")


def sb3_sees_each_agent_end_once(library: str) -> None:
    """The SB3 adapter over Seek-v0 (agents end at different steps, then
    their rows are dead, repeating their final flags) in same_step mode: each
    row is reported done exactly at the step its agent ended (with its
    terminal observation), never again while it is dead; found by review:
    the adapter read a dead row's repeated flag as a new end and failed
    looking up a final observation that was not there."""
    import envd
    from envd.integrations.sb3 import EnvdVecEnv
    envd.load_plugin(library)
    with envd.make("Seek-v0", 4, seed=5, autoreset_mode="same_step") as env:
        vec = EnvdVecEnv(env)
        vec.reset()
        rng = np.random.default_rng(1)
        ends = 0
        for _ in range(200):
            obs, rewards, dones, infos = vec.step(actions_for(vec.num_envs, rng))
            for i in np.flatnonzero(dones):
                assert "terminal_observation" in infos[i], (i, infos[i])
            ends += int(dones.sum())
        assert ends > 20, ends


#: the -D define that builds multi_agent.c as SeekFail-v0 (its envs made with
#: speed 3 fail in every step)
FAILING = "SEEK_FAILS"


def check_failure_names_rows(env, failing_env: int) -> None:
    """env: SeekFail-v0 with batch_size=1 whose env failing_env fails in
    every step.  A sync-shaped step is not possible in async mode, so the
    async path: send the failing env's rows alone; the recv raises, naming
    the env's first row (failing_env * AGENTS), as a step's error does."""
    env.async_reset()
    for _ in range(env.num_envs // AGENTS):
        env.recv()
    ids = np.full(AGENTS, failing_env, np.int64)
    try:
        env.send(np.ones((AGENTS, 2), np.int64), ids)
        env.recv()
    except envd_errors().NativeError as error:
        assert f"env {failing_env * AGENTS} " in str(error), error
    else:
        raise AssertionError("the failing env's recv raised nothing")


def check_step_failure_names_rows(env, failing_env: int) -> None:
    """env: SeekFail-v0 in sync mode: the failing env's step error names its
    first row."""
    env.reset()
    try:
        env.step(np.ones((env.num_envs, 2), np.int64))
    except envd_errors().NativeError as error:
        assert f"env {failing_env * AGENTS} " in str(error), error
    else:
        raise AssertionError("the failing env's step raised nothing")


def envd_errors():
    import envd.errors
    return envd.errors


def failures_name_rows(library: str) -> None:
    """In-process: SeekFail-v0's failing env (env 1 of 3: rows 3..5) is
    named by its first row, by a step and by a recv alike."""
    import envd
    envd.load_plugin(library)
    for threads in (0, 2):
        with envd.make("SeekFail-v0", 3, seed=0, speed=[1, 3, 1], num_threads=threads) as env:
            check_step_failure_names_rows(env, 1)
        with envd.make("SeekFail-v0", 3, seed=0, speed=[1, 3, 1], batch_size=1,
                       num_threads=threads) as env:
            check_failure_names_rows(env, 1)
