/*
 * vec.c -- N env instances over caller buffers; see vec.h.
 *
 * Memory layout: one cache-line aligned block per env holding its slot
 * (RNG, time limit and episode counters) followed by its state, so a chunk of
 * envs touches contiguous memory and two chunks never share a cache line.
 */
#include "vec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CACHE_LINE 64

/* Dispatch policy.  Waking a sleeping worker costs 20-40 us on the machines we
 * measured (DESIGN.md section 6), so a batch cheaper than INLINE_BELOW_NS runs
 * on the calling thread.  Chunks carry at least MIN_CHUNK_NS of work (the
 * atomic claim and a cold cache line stay negligible) and there are about
 * CHUNKS_PER_THREAD chunks per participating thread, which balances load when
 * envs differ in cost or a thread is preempted. */
#define INLINE_BELOW_NS 40000.0
#define MIN_CHUNK_NS 5000.0
#define CHUNKS_PER_THREAD 4
#define COST_EWMA_WEIGHT 0.125

/* A step submitted with envd_vec_step_submit and not yet finished. */
typedef enum pending { PENDING_NONE = 0, PENDING_INLINE, PENDING_POOLED } pending_t;

typedef struct env_slot {
    envd_rng_t rng;
    double episode_return;
    int64_t episode_length;
    int64_t elapsed_steps; /* for the time limit */
    double episode_start;  /* CLOCK_MONOTONIC seconds (Python's perf_counter) */
    bool started;          /* reset at least once */
    bool needs_reset;      /* done, and not reset yet */
} env_slot_t;

struct envd_vec {
    const envd_env_def_t *def;
    envd_vec_config_t config;
    envd_vec_buffers_t buf;
    envd_pool_t *pool;
    size_t obs_bytes, action_bytes, stride;
    unsigned char *blocks; /* num_envs blocks of `stride` bytes */
    bool all_started;      /* every env has been reset at least once */

    /* The job in flight: written by the caller before dispatch, read by the
     * threads running chunks; the pool's done handshake orders both. */
    envd_job_t job;
    const uint64_t *reset_seeds;
    const bool *reset_mask;
    pending_t pending;  /* a submitted step not finished yet */
    int inline_result;  /* PENDING_INLINE: what finish returns */

    /* Results accumulated by chunks (any thread). */
    _Atomic int first_error;
    _Atomic int64_t error_index;
    _Atomic int64_t num_done;
    _Atomic int64_t chunk_ns, chunk_items;

    /* Dispatch state, caller thread only. */
    int64_t forced_chunk;
    envd_vec_stats_t stats;
};

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* The clock read once per chunk, and only if the chunk needs it. */
typedef struct lazy_clock {
    double seconds; /* 0 until read */
} lazy_clock_t;

static double clock_seconds(lazy_clock_t *clock)
{
    if (clock->seconds == 0.0)
        clock->seconds = now_ns() * 1e-9;
    return clock->seconds;
}

static env_slot_t *slot_of(const envd_vec_t *vec, int64_t i)
{
    return (env_slot_t *)(vec->blocks + (size_t)i * vec->stride);
}

static void *state_of(const envd_vec_t *vec, int64_t i)
{
    return vec->blocks + (size_t)i * vec->stride + sizeof(env_slot_t);
}

static void record_error(envd_vec_t *vec, int rc, int64_t i)
{
    int expected = ENVD_OK;
    if (atomic_compare_exchange_strong(&vec->first_error, &expected, rc))
        atomic_store(&vec->error_index, i);
}

/* ---- per-env work ---------------------------------------------------------- */
static int reset_env(envd_vec_t *vec, int64_t i, void *obs, lazy_clock_t *clock)
{
    env_slot_t *slot = slot_of(vec, i);
    slot->elapsed_steps = 0;
    slot->episode_return = 0.0;
    slot->episode_length = 0;
    slot->episode_start = clock_seconds(clock);
    slot->started = true;
    slot->needs_reset = false;
    return vec->def->reset(state_of(vec, i), &slot->rng, obs);
}

static void reset_range(void *ctx, int64_t begin, int64_t end)
{
    envd_vec_t *vec = ctx;
    unsigned char *obs = vec->buf.observations;
    lazy_clock_t clock = {0};
    for (int64_t i = begin; i < end; i++) {
        if (vec->reset_mask && !vec->reset_mask[i])
            continue;
        if (vec->reset_seeds)
            envd_rng_seed(&slot_of(vec, i)->rng, vec->reset_seeds[i]);
        int rc = reset_env(vec, i, obs + (size_t)i * vec->obs_bytes, &clock);
        vec->buf.terminations[i] = false;
        vec->buf.truncations[i] = false;
        if (vec->buf.dones)
            vec->buf.dones[i] = false;
        if (rc != ENVD_OK)
            record_error(vec, ENVD_EENV, i);
    }
}

/* Episode statistics of env i for this step: its return, length and time
 * if its episode ended, zeros otherwise (gymnasium's np.where(dones, ...)). */
static void write_episode_stats(envd_vec_t *vec, int64_t i, bool done, lazy_clock_t *clock)
{
    const envd_vec_buffers_t *b = &vec->buf;
    const env_slot_t *slot = slot_of(vec, i);
    b->episode_returns[i] = done ? slot->episode_return : 0.0;
    b->episode_lengths[i] = done ? slot->episode_length : 0;
    if (b->episode_times)
        b->episode_times[i] =
            done ? rint((clock_seconds(clock) - slot->episode_start) * 1e6) / 1e6 : 0.0;
    if (b->dones)
        b->dones[i] = done;
}

/* One env step with time limit, episode statistics and autoreset.  Returns
 * whether the episode ended.  Forced inline into the chunk loop: gcc keeps it
 * out of line, and the call costs ~20 instructions per env (7% of a
 * CartPole step, counted with callgrind). */
static inline __attribute__((always_inline)) bool step_env(envd_vec_t *vec, int64_t i,
                                                           lazy_clock_t *clock)
{
    env_slot_t *slot = slot_of(vec, i);
    const envd_vec_buffers_t *b = &vec->buf;
    void *obs = (unsigned char *)b->observations + (size_t)i * vec->obs_bytes;
    double reward = 0.0;
    bool term = false, trunc = false, done = false;
    int rc;

    if (slot->needs_reset) {
        /* NEXT_STEP autoreset (validation rejects this in DISABLED mode): the
         * action is ignored and the step reports reward 0, not done. */
        rc = reset_env(vec, i, obs, clock);
    } else {
        const void *action = (const unsigned char *)b->actions + (size_t)i * vec->action_bytes;
        rc = vec->def->step(state_of(vec, i), &slot->rng, action, obs, &reward, &term, &trunc);
        slot->elapsed_steps++;
        if (vec->config.max_episode_steps > 0 &&
            slot->elapsed_steps >= vec->config.max_episode_steps)
            trunc = true;
        slot->episode_return += reward;
        slot->episode_length++;
        done = term || trunc;
    }
    b->rewards[i] = (float)reward;
    b->terminations[i] = term;
    b->truncations[i] = trunc;
    write_episode_stats(vec, i, done, clock);
    if (done) {
        slot->needs_reset = true;
        if (vec->config.autoreset_mode == ENVD_AUTORESET_SAME_STEP && rc == ENVD_OK) {
            memcpy((unsigned char *)b->final_observations + (size_t)i * vec->obs_bytes, obs,
                   vec->obs_bytes);
            rc = reset_env(vec, i, obs, clock);
        }
    }
    if (rc != ENVD_OK)
        record_error(vec, ENVD_EENV, i);
    return done;
}

static void step_range(void *ctx, int64_t begin, int64_t end)
{
    envd_vec_t *vec = ctx;
    int64_t done = 0;
    lazy_clock_t clock = {0};
    for (int64_t i = begin; i < end; i++)
        done += step_env(vec, i, &clock);
    if (done)
        atomic_fetch_add(&vec->num_done, done);
}

/* A pooled chunk also measures itself, feeding the cost estimate. */
static void timed_step_range(void *ctx, int64_t begin, int64_t end)
{
    envd_vec_t *vec = ctx;
    double t0 = now_ns();
    step_range(ctx, begin, end);
    atomic_fetch_add_explicit(&vec->chunk_ns, (int64_t)(now_ns() - t0), memory_order_relaxed);
    atomic_fetch_add_explicit(&vec->chunk_items, end - begin, memory_order_relaxed);
}

/* ---- dispatch ---------------------------------------------------------------- */

/* One sample moves the estimate at most by this factor, so a step that was
 * preempted (or ran on a cold cache) cannot flip the dispatch on its own. */
#define COST_SAMPLE_CLAMP 4.0

static void update_cost(envd_vec_t *vec, double ns, int64_t items)
{
    if (items <= 0)
        return;
    double sample = ns / (double)items;
    double *cost = &vec->stats.cost_ns_per_env;
    if (*cost == 0.0) {
        *cost = sample;
        return;
    }
    if (sample > *cost * COST_SAMPLE_CLAMP)
        sample = *cost * COST_SAMPLE_CLAMP;
    if (sample < *cost / COST_SAMPLE_CLAMP)
        sample = *cost / COST_SAMPLE_CLAMP;
    *cost += COST_EWMA_WEIGHT * (sample - *cost);
}

/* Chunk size for a pooled call, or 0 to run inline. */
static int64_t choose_chunk(const envd_vec_t *vec)
{
    int threads = vec->pool ? envd_pool_num_threads(vec->pool) : 0;
    int64_t n = vec->config.num_envs;
    if (threads == 0)
        return 0;
    if (vec->forced_chunk > 0)
        return vec->forced_chunk;
    double cost = vec->stats.cost_ns_per_env;
    if (cost == 0.0 || cost * (double)n < INLINE_BELOW_NS)
        return 0; /* unmeasured yet, or too cheap to pay for a wake-up */
    int64_t by_cost = (int64_t)(MIN_CHUNK_NS / cost) + 1;
    int64_t by_balance = (n + CHUNKS_PER_THREAD * (threads + 1) - 1) /
                         (CHUNKS_PER_THREAD * (threads + 1));
    int64_t chunk = by_cost > by_balance ? by_cost : by_balance;
    return chunk < n ? chunk : n;
}

static void clear_results(envd_vec_t *vec)
{
    atomic_store(&vec->first_error, ENVD_OK);
    atomic_store(&vec->error_index, -1);
    atomic_store(&vec->num_done, 0);
    atomic_store(&vec->chunk_ns, 0);
    atomic_store(&vec->chunk_items, 0);
}

/* What a step returns: the first error, else the number of envs done (an
 * int: num_envs <= ENVD_VEC_MAX_ENVS). */
static int step_result(envd_vec_t *vec)
{
    int rc = atomic_load(&vec->first_error);
    return rc != ENVD_OK ? rc : (int)atomic_load(&vec->num_done);
}

/* ---- validation ---------------------------------------------------------------- */
static int env_startable(const envd_vec_t *vec, int64_t i)
{
    const env_slot_t *slot = slot_of(vec, i);
    if (!slot->started)
        return ENVD_ESTATE;
    if (vec->config.autoreset_mode == ENVD_AUTORESET_DISABLED && slot->needs_reset)
        return ENVD_ESTATE;
    const envd_space_t *as = &vec->def->action_space;
    if (as->kind == ENVD_SPACE_DISCRETE) {
        int64_t a = ((const int64_t *)vec->buf.actions)[i];
        /* unsigned difference: no overflow for any start (validated: start + n fits) */
        if (a < as->start || (uint64_t)a - (uint64_t)as->start >= (uint64_t)as->n)
            return ENVD_ERANGE;
    }
    return ENVD_OK;
}

/* The whole batch is checked before any env moves, so a refused step leaves
 * every env as it was.  Only discrete actions, DISABLED mode and envs never
 * reset need a look at each env. */
static int validate_step(envd_vec_t *vec)
{
    bool per_env = !vec->all_started ||
                   vec->config.autoreset_mode == ENVD_AUTORESET_DISABLED ||
                   vec->def->action_space.kind == ENVD_SPACE_DISCRETE;
    for (int64_t i = 0; per_env && i < vec->config.num_envs; i++) {
        int rc = env_startable(vec, i);
        if (rc != ENVD_OK) {
            atomic_store(&vec->error_index, i);
            return rc;
        }
    }
    return ENVD_OK;
}

/* ---- steps ------------------------------------------------------------------------- */

/* The front half of every step: refuse while a submitted step is pending (its
 * chunks may still run, and its results are not collected), validate, choose
 * the dispatch.  Returns ENVD_OK and the chunk (0: inline) or a code. */
static int step_begin(envd_vec_t *vec, int64_t *chunk)
{
    if (vec->pending != PENDING_NONE)
        return ENVD_EBUSY;
    clear_results(vec);
    int rc = validate_step(vec);
    if (rc != ENVD_OK)
        return rc;
    *chunk = choose_chunk(vec);
    if (*chunk > 0) {
        vec->stats.pooled_jobs++;
        vec->stats.last_chunk = *chunk;
    } else {
        vec->stats.inline_jobs++;
    }
    return ENVD_OK;
}

/* A whole step on the calling thread, timed for the cost estimate. */
static void step_inline(envd_vec_t *vec)
{
    double t0 = now_ns();
    step_range(vec, 0, vec->config.num_envs);
    update_cost(vec, now_ns() - t0, vec->config.num_envs);
}

/* After a pooled step completed: feed the chunks' timing to the estimate. */
static int finish_pooled(envd_vec_t *vec)
{
    update_cost(vec, (double)atomic_load(&vec->chunk_ns), atomic_load(&vec->chunk_items));
    return step_result(vec);
}

/* Start a step: inline now, or on the pool with the given job flags.  On
 * success the step is pending until envd_vec_step_finish. */
static int step_start(envd_vec_t *vec, int job_flags)
{
    int64_t chunk = 0;
    int rc = step_begin(vec, &chunk);
    if (rc != ENVD_OK)
        return rc;
    if (chunk == 0) {
        step_inline(vec);
        vec->inline_result = step_result(vec);
        vec->pending = PENDING_INLINE;
        return ENVD_OK;
    }
    rc = envd_pool_submit(vec->pool, &vec->job, timed_step_range, vec,
                          vec->config.num_envs, chunk, job_flags);
    if (rc == ENVD_OK)
        vec->pending = PENDING_POOLED;
    return rc;
}

int envd_vec_step(envd_vec_t *vec)
{
    int rc = step_start(vec, 0);
    if (rc != ENVD_OK)
        return rc;
    if (vec->pending == PENDING_POOLED)
        envd_pool_wait(vec->pool, &vec->job); /* the calling thread runs chunks too */
    return envd_vec_step_finish(vec);
}

int envd_vec_step_submit(envd_vec_t *vec) { return step_start(vec, ENVD_JOB_NOTIFY); }

int envd_vec_step_done(const envd_vec_t *vec)
{
    return vec->pending != PENDING_POOLED || envd_job_done(&vec->job);
}

int envd_vec_step_finish(envd_vec_t *vec)
{
    switch (vec->pending) {
    case PENDING_INLINE:
        vec->pending = PENDING_NONE;
        return vec->inline_result;
    case PENDING_POOLED:
        if (!envd_job_done(&vec->job))
            return ENVD_EBUSY;
        vec->pending = PENDING_NONE;
        return finish_pooled(vec);
    default:
        return ENVD_ESTATE; /* nothing was submitted */
    }
}

/* ---- resets ------------------------------------------------------------------------ */
void envd_vec_seed(envd_vec_t *vec, const uint64_t *seeds)
{
    for (int64_t i = 0; i < vec->config.num_envs; i++)
        envd_rng_seed(&slot_of(vec, i)->rng, seeds[i]);
}

int envd_vec_reset(envd_vec_t *vec, const uint64_t *seeds, const bool *mask)
{
    if (vec->pending != PENDING_NONE)
        return ENVD_EBUSY;
    clear_results(vec);
    vec->reset_seeds = seeds;
    vec->reset_mask = mask;
    int64_t chunk = choose_chunk(vec);
    int rc = ENVD_OK;
    if (chunk == 0)
        reset_range(vec, 0, vec->config.num_envs);
    else
        rc = envd_pool_run(vec->pool, &vec->job, reset_range, vec, vec->config.num_envs, chunk);
    vec->reset_seeds = NULL;
    vec->reset_mask = NULL;
    if (rc != ENVD_OK)
        return rc;
    for (int64_t i = 0; !vec->all_started && i < vec->config.num_envs; i++)
        if (!slot_of(vec, i)->started)
            return atomic_load(&vec->first_error);
    vec->all_started = true;
    return atomic_load(&vec->first_error);
}

/* ---- queries ------------------------------------------------------------------------ */
int64_t envd_vec_error_index(const envd_vec_t *vec) { return atomic_load(&vec->error_index); }

int64_t envd_vec_num_done(const envd_vec_t *vec) { return atomic_load(&vec->num_done); }

void envd_vec_set_chunk(envd_vec_t *vec, int64_t chunk) { vec->forced_chunk = chunk > 0 ? chunk : 0; }

void envd_vec_get_stats(const envd_vec_t *vec, envd_vec_stats_t *stats) { *stats = vec->stats; }

/* ---- lifecycle ---------------------------------------------------------------------- */
static int check_args(const envd_env_def_t *def, const envd_vec_config_t *c,
                      const envd_vec_buffers_t *b)
{
    int rc = envd_env_def_validate(def);
    if (rc != ENVD_OK)
        return rc;
    if (c->num_envs < 1 || c->num_envs > ENVD_VEC_MAX_ENVS || c->max_episode_steps < 0)
        return ENVD_ERANGE;
    if (c->autoreset_mode < ENVD_AUTORESET_NEXT_STEP || c->autoreset_mode > ENVD_AUTORESET_DISABLED)
        return ENVD_EINVAL;
    if (def->num_params > 0 && c->params == NULL)
        return ENVD_EINVAL;
    if (!b->observations || !b->actions || !b->rewards || !b->terminations ||
        !b->truncations || !b->episode_returns || !b->episode_lengths)
        return ENVD_EINVAL;
    if (c->autoreset_mode == ENVD_AUTORESET_SAME_STEP && !b->final_observations)
        return ENVD_EINVAL;
    return ENVD_OK;
}

static size_t space_bytes(const envd_space_t *space)
{
    return (size_t)envd_space_numel(space) * envd_dtype_size(space->dtype);
}

int envd_vec_create(envd_vec_t **out, const envd_env_def_t *def,
                    const envd_vec_config_t *config,
                    const envd_vec_buffers_t *buffers, envd_pool_t *pool)
{
    *out = NULL;
    int rc = check_args(def, config, buffers);
    if (rc != ENVD_OK)
        return rc;
    envd_vec_t *vec = calloc(1, sizeof *vec);
    if (!vec)
        return ENVD_ENOMEM;
    vec->def = def;
    vec->config = *config;
    vec->buf = *buffers;
    vec->pool = pool;
    vec->obs_bytes = space_bytes(&def->observation_space);
    vec->action_bytes = space_bytes(&def->action_space);
    size_t block = sizeof(env_slot_t) + def->state_size;
    vec->stride = (block + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE;
    /* cannot overflow: state_size <= ENVD_MAX_STATE_SIZE (validated) and
     * num_envs <= ENVD_VEC_MAX_ENVS */
    size_t total = vec->stride * (size_t)config->num_envs;
    vec->blocks = aligned_alloc(CACHE_LINE, total);
    if (!vec->blocks) {
        free(vec);
        return ENVD_ENOMEM;
    }
    memset(vec->blocks, 0, total);
    clear_results(vec);
    for (int64_t i = 0; i < config->num_envs; i++) {
        rc = def->init(state_of(vec, i), config->params);
        if (rc != ENVD_OK) {
            /* close the envs that did initialise; env i cleaned up after itself */
            vec->config.num_envs = i;
            envd_vec_destroy(vec);
            return ENVD_EENV;
        }
    }
    *out = vec;
    return ENVD_OK;
}

void envd_vec_destroy(envd_vec_t *vec)
{
    if (!vec)
        return;
    /* A submitted step may still run on the pool: its chunks use this memory. */
    if (vec->pending == PENDING_POOLED)
        envd_pool_wait(vec->pool, &vec->job);
    if (vec->def->close)
        for (int64_t i = 0; i < vec->config.num_envs; i++)
            vec->def->close(state_of(vec, i));
    free(vec->blocks);
    free(vec);
}
