"""Results do not depend on the thread count or the chunking: the same seed
and actions give bit-identical trajectories for num_threads in {0, 1, 2, 4}
and forced chunk sizes {1, 3, all}, and adaptive dispatch as well."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

import envd
from conftest import BUILTIN_ENV_IDS, random_actions

NUM_ENVS = 64
STEPS = 400


def trajectory_digest(env_id, num_threads, chunk, autoreset_mode="next_step"):
    digest = hashlib.sha256()
    with envd.make(env_id, NUM_ENVS, seed=99, num_threads=num_threads,
                   autoreset_mode=autoreset_mode) as env:
        if chunk is not None:
            env.set_chunk_size(chunk)
        digest.update(env.reset()[0].tobytes())
        rng = np.random.default_rng(1)
        for _ in range(STEPS):
            obs, rew, term, trunc, info = env.step(random_actions(env.single_action_space,
                                                                  NUM_ENVS, rng))
            for array in (obs, rew, term, trunc):
                digest.update(array.tobytes())
            if "envd_episode" in info:
                digest.update(info["envd_episode"]["r"].tobytes())
                digest.update(info["envd_episode"]["l"].tobytes())
        stats = env.dispatch_stats()
        if chunk is not None and num_threads > 0:
            assert stats["pooled_jobs"] >= STEPS and stats["last_chunk"] == chunk
    return digest.hexdigest()


@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS)
def test_bit_identical_for_any_threads_and_chunks(env_id):
    reference = trajectory_digest(env_id, 0, None)
    for threads in (1, 2, 4):
        for chunk in (1, 3, NUM_ENVS, None):
            assert trajectory_digest(env_id, threads, chunk) == reference, (threads, chunk)


def test_same_step_mode_bit_identical_across_threads():
    reference = trajectory_digest("CartPole-v1", 0, None, "same_step")
    for threads, chunk in ((1, 1), (2, 3), (4, NUM_ENVS)):
        assert trajectory_digest("CartPole-v1", threads, chunk, "same_step") == reference


def test_adaptive_dispatch_runs_cheap_batches_inline():
    with envd.make("CartPole-v1", 8, seed=0, num_threads=2) as env:
        env.reset()
        for _ in range(50):
            env.step(np.zeros(8, np.int64))
        stats = env.dispatch_stats()
        assert stats["cost_ns_per_env"] > 0
        assert stats["inline_jobs"] >= 50 and stats["pooled_jobs"] == 0


def test_async_batch_between_5_and_40_us_goes_to_the_pool():
    """A send costing more than a wake-up call (about 5 us) is stepped on the
    pool, not inline on the trainer's thread (which then overlaps nothing);
    a whole-vec step of the same cost still runs inline.  The batch size is
    chosen from the vec's own measured cost, so that a batch is about 12 us
    of work: inline below 40 us before (native/src/vec.c,
    INLINE_BATCH_BELOW_NS)."""
    with envd.make("Acrobot-v1", 64, seed=0, num_threads=1) as env:
        env.reset()
        for _ in range(20):
            env.step(np.zeros(64, np.int64))
        cost = env.dispatch_stats()["cost_ns_per_env"]
    batch = min(512, max(1, round(12_000 / cost)))
    with envd.make("Acrobot-v1", 2 * batch, seed=0, num_threads=1, batch_size=batch) as env:
        env.async_reset()
        actions = np.zeros(batch, np.int64)
        for _ in range(30):
            env.send(actions, env.recv()[4]["env_id"])
        env.recv()
        env.recv()
        stats = env.dispatch_stats()
    if stats["cost_ns_per_env"] * batch >= 5000:  # (the pool's rule, on its own estimate)
        assert stats["inline_jobs"] == 0 and stats["pooled_jobs"] == 30
    else:  # the estimate fell by half: too cheap for any wake-up, inline is right
        assert stats["inline_jobs"] > 0
