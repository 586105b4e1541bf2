/*
 * backend_pool.c -- the pool-vec backend: C envs in a vec (vec.c) stepped by
 * a thread pool (pool.c).  Each op is the vec's own call; the vec's batch is
 * the backend's batch.  Ownership: an owned vec is destroyed with the
 * backend, a wrapped one is left to its creator.
 */
#include "backend.h"

#include <stdlib.h>

#include "envd.h"

typedef struct pool_backend {
    envd_backend_t base;
    envd_vec_t *vec;
    bool owns_vec;
} pool_backend_t;

static void seed(void *impl, const uint64_t *seeds) { envd_vec_seed(impl, seeds); }

static int reset(void *impl, const uint64_t *seeds, const bool *mask)
{
    return envd_vec_reset(impl, seeds, mask);
}

static int64_t reset_count(const void *impl) { return envd_vec_reset_count(impl); }
static int step(void *impl) { return envd_vec_step(impl); }
static int step_submit(void *impl) { return envd_vec_step_submit(impl); }
static int step_done(const void *impl) { return envd_vec_step_done(impl); }
static int step_finish(void *impl) { return envd_vec_step_finish(impl); }

static int batch_create(void *impl, envd_backend_batch_t **out, int64_t capacity)
{
    (void)impl;
    return envd_vec_batch_create((envd_vec_batch_t **)out, capacity);
}

static void batch_destroy(void *impl, envd_backend_batch_t *batch)
{
    (void)impl;
    envd_vec_batch_destroy((envd_vec_batch_t *)batch);
}

static int batch_submit(void *impl, envd_backend_batch_t *batch, const int64_t *ids,
                        int64_t count, int flags)
{
    return envd_vec_batch_submit(impl, (envd_vec_batch_t *)batch, ids, count, flags);
}

static int batch_done(const envd_backend_batch_t *batch)
{
    return envd_vec_batch_done((const envd_vec_batch_t *)batch);
}

static void batch_wait(void *impl, envd_backend_batch_t *batch)
{
    envd_vec_batch_wait(impl, (envd_vec_batch_t *)batch);
}

static int batch_unstarted(const envd_backend_batch_t *batch)
{
    return envd_vec_batch_unstarted((const envd_vec_batch_t *)batch);
}

static int batch_help_ref(envd_backend_batch_t *batch)
{
    return envd_vec_batch_help_ref((envd_vec_batch_t *)batch);
}

static void batch_help(void *impl, envd_backend_batch_t *batch, int (*leave)(void *), void *arg)
{
    envd_vec_batch_help(impl, (envd_vec_batch_t *)batch, leave, arg);
}

static int batch_finish(void *impl, envd_backend_batch_t *batch)
{
    return envd_vec_batch_finish(impl, (envd_vec_batch_t *)batch);
}

static uint64_t frame_bytes(const void *impl) { return envd_vec_frame_bytes(impl); }

static int render(void *impl, int64_t index, uint8_t *rgb)
{
    return envd_vec_render(impl, index, rgb);
}

static int64_t error_index(const void *impl) { return envd_vec_error_index(impl); }
static int env_started(const void *impl, int64_t index)
{
    return envd_vec_env_started(impl, index);
}
static const void *checked_actions(const void *impl) { return envd_vec_checked_actions(impl); }
static void set_chunk(void *impl, int64_t chunk) { envd_vec_set_chunk(impl, chunk); }
static double step_estimate_ns(const void *impl) { return envd_vec_step_estimate_ns(impl); }
static int set_max_threads(void *impl, int max_threads)
{
    return envd_vec_set_max_threads(impl, max_threads);
}

static void stats(const void *impl, envd_vec_stats_t *out) { envd_vec_get_stats(impl, out); }
static void notify(void *impl) { envd_vec_notify(impl); }

static void destroy(envd_backend_t *backend)
{
    pool_backend_t *b = (pool_backend_t *)backend; /* (base is its first member) */
    if (b->owns_vec)
        envd_vec_destroy(b->vec);
    free(b);
}

static const envd_backend_ops_t POOL_OPS = {
    .seed = seed, .reset = reset, .reset_count = reset_count, .step = step,
    .step_submit = step_submit, .step_done = step_done, .step_finish = step_finish,
    .batch_create = batch_create, .batch_destroy = batch_destroy,
    .batch_submit = batch_submit, .batch_done = batch_done, .notify = notify,
    .batch_wait = batch_wait, .batch_unstarted = batch_unstarted, .batch_help_ref = batch_help_ref,
    .batch_help = batch_help, .batch_finish = batch_finish,
    .frame_bytes = frame_bytes, .render = render,
    .error_index = error_index, .env_started = env_started, .checked_actions = checked_actions, .set_chunk = set_chunk,
    .step_estimate_ns = step_estimate_ns, .set_max_threads = set_max_threads, .stats = stats,
    .destroy = destroy,
};

uint64_t envd_backend_batch_bytes(int64_t capacity)
{
    return envd_vec_batch_memory_bytes(capacity);
}

static int wrap(envd_backend_t **out, envd_vec_t *vec, int64_t num_envs, bool owns_vec)
{
    pool_backend_t *b = calloc(1, sizeof *b);
    if (b == NULL)
        return ENVD_ENOMEM;
    b->base = (envd_backend_t){.ops = &POOL_OPS, .impl = vec, .num_envs = num_envs};
    b->vec = vec;
    b->owns_vec = owns_vec;
    *out = &b->base;
    return ENVD_OK;
}

int envd_backend_pool_create(envd_backend_t **out, const envd_env_def_t *def,
                             const envd_vec_config_t *config,
                             const envd_vec_buffers_t *buffers, envd_pool_t *pool)
{
    if (out == NULL || config == NULL)
        return ENVD_EINVAL;
    envd_vec_t *vec = NULL;
    int rc = envd_vec_create(&vec, def, config, buffers, pool);
    if (rc != ENVD_OK)
        return rc;
    rc = wrap(out, vec, config->num_envs, true);
    if (rc != ENVD_OK)
        envd_vec_destroy(vec);
    return rc;
}

int envd_backend_pool_wrap(envd_backend_t **out, envd_vec_t *vec, int64_t num_envs)
{
    if (out == NULL || vec == NULL || num_envs < 1 || num_envs > ENVD_VEC_MAX_ENVS)
        return ENVD_EINVAL;
    return wrap(out, vec, num_envs, false);
}

void envd_backend_destroy(envd_backend_t *backend)
{
    if (backend != NULL)
        backend->ops->destroy(backend);
}
