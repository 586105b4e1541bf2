"""MultiDiscrete/MultiBinary spaces and per-env make kwargs through the
daemon (tests/native/multi_spaces.c served with --plugin) against the plain
Python reference of support/multi_spaces_checks.py: both transports, with
and without the fast path, async send/recv and the SB3 adapter; refusals
arrive as the in-process ones do.  Multi-agent envs are refused by the
daemon for now (in-process only, docs/writing-envs.md)."""
from __future__ import annotations

import numpy as np
import pytest
from support.daemon import DaemonProcess, segments_of
from support.multi_agent_checks import SOURCE as SEEK_SOURCE
from support.multi_spaces_checks import SOURCE, Lights, compare, env_id, random_actions
from support.plugin_checks import build_plugin

import envd

BONUSES = [0.0, 2.0, 4.5, 10.0, 1.0, 3.25]
PATHS = {"shm-fast": {"transport": "shm", "fast_path": True},
         "shm-socket": {"transport": "shm", "fast_path": False},
         "inline": {"transport": "inline", "fast_path": False}}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    folder = tmp_path_factory.mktemp("multi")
    spaces_lib = build_plugin(SOURCE, folder / "libmulti_spaces.so")
    seek_lib = build_plugin(SEEK_SOURCE, folder / "libseek.so")
    with DaemonProcess(folder / "d", "--threads", "2", "--plugin", str(spaces_lib),
                       "--plugin", str(seek_lib)) as proc:
        yield proc
    assert proc.proc.returncode == 0, proc.log()
    assert segments_of(proc.pid) == []


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("switches", [False, True], ids=["multi_discrete", "multi_binary"])
def test_daemon_matches_reference_with_per_env_kwargs(daemon, path, switches):
    with daemon.connect() as client, \
            client.make(env_id(switches), 6, seed=8, bonus=BONUSES, **PATHS[path]) as env:
        assert env.fast_path == PATHS[path]["fast_path"]
        assert compare(env, 8, BONUSES, switches, steps=80) > 6


@pytest.mark.parametrize("path", sorted(PATHS))
def test_daemon_refuses_out_of_range_actions_and_nothing_moves(daemon, path):
    with daemon.connect() as client:
        for switches, bad in ((False, [0, 2]), (True, [0, 0, 3, 0])):
            with client.make(env_id(switches), 3, seed=1, **PATHS[path]) as env:
                refs = [Lights(1 + i, 1.0, switches) for i in range(3)]
                env.reset()
                for r in refs:
                    r.reset()
                rng = np.random.default_rng(0)
                actions = random_actions(switches, 3, rng)
                actions[2] = bad
                with pytest.raises(envd.InvalidActionError, match="of env 2"):
                    env.step(actions)
                actions = random_actions(switches, 3, rng)
                obs = env.step(actions)[0]
                assert np.array_equal(obs, np.stack([r.step(a)[0] for r, a in zip(refs, actions)]))


def test_daemon_refuses_bad_kwarg_lists(daemon):
    with daemon.connect() as client:
        with pytest.raises(envd.InvalidArgumentError, match="has 2 values but num_envs=3"):
            client.make("Lights-v0", 3, bonus=[1.0, 2.0])
        with pytest.raises(envd.InvalidArgumentError, match=r"out of range.*\(env 0 of the list\)"):
            client.make("Lights-v0", 3, bonus=[-1.0, 2.0, 3.0])
        with client.make("Lights-v0", 3, seed=0, bonus=2.0) as env:  # the session still works
            env.reset()


@pytest.mark.parametrize("path", sorted(PATHS))
def test_daemon_async_send_recv(daemon, path):
    """batch_size 2 of 6: recv's rows are their envs' (info["env_id"]), each
    stepped like its own reference with its own bonus."""
    with daemon.connect() as client, \
            client.make("Lights-v0", 6, seed=3, bonus=BONUSES, batch_size=2, **PATHS[path]) as env:
        refs = [Lights(3 + i, BONUSES[i], False) for i in range(6)]
        expected = {i: refs[i].reset() for i in range(6)}
        env.async_reset()
        rng = np.random.default_rng(1)
        rewarded = 0
        for _ in range(90):
            obs, rewards, terms, truncs, info = env.recv()
            ids = info["env_id"].tolist()
            assert np.array_equal(obs, np.stack([expected[i] for i in ids]))
            actions = random_actions(False, len(ids), rng)
            for i, a in zip(ids, actions):
                expected[i], reward, term, trunc = refs[i].step(a)
                rewarded += term
            env.send(actions, info["env_id"])
        assert rewarded > 3


def test_sb3_adapter_over_the_daemon(daemon):
    from envd.integrations.sb3 import EnvdVecEnv
    with daemon.connect() as client:
        venv = EnvdVecEnv.make("Switches-v0", 4, client=client, seed=2, bonus=[1.0, 2.0, 3.0, 4.0])
        try:
            refs = [Lights(2 + i, float(i + 1), True, same_step=True) for i in range(4)]
            assert np.array_equal(venv.reset(), np.stack([r.reset() for r in refs]))
            rng = np.random.default_rng(4)
            ended = 0
            for _ in range(60):
                actions = random_actions(True, 4, rng)
                venv.step_async(actions)
                obs, rewards, dones, infos = venv.step_wait()
                want = [r.step(a) for r, a in zip(refs, actions)]
                assert np.array_equal(obs, np.stack([w[0] for w in want]))
                assert rewards.tolist() == [float(np.float32(w[1])) for w in want]
                assert dones.tolist() == [w[2] or w[3] for w in want]
                for k in np.flatnonzero(dones):
                    assert np.array_equal(infos[k]["terminal_observation"], refs[k].final_obs)
                    ended += 1
            assert ended > 4
        finally:
            venv.close()


def test_daemon_serves_the_multi_agent_plugin_as_rows(daemon):
    """Seek-v0 (3 agents per env) through the daemon: one row per agent
    (tests/integration/test_daemon_multi_agent.py checks its results)."""
    with daemon.connect() as client:
        with client.make("Seek-v0", 2, seed=0) as env:
            agents = env.num_agents
            assert agents > 1 and env.num_envs == 2 * agents
            obs, info = env.reset()
            assert len(obs) == 2 * agents and info["agent_mask"].all()
