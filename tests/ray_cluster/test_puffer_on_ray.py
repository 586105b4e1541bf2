"""PufferLib on Ray: Ocean envs built on every node (build_ocean_on_nodes),
daemons placed by Ray serving them (``--ocean cartpole``), and a Ray task on
each node stepping PufferLib's ``pufferlib.vector.make`` through its node's
daemon (envd.puffer's backend), equal to envd's in-process make."""
from __future__ import annotations

import os

import numpy as np
import pytest
from support.ray_cluster import local_cluster, ray  # first: it sets Ray's environment

# isort: split
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import envd
import envd.puffer
from envd.integrations.ray import build_ocean_on_nodes, start_daemons

# pufferlib-core (envd's puffer extra) may be missing where Ray is installed.
pytest.importorskip("pufferlib.vector", reason="pufferlib-core: pip install 'envd-rl[puffer]'")

NUM_NODES = 2
INSTANCES, PER_INSTANCE = 2, 3  # vector.make's num_envs x the creator's num_envs
ROWS = INSTANCES * PER_INSTANCE
STEPS, SEED = 120, 17


@pytest.fixture(scope="module")
def ocean_daemons(tmp_path_factory):
    """(daemons serving puffer:cartpole on every node, the shared Ocean cache)."""
    cache = tmp_path_factory.mktemp("ocean-cache")
    cache.chmod(0o700)
    with local_cluster(NUM_NODES):
        nodes = build_ocean_on_nodes(["cartpole"], source=os.environ.get("ENVD_OCEAN_SOURCE"),
                                     cache=str(cache))
        assert sorted(nodes) == sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        with start_daemons(NUM_NODES, bundle={"CPU": 0.5},
                           daemon_args=["--ocean", "cartpole", "--ocean-cache", str(cache)]) \
                as daemons:
            yield daemons, cache


def test_pufferlib_on_each_node_steps_its_daemon_equal_to_in_process(ocean_daemons,
                                                                      monkeypatch):
    daemons, cache = ocean_daemons
    # defined here: Ray pickles it by value (workers cannot import this test module)
    def _step_with_pufferlib(daemons, actions: np.ndarray, seed: int):
        """On a Ray node: PufferLib's vector.make over the daemon of this node."""
        from pufferlib import vector
        endpoint = daemons.local_endpoint()
        vecenv = vector.make(envd.puffer.creator("cartpole", num_envs=PER_INSTANCE),
                             backend=envd.puffer.backend(endpoint=endpoint), num_envs=INSTANCES)
        try:
            vecenv.async_reset(seed)
            out = vecenv.recv()
            obs, rewards, terminals = [out[0].copy()], [], []
            for a in actions:
                vecenv.send(a)
                out = vecenv.recv()
                obs.append(out[0].copy())
                rewards.append(out[1].copy())
                terminals.append(out[2].copy())
        finally:
            vecenv.close()
        return (ray.get_runtime_context().get_node_id(), endpoint,
                np.stack(obs), np.stack(rewards), np.stack(terminals))

    actions = np.random.default_rng(3).integers(0, 2, size=(STEPS, ROWS))
    monkeypatch.setenv("ENVD_OCEAN_CACHE", str(cache))
    with envd.make("puffer:cartpole", ROWS, seed=0) as env:
        obs = [env.reset(seed=SEED)[0].copy()]
        rewards, terminals = [], []
        for a in actions:
            o, r, term, _, _ = env.step(a)
            obs.append(o.copy())
            rewards.append(r.copy())
            terminals.append(term.copy())
    want = np.stack(obs), np.stack(rewards).astype(np.float32), np.stack(terminals)
    assert want[2].any()  # episodes ended (and restarted) within the run

    with daemons.connect(timeout=60) as client:
        before = [s["env_steps"] for s in client.status()]
        task = ray.remote(num_cpus=0)(_step_with_pufferlib)
        results = ray.get([task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            d.node_id, soft=False)).remote(daemons, actions, SEED) for d in daemons.daemons])
        after = [s["env_steps"] for s in client.status()]
    for d, (node_id, endpoint, *got) in zip(daemons.daemons, results):
        assert (node_id, endpoint) == (d.node_id, d.ipc)  # its own node's daemon, over ipc
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.tobytes() == w.tobytes()
    # each daemon stepped its node's envs, none else
    assert [a - b for a, b in zip(after, before)] == [STEPS * ROWS] * NUM_NODES


def test_a_failed_build_names_each_node_and_env(ocean_daemons):
    _, cache = ocean_daemons
    with pytest.raises(envd.DaemonError) as failed:
        build_ocean_on_nodes(["cartpole", "nosuchenv"],
                             source=os.environ.get("ENVD_OCEAN_SOURCE"), cache=str(cache))
    message = str(failed.value)
    for node in ray.nodes():
        assert f"Ray node {node['NodeID'][:12]} (127.0.0.1): nosuchenv:" in message
    assert "cartpole:" not in message  # built (already, in the shared cache)
    with pytest.raises(envd.InvalidArgumentError, match="list of Ocean env names"):
        build_ocean_on_nodes("cartpole")
