"""The built-in simple_spread_v3 through envd (a vec of multi-agent envs, agents
as rows) against mpe2's parallel API, one reference env per envd env.

envd.make(id, n, seed=s) is n envs of 3 agents: 3n rows, agent-major within an
env (row 3i + a is agent a of env i), env i seeded s + i.  The reference is n
``mpe2.simple_spread_v3.parallel_env``s, env i reset with seed s + i.  With
next_step autoreset (envd's default, gymnasium's), the step after an env's
episode ends resets that env (reset() without a seed: the env's stream goes
on), ignores its actions and returns reward 0 and no flags.  Observations are
bit-equal (float32), rewards equal as float32, terminations and truncations
equal, whatever the thread count (0, 1, 2).  The reference lives in
tests/support/spread_reference.py (the daemon's equivalence test,
tests/integration/test_daemon_multi_agent.py, uses it too).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import envd

mpe2_spread = pytest.importorskip("mpe2.simple_spread_v3", reason="mpe2 is the reference")

from support.spread_reference import IDS, N_AGENTS, Reference, random_rows, run_equivalence  # noqa: E402


@pytest.mark.parametrize("num_threads", [0, 1, 2])
@pytest.mark.parametrize("num_envs", [1, 7, 64])
@pytest.mark.parametrize("env_id", sorted(IDS))
def test_vec_matches_mpe2(env_id, num_envs, num_threads):
    continuous, seed, max_cycles = IDS[env_id], 11 + num_envs, 25
    ref = Reference(num_envs, continuous, 0.5, max_cycles)
    with envd.make(env_id, num_envs, seed=seed, num_threads=num_threads) as env:
        assert env.num_envs == num_envs * N_AGENTS
        assert env.single_observation_space.shape == (6 * N_AGENTS,)
        ended = run_equivalence(env, ref, seed, continuous, steps=2 * max_cycles + 5)
    ref.close()
    assert ended == 2 * num_envs  # two episodes of every env, across an autoreset


@pytest.mark.parametrize("env_id", sorted(IDS))
def test_kwargs_match_mpe2(env_id):
    """local_ratio and max_cycles reach the env; local_ratio per env (a list)
    steps like separately made envs."""
    continuous, num_envs, max_cycles = IDS[env_id], 4, 7
    ratios = [0.0, 0.3, 0.9, 1.0]
    ref = Reference(num_envs, continuous, ratios, max_cycles)
    with envd.make(env_id, num_envs, seed=5, local_ratio=ratios, max_cycles=max_cycles) as env:
        ended = run_equivalence(env, ref, 5, continuous, steps=3 * (max_cycles + 1))
    ref.close()
    assert ended == 3 * num_envs


@pytest.mark.parametrize("env_id", sorted(IDS))
def test_episode_statistics_and_same_step_match_mpe2(env_id):
    """same_step autoreset: the step that ends an episode returns the reset
    observation and each row's final observation (mpe2's last one) in
    info["final_obs"]; every row's episode statistics are its agent's return
    (the sum of the env's float64 rewards, before they are rounded to float32)
    and length max_cycles."""
    continuous, num_envs, seed, max_cycles = IDS[env_id], 5, 21, 6
    ref = Reference(num_envs, continuous, 0.5, max_cycles)
    with envd.make(env_id, num_envs, seed=seed, max_cycles=max_cycles,
                   autoreset_mode="same_step") as env:
        obs, _ = env.reset(seed=seed)
        assert obs.tobytes() == ref.reset(seed).tobytes()
        rng = np.random.default_rng(seed)
        returns = np.zeros(env.num_envs)
        for step in range(3 * max_cycles):
            actions = random_rows(rng, env.num_envs, continuous)
            obs, rew, term, trunc, info = env.step(actions)
            r_obs, r_rew, r_term, r_trunc = ref.step(actions)
            returns += r_rew
            np.testing.assert_array_equal(rew, r_rew.astype(np.float32))
            np.testing.assert_array_equal(trunc, r_trunc)
            if step % max_cycles != max_cycles - 1:
                assert obs.tobytes() == r_obs.tobytes(), step
                assert "final_obs" not in info and "envd_episode" not in info
                continue
            assert trunc.all() and not term.any()
            assert info["_final_obs"].all()
            finals = np.stack(info["final_obs"])
            assert finals.tobytes() == r_obs.tobytes(), step
            assert obs.tobytes() == ref.step_reset().tobytes(), step  # the reset, same step
            assert info["_envd_episode"].all()
            np.testing.assert_array_equal(info["envd_episode"]["l"], max_cycles)
            np.testing.assert_array_equal(info["envd_episode"]["r"], returns)
            returns[:] = 0
    ref.close()


def test_render_draws_one_frame_per_env():
    """render() of a multi-agent vec returns one frame per env (its agents
    drawn together), each like mpe2's frame of the env seeded s + i."""
    seed, num_envs = 4, 3
    refs = [mpe2_spread.parallel_env(render_mode="rgb_array") for _ in range(num_envs)]
    with envd.make("simple_spread_v3", num_envs, seed=seed, render_mode="rgb_array") as env:
        env.reset(seed=seed)
        frames = env.render()
        assert len(frames) == num_envs and env.num_envs == num_envs * N_AGENTS
        for i, (frame, ref) in enumerate(zip(frames, refs)):
            ref.reset(seed=seed + i)
            expected = ref.render()
            assert frame.shape == expected.shape == (700, 700, 3)
            diff = np.abs(frame.astype(np.int16) - expected.astype(np.int16)).max(axis=2)
            assert np.mean(diff > 32) < 0.01, i
        assert not np.array_equal(frames[0], frames[1])
    for ref in refs:
        ref.close()


# A fresh interpreter steps both ids with threads and chunking (64 envs, 2
# threads, per-env kwargs), renders, and prints a digest of every result.
DIGEST_SCRIPT = """
import hashlib, numpy as np, envd
digest = hashlib.sha256()
rng = np.random.default_rng(0)
for env_id in ("simple_spread_v3", "simple_spread_continuous_v3"):
    with envd.make(env_id, 64, seed=1, num_threads=2, max_cycles=9, render_mode="rgb_array",
                   local_ratio=[i / 63 for i in range(64)]) as env:
        obs, _ = env.reset()
        digest.update(obs.tobytes())
        for frame in env.render():
            digest.update(frame.tobytes())
        for _ in range(40):
            if env_id == "simple_spread_v3":
                actions = rng.integers(0, 5, env.num_envs)
            else:
                actions = rng.random((env.num_envs, 5), dtype=np.float32) * 1.4 - 0.2
            for array in env.step(actions)[:4]:
                digest.update(np.ascontiguousarray(array).tobytes())
print("digest", digest.hexdigest())
"""


@pytest.mark.parametrize("kind", ["asan", "tsan"])
def test_steps_under_sanitizers(kind):
    """simple_spread.c on the ASan+UBSan and TSan builds of the extension, with
    the pool's threads: no report, and the same results as the plain build."""
    import subprocess
    import sys

    from support.sanitized_build import reports_in, sanitized_env

    def run(env):
        proc = subprocess.run([sys.executable, "-c", DIGEST_SCRIPT], env={**os.environ, **env},
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-8000:]
        return proc.stdout.split()[-1], proc.stderr

    plain, _ = run({})
    sanitized, stderr = run(sanitized_env(kind))
    assert not reports_in(stderr), stderr[-8000:]
    assert sanitized == plain
