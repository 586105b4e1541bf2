/*
 * stress_hold.h -- hold a pool's one worker in a job until released, so that
 * only the test's own threads (or a doorbell thread) step batches
 * meanwhile (doorbell_stress.c, session_stress.c).
 */
#ifndef ENVD_STRESS_HOLD_H
#define ENVD_STRESS_HOLD_H

#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "pool.h"
#include "stress_util.h"

typedef struct worker_hold {
    envd_job_t job;
    _Atomic int held, release;
} worker_hold_t;

static void worker_hold_fn(void *ctx, int64_t begin, int64_t end)
{
    worker_hold_t *w = ctx;
    (void)begin, (void)end;
    atomic_store(&w->held, 1);
    const double deadline = now_s() + 60.0;
    while (!atomic_load(&w->release)) {
        CHECK(now_s() < deadline, "the held worker was never released");
        sched_yield();
    }
}

/* Returns once the pool's worker runs the holding job (a pool of one worker:
 * the job is its only chunk). */
static inline void hold_worker(envd_pool_t *pool, worker_hold_t *w)
{
    memset(w, 0, sizeof *w);
    CHECK(envd_pool_submit(pool, &w->job, worker_hold_fn, w, 1, 1, 0) == ENVD_OK,
          "submit the holding job");
    const double deadline = now_s() + 60.0;
    while (!atomic_load(&w->held)) {
        CHECK(now_s() < deadline, "the pool's worker never took the holding job");
        sched_yield();
    }
}

static inline void release_worker(envd_pool_t *pool, worker_hold_t *w)
{
    atomic_store(&w->release, 1);
    envd_pool_wait(pool, &w->job);
}

#endif /* ENVD_STRESS_HOLD_H */
