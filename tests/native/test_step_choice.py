"""native/src/step_choice.h: whether a blocking step over the inline
threshold runs pooled or inline, driven by tests/native/step_choice_check.c
with made-up step times (no clock, no threads), plain and under
AddressSanitizer + UBSan; and through a real vec, the choice's estimates
reported by its stats."""
import os
from pathlib import Path

import numpy as np
import pytest
from cbuild import run_stress

import envd


@pytest.mark.parametrize("kind", ["plain", "asan"])
def test_the_choice_follows_the_faster_way(kind):
    """A vec whose pooled steps are measured slower than inline ones stays
    inline but for short probes (pong at N=1024 on 2 CPUs), one whose pooled
    steps are faster stays pooled, the choice follows a change of the times,
    a preempted or cold step does not flip it, and a step under the
    threshold always runs inline."""
    run_stress([Path(__file__).with_name("step_choice_check.c")], "step_choice_check", kind, 1,
               timeout=120)


def test_a_vec_reports_both_ways_once_it_has_stepped_both():
    """A costly vec (ConnectFour, 512 envs: milliseconds a step) on a pool
    steps inline first (unmeasured), then probes the pool: both estimates
    are then measured, and every step was one way or the other."""
    with envd.make("ConnectFour-v0", 512, seed=0, num_threads=1) as env:
        env.reset()
        for _ in range(40):
            env.step(np.zeros(512, np.int64))
        stats = env.dispatch_stats()
    assert stats["inline_step_ns_per_env"] > 0 and stats["pooled_step_ns_per_env"] > 0, stats
    assert stats["inline_jobs"] + stats["pooled_jobs"] == 40, stats


def test_a_pool_larger_than_the_cpus_splits_a_step_as_auto_does():
    """A blocking step or a reset runs on at most max(1, CPUs - 1) workers
    beside its caller (pool.h, ENVD_JOB_HELPED), so a pool with more threads
    splits it for those, as auto's pool does: the same chunks (num_threads=2
    on 2 CPUs is auto's split there).  A reset of a measured costly vec
    (ConnectFour, 512 envs: milliseconds) always goes to the pool."""
    cpus = len(os.sched_getaffinity(0))
    helped = max(1, cpus - 1)

    def reset_chunk(num_threads):
        with envd.make("ConnectFour-v0", 512, seed=0, num_threads=num_threads) as env:
            env.reset()
            for _ in range(3):  # measures the cost per env
                env.step(np.zeros(512, np.int64))
            env.reset()
            stats = env.dispatch_stats()
        assert stats["pooled_jobs"] >= 1, stats
        return stats["last_chunk"]

    assert reset_chunk(helped + 2) == reset_chunk(helped)
