"""envd.puffer.Backend under PufferLib's own ``pufferlib.vector.make``
(pufferlib-core, the ``puffer`` extra): PufferLib's own Ocean class stepped
by envd equals that class stepped by PufferLib's Serial backend over its own
binding (observations, rewards, terminals and the Log infos); envd's creator,
a daemon, multi-agent rows and bad input."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import puffer_reference
import pytest
from support.daemon import DaemonProcess, segments_of

import envd
import envd.puffer
from envd.errors import InvalidArgumentError

vector = pytest.importorskip("pufferlib.vector", reason="pufferlib-core (envd's puffer extra)")

STEPS = 300


@pytest.fixture
def ocean_cache(ocean_builds, monkeypatch):
    for env in ("breakout", "snake"):
        ocean_builds(env)
    monkeypatch.setenv("ENVD_OCEAN_CACHE", str(puffer_reference.test_cache()))


def _run(vecenv, actions, seed):
    """PufferLib's loop: async_reset(seed), then recv/send; the recv tuple as
    the installed pufferlib names it (obs, rewards, terminals, infos)."""
    vecenv.async_reset(seed)
    out = vecenv.recv()
    obs, rews, terms, infos = [out[0].copy()], [], [], []
    for a in actions:
        vecenv.send(a)
        out = vecenv.recv()
        assert len(out) == 8  # pufferlib-core 3.0.19's tuple: teacher_actions 5th
        o, r, d, t, _teacher, info, ids, mask = out
        assert r.dtype == np.float32 and d.dtype == bool and not t.any() and mask.all()
        assert (ids == np.arange(len(r))).all()
        obs.append(o.copy())
        rews.append(r.copy())
        terms.append(d.copy())
        infos.append(info)
    return np.stack(obs), np.stack(rews), np.stack(terms), infos


def test_puffer_class_equals_pufferlib_serial(ocean_cache):
    """One Breakout (PufferLib's envs share one global stream, so one env is
    comparable) through vector.make: envd's backend against PufferLib's Serial."""
    cls = puffer_reference.puffer_class("breakout", "Breakout")
    actions = np.random.default_rng(3).integers(0, 3, size=(STEPS, 1))
    ref = vector.make(cls, env_kwargs={"num_envs": 1}, backend=vector.Serial, num_envs=1)
    expected = _run(ref, actions, seed=5)
    ref.close()
    got_env = vector.make(cls, env_kwargs={"num_envs": 1}, backend=envd.puffer.Backend,
                          num_envs=1)
    assert got_env.single_observation_space == ref.single_observation_space
    assert got_env.single_action_space == ref.single_action_space
    assert got_env.num_agents == ref.num_agents == 1
    got = _run(got_env, actions, seed=5)
    got_env.close()
    for a, b in zip(expected[:3], got[:3]):
        assert a.tobytes() == b.tobytes()
    # the Log infos: on the same steps (every log_interval=128), the same values
    assert [bool(i) for i in expected[3]] == [bool(i) for i in got[3]]
    logged = [(e[0], g[0]) for e, g in zip(expected[3], got[3]) if e]
    assert logged, "no episode ended: the test compares no infos"
    for e, g in logged:
        assert e.keys() == g.keys()
        for key in e:
            assert g[key] == pytest.approx(e[key], rel=1e-5), key


def test_creator_through_daemon_equals_in_process(ocean_cache, tmp_path):
    """envd's creator, 2 instances x 3 envs: in-process, and through a daemon
    (backend(endpoint=...)), equal; both equal envd.make's reset(seed)/step."""
    creator = envd.puffer.creator("breakout", num_envs=3, frameskip=2)
    actions = np.random.default_rng(4).integers(0, 3, size=(100, 6))
    with envd.make("puffer:breakout", 6, seed=0, frameskip=2) as env:
        obs = [env.reset(seed=11)[0].copy()]
        for a in actions:
            obs.append(env.step(a)[0].copy())
    local = vector.make(creator, backend=envd.puffer.backend(num_threads=2), num_envs=2)
    assert local.num_agents == 6
    in_process = _run(local, actions, seed=11)
    local.close()
    assert in_process[0].tobytes() == np.stack(obs).tobytes()
    with DaemonProcess(tmp_path / "daemon", "--threads", "2", "--ocean", "breakout",
                       "--ocean-cache", str(puffer_reference.test_cache())) as proc:
        remote = vector.make(creator, backend=envd.puffer.backend(endpoint=proc.endpoint),
                             num_envs=2)
        through_daemon = _run(remote, actions, seed=11)
        remote.close()
        # batches of one instance each, through the daemon: batch 1 holds rows 3-5
        batched = vector.make(creator, backend=envd.puffer.backend(endpoint=proc.endpoint),
                              num_envs=2, num_workers=2, batch_size=1)
        batched.async_reset(11)
        assert batched.recv()[0].tobytes() == in_process[0][0, :3].tobytes()
        batched.send(np.zeros(3, dtype=np.int64))
        assert batched.recv()[0].tobytes() == in_process[0][0, 3:].tobytes()
        batched.close()
    assert proc.proc.returncode == 0, proc.log()
    assert segments_of(proc.pid) == []
    for a, b in zip(in_process[:3], through_daemon[:3]):
        assert a.tobytes() == b.tobytes()


def test_multi_agent_rows_in_agent_order(ocean_cache):
    """snake: rows are agents, each env's snakes together, as envd's make."""
    kwargs = {"width": 40, "height": 32, "num_snakes": 4, "num_food": 40}
    actions = np.random.default_rng(5).integers(0, 4, size=(50, 8))
    with envd.make("puffer:snake", 2, seed=0, **kwargs) as env:
        obs = [env.reset(seed=2)[0].copy()]
        for a in actions:
            obs.append(env.step(a)[0].copy())
    vecenv = vector.make(envd.puffer.creator("snake", num_envs=2, **kwargs),
                         backend=envd.puffer.backend(num_threads=2), num_envs=1)
    assert vecenv.num_agents == 8
    got = _run(vecenv, actions, seed=2)
    vecenv.close()
    assert got[0].tobytes() == np.stack(obs).tobytes()


def test_seven_tuple_and_sync_helpers(ocean_cache):
    """recv_tuple=7 gives pufferlib 3.0.0's tuple; reset/step are vector.reset/step's."""
    vecenv = envd.puffer.Backend([envd.puffer.creator("breakout")], [[]], [{}], 1,
                                 recv_tuple=7)
    obs, infos = vecenv.reset(seed=1)
    assert obs.shape == (1, 118) and infos == []
    vecenv.send(np.array([1]))
    assert len(vecenv.recv()) == 7
    assert len(vecenv.step(np.array([2]))) == 5
    vecenv.close()
    # called, envd's creator makes its envs in this process (outside PufferLib)
    with envd.puffer.creator("breakout", num_envs=2, log_interval=4, frameskip=2)() as env:
        with envd.make("puffer:breakout", 2, seed=1, frameskip=2) as ref:
            assert env.reset(seed=1)[0].tobytes() == ref.reset(seed=1)[0].tobytes()


def test_bad_input(ocean_cache):
    creator = envd.puffer.creator("breakout")
    with pytest.raises(InvalidArgumentError, match="Ocean classes"):
        vector.make(lambda **kw: None, backend=envd.puffer.Backend, num_envs=1)
    with pytest.raises(InvalidArgumentError, match="batch_size must divide"):
        envd.puffer.Backend([creator] * 3, [[]] * 3, [{}] * 3, 3, batch_size=2)
    with pytest.raises(InvalidArgumentError, match="one creator"):
        vector.make([creator, envd.puffer.creator("breakout", frameskip=2)],
                    env_args=[[], []], env_kwargs=[{}, {}], backend=envd.puffer.Backend,
                    num_envs=2)
    with pytest.raises(InvalidArgumentError, match="render"):
        vector.make(creator, env_kwargs={"render_mode": "human"},
                    backend=envd.puffer.Backend, num_envs=1)
    with pytest.raises(InvalidArgumentError, match="async_reset"):
        vector.make(creator, env_kwargs={"seed": 3}, backend=envd.puffer.Backend, num_envs=1)
    with pytest.raises(InvalidArgumentError, match="env_kwargs, not env_args"):
        vector.make(creator, env_args=[4], backend=envd.puffer.Backend, num_envs=1)
    with pytest.raises(InvalidArgumentError, match="num_envs must be a positive int"):
        vector.make(creator, env_kwargs={"num_envs": 0}, backend=envd.puffer.Backend,
                    num_envs=1)
    with pytest.raises(InvalidArgumentError, match="frameskp"):
        vector.make(envd.puffer.creator("breakout", frameskp=2),
                    backend=envd.puffer.Backend, num_envs=1)
    with pytest.raises(InvalidArgumentError, match="num_threads is the daemon's"):
        vector.make(creator, backend=envd.puffer.backend(endpoint="ipc:///nonexistent/envd.sock",
                                                         num_threads=2), num_envs=1)
    with pytest.raises(InvalidArgumentError, match="unknown argument"):
        envd.puffer.Backend([creator], [[]], [{}], 1, workers=2)
    vecenv = vector.make(creator, backend=envd.puffer.Backend, num_envs=1)
    with pytest.raises(InvalidArgumentError, match="recv before send"):
        vecenv.recv()
    vecenv.async_reset(0)
    with pytest.raises(InvalidArgumentError, match="send before recv"):
        vecenv.send(np.array([0]))
    vecenv.recv()
    vecenv.close()


def test_env_not_built_names_the_build_command(tmp_path):
    """A fresh process (no env loaded) with an empty Ocean cache."""
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    code = ("import pufferlib.vector, envd.puffer\n"
            "pufferlib.vector.make(envd.puffer.creator('breakout'), "
            "backend=envd.puffer.Backend, num_envs=1)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "ENVD_OCEAN_CACHE": str(empty)}, timeout=120)
    assert run.returncode != 0
    assert "UnknownEnvError" in run.stderr and "envd ocean build breakout" in run.stderr


def test_pufferlib_reset_and_step_helpers(ocean_cache):
    """PufferLib's own vector.reset/vector.step drive the backend (they call
    async_reset/recv and send/recv, unpacking the installed tuple)."""
    vecenv = vector.make(envd.puffer.creator("breakout", num_envs=2),
                         backend=envd.puffer.Backend, num_envs=1)
    obs, infos = vector.reset(vecenv, seed=6)
    with envd.make("puffer:breakout", 2, seed=0) as env:
        assert obs.tobytes() == env.reset(seed=6)[0].tobytes()
        for a in np.random.default_rng(7).integers(0, 3, size=(20, 2)):
            o, r, d, t, info = vector.step(vecenv, a)
            expected = env.step(a)
            assert o.tobytes() == expected[0].tobytes()
            assert (r == expected[1].astype(np.float32)).all() and (d == expected[2]).all()
    vecenv.close()


def test_batches_received_in_turn(ocean_cache):
    """batch_size 2 of 4 instances (2 envs each): two batches of rows 0-3 and
    4-7, received in turn, each stepping while the other is held; every
    batch's rows equal envd.make's of 8 envs, seed for seed."""
    vecenv = vector.make(envd.puffer.creator("breakout", num_envs=2),
                         backend=envd.puffer.backend(num_threads=2), num_envs=4,
                         num_workers=2, batch_size=2)
    assert vecenv.num_agents == 8 and vecenv.agents_per_batch == 4
    actions = np.random.default_rng(8).integers(0, 3, size=(40, 8))
    with envd.make("puffer:breakout", 8, seed=0) as env:
        expected = [env.reset(seed=9)[0].copy()]
        expected += [env.step(a)[0].copy() for a in actions]
    vecenv.async_reset(9)
    for t in range(len(actions) + 1):
        for rows in (slice(0, 4), slice(4, 8)):
            out = vecenv.recv()
            assert (out[6] == np.arange(8)[rows]).all()  # env_ids: the batch's agents
            assert out[0].tobytes() == expected[t][rows].tobytes(), (t, rows)
            if t == len(actions):
                break  # (as in PufferLib, a recv is followed by a send before the next)
            vecenv.send(actions[t, rows])
    with pytest.raises(InvalidArgumentError, match="recv before send"):
        vecenv.recv()
    vecenv.close()
