"""envd.integrations.rllib: a short PPO run (RLlib's new API stack) whose env
runners step CartPole-v1 through the daemon on their own Ray node."""
from __future__ import annotations

import math

import pytest
from support.ray_cluster import local_cluster, ray  # first: it sets Ray's environment

from envd.integrations.ray import start_daemons

pytest.importorskip("ray.rllib", reason="the RLlib test needs the rllib extra")
from ray.rllib.algorithms.ppo import PPOConfig

from envd.integrations.rllib import use_envd

NUM_NODES = 2
NUM_ENVS = 4


@pytest.fixture(scope="module")
def daemons():
    with local_cluster(NUM_NODES):
        with start_daemons(NUM_NODES, threads=1, bundle={"CPU": 0.25}) as placed:
            yield placed


def test_ppo_steps_through_the_daemon_of_each_runners_node(daemons):
    config = use_envd(PPOConfig(), "CartPole-v1", daemons=daemons)
    # Half a CPU per runner beside a daemon's quarter on each one-CPU node:
    # Ray puts one runner on each node.
    config = (config.env_runners(num_env_runners=NUM_NODES, num_envs_per_env_runner=NUM_ENVS,
                                 num_cpus_per_env_runner=0.5, rollout_fragment_length=32)
              .training(train_batch_size_per_learner=256, minibatch_size=64, num_epochs=1)
              .debugging(seed=0))
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        loss = result["learners"]["default_policy"]["total_loss"]
        assert math.isfinite(float(loss))
        sampled = result["env_runners"]["num_env_steps_sampled_lifetime"]
        assert sampled >= 2 * 256
        runner_nodes = set(algo.env_runner_group.foreach_env_runner(
            lambda runner: ray.get_runtime_context().get_node_id(), local_env_runner=False))
        assert runner_nodes == {d.node_id for d in daemons.daemons}
        with daemons.connect(timeout=60) as client:
            steps = [status["env_steps"] for status in client.status()]
        # every daemon stepped its node's runner's envs, all of them in sum
        assert all(s > 0 for s in steps), steps
        assert sum(steps) >= sampled
    finally:
        algo.stop()
