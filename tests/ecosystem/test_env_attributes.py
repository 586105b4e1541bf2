"""What a gymnasium user reads off an envd env besides its results:
spec.reward_threshold (gymnasium's own, read from its registry), the render
modes an env can give even when it does not render, the rows/agents books
(num_envs counts rows; num_agents_per_env, possible_agents), in-process and
through a daemon."""
from __future__ import annotations

import gymnasium as gym
import pytest
from support.builtin_envs import GYMNASIUM_ENV_IDS

import envd

PZ_ID = "pz:pettingzoo.classic.rps_v2:parallel_env"


@pytest.mark.parametrize("env_id", GYMNASIUM_ENV_IDS)
def test_reward_threshold_is_gymnasiums(env_id):
    """envd's ports carry gymnasium's reward_threshold (None where gymnasium
    has none: Pendulum-v1), through make_vec and make alike."""
    want = gym.spec(env_id).reward_threshold
    assert gym.spec(f"envd/{env_id}").reward_threshold == want
    with gym.make_vec(f"envd/{env_id}", num_envs=2) as env:
        assert env.spec.reward_threshold == want
    single = gym.make(f"envd/{env_id}")
    assert single.spec.reward_threshold == want
    single.close()


def test_envs_gymnasium_lacks_have_no_threshold():
    assert gym.spec("envd/Snake-v0").reward_threshold is None
    assert gym.spec("envd/simple_spread_v3").reward_threshold is None


def test_render_modes_say_what_the_env_can_render_when_not_rendering(daemon):
    with envd.make("CartPole-v1", 2) as env:
        assert env.render_mode is None and env.metadata["render_modes"] == ["rgb_array"]
        assert env.metadata["render_fps"] == gym.make("CartPole-v1").metadata["render_fps"]
    with gym.make_vec("envd/Snake-v0", num_envs=2) as env:
        assert env.metadata["render_modes"] == ["rgb_array"]
    assert gym.make("envd/Acrobot-v1").metadata["render_modes"] == ["rgb_array"]
    with daemon.connect() as client:
        env = client.make("CartPole-v1", 2)
        assert env.render_mode is None and env.metadata["render_modes"] == ["rgb_array"]
        env.close()
        env = client.make("CartPole-v1", 2, render_mode="rgb_array")
        assert env.metadata["render_modes"] == ["rgb_array"]
        env.close()
    with envd.make("py:CartPole-v1", 2, num_workers=0) as env:
        # hosted envs render rgb_array frames (drawn in the workers), at the env's rate
        assert env.render_mode is None and env.metadata["render_modes"] == ["rgb_array"]
        assert env.metadata["render_fps"] == gym.make("CartPole-v1").metadata["render_fps"]


def test_rows_and_agents_of_a_native_multi_agent_env(daemon):
    """num_envs counts rows (gymnasium's batch dimension); num_env_instances
    envs of num_agents_per_env agents each, named as mpe2 names them."""
    import mpe2.simple_spread_v3
    names = mpe2.simple_spread_v3.parallel_env().possible_agents
    with envd.make("simple_spread_v3", 4) as env:
        assert (env.num_envs, env.num_env_instances, env.num_agents_per_env) == (12, 4, 3)
        assert env.possible_agents == names
        assert env.observation_space.shape[0] == env.num_envs
    with daemon.connect() as client:
        env = client.make("simple_spread_v3", 4)
        assert (env.num_envs, env.num_agents_per_env, env.possible_agents) == (12, 3, names)
        env.close()
    with envd.make("CartPole-v1", 3) as env:
        assert (env.num_envs, env.num_agents_per_env, env.possible_agents) == (3, 1, ["agent_0"])


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_pettingzoo_envs_agents_keep_their_names(num_workers):
    from pettingzoo.classic import rps_v2
    names = rps_v2.parallel_env().possible_agents
    with envd.make(PZ_ID, 3, num_workers=num_workers) as env:
        assert names == ["player_0", "player_1"]
        assert (env.num_envs, env.num_agents_per_env, env.possible_agents) == (6, 2, names)


def test_a_pettingzoo_envs_agent_names_through_a_daemon(harness):
    from pettingzoo.classic import rps_v2
    client = harness.connect(harness.daemon("--threads", "1", "--python-env", PZ_ID))
    env = client.make(PZ_ID, 3, num_workers=1)
    assert env.possible_agents == rps_v2.parallel_env().possible_agents
    assert (env.num_envs, env.num_agents_per_env) == (6, 2)
    env.close()


def test_a_clients_make_points_num_threads_to_max_threads(daemon):
    with daemon.connect() as client:
        with pytest.raises(envd.InvalidArgumentError, match="takes no num_threads.*max_threads"):
            client.make("CartPole-v1", 2, num_threads=2)
        with pytest.raises(envd.InvalidArgumentError, match="takes no pin_cpus.*--pin-cpus"):
            client.make("CartPole-v1", 2, pin_cpus=[0])
        assert client.status()["sessions"] == 0
        client.make("CartPole-v1", 2, max_threads=1).close()
