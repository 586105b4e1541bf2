"""envd.integrations.sb3.EnvdVecEnv against Stable-Baselines3's own conventions:
step for step the same as SB3's DummyVecEnv over gymnasium's envs (envd's
classic control is bit-identical to gymnasium's), in-process and through a
daemon, and SB3's PPO learns through it."""
from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

import envd
from envd.integrations.sb3 import EnvdVecEnv

# A short time limit, so that truncations (TimeLimit.truncated, bootstrapping)
# happen often under random actions, alongside terminations.
LIMIT = 20


def actions_for(space, num_envs: int, rng: np.random.Generator) -> np.ndarray:
    """Actions as SB3's policies pass them: int64 for Discrete, float32 for Box."""
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, space.n, size=num_envs, dtype=np.int64)
    return rng.uniform(space.low, space.high, (num_envs, *space.shape)).astype(np.float32)


def compare_with_dummy_vec_env(ours: VecEnv, env_id: str, num_envs: int,
                               steps: int) -> tuple[int, int]:
    """Step ours and a DummyVecEnv of gymnasium envs with the same seeds and
    actions; every result must match.  Returns (episodes ended, of which cut
    by the time limit)."""
    ref = DummyVecEnv([lambda: gym.make(env_id, max_episode_steps=LIMIT)
                       for _ in range(num_envs)])
    assert ours.num_envs == ref.num_envs
    assert ours.observation_space == ref.observation_space
    assert ours.action_space == ref.action_space
    assert ours.seed(123) == ref.seed(123)
    a, b = ours.reset(), ref.reset()
    assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    rng = np.random.default_rng(5)
    returns, lengths = np.zeros(num_envs), np.zeros(num_envs, int)
    ended = truncated = 0
    for t in range(steps):
        actions = actions_for(ours.action_space, num_envs, rng)
        got, want = ours.step(actions), ref.step(actions)
        for x, y in zip(got[:3], want[:3]):
            assert x.dtype == y.dtype and x.shape == y.shape, t
            assert x.tobytes() == y.tobytes(), f"step {t} differs"
        returns += got[1]
        lengths += 1
        for i, (mine, theirs) in enumerate(zip(got[3], want[3])):
            assert set(mine) - {"episode"} == set(theirs), (mine, theirs)
            assert mine["TimeLimit.truncated"] is theirs["TimeLimit.truncated"]
            truncated += theirs["TimeLimit.truncated"]
            if not got[2][i]:
                assert "episode" not in mine and "terminal_observation" not in mine
                continue
            x, y = mine["terminal_observation"], theirs["terminal_observation"]
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
            # What SB3's Monitor would have written, from envd's statistics.
            ep = mine["episode"]
            assert set(ep) == {"r", "l", "t"} and ep["t"] >= 0
            assert ep["r"] == pytest.approx(returns[i]) and ep["l"] == lengths[i]
            returns[i], lengths[i] = 0, 0
            ended += 1
    ref.close()
    return ended, truncated


def test_in_process_matches_dummy_vec_env():
    ours = EnvdVecEnv.make("CartPole-v1", 4, max_episode_steps=LIMIT)
    ended, truncated = compare_with_dummy_vec_env(ours, "CartPole-v1", 4, 300)
    assert 0 < truncated < ended  # terminations and time-limit cuts both happened
    ours.close()


def test_box_actions_match_dummy_vec_env():
    """Pendulum-v1: float32 Box actions, every episode ends by the time limit."""
    ours = EnvdVecEnv.make("Pendulum-v1", 4, max_episode_steps=LIMIT)
    ended, truncated = compare_with_dummy_vec_env(ours, "Pendulum-v1", 4, 100)
    assert ended == truncated == 4 * 100 // LIMIT
    ours.close()


def test_daemon_served_matches_dummy_vec_env(harness):
    client = harness.connect(harness.daemon("--threads", "1"))
    ours = EnvdVecEnv.make("CartPole-v1", 3, client=client, max_episode_steps=LIMIT)
    ended, truncated = compare_with_dummy_vec_env(ours, "CartPole-v1", 3, 300)
    assert 0 < truncated < ended
    ours.close()


def test_wraps_only_same_step_envs_and_answers_the_vecenv_abc():
    with pytest.raises(ValueError, match="same_step"):
        EnvdVecEnv(envd.make("CartPole-v1", 2))
    with pytest.raises(ValueError, match="same_step"):
        EnvdVecEnv.make("CartPole-v1", 2, autoreset_mode="disabled")
    with pytest.raises(ValueError, match="batch_size"):
        EnvdVecEnv(envd.make("CartPole-v1", 4, batch_size=2, autoreset_mode="same_step"))
    venv = EnvdVecEnv(envd.make("CartPole-v1", 3, seed=0, autoreset_mode="same_step"))
    assert venv.render_mode is None
    assert venv.get_attr("render_mode") == [None] * 3
    assert venv.get_attr("max_episode_steps", indices=[0, 2]) == [500, 500]
    assert venv.get_attr("action_space", indices=1) == [gym.spaces.Discrete(2)]
    assert venv.has_attr("env_id") and not venv.has_attr("gravity")
    with pytest.raises(AttributeError, match="native code"):
        venv.get_attr("gravity")
    with pytest.raises(NotImplementedError):
        venv.set_attr("gravity", 1.0)
    with pytest.raises(NotImplementedError):
        venv.env_method("render")
    with pytest.raises(NotImplementedError):
        venv.render()
    assert venv.env_is_wrapped(Monitor) == [True] * 3  # envd's statistics are Monitor's
    obs = venv.reset()
    # Returned arrays are copies: stepping does not change what SB3 kept.
    kept = obs.copy()
    venv.step(np.ones(3, dtype=np.int64))
    assert obs.tobytes() == kept.tobytes()
    with pytest.raises(TypeError, match="integers"):
        venv.step(np.ones(3, dtype=np.float32))
    venv.set_options({"x": 1})
    with pytest.raises(NotImplementedError, match="options"):
        venv.reset()
    venv.close()


def test_ppo_learns_through_a_daemon(harness):
    client = harness.connect(harness.daemon("--threads", "1"))
    venv = EnvdVecEnv.make("CartPole-v1", 8, client=client, seed=0)
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=128, n_epochs=2, seed=0,
                device="cpu", verbose=0)
    model.learn(total_timesteps=8 * 64 * 2)
    assert model.num_timesteps == 1024
    # What SB3's logger averages into rollout/ep_rew_mean: envd's episode statistics.
    episodes = list(model.ep_info_buffer)
    assert len(episodes) >= 20 and all(ep["r"] == ep["l"] > 0 for ep in episodes)
    venv.close()


def test_cnn_policy_trains_on_snake_through_the_adapter():
    """Snake-v0's 84x84 uint8 frames reach SB3 as (1, 84, 84) images (channels
    first), so CnnPolicy (NatureCNN) takes them without reshaping or a
    VecTransposeImage, and PPO runs its updates."""
    from stable_baselines3.common.preprocessing import is_image_space, is_image_space_channels_first
    venv = EnvdVecEnv.make("Snake-v0", 2, seed=0, num_threads=0)
    assert venv.observation_space == gym.spaces.Box(0, 255, (1, 84, 84), np.uint8)
    assert is_image_space(venv.observation_space)
    assert is_image_space_channels_first(venv.observation_space)
    obs = venv.reset()
    assert obs.shape == (2, 1, 84, 84) and obs.dtype == np.uint8
    model = PPO("CnnPolicy", venv, n_steps=16, batch_size=16, n_epochs=1, seed=0,
                device="cpu", verbose=0)
    assert model.get_env() is venv  # no VecTransposeImage: channels are first already
    model.learn(total_timesteps=2 * 16 * 3)
    assert model.num_timesteps == 96
    assert model._n_updates == 3
    venv.close()


def test_snake_frames_keep_their_bytes_in_either_layout():
    """The channel axis is a reshape: the frames SB3 gets are the env's own
    bytes, in both layouts; terminal observations get the axis too; and
    image_layout=None keeps the env's (84, 84)."""
    rng = np.random.default_rng(0)
    for layout, shape in (("channels_first", (1, 84, 84)), ("channels_last", (84, 84, 1)),
                          (None, (84, 84))):
        venv = EnvdVecEnv.make("Snake-v0", 3, seed=1, image_layout=layout, max_episode_steps=5)
        twin = envd.make("Snake-v0", 3, seed=1, autoreset_mode="same_step",
                         max_episode_steps=5)
        assert venv.observation_space.shape == shape
        assert venv.reset().tobytes() == twin.reset()[0].tobytes()
        ended = 0
        for _ in range(12):
            actions = rng.integers(0, 4, 3)
            obs, _, dones, infos = venv.step(actions)
            want = twin.step(actions)
            assert obs.shape == (3, *shape) and obs.tobytes() == want[0].tobytes()
            for i in np.flatnonzero(dones):
                final = infos[i]["terminal_observation"]
                assert final.shape == shape
                assert final.tobytes() == want[4]["final_obs"][i].tobytes()
                ended += 1
        assert ended >= 3  # every env ends within 5 steps
        venv.close()
        twin.close()
    with pytest.raises(ValueError, match="image_layout"):
        EnvdVecEnv.make("Snake-v0", 1, image_layout="sideways")


def test_episode_statistics_under_any_key_reach_sb3():
    """The adapter reads envd's statistics under the env's own key (the default
    "envd_episode", or e.g. gymnasium's "episode"), and passes none when off."""
    for statistics in (True, "episode", "stats"):
        venv = EnvdVecEnv.make("CartPole-v1", 2, seed=0, max_episode_steps=3,
                               episode_statistics=statistics)
        venv.reset()
        for _ in range(3):
            _, _, dones, infos = venv.step(np.ones(2, dtype=np.int64))
        assert dones.all()
        assert all(info["episode"]["l"] == 3 and info["episode"]["r"] == 3.0 for info in infos)
        assert all(set(info) == {"episode", "terminal_observation", "TimeLimit.truncated"}
                   for info in infos)
        venv.close()
    venv = EnvdVecEnv.make("CartPole-v1", 2, seed=0, max_episode_steps=3,
                           episode_statistics=False)
    venv.reset()
    for _ in range(3):
        _, _, dones, infos = venv.step(np.ones(2, dtype=np.int64))
    assert dones.all() and not any("episode" in info for info in infos)
    venv.close()


def test_importing_envd_does_not_import_sb3():
    code = ("import sys, envd, envd.integrations; "
            "assert 'stable_baselines3' not in sys.modules and 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")
