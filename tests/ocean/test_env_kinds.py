"""Every env kind of the registry (envd.make_options.KINDS) made through
every entry point: envd.make in this process, Client.make (the daemon's make
handler builds the session with the kind's daemon builder) and
MultiClient.make over two daemons.  Where the kind claims the entry point,
the env is made and steps as the in-process env does (the same
observations, rewards and dones, bit for bit); where it does not, the entry
point refuses it with the registry's refusal.  A daemon started without a
kind's flag (--ocean, --python-env) refuses its ids, naming the flag.

(Here and not in tests/integration: the puffer: kind needs an Ocean build,
which this folder's fixtures make.)"""
from __future__ import annotations

import contextlib

import numpy as np
import puffer_reference
import pytest
from support.daemon import DaemonProcess, left_clean

import envd
from envd import make_options as mo

pytest.importorskip("mpe2.simple_spread_v3", reason="mpe2's simple_spread is the pz: env")

#: One id of each kind (the registry's kinds, no more and no less: checked below).
IDS = {mo.NATIVE: "CartPole-v1", mo.PUFFER: "puffer:pong", mo.PYTHON: "py:CartPole-v1",
       mo.PETTINGZOO: "pz:mpe2.simple_spread_v3:parallel_env"}
NUM_ENVS, SEED, STEPS = 3, 11, 5


def test_every_kind_of_the_registry_is_covered():
    assert set(IDS) == set(mo.KINDS)
    assert all(mo.kind_of(env_id) == kind for kind, env_id in IDS.items())


def _flags(cache) -> tuple[str, ...]:
    return ("--threads", "1", "--lease-timeout", "10", "--ocean", "pong", "--ocean-cache",
            str(cache), "--python-env", IDS[mo.PYTHON], "--python-env", IDS[mo.PETTINGZOO])


@pytest.fixture(scope="module")
def daemons(tmp_path_factory, ocean_builds):
    ocean_builds("pong")
    cache = puffer_reference.test_cache()
    folder = tmp_path_factory.mktemp("kinds")
    procs = [DaemonProcess(folder / f"d{k}", *_flags(cache)) for k in range(2)]
    with left_clean(procs):
        yield procs


def _run(env) -> list[np.ndarray]:
    """Observations, rewards and dones of a reset and STEPS steps of fixed actions."""
    out = [env.reset(seed=SEED)[0].copy()]
    rng = np.random.default_rng(SEED)
    for _ in range(STEPS):
        space = env.single_action_space
        actions = np.stack([rng.integers(0, space.n) if hasattr(space, "n")
                            else np.zeros(space.shape, space.dtype)
                            for _ in range(env.num_envs)]).astype(space.dtype)
        obs, rew, term, trunc, _ = env.step(actions)
        out += [obs.copy(), rew.copy(), term.copy(), trunc.copy()]
    return out


def _make(place: str, env_id: str, daemons: list[DaemonProcess],
          stack: contextlib.ExitStack):
    if place == mo.IN_PROCESS:
        return envd.make(env_id, NUM_ENVS, seed=SEED)
    endpoints = [d.endpoint for d in (daemons[:1] if place == mo.DAEMON else daemons)]
    client = stack.enter_context(envd.connect(endpoints[0] if len(endpoints) == 1
                                              else endpoints))
    return client.make(env_id, NUM_ENVS, seed=SEED)


@pytest.mark.parametrize("place", [mo.IN_PROCESS, mo.DAEMON, mo.MULTI_DAEMON])
@pytest.mark.parametrize("kind", list(IDS))
def test_each_kind_is_made_where_the_registry_says_and_refused_elsewhere(
        daemons, kind, place, monkeypatch):
    monkeypatch.setenv("ENVD_OCEAN_CACHE", str(puffer_reference.test_cache()))
    env_id, record = IDS[kind], mo.KINDS[kind]
    with contextlib.ExitStack() as stack:
        if place not in record.places:
            with pytest.raises(envd.InvalidArgumentError) as error:
                _make(place, env_id, daemons, stack)
            assert str(error.value) == f"{env_id}: {record.instead}"
            return
        env = stack.enter_context(_make(place, env_id, daemons, stack))
        got = _run(env)
    with envd.make(env_id, NUM_ENVS, seed=SEED) as local:
        want = _run(local)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("kind", [kind for kind, record in mo.KINDS.items()
                                  if record.daemon_flag is not None])
def test_a_daemon_without_the_kinds_flag_refuses_its_ids_naming_the_flag(tmp_path, kind):
    with DaemonProcess(tmp_path / "plain", "--threads", "1") as proc:
        with proc.connect() as client:
            with pytest.raises(envd.UnknownEnvError) as error:
                client.make(IDS[kind], 1)
            assert IDS[kind] in str(error.value)
            assert mo.KINDS[kind].daemon_flag in str(error.value)
    assert proc.proc.returncode == 0, proc.log()


def test_a_daemon_serving_some_ocean_ids_answers_a_typo_with_the_closest(daemons):
    """With --ocean pong, 'puffer:pongg' is a typo, not a missing flag."""
    with envd.connect(daemons[0].endpoint) as client:
        with pytest.raises(envd.UnknownEnvError) as error:
            client.make("puffer:pongg", 1)
    assert "did you mean 'puffer:pong'" in str(error.value)
    assert "--ocean" not in str(error.value)
