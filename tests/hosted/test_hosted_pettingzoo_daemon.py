"""Hosted PettingZoo envs served by a daemon (--python-env pz:<module>:<factory>):
the daemon hosts the ParallelEnvs, their agents rows of the client's
RemoteVecEnv as a C multi-agent env's; the same rows as the in-process env (and so as the direct reference of
test_hosted_pettingzoo.py) over shm and inline, sync and async; only the ids
the operator allowed; an env's failure is EnvError and leaves the daemon up."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from envs import DAEMON_ENV, alive, descendants, wait_until
from support.daemon import DaemonProcess, left_clean

import envd

pytest.importorskip("mpe2.simple_spread_v3", reason="mpe2 is the env served")

SPREAD = "pz:mpe2.simple_spread_v3:parallel_env"
STAGGERED = "pz:pz_envs:staggered"
RAISING = "pz:pz_envs:raising"
SOLO = "pz:pz_envs:solo"  # one agent: agent_mask all the same
LATE = "pz:pz_envs:late"  # an agent absent from every other reset
ENV = DAEMON_ENV



@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    proc = DaemonProcess(tmp_path_factory.mktemp("pz") / "daemon", "--threads", "1",
                         "--python-env", SPREAD, "--python-env", STAGGERED,
                         "--python-env", RAISING, "--python-env", SOLO,
                         "--python-env", LATE, env=ENV)
    with left_clean([proc]):
        yield proc


def _run(env, steps: int, seed: int):
    out = [env.reset(seed=seed)[0].copy()]
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        obs, rew, term, trunc, info = env.step(rng.integers(0, 5, env.num_envs) % 3
                                               if "spread" not in env.env_id
                                               else rng.integers(0, 5, env.num_envs))
        stats = info.get("envd_episode", {}).get("r", np.zeros(env.num_envs))
        out += [obs.copy(), rew.copy(), term.copy(), trunc.copy(), info["agent_mask"].copy(),
                np.asarray(stats).copy()]
        if "final_obs" in info:  # (same_step: the final observations of the rows that ended)
            ended = info["_final_obs"]
            out += [ended.copy(), *(info["final_obs"][k].copy() for k in np.flatnonzero(ended))]
    return out


@pytest.mark.parametrize("env_id", [SPREAD, STAGGERED, SOLO, LATE])
@pytest.mark.parametrize("transport,mode", [("shm", "next_step"), ("inline", "next_step"),
                                            ("shm", "same_step")])
def test_daemon_rows_equal_in_process(daemon, env_id, transport, mode):
    local = envd.make(env_id, 3, num_workers=1, seed=4, autoreset_mode=mode)
    try:
        want = _run(local, 12, 4)
    finally:
        local.close()
    with daemon.connect() as client:
        env = client.make(env_id, 3, num_workers=2, seed=4, transport=transport,
                          autoreset_mode=mode)
        try:
            agents = local.num_agents  # (SOLO: one)
            assert (env.num_envs, env.num_agents, env.num_env_instances) == (3 * agents, agents, 3)
            assert env.possible_agents == local.possible_agents
            assert env.single_action_space == local.single_action_space
            got = _run(env, 12, 4)
        finally:
            env.close()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_daemon_async_whole_envs(daemon):
    with daemon.connect() as client:
        env = client.make(STAGGERED, 3, num_workers=1, seed=0, batch_size=1)
        try:
            env.async_reset()
            seen = set()
            for _ in range(9):
                obs, _, _, _, info = env.recv()
                assert len(info["env_id"]) == 3 and len(set(info["env_id"])) == 1
                seen.add(int(info["env_id"][0]))
                env.send(np.zeros(3, np.int64), info["env_id"])
            assert seen == {0, 1, 2}
        finally:
            env.close()


def test_daemon_refusals_and_env_error(daemon):
    with daemon.connect() as client:
        with pytest.raises(envd.UnknownEnvError, match="does not host"):
            client.make("pz:mpe2.simple_spread_v3:raw_env", 2)
        with pytest.raises(envd.InvalidArgumentError, match="max_episode_steps"):
            client.make(SPREAD, 2, max_episode_steps=5)
        env = client.make(RAISING, 2, num_workers=1, seed=0)
        try:
            env.reset()
            env.step(np.zeros(6, np.int64))
            with pytest.raises(envd.EnvError, match="env 1 raised ValueError: boom at step 2"):
                env.step(np.zeros(6, np.int64))
        finally:
            env.close()
        # the daemon and other sessions go on
        ok = client.make(SPREAD, 1, num_workers=1, seed=0)
        ok.reset()
        ok.close()


def test_status_counts_envs_and_agents_of_pettingzoo_sessions(daemon):
    """Review finding L4: `envd status` showed a pz: session as num_envs envs
    of one agent (its segment's adapter rows).  Its row says the agents now,
    `rows` counts them beside a native multi-agent session's, and the table
    shows envs x agents."""
    from envd.tools.cli import status_table
    with daemon.connect() as client, \
            client.make(STAGGERED, 4, num_workers=1, seed=0) as hosted, \
            client.make("simple_spread_v3", 2, seed=0) as native:
        assert hosted.num_envs == 12 and native.num_envs == 6
        status = client.status()
        rows = {row["env_id"]: row for row in status["session_table"]}
        assert (rows[STAGGERED]["num_envs"], rows[STAGGERED]["num_agents"]) == (4, 3)
        assert (rows["simple_spread_v3"]["num_envs"],
                rows["simple_spread_v3"]["num_agents"]) == (2, 3)
        assert status["envs"] == 6 and status["rows"] == 4 * 3 + 2 * 3
        table = status_table(status)
        assert "4x3" in table and "2x3" in table


def test_multi_client_refuses_pettingzoo_ids(daemon):
    multi = envd.connect([daemon.endpoint], timeout=30)  # (a list: a MultiClient)
    try:
        with pytest.raises(envd.InvalidArgumentError, match="served by one daemon"):
            multi.make(SPREAD, 2)
    finally:
        multi.close()


def test_daemon_worker_killed_is_env_error(daemon):
    with daemon.connect() as client:
        other = client.make(SPREAD, 1, num_workers=1, seed=0)
        other.reset()
        before = set(descendants(daemon.pid))
        env = client.make(STAGGERED, 4, num_workers=2, seed=0)
        workers = sorted(set(descendants(daemon.pid)) - before)
        assert len(workers) == 2, workers
        env.reset()
        os.kill(workers[1], signal.SIGKILL)
        with pytest.raises(envd.EnvError, match=r"worker 1 \(pid \d+, envs 2\.\.3\) died"):
            for _ in range(1000):  # (a step may finish before the kill lands)
                env.step(np.zeros(12, np.int64))
        assert other.step(np.zeros(3, np.int64))[0].shape == (3, 18)  # the others go on
        env.close()
        assert wait_until(lambda: not any(map(alive, workers)), 30)
        other.close()


def test_daemon_render_equals_the_parallel_envs_own(daemon):
    """render_mode="rgb_array": each env's frame, its ParallelEnv's own
    render() in the daemon's workers, as mpe2's simple_spread_v3 made here."""
    from mpe2 import simple_spread_v3
    n, seed = 2, 3
    refs = [simple_spread_v3.parallel_env(render_mode="rgb_array") for _ in range(n)]
    with daemon.connect() as client:
        env = client.make(SPREAD, n, num_workers=2, seed=seed, render_mode="rgb_array")
        try:
            assert env.render_mode == "rgb_array"
            assert env.metadata["render_fps"] == refs[0].metadata["render_fps"]
            env.reset()
            for i, ref in enumerate(refs):
                ref.reset(seed=seed + i)
            rng = np.random.default_rng(1)
            for _ in range(4):
                frames = env.render()
                assert type(frames) is tuple and len(frames) == n
                for frame, ref in zip(frames, refs):
                    np.testing.assert_array_equal(frame, ref.render())
                actions = rng.integers(0, 5, env.num_envs)
                env.step(actions)
                for i, ref in enumerate(refs):
                    ref.step({agent: int(actions[i * 3 + k])
                              for k, agent in enumerate(ref.possible_agents)})
        finally:
            env.close()
            for ref in refs:
                ref.close()
        with pytest.raises(envd.InvalidArgumentError, match="rgb_array"):
            client.make(SPREAD, 1, render_mode="human")
        with client.make(SPREAD, 1, num_workers=1) as plain:
            plain.reset(seed=0)
            with pytest.raises(envd.EnvStateError, match="render_mode='rgb_array'"):
                plain.render()


def test_daemon_calls_reach_the_parallel_envs(daemon):
    with daemon.connect() as client:
        with client.make(SPREAD, 3, num_workers=2, seed=0) as env:
            env.reset()
            assert env.get_attr("max_cycles") == (25,) * 3  # (simple_spread_v3's default)
            assert env.get_attr("possible_agents") == (env.possible_agents,) * 3
            states = env.call("state")
            assert len(states) == 3 and not np.array_equal(states[0], states[1])
            env.set_attr("marker", [1, 2, 3])
            assert env.get_attr("marker") == (1, 2, 3)
            with pytest.raises(ValueError, match="equal to the number of environments"):
                env.set_attr("marker", [0] * env.num_envs)  # (one per env, not per row)
            with pytest.raises(AttributeError):
                env.get_attr("no_such_attribute")
            env.step(np.zeros(env.num_envs, np.int64))
