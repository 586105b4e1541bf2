"""Hosted PettingZoo ParallelEnvs (src/envd/hosted_pettingzoo.py): agents as rows.

The reference (``Reference``) steps the same ParallelEnvs directly and lays
their results out as docs/writing-envs.md ("Multi-agent envs") says: row
i*A + a is agent a of env i; a done agent's later rows are dead (zero
observation, reward 0, final flags again, agent_mask false); an env resets
(next_step: on the following step, reward 0, flags false, every row live)
when all its agents are done; env i seeded s + i, later resets unseeded;
an agent absent from a reset is dead for that episode (zero observation,
truncated from its first step, agent_mask false, no action passed, no
statistics); in a same_step done step, a row whose agent ended in it keeps
its mask though the agent is absent from the next episode.
Hosted results must equal it for worker counts 0, 1 and 2.
"""
from __future__ import annotations

import gc
import os
import signal

import numpy as np
import pytest
import pz_envs
from envs import alive, open_fds, wait_until
from gymnasium import spaces

import envd

mpe2_spread = pytest.importorskip("mpe2.simple_spread_v3", reason="mpe2 is the reference")

SPREAD_ID = "pz:mpe2.simple_spread_v3:parallel_env"


class Reference:
    """num_envs ParallelEnvs stepped directly, results as rows, in an
    autoreset mode: next_step (an env whose agents are all done resets at
    its next step, actions ignored), same_step (it resets within the done
    step: the step's observations are its final ones, the reset's returned,
    every row live again) or disabled (it is stepped no more until reset)."""

    def __init__(self, make, num_envs: int, seed: int, mode: str = "next_step"):
        self.envs = [make() for _ in range(num_envs)]
        self.agents = self.envs[0].possible_agents
        self.a = len(self.agents)
        self.seed = seed
        self.mode = mode
        self.obs_shape = self.envs[0].observation_space(self.agents[0]).shape
        n = num_envs * self.a
        self.final = np.zeros((2, n), bool)
        self.dead = np.zeros(n, bool)
        self.restart = np.zeros(num_envs, bool)  # next_step: resets at its next step
        self.over = np.zeros(num_envs, bool)  # disabled: done, not reset yet
        self.final_obs = {}  # same_step: env -> its last done step's final observations

    def reset(self, envs=None):
        """Reset envs (default all, seeded seed + i; a masked reset of some
        unseeded): their rows' observations."""
        rows = []
        for i in range(len(self.envs)) if envs is None else envs:
            obs, _ = self.envs[i].reset(seed=self.seed + i if envs is None else None)
            rows += self._live(i, obs)
        return np.stack(rows)

    def _live(self, i, obs):
        """Env i's rows as its reset with obs leaves them: live but those
        of agents absent from it; their observations."""
        rows = slice(i * self.a, (i + 1) * self.a)
        self.dead[rows] = [a not in obs for a in self.agents]
        self.final[0, rows] = False
        self.final[1, rows] = self.dead[rows]  # (an absent agent's dead rows: truncated)
        self.restart[i] = self.over[i] = False
        return [obs.get(a, np.zeros(self.obs_shape)) for a in self.agents]

    def step(self, actions, envs=None):
        """Step envs (default all, in order) with actions (their rows, in
        that order): their rows' (obs, rewards, terms, truncs, agent_mask)."""
        envs = range(len(self.envs)) if envs is None else envs
        n = len(envs) * self.a
        obs = np.zeros((n, *self.obs_shape))
        rew, mask = np.zeros(n), np.ones(n, bool)
        term, trunc = np.zeros(n, bool), np.zeros(n, bool)
        self.final_obs = {}
        for j, i in enumerate(envs):
            assert not self.over[i], "a done env stepped under disabled autoreset"
            env = self.envs[i]
            rows = slice(i * self.a, (i + 1) * self.a)
            out = slice(j * self.a, (j + 1) * self.a)
            if self.restart[i]:
                o, _ = env.reset()
                obs[out] = self._live(i, o)
                mask[out] = ~self.dead[rows]
                continue
            live = [a for k, a in enumerate(self.agents) if not self.dead[i * self.a + k]]
            o, r, te, tr, _ = env.step({a: actions[j * self.a + self.agents.index(a)]
                                        for a in live})
            for k, a in enumerate(self.agents):
                row, res = i * self.a + k, j * self.a + k
                if self.dead[row]:
                    mask[res] = False
                else:
                    obs[res], rew[res] = o[a], r[a]
                    self.final[:, row] = te[a], tr[a]
                    self.dead[row] = te[a] or tr[a]
                term[res], trunc[res] = self.final[:, row]
            if not self.dead[rows].all():
                continue
            if self.mode == "next_step":
                self.restart[i] = True
            elif self.mode == "same_step":
                self.final_obs[i] = obs[out].copy()
                o, _ = env.reset()
                obs[out] = self._live(i, o)
                mask[out] |= ~self.dead[rows]  # (a row that ended in this step keeps its mask)
            else:
                self.over[i] = True
        return obs, rew, term, trunc, mask


def _compare(env, ref, steps: int, seed: int, action_n: int):
    obs, info = env.reset(seed=seed)
    np.testing.assert_array_equal(obs, ref.reset())
    np.testing.assert_array_equal(info["agent_mask"], ~ref.dead)
    rng = np.random.default_rng(seed)
    saw_dead = saw_reset = False
    a = ref.a
    for _ in range(steps):
        if ref.over.any():  # disabled: a done env is refused, then reset with a mask
            with pytest.raises(envd.EnvStateError):
                env.step(np.zeros(env.num_envs, np.int64))
            over = np.flatnonzero(ref.over)
            obs, info = env.reset(options={"reset_mask": np.repeat(ref.over, a)})
            rows = np.concatenate([np.arange(i * a, (i + 1) * a) for i in over])
            np.testing.assert_array_equal(obs[rows], ref.reset(over).astype(obs.dtype))
            np.testing.assert_array_equal(info["agent_mask"][rows], ~ref.dead[rows])
            saw_reset = True
        actions = rng.integers(0, action_n, env.num_envs)
        obs, rew, term, trunc, info = env.step(actions)
        r_obs, r_rew, r_term, r_trunc, r_mask = ref.step(actions)
        np.testing.assert_array_equal(obs, r_obs.astype(obs.dtype))
        np.testing.assert_array_equal(rew, r_rew)
        np.testing.assert_array_equal(term, r_term)
        np.testing.assert_array_equal(trunc, r_trunc)
        np.testing.assert_array_equal(info["agent_mask"], r_mask)
        for i, final in ref.final_obs.items():  # same_step: the rows that ended in it
            for k in range(a):
                if info["_final_obs"][i * a + k]:
                    np.testing.assert_array_equal(info["final_obs"][i * a + k],
                                                  final[k].astype(obs.dtype))
        saw_dead |= not r_mask.all()
        saw_reset |= bool(ref.restart.any() or ref.final_obs)
    return saw_dead, saw_reset


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_simple_spread_equals_direct_mpe2(num_workers):
    env = envd.make(SPREAD_ID, 3, num_workers=num_workers, seed=11, max_cycles=6)
    try:
        assert (env.num_envs, env.num_agents, env.num_env_instances) == (9, 3, 3)
        assert env.single_action_space == mpe2_spread.parallel_env().action_space("agent_0")
        ref = Reference(lambda: mpe2_spread.parallel_env(max_cycles=6), 3, 11)
        _, saw_reset = _compare(env, ref, 20, 11, 5)
        assert saw_reset  # episodes of 6 cycles: several autoresets in 20 steps
    finally:
        env.close()


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_dead_rows_flags_and_statistics_equal_reference(num_workers):
    env = envd.make_pettingzoo(pz_envs.staggered, 3, num_workers=num_workers, seed=3)
    try:
        saw_dead, saw_reset = _compare(env, Reference(pz_envs.staggered, 3, 3), 14, 3, 3)
        assert saw_dead and saw_reset
    finally:
        env.close()


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_dead_agents_row_is_zeroed_whatever_the_env_reports(num_workers):
    """The parent zeroes a dead row's observation (and reward) in the
    observation leaf, as the pool does a C multi-agent env's: an env whose
    done agents linger in its dicts (pz_envs.LingeringEnv) equals the
    reference, which reads only live agents."""
    direct = pz_envs.lingering()
    direct.reset(seed=0)
    for _ in range(3):
        obs, rew, _, _, _ = direct.step(dict.fromkeys(direct.agents, 1))
    assert obs["a0"].any() and rew["a0"] == 99.0  # (a0 ended at step 2)
    env = envd.make_pettingzoo(pz_envs.lingering, 2, num_workers=num_workers, seed=4)
    try:
        saw_dead, _ = _compare(env, Reference(pz_envs.lingering, 2, 4), 9, 4, 3)
        assert saw_dead
    finally:
        env.close()


@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize("mode", ["next_step", "same_step", "disabled"])
def test_every_autoreset_mode_equals_reference(mode, num_workers):
    """Each autoreset mode, as a C multi-agent env takes it: same_step resets
    an env within the step that ends its last agent (its final observations
    in info["final_obs"], the rows of agents dead before it zeroed, every
    row live again); disabled refuses a done env's step until a masked reset
    (one row selects its env)."""
    env = envd.make_pettingzoo(pz_envs.staggered, 3, num_workers=num_workers, seed=6,
                               autoreset_mode=mode)
    try:
        assert env.metadata["autoreset_mode"].name.lower() == mode
        saw_dead, saw_reset = _compare(env, Reference(pz_envs.staggered, 3, 6, mode), 14, 6, 3)
        assert saw_dead and saw_reset
    finally:
        env.close()
    if mode == "same_step":  # mpe2 too: every agent truncated at once by max_cycles
        with envd.make(SPREAD_ID, 2, num_workers=num_workers, seed=2, max_cycles=4,
                       autoreset_mode=mode) as env:
            ref = Reference(lambda: mpe2_spread.parallel_env(max_cycles=4), 2, 2, mode)
            assert _compare(env, ref, 10, 2, 5)[1]


def _spread5():
    return mpe2_spread.parallel_env(max_cycles=5)


@pytest.mark.parametrize("make,action_n", [(pz_envs.staggered, 3), (_spread5, 5)],
                         ids=["staggered", "simple_spread"])
@pytest.mark.parametrize("num_workers,batch_size", [(0, 3), (1, 1), (2, 2), (2, 3)])
def test_async_whole_envs_equal_reference(num_workers, batch_size, make, action_n):
    env = envd.make_pettingzoo(make, 3, num_workers=num_workers, seed=5,
                               batch_size=batch_size)
    ref = Reference(make, 3, 5)
    try:
        env.async_reset()
        first = ref.reset()
        rng = np.random.default_rng(1)
        seen_first, expected = set(), {}
        saw_dead = saw_end = False
        for _ in range(30):
            obs, rew, term, trunc, info = env.recv()
            ids = info["env_id"]
            assert len(ids) == 3 * batch_size
            envs = list(ids[::3])
            np.testing.assert_array_equal(ids, np.repeat(envs, 3))
            for j, i in enumerate(envs):
                rows = slice(3 * j, 3 * j + 3)
                if i not in seen_first:  # its reset observations: live, nothing earned
                    want = [first[3 * i:3 * i + 3], np.zeros(3), np.zeros(3, bool),
                            np.zeros(3, bool), np.ones(3, bool)]
                    seen_first.add(i)
                else:
                    want = expected[i]
                for got, wanted in zip((obs, rew, term, trunc, info["agent_mask"]), want):
                    np.testing.assert_array_equal(got[rows], wanted)
                saw_dead |= not want[4].all()
                saw_end |= bool(want[2].any() or want[3].any())
            actions = rng.integers(0, action_n, len(ids))
            env.send(actions, ids)
            # (each env's results, as the reference steps it with the same actions)
            results = ref.step(actions, envs)
            for j, i in enumerate(envs):
                expected[i] = [f[3 * j:3 * j + 3] for f in results]
        assert saw_dead if make is pz_envs.staggered else saw_end
    finally:
        env.close()


def test_async_send_takes_ids_per_row():
    env = envd.make_pettingzoo(pz_envs.staggered, 2, num_workers=0, seed=0, batch_size=1)
    try:
        env.async_reset()
        obs, _, _, _, info = env.recv()
        with pytest.raises(envd.InvalidArgumentError, match="each env's id 3 times in a row"):
            env.send(np.zeros(3, np.int64), [0, 0, 1])
    finally:
        env.close()


def test_episode_statistics_per_row():
    env = envd.make_pettingzoo(pz_envs.staggered, 2, num_workers=0, seed=0)
    try:
        env.reset()
        ones = np.ones(env.num_envs, np.int64)  # every reward k + 1 + 0.1
        ended = {}
        for t in range(1, 6):
            _, _, _, _, info = env.step(ones)
            if "envd_episode" in info:
                ended[t] = (info["_envd_episode"].copy(), info["envd_episode"]["r"].copy(),
                            info["envd_episode"]["l"].copy())
        # agent k (rows k and 3 + k) ends at step k + 2 after k + 2 live steps
        assert sorted(ended) == [2, 3, 4]
        for t, (mask, returns, lengths) in ended.items():
            k = t - 2
            np.testing.assert_array_equal(np.flatnonzero(mask), [k, 3 + k])
            np.testing.assert_allclose(returns[mask], (k + 1.1) * t)
            np.testing.assert_array_equal(lengths[mask], t)
    finally:
        env.close()


@pytest.mark.parametrize("num_workers", [0, 1])
def test_an_agent_dropped_without_a_flag_ends_truncated(num_workers):
    """Review finding L1: an agent the env drops from its dicts and from
    ``agents`` without a termination or truncation flag ends truncated at
    that step (its episode statistics with it), then is a dead row that
    repeats that flag; agents left when the env empties ``agents`` without
    flags alike; the env then resets as usual."""
    env = envd.make_pettingzoo(pz_envs.dropping, 2, num_workers=num_workers, seed=0)
    try:
        env.reset()
        ones = np.ones(env.num_envs, np.int64)
        env.step(ones)
        obs, rew, term, trunc, info = env.step(ones)  # step 2: a1 (rows 1, 4) dropped
        np.testing.assert_array_equal(np.flatnonzero(trunc), [1, 4])
        assert not term[[1, 4]].any()  # a0 (rows 0, 3) terminates at step 2 as flagged
        np.testing.assert_array_equal(np.flatnonzero(info["_envd_episode"]), [0, 1, 3, 4])
        np.testing.assert_array_equal(info["envd_episode"]["l"][[1, 4]], [2, 2])
        assert obs[[1, 4]].tolist() == [[0.0] * 4] * 2 and rew[[1, 4]].tolist() == [0, 0]
        _, _, term, trunc, info = env.step(ones)  # step 3: a1's rows dead, flags again
        assert trunc[[1, 4]].all() and not info["agent_mask"][[1, 4]].any()
    finally:
        env.close()
    env = envd.make_pettingzoo(pz_envs.quitting, 1, num_workers=num_workers, seed=0)
    try:
        env.reset()
        ones = np.ones(env.num_envs, np.int64)
        env.step(ones), env.step(ones)
        _, _, term, trunc, info = env.step(ones)  # step 3: agents emptied, no flags
        # a0 terminated at step 2, a1 dropped at 2 (dead rows), a2 cut short now
        assert term.tolist() == [True, False, False]
        assert trunc.tolist() == [False, True, True]
        assert info["_envd_episode"].tolist() == [False, False, True]
        obs, _, term, trunc, info = env.step(ones)  # next_step: the env resets
        assert info["agent_mask"].all() and not (term | trunc).any()
    finally:
        env.close()


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("mode", ["next_step", "same_step", "disabled"])
def test_an_agent_absent_at_reset_is_dead_for_its_episode(mode, num_workers):
    """Review finding M2: an agent absent from a reset (pz_envs.LateEnv's a2,
    every other episode) is dead for that episode, as it was before the env
    slots: its row masked from the reset on, zero observation, reward 0,
    truncated from its first step (every row that dies says so in its
    flags, so an env whose rows are all flagged is done), no action passed (LateEnv asserts it: make's own timed
    steps too), no episode statistics; present again at a later reset (every
    autoreset mode), it lives then."""
    env = envd.make_pettingzoo(pz_envs.late, 2, num_workers=num_workers, seed=5,
                               autoreset_mode=mode)
    try:
        saw_dead, saw_reset = _compare(env, Reference(pz_envs.late, 2, 5, mode), 16, 5, 3)
        assert saw_dead and saw_reset
    finally:
        env.close()
    with envd.make_pettingzoo(pz_envs.late, 2, num_workers=num_workers, seed=5,
                              autoreset_mode=mode) as env:
        _, info = env.reset()
        assert info["agent_mask"].tolist() == [True, True, False] * 2
        ended = np.zeros(env.num_envs, int)
        for t in range(3):  # the first episode: a0 ends at step 2, a1 at 3, a2 never lived
            obs, rew, term, trunc, info = env.step(np.ones(env.num_envs, np.int64))
            ended += info.get("_envd_episode", np.zeros(env.num_envs, bool))
            if t == 2:  # (same_step: the rows of step 3 are the next episode's, a2 there)
                break
            assert not info["agent_mask"][[2, 5]].any()
            assert not (obs[[2, 5]].any() or rew[[2, 5]].any() or term[[2, 5]].any())
            assert trunc[[2, 5]].all()
        assert ended.tolist() == [1, 1, 0] * 2  # a statistic per agent that lived


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("mode", ["next_step", "same_step", "disabled"])
def test_an_env_of_one_agent_keeps_agent_rows(mode, num_workers):
    """Review finding L1: a PettingZoo env of one agent is rows as any
    other's (its env's agent_mask, its dead rows), as envd.make_pettingzoo's
    envs always were: info["agent_mask"] in every reset and step."""
    env = envd.make_pettingzoo(pz_envs.solo, 3, num_workers=num_workers, seed=2,
                               autoreset_mode=mode)
    try:
        assert (env.num_envs, env.num_agents, env.possible_agents) == (3, 1, ["a0"])
        _, saw_reset = _compare(env, Reference(pz_envs.solo, 3, 2, mode), 7, 2, 3)
        assert saw_reset
    finally:
        env.close()


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("kind", ["order", "count", "space"])
def test_every_env_must_have_the_described_agents(kind, num_workers, tmp_path):
    """Review finding M1: a creator whose instances differ from the one the
    session was described with (agents in another order, another number of
    them, another agent space) is refused at make, naming the env, instead
    of writing its rows into other envs' rows."""
    import functools
    # (instances 0 and 1: the description's and env 0; env 1 on differs)
    creator = functools.partial(pz_envs.CountedEnv, str(tmp_path / "made"), kind, 2)
    with pytest.raises((ValueError, envd.EnvError), match="env 1") as refused:
        envd.make_pettingzoo(creator, 3, num_workers=num_workers)
    text = str(refused.value)
    what = {"order": "['a2', 'a1', 'a0']", "count": "'a3'", "space": "(5,)"}[kind]
    assert what in text and "session was made for" in text
    same = functools.partial(pz_envs.CountedEnv, str(tmp_path / "same"), kind, 99)
    with envd.make_pettingzoo(same, 3, num_workers=num_workers) as env:  # all alike: made
        assert env.num_envs == 9


def test_reset_mask_and_seed_are_per_env():
    env = envd.make_pettingzoo(pz_envs.staggered, 2, num_workers=0, seed=0)
    try:
        obs, _ = env.reset(seed=7)
        draws = obs[:, 2].copy()
        # one RNG stream per env, seeded 7 + i, drawn by its agents in order
        for i in range(2):
            np.testing.assert_array_equal(draws[3 * i:3 * i + 3],
                                          np.random.default_rng(7 + i).random(3))
        env.step(np.zeros(6, np.int64))
        obs, _ = env.reset(options={"reset_mask": np.array([0, 1, 0, 0, 0, 0], bool)})
        assert (obs[:3, 0] == 0).all() and (obs[3:, 0] == 1).all()  # env 0 reset, env 1 not
    finally:
        env.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_raising_env_is_env_error(num_workers):
    env = envd.make_pettingzoo(lambda: pz_envs.staggered(raise_seed=1), 2, num_workers=num_workers,
                               seed=0)
    try:
        env.reset()
        env.step(np.zeros(6, np.int64))
        with pytest.raises(envd.EnvError, match="env 1 raised ValueError: boom at step 2"):
            env.step(np.zeros(6, np.int64))
    finally:
        env.close()


def test_dying_worker_is_env_error():
    env = envd.make_pettingzoo(pz_envs.staggered, 2, num_workers=2, seed=0)
    try:
        env.reset()
        pid = env.worker_pids[1]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(envd.EnvError, match=r"worker 1 .* died"):
            env.step(np.zeros(6, np.int64))
    finally:
        env.close()


def test_heterogeneous_agents_are_refused():
    with pytest.raises(envd.EnvError, match=r"agent 'a1' has action space Discrete\(4\), "
                                            r"agent 'a0' Discrete\(3\)"):
        envd.make_pettingzoo(pz_envs.mixed, 2, num_workers=0)


def test_refusals():
    with pytest.raises(envd.InvalidArgumentError, match="pz:<module>:<factory>"):
        envd.make_pettingzoo("pz:mpe2.simple_spread_v3", 2)
    with pytest.raises(envd.UnknownEnvError, match="no module 'no_such_module'"):
        envd.make("pz:no_such_module:env", 2)
    with pytest.raises(envd.InvalidArgumentError, match="max_episode_steps"):
        envd.make(SPREAD_ID, 2, max_episode_steps=5)
    with pytest.raises(envd.InvalidArgumentError, match="env kwargs"):
        envd.make_pettingzoo(pz_envs.staggered, 2, raise_seed=3)


class CrowdEnv(pz_envs.StaggeredEnv):
    def __init__(self, agents: int):
        super().__init__()
        self.possible_agents = [f"a{k}" for k in range(agents)]


def test_agents_are_rows_within_their_bounds():
    """SECURITY.md: at most ENVD_MAX_AGENTS agents per env, and envs times
    agents within the rows a session takes, each refused at make."""
    with pytest.raises(envd.EnvError, match="4097 possible agents, over the 4096"):
        envd.make_pettingzoo(lambda: CrowdEnv(4097), 1, num_workers=0)
    with pytest.raises(envd.InvalidArgumentError, match="has 3 agents per env: 400000 envs"):
        envd.make_pettingzoo(pz_envs.staggered, 400_000, num_workers=0)


class OneSpaceEnv(pz_envs.StaggeredEnv):
    """Three agents of one space (observation and action), stepped with
    actions in it; every agent truncated at step 3."""

    def __init__(self, space):
        super().__init__()
        self.space = space

    def observation_space(self, agent):
        return self.space

    def action_space(self, agent):
        return self.space

    def _obs(self, agent, action=0.0):
        return self.space.sample()

    def step(self, actions):
        self.t += 1
        assert all(self.space.contains(np.asarray(actions[a], self.space.dtype).reshape(
            self.space.shape)) for a in self.agents)
        obs = {a: self.space.sample() for a in self.agents}
        trunc = dict.fromkeys(self.agents, self.t >= 3)
        rew = dict.fromkeys(self.agents, 0.0)
        if self.t >= 3:
            self.agents = []
        return obs, rew, dict.fromkeys(obs, False), trunc, {a: {} for a in obs}


@pytest.mark.parametrize("space", [
    spaces.Box(-1.0, 2.0, (4,), np.float32), spaces.Box(0, 9, (2, 3), np.int16),
    spaces.Discrete(5), spaces.Discrete(4, start=-2), spaces.MultiDiscrete([3, 4]),
    spaces.MultiBinary(3)])
def test_agent_spaces_are_the_rows_spaces(space):
    """The agents' spaces are the VecEnv's single spaces (one row each), and
    every agent's row of a discrete action is checked against its bounds."""
    with envd.make_pettingzoo(lambda: OneSpaceEnv(space), 2, num_workers=0, seed=0) as env:
        assert env.single_observation_space == space and env.single_action_space == space
        obs, _ = env.reset()
        assert obs.shape == (6, *space.shape) and obs.dtype == space.dtype
        for _ in range(4):
            env.step(env.action_space.sample())
        if isinstance(space, spaces.Box):
            return
        actions = env.action_space.sample()
        if isinstance(space, spaces.Discrete):
            actions[4] = space.start + space.n
        elif isinstance(space, spaces.MultiDiscrete):
            actions[4][1] = space.nvec[1]
        else:
            actions[4][2] = 2
        with pytest.raises(envd.InvalidActionError, match="of env 4 is out of range"):
            env.step(actions)


def test_out_of_range_action_is_refused():
    env = envd.make_pettingzoo(pz_envs.staggered, 2, num_workers=0, seed=0)
    try:
        env.reset()
        with pytest.raises(envd.InvalidActionError, match="action 3 of env 4 is out of range"):
            env.step(np.array([0, 0, 0, 0, 3, 0]))
    finally:
        env.close()


def test_async_episode_statistics_per_row():
    env = envd.make_pettingzoo(pz_envs.staggered, 2, num_workers=1, seed=0, batch_size=1)
    try:
        env.async_reset()
        ended = {0: {}, 1: {}}  # env -> {its step: (mask, returns, lengths)}
        steps = {0: 0, 1: 0}
        for _ in range(12):
            obs, _, _, _, info = env.recv()
            i = int(info["env_id"][0])
            if "envd_episode" in info and steps[i] <= 5:
                ended[i][steps[i]] = (info["_envd_episode"].copy(),
                                      info["envd_episode"]["r"].copy(),
                                      info["envd_episode"]["l"].copy())
            env.send(np.ones(3, np.int64), info["env_id"])
            steps[i] += 1
        for i in (0, 1):
            assert sorted(ended[i]) == [2, 3, 4]  # agent k ends at the env's step k + 2
            for t, (mask, returns, lengths) in ended[i].items():
                np.testing.assert_array_equal(np.flatnonzero(mask), [t - 2])
                np.testing.assert_allclose(returns[mask], (t - 2 + 1.1) * t)
                np.testing.assert_array_equal(lengths[mask], t)
    finally:
        env.close()


def test_close_reaps_workers_and_fds():
    envd.make(SPREAD_ID, 2, num_workers=1).close()  # the template is up (its fds stay)
    gc.collect()
    fds = open_fds()
    env = envd.make(SPREAD_ID, 2, num_workers=2, seed=0)
    pids = env.worker_pids
    assert len(pids) == 2 and all(alive(pid) for pid in pids)
    results = env.reset()
    env.step(np.zeros(6, np.int64))
    env.close()
    del results, env  # (views keep the mapping, and its descriptor, alive)
    gc.collect()
    assert wait_until(lambda: not any(alive(pid) for pid in pids))
    # (the segment's memfd and the workers' pidfds too; at most the
    # baseline's: another thread's finalizer may close an earlier one)
    assert wait_until(lambda: open_fds() <= fds), sorted(open_fds() - fds)
