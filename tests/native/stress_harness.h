/*
 * stress_harness.h -- a CartPole-like session over private buffers, reset
 * with fixed seeds, and a gate that holds an env's step until released
 * (session_stress.c, engine_stress.c).
 */
#ifndef ENVD_STRESS_HARNESS_H
#define ENVD_STRESS_HARNESS_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "builtin_envs.h"
#include "envd.h"
#include "session.h"
#include "stress_util.h"

enum { TIME_LIMIT = 50 };

/* ---- a session with its buffers ------------------------------------------------------ */
typedef struct harness {
    int64_t n;
    float *obs;
    int64_t *actions;
    float *rewards;
    bool *terms, *truncs, *dones;
    double *returns, *times;
    int64_t *lengths;
    envd_vec_buffers_t bufs;
    envd_vec_config_t cfg;
    double params[8];
    envd_session_t *s;
} harness_t;

/* The thread cap harness_init applies to sessions on a pool (ENVD_VEC_NO_CAP: none). */
static int g_max_threads = ENVD_VEC_NO_CAP;

static void harness_init(harness_t *h, const envd_env_def_t *def, int64_t n, envd_pool_t *pool,
                         int64_t chunk)
{
    memset(h, 0, sizeof *h);
    h->n = n;
    h->obs = xcalloc((size_t)n * 4, sizeof *h->obs);
    h->actions = xcalloc((size_t)n, sizeof *h->actions);
    h->rewards = xcalloc((size_t)n, sizeof *h->rewards);
    h->terms = xcalloc((size_t)n, sizeof *h->terms);
    h->truncs = xcalloc((size_t)n, sizeof *h->truncs);
    h->dones = xcalloc((size_t)n, sizeof *h->dones);
    h->returns = xcalloc((size_t)n, sizeof *h->returns);
    h->times = xcalloc((size_t)n, sizeof *h->times);
    h->lengths = xcalloc((size_t)n, sizeof *h->lengths);
    for (int i = 0; i < def->num_params; i++)
        h->params[i] = def->params[i].default_value;
    h->bufs = (envd_vec_buffers_t){
        .observations = h->obs, .actions = h->actions, .rewards = h->rewards,
        .terminations = h->terms, .truncations = h->truncs, .episode_returns = h->returns,
        .episode_lengths = h->lengths, .episode_times = h->times, .dones = h->dones};
    h->cfg = (envd_vec_config_t){.num_envs = n, .autoreset_mode = ENVD_AUTORESET_NEXT_STEP,
                                 .max_episode_steps = TIME_LIMIT, .params = h->params};
    envd_backend_t *backend = NULL;
    int rc = envd_backend_pool_create(&backend, def, &h->cfg, &h->bufs, pool);
    CHECK(rc == ENVD_OK, "backend: %s", envd_strerror(rc));
    rc = envd_session_create(&h->s, backend);
    CHECK(rc == ENVD_OK, "session: %s", envd_strerror(rc));
    envd_session_set_chunk(h->s, chunk);
    if (pool)
        CHECK(envd_session_set_max_threads(h->s, g_max_threads) == ENVD_OK, "cap %d",
              g_max_threads);
    uint64_t *seeds = xcalloc((size_t)n, sizeof *seeds);
    for (int64_t i = 0; i < n; i++)
        seeds[i] = 1000 + (uint64_t)i;
    CHECK(envd_session_reset(h->s, seeds, NULL) == ENVD_OK, "reset");
    free(seeds);
}

static void harness_free(harness_t *h)
{
    envd_session_destroy(h->s);
    free(h->obs);
    free(h->actions);
    free(h->rewards);
    free(h->terms);
    free(h->truncs);
    free(h->dones);
    free(h->returns);
    free(h->times);
    free(h->lengths);
}

/* ---- a gated env: its step blocks while the gate is armed ---------------------------- */
static _Atomic int g_gate_armed, g_gate_started, g_gate_release;

/* In an env's step: while the gate is armed, say so and wait for the release. */
static inline void gate_hold(void)
{
    if (atomic_load(&g_gate_armed)) {
        atomic_store(&g_gate_started, 1);
        while (!atomic_load(&g_gate_release))
            sched_yield();
    }
}

/* CartPole's step behind the gate. */
static inline int gated_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                             double *reward, bool *terminated, bool *truncated)
{
    gate_hold();
    return envd_builtin_cartpole.step(state, rng, action, obs, reward, terminated, truncated);
}

/* Close the gate (armed 1) or open it (armed 0), nothing started or released. */
static inline void gate(int armed)
{
    atomic_store(&g_gate_started, 0);
    atomic_store(&g_gate_release, 0);
    atomic_store(&g_gate_armed, armed);
}

static inline void gate_wait_started(void)
{
    const double deadline = now_s() + 60.0;
    while (!atomic_load(&g_gate_started)) {
        CHECK(now_s() < deadline, "the gated batch never started");
        sched_yield();
    }
}

/* A thread's body: release the gate a little later (while the test waits). */
static inline void *gate_release_later(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 30 * 1000000};
    nanosleep(&ts, NULL);
    atomic_store(&g_gate_release, 1);
    return NULL;
}

#endif /* ENVD_STRESS_HARNESS_H */
