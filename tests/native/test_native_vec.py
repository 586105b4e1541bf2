"""native/native_vec.py: the pool wrapper and the vec's structs (through the
tests' bare vec, support.native_vec), and the dispatch rule the daemon
relies on: a step submitted for an event loop never runs on the submitting
thread before its cost is known."""
from __future__ import annotations

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from support.native_vec import NativeVec

import envd
from envd.buffer_layout import buffer_layout
from envd.native.native_vec import NativePool
from envd.native.vector_env import AUTORESET_MODE_CODES


def native_cartpole(num_envs: int, pool: NativePool | None) -> tuple[NativeVec, dict]:
    spec = envd.native.get_spec("CartPole-v1")
    mode = AutoresetMode.NEXT_STEP
    buffers = {name: np.zeros(shape, dtype) for name, (shape, dtype)
               in buffer_layout(spec.observation_space, spec.action_space, num_envs, mode).items()}
    buffers["reset_seeds"][...] = np.arange(num_envs, dtype=np.uint64)
    vec = NativeVec(spec, num_envs, autoreset_mode=AUTORESET_MODE_CODES[mode],
                    max_episode_steps=500, params=[0.0], buffers=buffers, pool=pool)
    vec.seed()
    return vec, buffers


def test_a_submitted_first_step_goes_to_the_pool():
    pool = NativePool(1)
    vec, _ = native_cartpole(4, pool)
    try:
        vec.reset(False, False)
        vec.step_submit()
        while not vec.step_done():
            pass
        assert vec.step_finish() == 0
        stats = vec.stats()
        assert (stats["pooled_jobs"], stats["inline_jobs"]) == (1, 0)
        assert stats["cost_ns_per_env"] > 0
        # Measured (and cheap): later steps run inline, done as submit returns.
        for _ in range(50):
            inline_before = vec.stats()["inline_jobs"]
            vec.step_submit()
            ran_inline = vec.stats()["inline_jobs"] > inline_before
            assert not ran_inline or vec.step_done()
            while not vec.step_done():
                pass
            vec.step_finish()
        assert vec.stats()["inline_jobs"] >= 1
    finally:
        vec.destroy()
        pool.close()


def test_a_blocking_first_step_runs_inline_to_measure_itself():
    pool = NativePool(1)
    vec, _ = native_cartpole(4, pool)
    try:
        vec.reset(False, False)
        vec.step()
        assert vec.stats()["inline_jobs"] == 1
    finally:
        vec.destroy()
        pool.close()


def test_results_match_the_in_process_env():
    vec, buffers = native_cartpole(6, None)
    with envd.make("CartPole-v1", 6, seed=0, num_threads=0) as env:
        try:
            vec.reset(False, False)
            assert buffers["observations"].tobytes() == env.reset()[0].tobytes()
            rng = np.random.default_rng(0)
            for _ in range(100):
                actions = rng.integers(0, 2, 6)
                buffers["actions"][...] = actions
                num_done = vec.step()
                obs, _, term, trunc, _ = env.step(actions)
                assert buffers["observations"].tobytes() == obs.tobytes()
                assert num_done == int((term | trunc).sum())
        finally:
            vec.destroy()


def test_errors_name_the_env():
    vec, buffers = native_cartpole(3, None)
    try:
        with pytest.raises(envd.EnvStateError, match="env 0 was never reset"):
            vec.step()
        vec.reset(False, False)
        buffers["actions"][...] = [0, 5, 1]
        with pytest.raises(envd.InvalidActionError, match="action 5 of env 1"):
            vec.step()
    finally:
        vec.destroy()


def test_a_blocking_step_runs_inline_while_the_pool_is_saturated():
    """Other vecs' jobs keep every CPU but one busy (envd_pool_saturated): a
    blocking step then runs on its caller, though it would be split on an
    idle pool (several daemon sessions stepping at once on a small machine)."""
    import os
    pool = NativePool(2)
    cpus = len(os.sched_getaffinity(0))
    busy = [native_cartpole(1 << 17, pool)[0] for _ in range(max(1, cpus - 1))]
    vec, _ = native_cartpole(1 << 13, pool)
    try:
        for v in busy + [vec]:
            v.reset(False, False)
        vec.step()  # measures itself (inline)
        before = vec.stats()
        vec.step()  # an idle pool: split
        assert vec.stats()["pooled_jobs"] == before["pooled_jobs"] + 1
        checked = 0
        for _ in range(20):
            for v in busy:
                v.set_chunk(64)  # many small chunks: the job stays in flight a while
                v.step_submit()
            before = vec.stats()
            vec.step()
            if not any(v.step_done() for v in busy):  # saturated throughout the step
                checked += 1
                assert vec.stats()["inline_jobs"] == before["inline_jobs"] + 1
                assert vec.stats()["pooled_jobs"] == before["pooled_jobs"]
            for v in busy:
                while not v.step_done():
                    pass
                v.step_finish()
        assert checked > 0, "the busy jobs always ended before the step: make them longer"
    finally:
        for v in busy + [vec]:
            v.destroy()
        pool.close()
