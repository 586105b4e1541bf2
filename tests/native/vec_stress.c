/*
 * vec_stress.c -- tests of native/src/vec.c over the built-in envs and two
 * test-only envs; exits non-zero on any failure.  Usage: vec_stress [divisor];
 * step and loop counts are divided by divisor (sanitizer builds run slower).
 *
 * Checks:
 *   - determinism: every output buffer after every step is bit-identical to a
 *     serial run, for pools of 0, 1, 2 and 4 threads, adaptive and forced
 *     chunk sizes, and the three autoreset modes;
 *   - the split API (submit / done / finish) gives the results of
 *     envd_vec_step, also with two vecs in flight on one pool, and the pool's
 *     eventfd counts exactly the pooled submits;
 *   - the documented error paths, and that a rejected step changes nothing;
 *   - env callbacks that fail in init (the instances already initialised are
 *     closed), reset or step (ENVD_EENV naming the env);
 *   - async batches: random batches (random subsets in random order, several
 *     in flight, finished in random order, whole-vec steps in between) give
 *     each env the outputs of a serial envd_vec_step run, for every pool,
 *     chunk size and autoreset mode; the eventfd counts exactly the pooled
 *     NOTIFY runs; every documented refusal of a batch submit starts nothing
 *     (a twin vec that never saw it stays identical) and leaves its envs
 *     free; a batch blocked in flight, and failing callbacks inside batches;
 *   - create/destroy in a loop (leaks show up under LeakSanitizer);
 *   - a per-vec thread cap (envd_vec_set_max_threads): the determinism and
 *     async batch runs again on the 4-thread pool under caps of 0 (every run
 *     inline, even with a forced chunk), 1 and 2, with the same results; the
 *     setter's refusals;
 *   - ABI 5: an env that resets itself (no host reset, no truncation, its
 *     episodes from episode_end into the statistics and episode_log), its
 *     seed callback (before init, at seeded resets only), in whole steps and
 *     async batches on every pool; its refusals; SERIAL_INIT across threads;
 *     bound to its rows (ENVD_ENV_OBS_ROWS): bound once after init, only ever
 *     given its own row after; with ENVD_ENV_OBS_ROWS_PRIVATE bound only over
 *     private rows.
 */
#define _GNU_SOURCE
#include "vec.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "builtin_envs.h"
#include "envd.h"
#include "stress_util.h"
#include "pool.h"

/* A double in [0, 1) from the top 53 bits. */
static double rnd_unit(uint64_t *s)
{
    return (double)(rnd(s) >> 11) * 0x1.0p-53;
}

/* 64-bit FNV-1a over 8-byte words (tail bytes one by one), with a final
 * avalanche: cheap enough to run over every buffer after every step, even
 * under ThreadSanitizer. */
static uint64_t hash_bytes(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* The built-ins this harness drives: its buffers hold one row per env, so
 * only the single-agent ones (num_agents == 1).  The multi-agent built-ins
 * (simple_spread) are stepped with threads on the ASan+UBSan and TSan builds
 * by tests/native/test_simple_spread_vec.py, and the vec's agent rows are
 * stressed by tests/native/test_multi_agent.py. */
static int builtin_count(void)
{
    int count = 0;
    for (int e = 0; e < envd_builtin_count(); e++)
        count += envd_builtin_get(e)->num_agents == 1;
    return count;
}

/* The i-th single-agent built-in (NULL when out of range). */
static const envd_env_def_t *builtin_get(int i)
{
    for (int e = 0; e < envd_builtin_count(); e++)
        if (envd_builtin_get(e)->num_agents == 1 && i-- == 0)
            return envd_builtin_get(e);
    return NULL;
}

static size_t space_bytes(const envd_space_t *space)
{
    return (size_t)envd_space_numel(space) * envd_dtype_size(space->dtype);
}

/* ---- a vec with its buffers and an action generator ---------------------------- */
typedef struct harness {
    const envd_env_def_t *def;
    envd_vec_t *vec;
    envd_pool_t *pool;
    int64_t n;
    size_t obs_bytes, act_bytes;
    unsigned char *obs, *final_obs, *actions;
    float *rewards;
    bool *terms, *truncs, *mask;
    double *returns;
    int64_t *lengths;
    unsigned char *info[ENVD_MAX_INFO_FIELDS]; /* the env's info fields */
    size_t info_bytes;                         /* all of them, per env */
    double params[8];
    envd_vec_buffers_t bufs;
    envd_vec_config_t cfg;
    uint64_t act_state;
} harness_t;

static size_t info_field_bytes(const envd_info_field_t *f)
{
    size_t bytes = envd_dtype_size(f->dtype);
    for (int d = 0; d < f->ndim; d++)
        bytes *= (size_t)f->shape[d];
    return bytes;
}

/* Allocates zeroed buffers and fills the config (seed starts the action
 * generator); does not create the vec.
 * final_observations is only passed in SAME_STEP mode, so a vec that wrote
 * it in another mode would crash instead of passing silently. */
static void harness_init(harness_t *h, const envd_env_def_t *def, int64_t n, int mode,
                         int64_t time_limit, uint64_t seed)
{
    memset(h, 0, sizeof *h);
    h->def = def;
    h->n = n;
    h->obs_bytes = space_bytes(&def->observation_space);
    h->act_bytes = space_bytes(&def->action_space);
    h->obs = xcalloc((size_t)n, h->obs_bytes);
    h->final_obs = mode == ENVD_AUTORESET_SAME_STEP ? xcalloc((size_t)n, h->obs_bytes) : NULL;
    h->actions = xcalloc((size_t)n, h->act_bytes);
    h->rewards = xcalloc((size_t)n, sizeof *h->rewards);
    h->terms = xcalloc((size_t)n, sizeof *h->terms);
    h->truncs = xcalloc((size_t)n, sizeof *h->truncs);
    h->mask = xcalloc((size_t)n, sizeof *h->mask);
    h->returns = xcalloc((size_t)n, sizeof *h->returns);
    h->lengths = xcalloc((size_t)n, sizeof *h->lengths);
    for (int k = 0; k < def->num_info_fields; k++) {
        size_t bytes = info_field_bytes(&def->info_fields[k]);
        h->info[k] = xcalloc((size_t)n, bytes);
        h->info_bytes += bytes;
    }
    CHECK(def->num_params <= (int32_t)COUNT(h->params), "too many params");
    for (int i = 0; i < def->num_params; i++)
        h->params[i] = def->params[i].default_value;
    h->bufs = (envd_vec_buffers_t){
        .observations = h->obs,
        .actions = h->actions,
        .rewards = h->rewards,
        .terminations = h->terms,
        .truncations = h->truncs,
        .final_observations = h->final_obs,
        .episode_returns = h->returns,
        .episode_lengths = h->lengths,
    };
    for (int k = 0; k < def->num_info_fields; k++)
        h->bufs.info_fields[k] = h->info[k];
    h->cfg = (envd_vec_config_t){
        .num_envs = n, .autoreset_mode = mode, .max_episode_steps = time_limit,
        .params = h->params};
    h->act_state = seed | 1; /* xorshift state must be non-zero */
}

static void harness_free(harness_t *h)
{
    envd_vec_destroy(h->vec);
    free(h->obs);
    free(h->final_obs);
    free(h->actions);
    free(h->rewards);
    free(h->terms);
    free(h->truncs);
    free(h->mask);
    free(h->returns);
    free(h->lengths);
    for (int k = 0; k < ENVD_MAX_INFO_FIELDS; k++)
        free(h->info[k]);
    h->vec = NULL;
}

/* The thread cap every harness_create applies (ENVD_VEC_NO_CAP: none). */
static int g_max_threads = ENVD_VEC_NO_CAP;

static void harness_create(harness_t *h, envd_pool_t *pool, int64_t chunk)
{
    h->pool = pool;
    int rc = envd_vec_create(&h->vec, h->def, &h->cfg, &h->bufs, pool);
    CHECK(rc == ENVD_OK, "%s: create: %s", h->def->id, envd_strerror(rc));
    envd_vec_set_chunk(h->vec, chunk);
    rc = envd_vec_set_max_threads(h->vec, g_max_threads);
    CHECK(rc == ENVD_OK && envd_vec_max_threads(h->vec) == g_max_threads, "%s: cap %d: %s",
          h->def->id, g_max_threads, envd_strerror(rc));
}

/* A forced chunk puts every run on the pool, unless the cap is 0. */
static bool runs_pooled(envd_pool_t *pool, int64_t chunk)
{
    return pool && envd_pool_num_threads(pool) > 0 && chunk > 0 && g_max_threads != 0;
}

/* Every env seeded with base + i. */
static void harness_reset(harness_t *h, uint64_t base)
{
    uint64_t *seeds = xcalloc((size_t)h->n, sizeof *seeds);
    for (int64_t i = 0; i < h->n; i++)
        seeds[i] = base + (uint64_t)i;
    int rc = envd_vec_reset(h->vec, seeds, NULL);
    CHECK(rc == ENVD_OK, "%s: reset: %s", h->def->id, envd_strerror(rc));
    free(seeds);
}

/* One envd_vec_step that must succeed. */
static void step_ok(harness_t *h, const char *what)
{
    int rc = envd_vec_step(h->vec);
    CHECK(rc >= 0, "%s: %s (env %lld)", what, envd_strerror(rc),
          (long long)envd_vec_error_index(h->vec));
    CHECK(rc == envd_vec_num_done(h->vec), "%s: returned %d, %lld envs done", what, rc,
          (long long)envd_vec_num_done(h->vec));
}

/* Bounds of one box element for the action generator; unbounded sides get
 * [-1, 1] so the sample stays finite. */
static void action_bounds(const envd_space_t *as, int64_t k, double *lo, double *hi)
{
    *lo = as->low && isfinite(as->low[k]) ? as->low[k] : -1.0;
    *hi = as->high && isfinite(as->high[k]) ? as->high[k] : 1.0;
}

/* Env i's action from the generator state *s.  Discrete: uniform over the n
 * valid actions.  Box: uniform over the bounds widened by a quarter of their
 * span on each side (1.5x), so the envs' clipping runs too. */
static void fill_env_action(harness_t *h, int64_t i, uint64_t *s)
{
    const envd_space_t *as = &h->def->action_space;
    if (as->kind == ENVD_SPACE_DISCRETE) {
        ((int64_t *)h->actions)[i] = as->start + (int64_t)(rnd(s) % (uint64_t)as->n);
        return;
    }
    int64_t numel = envd_space_numel(as);
    for (int64_t k = 0; k < numel; k++) {
        double lo, hi;
        action_bounds(as, k, &lo, &hi);
        double v = lo - 0.25 * (hi - lo) + 1.5 * (hi - lo) * rnd_unit(s);
        if (as->dtype == ENVD_DTYPE_FLOAT32)
            ((float *)h->actions)[i * numel + k] = (float)v;
        else if (as->dtype == ENVD_DTYPE_FLOAT64)
            ((double *)h->actions)[i * numel + k] = v;
        else
            CHECK(0, "%s: box actions of dtype %d are not generated", h->def->id, as->dtype);
    }
}

/* Every env's next action from the harness's generator. */
static void fill_actions(harness_t *h)
{
    for (int64_t i = 0; i < h->n; i++)
        fill_env_action(h, i, &h->act_state);
}

/* Hash of every output buffer plus num_done. */
static uint64_t digest(const harness_t *h)
{
    uint64_t d = 0xcbf29ce484222325ull;
    size_t n = (size_t)h->n;
    d = hash_bytes(d, h->obs, n * h->obs_bytes);
    d = hash_bytes(d, h->rewards, n * sizeof *h->rewards);
    d = hash_bytes(d, h->terms, n * sizeof *h->terms);
    d = hash_bytes(d, h->truncs, n * sizeof *h->truncs);
    d = hash_bytes(d, h->returns, n * sizeof *h->returns);
    d = hash_bytes(d, h->lengths, n * sizeof *h->lengths);
    if (h->final_obs)
        d = hash_bytes(d, h->final_obs, n * h->obs_bytes);
    for (int k = 0; k < h->def->num_info_fields; k++)
        d = hash_bytes(d, h->info[k], n * info_field_bytes(&h->def->info_fields[k]));
    int64_t num_done = envd_vec_num_done(h->vec);
    return hash_bytes(d, &num_done, sizeof num_done);
}

/* Invariants of one completed step; in DISABLED mode, resets the envs that
 * finished (with a mask, so the others keep running).  Returns the digest. */
static uint64_t after_step(harness_t *h)
{
    int64_t done = 0;
    for (int64_t i = 0; i < h->n; i++) {
        bool d = h->terms[i] || h->truncs[i];
        done += d;
        CHECK(d == (h->lengths[i] > 0), "%s env %lld: done %d but episode length %lld",
              h->def->id, (long long)i, d, (long long)h->lengths[i]);
        CHECK(d || h->returns[i] == 0.0, "%s env %lld: return without an episode end",
              h->def->id, (long long)i);
        h->mask[i] = d;
    }
    CHECK(envd_vec_num_done(h->vec) == done, "%s: num_done %lld, counted %lld", h->def->id,
          (long long)envd_vec_num_done(h->vec), (long long)done);
    uint64_t d = digest(h);
    if (h->cfg.autoreset_mode == ENVD_AUTORESET_DISABLED && done > 0) {
        int rc = envd_vec_reset(h->vec, NULL, h->mask);
        CHECK(rc == ENVD_OK, "%s: masked reset: %s", h->def->id, envd_strerror(rc));
        d = hash_bytes(d, h->obs, (size_t)h->n * h->obs_bytes);
    }
    return d;
}

/* ---- determinism ---------------------------------------------------------------- */
/* The time limit is short so that every env, including those that rarely
 * terminate under random actions (MountainCar*, Pendulum never does), ends
 * episodes several times per run and the autoreset paths run. */
enum { SEED_BASE = 1000, TIME_LIMIT = 50 };

/* Trajectories with the same num_envs get the same actions, so runs can be
 * compared step by step. */
static uint64_t action_seed(int64_t n)
{
    return 0x5eed0000ull + (uint64_t)n;
}

static const char *mode_name(int mode)
{
    static const char *names[] = {"next_step", "same_step", "disabled"};
    return names[mode];
}

/* One trajectory through envd_vec_step: out[0] digests the reset, out[s]
 * step s. */
static void run_trajectory(const envd_env_def_t *def, int64_t n, int mode, envd_pool_t *pool,
                           int64_t chunk, int steps, uint64_t *out)
{
    harness_t h;
    harness_init(&h, def, n, mode, TIME_LIMIT, action_seed(n));
    harness_create(&h, pool, chunk);
    harness_reset(&h, SEED_BASE);
    out[0] = digest(&h);
    for (int s = 1; s <= steps; s++) {
        fill_actions(&h);
        int rc = envd_vec_step(h.vec);
        CHECK(rc >= 0, "%s step %d: %s (env %lld)", def->id, s, envd_strerror(rc),
              (long long)envd_vec_error_index(h.vec));
        CHECK(rc == envd_vec_num_done(h.vec), "%s step %d: returned %d, %lld envs done",
              def->id, s, rc, (long long)envd_vec_num_done(h.vec));
        out[s] = after_step(&h);
    }
    envd_vec_stats_t st;
    envd_vec_get_stats(h.vec, &st);
    if (runs_pooled(pool, chunk))
        CHECK(st.pooled_jobs >= steps && st.last_chunk == chunk,
              "%s: forced chunk %lld not used: pooled_jobs %lld last_chunk %lld", def->id,
              (long long)chunk, (long long)st.pooled_jobs, (long long)st.last_chunk);
    if (g_max_threads == 0)
        CHECK(st.pooled_jobs == 0, "%s: cap 0, yet %lld runs went to the pool", def->id,
              (long long)st.pooled_jobs);
    harness_free(&h);
}

static void compare_digests(const uint64_t *want, const uint64_t *got, int steps,
                            const char *what)
{
    for (int s = 0; s <= steps; s++)
        CHECK(want[s] == got[s], "%s: outputs differ from the serial run at step %d", what, s);
}

static void test_determinism(envd_pool_t *const *pools, int num_pools, int steps)
{
    static const int64_t sizes[] = {1, 7, 64};
    uint64_t *ref = xcalloc((size_t)steps + 1, sizeof *ref);
    uint64_t *got = xcalloc((size_t)steps + 1, sizeof *got);
    for (int e = 0; e < builtin_count(); e++) {
        const envd_env_def_t *def = builtin_get(e);
        for (size_t si = 0; si < COUNT(sizes); si++) {
            int64_t n = sizes[si];
            const int64_t chunks[] = {0, 1, 3, n};
            for (int mode = 0; mode < 3; mode++) {
                run_trajectory(def, n, mode, NULL, 0, steps, ref);
                for (int p = 0; p < num_pools; p++) {
                    for (size_t c = 0; c < COUNT(chunks); c++) {
                        run_trajectory(def, n, mode, pools[p], chunks[c], steps, got);
                        char what[160];
                        snprintf(what, sizeof what, "%s n=%lld %s threads=%d chunk=%lld",
                                 def->id, (long long)n, mode_name(mode),
                                 envd_pool_num_threads(pools[p]), (long long)chunks[c]);
                        compare_digests(ref, got, steps, what);
                    }
                }
            }
        }
    }
    free(ref);
    free(got);
}

/* Seeds are applied per env: env i of a vec reset with seeds base + i starts
 * like a one-env vec seeded with base + i, and reseeding after some steps
 * starts the same episodes again.  (The determinism runs compare vecs with
 * each other, so they cannot see seeds applied to the wrong envs.) */
static void test_seeding(envd_pool_t *pool)
{
    const int64_t n = 7;
    for (int e = 0; e < builtin_count(); e++) {
        const envd_env_def_t *def = builtin_get(e);
        harness_t h;
        harness_init(&h, def, n, ENVD_AUTORESET_NEXT_STEP, 0, 8);
        harness_create(&h, pool, 2);
        harness_reset(&h, 500);
        unsigned char *first = xcalloc((size_t)n, h.obs_bytes);
        memcpy(first, h.obs, (size_t)n * h.obs_bytes);
        for (int64_t i = 0; i < n; i++) {
            harness_t one;
            harness_init(&one, def, 1, ENVD_AUTORESET_NEXT_STEP, 0, 8);
            harness_create(&one, NULL, 0);
            harness_reset(&one, 500 + (uint64_t)i);
            CHECK(memcmp(one.obs, first + (size_t)i * h.obs_bytes, h.obs_bytes) == 0,
                  "%s: env %lld did not get seed 500 + %lld", def->id, (long long)i, (long long)i);
            harness_free(&one);
        }
        for (int s = 0; s < 5; s++) {
            fill_actions(&h);
            step_ok(&h, "seeding");
        }
        harness_reset(&h, 500);
        CHECK(memcmp(first, h.obs, (size_t)n * h.obs_bytes) == 0, "%s: reseeding differs",
              def->id);
        free(first);
        harness_free(&h);
    }
}

/* ---- the split API ------------------------------------------------------------- */
static uint64_t drain_eventfd(int fd)
{
    uint64_t value = 0;
    if (read(fd, &value, sizeof value) != sizeof value) {
        CHECK(errno == EAGAIN, "read eventfd: %s", strerror(errno));
        return 0;
    }
    return value;
}

/* Submits on h; returns whether it went to the pool (and so will count on the
 * eventfd once complete). */
static bool submit(harness_t *h)
{
    envd_vec_stats_t before, after;
    envd_vec_get_stats(h->vec, &before);
    int rc = envd_vec_step_submit(h->vec);
    CHECK(rc == ENVD_OK, "%s: submit: %s", h->def->id, envd_strerror(rc));
    envd_vec_get_stats(h->vec, &after);
    return after.pooled_jobs > before.pooled_jobs;
}

/* Waits for both vecs, by polling envd_vec_step_done or by sleeping on the
 * eventfd as an event loop does; returns the eventfd counts consumed. */
static uint64_t wait_both(harness_t *a, harness_t *b, int efd, bool use_eventfd)
{
    uint64_t counted = 0;
    const double deadline = now_s() + 30.0;
    while (!(envd_vec_step_done(a->vec) && envd_vec_step_done(b->vec))) {
        CHECK(now_s() < deadline, "split step not done after 30 s");
        if (use_eventfd) {
            struct pollfd pfd = {.fd = efd, .events = POLLIN};
            CHECK(poll(&pfd, 1, 100) >= 0, "poll: %s", strerror(errno));
            if (pfd.revents & POLLIN)
                counted += drain_eventfd(efd);
        } else {
            sched_yield();
        }
    }
    return counted;
}

static void finish(harness_t *h)
{
    int rc = envd_vec_step_finish(h->vec);
    CHECK(rc >= 0, "%s: finish: %s (env %lld)", h->def->id, envd_strerror(rc),
          (long long)envd_vec_error_index(h->vec));
    CHECK(rc == envd_vec_num_done(h->vec), "%s: finish returned %d, %lld envs done",
          h->def->id, rc, (long long)envd_vec_num_done(h->vec));
}

/* Two vecs (different envs and modes) on one pool, stepped in lockstep with
 * both steps in flight at once, against serial envd_vec_step runs. */
static void test_split_pair(envd_pool_t *pool, int ea, int eb, int mode_a, int mode_b,
                            int64_t na, int64_t nb, int64_t chunk, int steps)
{
    const envd_env_def_t *da = builtin_get(ea), *db = builtin_get(eb);
    uint64_t *ref_a = xcalloc((size_t)steps + 1, sizeof(uint64_t));
    uint64_t *ref_b = xcalloc((size_t)steps + 1, sizeof(uint64_t));
    run_trajectory(da, na, mode_a, NULL, 0, steps, ref_a);
    run_trajectory(db, nb, mode_b, NULL, 0, steps, ref_b);

    harness_t a, b;
    harness_init(&a, da, na, mode_a, TIME_LIMIT, action_seed(na));
    harness_init(&b, db, nb, mode_b, TIME_LIMIT, action_seed(nb));
    harness_create(&a, pool, chunk);
    harness_create(&b, pool, chunk);
    harness_reset(&a, SEED_BASE);
    harness_reset(&b, SEED_BASE);
    CHECK(digest(&a) == ref_a[0] && digest(&b) == ref_b[0], "reset digests differ");

    const int efd = envd_pool_eventfd(pool);
    while (drain_eventfd(efd))
        ; /* counts left by earlier tests on this pool */
    uint64_t expected = 0, counted = 0;
    for (int s = 1; s <= steps; s++) {
        fill_actions(&a);
        fill_actions(&b);
        expected += submit(&a);
        expected += submit(&b);
        counted += wait_both(&a, &b, efd, s % 2 == 0);
        /* Alternate the finish order: finishing one must not disturb the other. */
        if (s % 3 == 0) {
            finish(&b);
            finish(&a);
        } else {
            finish(&a);
            finish(&b);
        }
        char what[160];
        snprintf(what, sizeof what, "split %s/%s threads=%d chunk=%lld", da->id, db->id,
                 envd_pool_num_threads(pool), (long long)chunk);
        CHECK(after_step(&a) == ref_a[s], "%s: vec A differs from envd_vec_step at step %d",
              what, s);
        CHECK(after_step(&b) == ref_b[s], "%s: vec B differs from envd_vec_step at step %d",
              what, s);
    }
    /* Completion is flagged before the eventfd write: read until the total is
     * reached, then nothing more may come. */
    const double deadline = now_s() + 30.0;
    while (counted < expected) {
        struct pollfd pfd = {.fd = efd, .events = POLLIN};
        CHECK(poll(&pfd, 1, 100) >= 0, "poll: %s", strerror(errno));
        counted += drain_eventfd(efd);
        CHECK(now_s() < deadline, "eventfd total %llu of %llu", (unsigned long long)counted,
              (unsigned long long)expected);
    }
    CHECK(counted == expected, "eventfd counted %llu, pooled submits %llu",
          (unsigned long long)counted, (unsigned long long)expected);
    CHECK(drain_eventfd(efd) == 0, "eventfd has extra counts");
    if (runs_pooled(pool, chunk))
        CHECK(expected == 2 * (uint64_t)steps, "forced chunk: %llu of %d submits pooled",
              (unsigned long long)expected, 2 * steps);
    harness_free(&a);
    harness_free(&b);
    free(ref_a);
    free(ref_b);
}

static void test_split(envd_pool_t *const *pools, int num_pools, int steps)
{
    int k = 0;
    for (int p = 0; p < num_pools; p++) {
        for (int ea = 0; ea < builtin_count(); ea++, k++) {
            int eb = (ea + 1 + p) % builtin_count();
            test_split_pair(pools[p], ea, eb, k % 3, (k + 1) % 3, 7, 64, 1 + k % 3, steps);
            test_split_pair(pools[p], ea, eb, (k + 2) % 3, k % 3, 64, 7, 0, steps);
        }
    }
}

/* ---- test-only envs -------------------------------------------------------------- */
/* Failure injection.  Written by the main thread between vec calls and read by
 * callbacks inside them (the pool's job handshake orders both). */
static struct {
    int init_calls, close_calls, bad_closes;
    int fail_init_at;           /* the init call (0-based) that fails; -1: none */
    int fail_reset_id;          /* the instance whose reset fails; -1: none */
    int fail_step_id;           /* the instance whose step fails ... */
    int64_t fail_step_at;       /* ... at this step of its episode */
} g_test;

static void test_env_setup(void)
{
    memset(&g_test, 0, sizeof g_test);
    g_test.fail_init_at = g_test.fail_reset_id = g_test.fail_step_id = -1;
}

enum { MAGIC_LIVE = 0x11fe, MAGIC_FAILED = 0xfa11, MAGIC_CLOSED = 0xc105 };

typedef struct test_state {
    int magic;
    int id;        /* the order of its init call */
    int64_t steps; /* in this episode */
} test_state_t;

/* init calls come one at a time from the thread calling envd_vec_create, so
 * the instance number can come from a global counter. */
static int test_init(void *state, const double *params)
{
    (void)params;
    test_state_t *s = state;
    CHECK(s->magic == 0 && s->id == 0 && s->steps == 0, "init on non-zeroed state");
    s->id = g_test.init_calls++;
    if (s->id == g_test.fail_init_at) {
        s->magic = MAGIC_FAILED; /* a failed init cleans up after itself */
        return ENVD_ENOMEM;
    }
    s->magic = MAGIC_LIVE;
    return ENVD_OK;
}

static void test_close(void *state)
{
    test_state_t *s = state;
    g_test.bad_closes += s->magic != MAGIC_LIVE;
    s->magic = MAGIC_CLOSED;
    g_test.close_calls++;
}

static int test_reset(void *state, envd_rng_t *rng, void *obs)
{
    test_state_t *s = state;
    if (s->id == g_test.fail_reset_id)
        return ENVD_EINVAL;
    s->steps = 0;
    float *o = obs;
    o[0] = (float)s->id;
    o[1] = (float)envd_rng_random(rng);
    return ENVD_OK;
}

/* Episode lengths differ per instance (3 + id % 5 steps), so done envs are
 * a varying subset. */
static int test_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                     double *reward, bool *terminated, bool *truncated)
{
    test_state_t *s = state;
    CHECK(s->magic == MAGIC_LIVE, "step on instance %d with magic %#x", s->id, s->magic);
    s->steps++;
    if (s->id == g_test.fail_step_id && s->steps == g_test.fail_step_at)
        return ENVD_EINVAL;
    int64_t a = *(const int64_t *)action;
    CHECK(a >= -1 && a <= 1, "instance %d got action %lld", s->id, (long long)a);
    float *o = obs;
    o[0] = (float)s->id;
    o[1] = (float)envd_rng_random(rng) + (float)s->steps;
    *reward = (double)a + 0.5;
    *terminated = s->steps % (3 + s->id % 5) == 0;
    *truncated = false;
    return ENVD_OK;
}

/* Actions are -1, 0, 1 (start -1), so range checks relative to start run. */
static const envd_env_def_t test_env = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "VecStressTest-v0",
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                          .shape = {2}},
    .action_space = {.kind = ENVD_SPACE_DISCRETE, .dtype = ENVD_DTYPE_INT64, .n = 3, .start = -1},
    .state_size = sizeof(test_state_t),
    .num_agents = 1,
    .max_episode_steps = 0,
    .init = test_init,
    .reset = test_reset,
    .step = test_step,
    .close = test_close,
};

/* A 1x1 frame: the instance's step count in red. */
static int test_render_frame(const void *state, uint8_t *rgb)
{
    const test_state_t *s = state;
    rgb[0] = (uint8_t)s->steps;
    rgb[1] = rgb[2] = 7;
    return ENVD_OK;
}

/* A step that blocks until released, to observe a step in flight. */
static _Atomic int g_gate_started, g_gate_release;

static int gate_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                     double *reward, bool *terminated, bool *truncated)
{
    atomic_store(&g_gate_started, 1);
    const double deadline = now_s() + 30.0;
    while (!atomic_load(&g_gate_release))
        CHECK(now_s() < deadline, "gate never released");
    return test_step(state, rng, action, obs, reward, terminated, truncated);
}

/* ---- error paths ------------------------------------------------------------------ */
/* A copy of every output buffer, to check that a rejected call wrote nothing. */
typedef struct snapshot {
    unsigned char *data;
    size_t size;
} snapshot_t;

static size_t outputs_size(const harness_t *h)
{
    size_t n = (size_t)h->n;
    return n * (2 * h->obs_bytes + sizeof(float) + 2 * sizeof(bool) + sizeof(double) +
                sizeof(int64_t) + h->info_bytes);
}

static void outputs_copy(const harness_t *h, unsigned char *dst)
{
    size_t n = (size_t)h->n;
    const struct {
        const void *p;
        size_t size;
    } parts[] = {
        {h->obs, n * h->obs_bytes},      {h->final_obs, n * h->obs_bytes},
        {h->rewards, n * sizeof(float)}, {h->terms, n * sizeof(bool)},
        {h->truncs, n * sizeof(bool)},   {h->returns, n * sizeof(double)},
        {h->lengths, n * sizeof(int64_t)},
    };
    for (size_t i = 0; i < COUNT(parts); i++) {
        if (parts[i].p)
            memcpy(dst, parts[i].p, parts[i].size);
        else
            memset(dst, 0, parts[i].size);
        dst += parts[i].size;
    }
    for (int k = 0; k < h->def->num_info_fields; k++) {
        size_t size = n * info_field_bytes(&h->def->info_fields[k]);
        memcpy(dst, h->info[k], size);
        dst += size;
    }
}

static snapshot_t snapshot(const harness_t *h)
{
    snapshot_t s = {xcalloc(1, outputs_size(h)), outputs_size(h)};
    outputs_copy(h, s.data);
    return s;
}

static bool snapshot_same(const harness_t *h, snapshot_t *s)
{
    unsigned char *now = xcalloc(1, s->size);
    outputs_copy(h, now);
    bool same = memcmp(now, s->data, s->size) == 0;
    free(now);
    free(s->data);
    s->data = NULL;
    return same;
}

/* A step that validation rejects, by either entry point: the code, the env
 * named, and no output written. */
static void expect_rejected(harness_t *h, int want, int64_t index, const char *what)
{
    for (int entry = 0; entry < 2; entry++) {
        snapshot_t before = snapshot(h);
        int rc = entry == 0 ? envd_vec_step(h->vec) : envd_vec_step_submit(h->vec);
        CHECK(rc == want, "%s (%s): got %s, want %s", what, entry ? "submit" : "step",
              envd_strerror(rc), envd_strerror(want));
        CHECK(envd_vec_error_index(h->vec) == index, "%s: error index %lld, want %lld", what,
              (long long)envd_vec_error_index(h->vec), (long long)index);
        CHECK(snapshot_same(h, &before), "%s: a rejected step wrote outputs", what);
    }
}

/* Any non-NULL pointer: a failed create must set *out to NULL. */
static char not_null_target;
#define NOT_NULL ((envd_vec_t *)(void *)&not_null_target)

static void test_create_errors(envd_pool_t *pool)
{
    harness_t h;
    harness_init(&h, &envd_builtin_cartpole, 4, ENVD_AUTORESET_SAME_STEP, 0, 1);
    envd_vec_t *vec = NOT_NULL;
    struct {
        int64_t num_envs;
        int want;
    } sizes[] = {{0, ENVD_ERANGE}, {-1, ENVD_ERANGE}, {INT64_MIN, ENVD_ERANGE},
                 {ENVD_VEC_MAX_ENVS + 1, ENVD_ERANGE}, {INT64_MAX, ENVD_ERANGE}};
    for (size_t i = 0; i < COUNT(sizes); i++) {
        envd_vec_config_t cfg = h.cfg;
        cfg.num_envs = sizes[i].num_envs;
        int rc = envd_vec_create(&vec, h.def, &cfg, &h.bufs, pool);
        CHECK(rc == sizes[i].want && vec == NULL, "num_envs %lld: %s",
              (long long)sizes[i].num_envs, envd_strerror(rc));
        vec = NOT_NULL;
    }

    /* A multi-agent env's rows (num_envs * num_agents) are capped at
     * ENVD_VEC_MAX_ENVS: ERANGE above the cap, before any buffer is looked
     * at; at the cap the size passes (and the missing agent_mask is EINVAL). */
    const envd_env_def_t *spread = &envd_builtin_simple_spread;
    const int64_t agents = spread->num_agents;
    const int64_t rows_over[] = {ENVD_VEC_MAX_ENVS / agents + 1, ENVD_VEC_MAX_ENVS};
    for (size_t i = 0; i < COUNT(rows_over); i++) {
        envd_vec_config_t cfg = h.cfg;
        cfg.num_envs = rows_over[i];
        int rc = envd_vec_create(&vec, spread, &cfg, &h.bufs, pool);
        CHECK(rc == ENVD_ERANGE && vec == NULL, "%lld envs of %lld agents: %s",
              (long long)rows_over[i], (long long)agents, envd_strerror(rc));
        vec = NOT_NULL;
    }
    {
        envd_vec_config_t cfg = h.cfg;
        cfg.num_envs = ENVD_VEC_MAX_ENVS / agents;
        int rc = envd_vec_create(&vec, spread, &cfg, &h.bufs, pool);
        CHECK(rc == ENVD_EINVAL && vec == NULL, "%lld envs of %lld agents (at the cap): %s",
              (long long)cfg.num_envs, (long long)agents, envd_strerror(rc));
        vec = NOT_NULL;
    }

    /* Each required buffer left out in turn (final_observations is required
     * in SAME_STEP mode). */
    for (int i = 0; i < 8; i++) {
        envd_vec_buffers_t bufs = h.bufs;
        switch (i) {
        case 0: bufs.observations = NULL; break;
        case 1: bufs.actions = NULL; break;
        case 2: bufs.rewards = NULL; break;
        case 3: bufs.terminations = NULL; break;
        case 4: bufs.truncations = NULL; break;
        case 5: bufs.episode_returns = NULL; break;
        case 6: bufs.episode_lengths = NULL; break;
        default: bufs.final_observations = NULL; break;
        }
        int rc = envd_vec_create(&vec, h.def, &h.cfg, &bufs, pool);
        CHECK(rc == ENVD_EINVAL && vec == NULL, "NULL buffer %d: %s", i, envd_strerror(rc));
        vec = NOT_NULL;
    }

    struct {
        int mode;
        int64_t time_limit;
        bool null_params;
        int want;
    } cfgs[] = {
        {3, 0, false, ENVD_EINVAL},
        {-1, 0, false, ENVD_EINVAL},
        {ENVD_AUTORESET_SAME_STEP, -1, false, ENVD_ERANGE},
        {ENVD_AUTORESET_SAME_STEP, 0, true, ENVD_EINVAL}, /* cartpole has a param */
    };
    for (size_t i = 0; i < COUNT(cfgs); i++) {
        envd_vec_config_t cfg = h.cfg;
        cfg.autoreset_mode = cfgs[i].mode;
        cfg.max_episode_steps = cfgs[i].time_limit;
        if (cfgs[i].null_params)
            cfg.params = NULL;
        int rc = envd_vec_create(&vec, h.def, &cfg, &h.bufs, pool);
        CHECK(rc == cfgs[i].want && vec == NULL, "config %zu: %s", i, envd_strerror(rc));
        vec = NOT_NULL;
    }

    /* An invalid definition is refused with envd_env_def_validate's code. */
    envd_env_def_t bad = envd_builtin_cartpole;
    bad.abi_version = ENVD_ABI_VERSION + 1;
    CHECK(envd_vec_create(&vec, &bad, &h.cfg, &h.bufs, pool) == ENVD_EABI && vec == NULL,
          "wrong ABI version accepted");
    bad = envd_builtin_cartpole;
    bad.step = NULL;
    vec = NOT_NULL;
    CHECK(envd_vec_create(&vec, &bad, &h.cfg, &h.bufs, pool) == ENVD_EINVAL && vec == NULL,
          "definition without step accepted");

    /* final_observations may be NULL outside SAME_STEP. */
    for (int mode = ENVD_AUTORESET_NEXT_STEP; mode <= ENVD_AUTORESET_DISABLED; mode += 2) {
        envd_vec_buffers_t bufs = h.bufs;
        bufs.final_observations = NULL;
        envd_vec_config_t cfg = h.cfg;
        cfg.autoreset_mode = mode;
        int rc = envd_vec_create(&vec, h.def, &cfg, &bufs, pool);
        CHECK(rc == ENVD_OK && vec != NULL, "mode %d without final_observations: %s", mode,
              envd_strerror(rc));
        envd_vec_destroy(vec);
    }
    envd_vec_destroy(NULL);
    harness_free(&h);

    /* An env with info fields needs a buffer for each. */
    harness_t c4;
    harness_init(&c4, &envd_builtin_connect_four, 4, ENVD_AUTORESET_NEXT_STEP, 0, 1);
    CHECK(envd_builtin_connect_four.num_info_fields == 1, "ConnectFour has one info field");
    envd_vec_buffers_t bufs = c4.bufs;
    bufs.info_fields[0] = NULL;
    vec = NOT_NULL;
    CHECK(envd_vec_create(&vec, c4.def, &c4.cfg, &bufs, pool) == ENVD_EINVAL && vec == NULL,
          "a missing info field buffer was accepted");
    harness_free(&c4);
}

static void test_step_before_reset(envd_pool_t *pool)
{
    for (int mode = 0; mode < 3; mode++) {
        harness_t h;
        harness_init(&h, &envd_builtin_acrobot, 5, mode, 0, 2);
        harness_create(&h, pool, 2);
        expect_rejected(&h, ENVD_ESTATE, 0, "step before reset (names env 0)");
        /* a masked first reset leaves the unmasked envs unstarted */
        const bool mask[5] = {true, true, false, true, true};
        CHECK(envd_vec_reset(h.vec, NULL, mask) == ENVD_OK, "masked first reset");
        expect_rejected(&h, ENVD_ESTATE, 2, "step with env 2 never reset");
        harness_reset(&h, 7);
        step_ok(&h, "step after reset");
        harness_free(&h);
    }
}

/* A discrete action out of range anywhere rejects the whole step; after it,
 * the vec continues exactly like a twin that never saw the bad action. */
static void test_action_range(envd_pool_t *pool, const envd_env_def_t *def, int64_t chunk)
{
    test_env_setup();
    const envd_space_t *as = &def->action_space;
    CHECK(as->kind == ENVD_SPACE_DISCRETE, "%s has no discrete actions", def->id);
    const int64_t n = 9;
    /* INT64_MAX and INT64_MIN: a naive a - start overflows for start != 0. */
    const int64_t bad[] = {as->start - 1, as->start + as->n, INT64_MIN, INT64_MAX};
    const int64_t where[] = {0, n - 1, 4};
    harness_t h, twin;
    harness_init(&h, def, n, ENVD_AUTORESET_NEXT_STEP, 0, 3);
    harness_init(&twin, def, n, ENVD_AUTORESET_NEXT_STEP, 0, 3);
    harness_create(&h, pool, chunk);
    g_test.init_calls = 0; /* the test env's instance numbers restart for the twin */
    harness_create(&twin, NULL, 0);
    harness_reset(&h, 11);
    harness_reset(&twin, 11);
    for (int round = 0; round < 12; round++) {
        fill_actions(&h);
        fill_actions(&twin);
        if (round % 2 == 1) {
            int64_t k = where[round / 2 % COUNT(where)];
            int64_t *a = (int64_t *)h.actions;
            int64_t good = a[k];
            a[k] = bad[round / 2 % COUNT(bad)];
            char what[128];
            snprintf(what, sizeof what, "%s action %lld at env %lld", def->id, (long long)a[k],
                     (long long)k);
            expect_rejected(&h, ENVD_ERANGE, k, what);
            a[k] = good;
        }
        step_ok(&h, "step after a rejected one");
        step_ok(&twin, "twin step");
        CHECK(digest(&h) == digest(&twin), "%s: a rejected step changed the trajectory (round %d)",
              def->id, round);
    }
    harness_free(&h);
    harness_free(&twin);
}

/* ---- copy, then check -------------------------------------------------------------
 * The caller's input buffers may be shared memory another process rewrites at
 * any moment (vec.h, "Inputs").  FlipTest-v0's callbacks play that process,
 * deterministically: before they read anything, they rewrite every input of
 * every env in the caller's buffers (actions to 99, out of range; the reset
 * mask to all false; the seeds to others), with relaxed atomics (workers of a
 * pooled call write the same words).  A vec that acts on its private copies
 * hands each env what the caller had written when the call started. */
static struct {
    int64_t *actions;  /* the caller's buffers, rewritten by the callbacks */
    bool *mask;
    uint64_t *seeds;
    int64_t n;
    int64_t seen[64];  /* per instance: the action its last step received */
    int resets[64];    /* per instance: reset calls */
    float first_draw[64]; /* per instance: its RNG's first draw at its last reset */
} g_flip;

static void flip_inputs(void)
{
    for (int64_t i = 0; i < g_flip.n; i++) {
        __atomic_store_n(&g_flip.actions[i], 99, __ATOMIC_RELAXED);
        if (g_flip.mask)
            __atomic_store_n(&g_flip.mask[i], false, __ATOMIC_RELAXED);
        if (g_flip.seeds)
            __atomic_store_n(&g_flip.seeds[i], 777, __ATOMIC_RELAXED);
    }
}

static int flip_reset(void *state, envd_rng_t *rng, void *obs)
{
    flip_inputs();
    test_state_t *s = state;
    g_flip.resets[s->id]++;
    g_flip.first_draw[s->id] = (float)envd_rng_random(rng);
    ((float *)obs)[0] = (float)s->id;
    ((float *)obs)[1] = g_flip.first_draw[s->id];
    return ENVD_OK;
}

static int flip_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                     double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    flip_inputs();
    test_state_t *s = state;
    g_flip.seen[s->id] = *(const volatile int64_t *)action;
    ((float *)obs)[0] = (float)s->id;
    *reward = 0.0;
    *terminated = *truncated = false;
    return ENVD_OK;
}

static const envd_env_def_t flip_env = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "FlipTest-v0",
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                          .shape = {2}},
    .action_space = {.kind = ENVD_SPACE_DISCRETE, .dtype = ENVD_DTYPE_INT64, .n = 3},
    .state_size = sizeof(test_state_t),
    .num_agents = 1,
    .init = test_init,
    .reset = flip_reset,
    .step = flip_step,
    .close = test_close,
};

static void test_inputs_copied(envd_pool_t *pool, int64_t chunk)
{
    test_env_setup();
    enum { N = 12 };
    harness_t h;
    harness_init(&h, &flip_env, N, ENVD_AUTORESET_NEXT_STEP, 0, 21);
    harness_create(&h, pool, chunk);
    memset(&g_flip, 0, sizeof g_flip);
    uint64_t seeds[N];
    g_flip.actions = (int64_t *)h.actions;
    g_flip.n = N;
    g_flip.mask = h.mask;
    g_flip.seeds = seeds;
    /* a masked, seeded reset: exactly the envs selected when it started, with
     * the seeds given then */
    for (int i = 0; i < N; i++) {
        seeds[i] = 1000 + (uint64_t)i;
        h.mask[i] = true;
    }
    CHECK(envd_vec_reset(h.vec, seeds, h.mask) == ENVD_OK, "flip: first reset");
    for (int round = 0; round < 6; round++) {
        for (int i = 0; i < N; i++) {
            h.mask[i] = (i + round) % 3 != 0;
            seeds[i] = 5000 + 100 * (uint64_t)round + (uint64_t)i;
        }
        bool want[N];
        memcpy(want, h.mask, sizeof want);
        int before[N];
        memcpy(before, g_flip.resets, sizeof before);
        CHECK(envd_vec_reset(h.vec, seeds, h.mask) == ENVD_OK, "flip: masked reset");
        for (int i = 0; i < N; i++) {
            CHECK(g_flip.resets[i] - before[i] == (want[i] ? 1 : 0),
                  "flip: env %d reset %d times, mask said %d (round %d)", i,
                  g_flip.resets[i] - before[i], want[i], round);
            envd_rng_t ref;
            envd_rng_seed(&ref, 5000 + 100 * (uint64_t)round + (uint64_t)i);
            CHECK(!want[i] || g_flip.first_draw[i] == (float)envd_rng_random(&ref),
                  "flip: env %d reset from a seed written after the call started", i);
        }
        /* a whole-vec step: every env gets the action written before the call */
        int64_t *a = (int64_t *)h.actions;
        for (int i = 0; i < N; i++)
            a[i] = (i + round) % 3;
        step_ok(&h, "flip: step");
        for (int i = 0; i < N; i++)
            CHECK(g_flip.seen[i] == (i + round) % 3, "flip: env %d stepped with %lld, not %d",
                  i, (long long)g_flip.seen[i], (i + round) % 3);
        /* a batch: its envs get their actions as they were at submit */
        envd_vec_batch_t *b;
        CHECK(envd_vec_batch_create(&b, N) == ENVD_OK, "flip: batch create");
        const int64_t ids[] = {7, 2, 11, 0};
        for (int i = 0; i < N; i++)
            a[i] = (2 * i + round) % 3;
        CHECK(envd_vec_batch_submit(h.vec, b, ids, 4, 0) == ENVD_OK, "flip: batch submit");
        envd_vec_batch_wait(h.vec, b);
        CHECK(envd_vec_batch_finish(h.vec, b) >= 0, "flip: batch finish");
        for (int k = 0; k < 4; k++)
            CHECK(g_flip.seen[ids[k]] == (2 * ids[k] + round) % 3,
                  "flip: batch env %lld stepped with %lld", (long long)ids[k],
                  (long long)g_flip.seen[ids[k]]);
        envd_vec_batch_destroy(b);
    }
    /* the count of selected envs is the copy's: a callback's rewrite of the
     * mask to all false does not change it (nor does a byte neither 0 nor 1) */
    memset(h.mask, 0, N);
    ((unsigned char *)h.mask)[3] = 2;
    h.mask[5] = true;
    CHECK(envd_vec_reset(h.vec, NULL, h.mask) == ENVD_OK, "flip: last reset");
    CHECK(envd_vec_reset_count(h.vec) == 2, "flip: reset count %lld, not 2",
          (long long)envd_vec_reset_count(h.vec));
    memset(h.mask, 0, N);
    CHECK(envd_vec_reset(h.vec, NULL, h.mask) == ENVD_OK && envd_vec_reset_count(h.vec) == 0,
          "flip: empty mask");
    g_flip.actions = NULL;
    g_flip.n = 0;
    harness_free(&h);
}

/* DISABLED mode: stepping an env that finished and was not reset is refused;
 * a masked reset makes it steppable again. */
static void test_disabled_done(envd_pool_t *pool, int64_t chunk)
{
    test_env_setup();
    const int64_t n = 10;
    harness_t h;
    harness_init(&h, &test_env, n, ENVD_AUTORESET_DISABLED, 0, 4);
    harness_create(&h, pool, chunk);
    harness_reset(&h, 5);
    /* Instance i ends its episode after 3 + i % 5 steps: after 3 steps,
     * instances 0 and 5 are done. */
    for (int s = 0; s < 3; s++) {
        fill_actions(&h);
        step_ok(&h, "disabled step");
    }
    for (int64_t i = 0; i < n; i++)
        CHECK(h.terms[i] == (i % 5 == 0), "env %lld terminated %d after 3 steps", (long long)i,
              h.terms[i]);
    expect_rejected(&h, ENVD_ESTATE, 0, "DISABLED step with env 0 done");
    bool mask[10] = {[0] = true};
    CHECK(envd_vec_reset(h.vec, NULL, mask) == ENVD_OK, "masked reset");
    expect_rejected(&h, ENVD_ESTATE, 5, "DISABLED step with env 5 done");
    mask[0] = false;
    mask[5] = true;
    CHECK(envd_vec_reset(h.vec, NULL, mask) == ENVD_OK, "masked reset");
    step_ok(&h, "step after the done envs were reset");
    CHECK(h.lengths[0] == 0 && !h.terms[0] && !h.terms[5], "reset envs ended again at once");
    CHECK(h.terms[1] && h.lengths[1] == 4, "env 1: terminated %d length %lld", h.terms[1],
          (long long)h.lengths[1]);
    harness_free(&h);
    CHECK(g_test.bad_closes == 0 && g_test.close_calls == n, "closes %d, bad %d",
          g_test.close_calls, g_test.bad_closes);
}

/* init failing at instance k: ENVD_EENV, and exactly the k instances that
 * initialised are closed. */
static void test_init_failure(envd_pool_t *pool)
{
    const int64_t n = 8;
    const int fail_at[] = {0, 1, 5, 7};
    for (size_t i = 0; i < COUNT(fail_at); i++) {
        test_env_setup();
        g_test.fail_init_at = fail_at[i];
        harness_t h;
        harness_init(&h, &test_env, n, ENVD_AUTORESET_NEXT_STEP, 0, 5);
        envd_vec_t *vec = NOT_NULL;
        int rc = envd_vec_create(&vec, &test_env, &h.cfg, &h.bufs, pool);
        CHECK(rc == ENVD_EENV && vec == NULL, "init failing at %d: %s", fail_at[i],
              envd_strerror(rc));
        CHECK(g_test.init_calls == fail_at[i] + 1, "init called %d times, failed at %d",
              g_test.init_calls, fail_at[i]);
        CHECK(g_test.close_calls == fail_at[i] && g_test.bad_closes == 0,
              "init failed at %d: %d closes, %d on instances not initialised", fail_at[i],
              g_test.close_calls, g_test.bad_closes);
        harness_free(&h);
    }
}

/* A failing reset or step callback: ENVD_EENV naming the env, serially and on
 * the pool, through envd_vec_step and the split API. */
static void test_callback_failure(envd_pool_t *pool, int64_t chunk)
{
    const int64_t n = 16;
    for (int entry = 0; entry < 2; entry++) {
        test_env_setup();
        harness_t h;
        harness_init(&h, &test_env, n, ENVD_AUTORESET_SAME_STEP, 0, 6);
        harness_create(&h, pool, chunk);
        g_test.fail_reset_id = 13;
        int rc = envd_vec_reset(h.vec, NULL, NULL);
        CHECK(rc == ENVD_EENV && envd_vec_error_index(h.vec) == 13,
              "failing reset: %s, index %lld", envd_strerror(rc),
              (long long)envd_vec_error_index(h.vec));
        g_test.fail_reset_id = -1;
        harness_reset(&h, 9);
        g_test.fail_step_id = 11;
        g_test.fail_step_at = 2; /* instance 11's episodes last 4 steps */
        fill_actions(&h);
        step_ok(&h, "step before the failing one");
        fill_actions(&h);
        if (entry == 0) {
            rc = envd_vec_step(h.vec);
        } else {
            CHECK(envd_vec_step_submit(h.vec) == ENVD_OK, "submit of the failing step");
            const double deadline = now_s() + 30.0;
            while (!envd_vec_step_done(h.vec)) {
                CHECK(now_s() < deadline, "step not done after 30 s");
                sched_yield();
            }
            rc = envd_vec_step_finish(h.vec);
        }
        CHECK(rc == ENVD_EENV && envd_vec_error_index(h.vec) == 11,
              "failing step (%s): %s, index %lld", entry ? "split" : "step", envd_strerror(rc),
              (long long)envd_vec_error_index(h.vec));
        harness_free(&h);
        CHECK(g_test.close_calls == n && g_test.bad_closes == 0, "closes %d, bad %d",
              g_test.close_calls, g_test.bad_closes);
    }
}

/* A step in flight: not done, finish says ENVD_EBUSY; then it completes. */
/* Opens the gate after the main thread has had time to block in destroy. */
static void *release_gate_later(void *arg)
{
    (void)arg;
    const double deadline = now_s() + 30.0;
    while (!atomic_load(&g_gate_started) && now_s() < deadline)
        sched_yield();
    nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    atomic_store(&g_gate_release, 1);
    return NULL;
}

static void test_in_flight(envd_pool_t *pool)
{
    test_env_setup();
    envd_env_def_t gated = test_env;
    gated.step = gate_step;
    gated.render_width = gated.render_height = gated.render_fps = 1;
    gated.render = test_render_frame;
    harness_t h;
    harness_init(&h, &gated, 3, ENVD_AUTORESET_NEXT_STEP, 0, 7);
    harness_create(&h, pool, 3); /* one chunk: a worker runs it, not this thread */
    harness_reset(&h, 1);
    atomic_store(&g_gate_started, 0);
    atomic_store(&g_gate_release, 0);
    fill_actions(&h);
    CHECK(envd_vec_step_submit(h.vec) == ENVD_OK, "submit");
    const double deadline = now_s() + 30.0;
    while (!atomic_load(&g_gate_started))
        CHECK(now_s() < deadline, "gated step never started");
    CHECK(!envd_vec_step_done(h.vec), "step done while blocked");
    CHECK(envd_vec_step_finish(h.vec) == ENVD_EBUSY, "finish of a step in flight");
    /* nothing else may run on the vec while its step is pending */
    CHECK(envd_vec_step(h.vec) == ENVD_EBUSY, "step while a step is pending");
    CHECK(envd_vec_step_submit(h.vec) == ENVD_EBUSY, "submit while a step is pending");
    CHECK(envd_vec_reset(h.vec, NULL, NULL) == ENVD_EBUSY, "reset while a step is pending");
    uint8_t pixel[3] = {0};
    CHECK(envd_vec_render(h.vec, 0, pixel) == ENVD_EBUSY, "render while a step is pending");
    atomic_store(&g_gate_release, 1);
    while (!envd_vec_step_done(h.vec)) {
        CHECK(now_s() < deadline, "released step not done");
        sched_yield();
    }
    finish(&h);
    CHECK(h.rewards[2] == (float)(((int64_t *)h.actions)[2] + 0.5), "reward of the gated step");
    CHECK(envd_vec_step_finish(h.vec) == ENVD_ESTATE, "finish without a submit");
    CHECK(envd_vec_render(h.vec, 2, pixel) == ENVD_OK && pixel[1] == 7, "render after finish");

    /* destroy while a step is pending waits for it (ASAN: no use after free) */
    atomic_store(&g_gate_started, 0);
    atomic_store(&g_gate_release, 0);
    fill_actions(&h);
    CHECK(envd_vec_step_submit(h.vec) == ENVD_OK, "second submit");
    pthread_t releaser;
    CHECK(pthread_create(&releaser, NULL, release_gate_later, NULL) == 0, "releaser thread");
    harness_free(&h);
    CHECK(atomic_load(&g_gate_release), "destroy returned before the pending step ended");
    pthread_join(releaser, NULL);
}

/* ---- rendering --------------------------------------------------------------------- */
/* Every built-in draws exactly its frame (ASAN: frames are heap blocks of
 * exactly envd_vec_frame_bytes, so a pixel out of bounds is caught), the
 * frame follows the state, and the refusals come before any drawing. */
static void test_render(envd_pool_t *pool)
{
    for (int e = 0; e < builtin_count(); e++) {
        const envd_env_def_t *def = builtin_get(e);
        harness_t h;
        harness_init(&h, def, 3, ENVD_AUTORESET_NEXT_STEP, 0, 11);
        harness_create(&h, pool, 0);
        const size_t bytes = (size_t)envd_vec_frame_bytes(h.vec);
        int32_t width = 0, height = 0;
        CHECK(envd_env_def_render_info(def, &width, &height, NULL) &&
              bytes == (size_t)width * (size_t)height * 3, "%s: frame bytes", def->id);
        uint8_t *before = xcalloc(1, bytes), *after = xcalloc(1, bytes);
        CHECK(envd_vec_render(h.vec, 0, before) == ENVD_ESTATE, "%s: render before reset",
              def->id);
        harness_reset(&h, 5);
        CHECK(envd_vec_render(h.vec, -1, before) == ENVD_ERANGE, "%s: index -1", def->id);
        CHECK(envd_vec_render(h.vec, 3, before) == ENVD_ERANGE, "%s: index n", def->id);
        CHECK(envd_vec_render(h.vec, 0, NULL) == ENVD_EINVAL, "%s: NULL frame", def->id);
        CHECK(envd_vec_render(h.vec, 1, before) == ENVD_OK, "%s: render", def->id);
        bool drawn = false;
        for (size_t k = 3; k < bytes && !drawn; k++)
            drawn = before[k] != before[k % 3];
        CHECK(drawn, "%s: the frame is one colour", def->id);
        for (int t = 0; t < 40; t++) { /* enough for a mountain car to move pixels */
            fill_actions(&h);
            step_ok(&h, def->id);
        }
        CHECK(envd_vec_render(h.vec, 1, after) == ENVD_OK, "%s: render after steps", def->id);
        CHECK(memcmp(before, after, bytes) != 0, "%s: the frame did not follow the state",
              def->id);
        free(before);
        free(after);
        harness_free(&h);
    }
    harness_t h; /* an env without a render callback draws nothing */
    harness_init(&h, &test_env, 2, ENVD_AUTORESET_NEXT_STEP, 0, 3);
    harness_create(&h, pool, 0);
    harness_reset(&h, 1);
    uint8_t pixel[3] = {1, 2, 3};
    CHECK(envd_vec_frame_bytes(h.vec) == 0, "test env: frame bytes");
    CHECK(envd_vec_render(h.vec, 0, pixel) == ENVD_EINVAL && pixel[0] == 1,
          "test env: render without a callback");
    harness_free(&h);
}

/* ---- async batches ---------------------------------------------------------------- */
/* Short episodes, so that every env ends several inside the few steps a batch
 * run takes and the autoreset paths run inside batches. */
enum { BATCH_TIME_LIMIT = 8, MAX_BATCHES = 4 };

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Env i's t-th action (t from 0): a function of (i, t) and the harness seed
 * only, so runs that group the env steps differently send the same actions. */
static void env_action(harness_t *h, int64_t i, int64_t t)
{
    uint64_t s = mix64(h->act_state ^ mix64(((uint64_t)i << 32) ^ (uint64_t)t)) | 1;
    fill_env_action(h, i, &s);
}

static bool env_done(const harness_t *h, int64_t i)
{
    return h->terms[i] || h->truncs[i];
}

/* Env i's outputs (final obs in SAME_STEP mode included) folded into d. */
static uint64_t env_hash(const harness_t *h, uint64_t d, int64_t i)
{
    d = hash_bytes(d, h->obs + (size_t)i * h->obs_bytes, h->obs_bytes);
    d = hash_bytes(d, &h->rewards[i], sizeof h->rewards[i]);
    d = hash_bytes(d, &h->terms[i], sizeof h->terms[i]);
    d = hash_bytes(d, &h->truncs[i], sizeof h->truncs[i]);
    d = hash_bytes(d, &h->returns[i], sizeof h->returns[i]);
    d = hash_bytes(d, &h->lengths[i], sizeof h->lengths[i]);
    if (h->final_obs)
        d = hash_bytes(d, h->final_obs + (size_t)i * h->obs_bytes, h->obs_bytes);
    return d;
}

/* After env i stepped: the per-step invariants, then its outputs into its
 * running hash. */
static uint64_t env_record(const harness_t *h, uint64_t d, int64_t i)
{
    bool done = env_done(h, i);
    CHECK(done == (h->lengths[i] > 0), "%s env %lld: done %d but episode length %lld",
          h->def->id, (long long)i, done, (long long)h->lengths[i]);
    CHECK(done || h->returns[i] == 0.0, "%s env %lld: return without an episode end",
          h->def->id, (long long)i);
    return env_hash(h, d, i);
}

/* Resets the envs in h->mask (DISABLED mode: done ones), folds their new
 * observation into their hash and clears the mask. */
static void reset_masked(harness_t *h, uint64_t *hashes)
{
    int rc = envd_vec_reset(h->vec, NULL, h->mask);
    CHECK(rc == ENVD_OK, "%s: masked reset: %s", h->def->id, envd_strerror(rc));
    for (int64_t i = 0; i < h->n; i++) {
        if (h->mask[i])
            hashes[i] = hash_bytes(hashes[i], h->obs + (size_t)i * h->obs_bytes, h->obs_bytes);
        h->mask[i] = false;
    }
}

/* The reference: a serial vec stepped `steps` times with envd_vec_step, env
 * i's t-th step with env_action(i, t); want[i] hashes env i's reset and
 * outputs after each step (and its masked resets in DISABLED mode). */
static void batch_reference(const envd_env_def_t *def, int64_t n, int mode, int steps,
                            uint64_t *want)
{
    harness_t h;
    harness_init(&h, def, n, mode, BATCH_TIME_LIMIT, action_seed(n));
    harness_create(&h, NULL, 0);
    harness_reset(&h, SEED_BASE);
    for (int64_t i = 0; i < n; i++)
        want[i] = env_hash(&h, 0xcbf29ce484222325ull, i);
    for (int t = 0; t < steps; t++) {
        for (int64_t i = 0; i < n; i++)
            env_action(&h, i, t);
        step_ok(&h, "batch reference");
        for (int64_t i = 0; i < n; i++) {
            want[i] = env_record(&h, want[i], i);
            h.mask[i] = mode == ENVD_AUTORESET_DISABLED && env_done(&h, i);
        }
        reset_masked(&h, want);
    }
    harness_free(&h);
}

/* A vec driven by random batches; h.mask marks DISABLED envs waiting for
 * their reset (which needs every batch finished). */
typedef struct async_run {
    harness_t h;
    envd_vec_batch_t *batch[MAX_BATCHES];
    int64_t *ids[MAX_BATCHES]; /* the envs of each batch in flight */
    int64_t count[MAX_BATCHES];
    int64_t cap[MAX_BATCHES];
    bool flying[MAX_BATCHES];
    int64_t *steps; /* per env: steps finished */
    bool *busy;     /* per env: in a batch in flight */
    uint64_t *hashes;
    bool forced;    /* threads and a forced chunk: every run is pooled */
    int efd;
    uint64_t expected, counted; /* pooled NOTIFY runs; eventfd counts read */
    uint64_t r;
    char what[160];
} async_run_t;

static void async_drain(async_run_t *a)
{
    if (a->efd >= 0)
        a->counted += drain_eventfd(a->efd);
}

/* Submit ids (a scratch array: scribbled over afterwards, the batch keeps a
 * copy) on batch slot, with each env's next action. */
static void async_submit(async_run_t *a, int slot, int64_t *ids, int64_t count)
{
    for (int64_t k = 0; k < count; k++)
        env_action(&a->h, ids[k], a->steps[ids[k]]);
    int flags = rnd(&a->r) % 2 ? ENVD_JOB_NOTIFY : 0;
    envd_vec_stats_t before, after;
    envd_vec_get_stats(a->h.vec, &before);
    int rc = envd_vec_batch_submit(a->h.vec, a->batch[slot], ids, count, flags);
    CHECK(rc == ENVD_OK, "%s: submit of %lld envs: %s (env %lld)", a->what, (long long)count,
          envd_strerror(rc), (long long)envd_vec_error_index(a->h.vec));
    envd_vec_get_stats(a->h.vec, &after);
    int64_t pooled = after.pooled_jobs - before.pooled_jobs;
    CHECK(pooled + after.inline_jobs - before.inline_jobs == 1 && pooled >= 0,
          "%s: a submit counted %lld pooled, %lld inline runs", a->what, (long long)pooled,
          (long long)(after.inline_jobs - before.inline_jobs));
    CHECK(!a->forced || pooled == 1, "%s: forced chunk, batch ran inline", a->what);
    if (flags & ENVD_JOB_NOTIFY)
        a->expected += (uint64_t)pooled;
    CHECK(envd_vec_batch_size(a->batch[slot]) == count, "%s: batch size %lld, submitted %lld",
          a->what, (long long)envd_vec_batch_size(a->batch[slot]), (long long)count);
    memcpy(a->ids[slot], ids, (size_t)count * sizeof *ids);
    a->count[slot] = count;
    a->flying[slot] = true;
    for (int64_t k = 0; k < count; k++)
        a->busy[ids[k]] = true;
    memset(ids, 0xff, (size_t)count * sizeof *ids);
}

/* Wait for batch slot (polling done, batch_wait, finish until not EBUSY, or
 * the eventfd), finish it and record its envs. */
static void async_finish(async_run_t *a, int slot)
{
    envd_vec_t *vec = a->h.vec;
    envd_vec_batch_t *b = a->batch[slot];
    const double deadline = now_s() + 30.0;
    int rc = ENVD_EBUSY;
    switch (rnd(&a->r) % 4) {
    case 0:
        while (!envd_vec_batch_done(b)) {
            CHECK(now_s() < deadline, "%s: batch not done after 30 s", a->what);
            sched_yield();
        }
        break;
    case 1:
        envd_vec_batch_wait(vec, b);
        CHECK(envd_vec_batch_done(b), "%s: batch not done after wait", a->what);
        break;
    case 2:
        rc = envd_vec_batch_finish(vec, b);
        if (rc == ENVD_EBUSY) {
            envd_vec_batch_wait(vec, b);
            rc = envd_vec_batch_finish(vec, b);
        }
        break;
    default:
        while (!envd_vec_batch_done(b)) {
            CHECK(now_s() < deadline, "%s: batch not done after 30 s", a->what);
            if (a->efd >= 0) {
                struct pollfd pfd = {.fd = a->efd, .events = POLLIN};
                CHECK(poll(&pfd, 1, 1) >= 0, "poll: %s", strerror(errno));
                async_drain(a);
            } else {
                sched_yield();
            }
        }
        break;
    }
    if (rc == ENVD_EBUSY)
        rc = envd_vec_batch_finish(vec, b);
    CHECK(rc >= 0, "%s: finish: %s (env %lld)", a->what, envd_strerror(rc),
          (long long)envd_vec_error_index(vec));
    int64_t done = 0;
    for (int64_t k = 0; k < a->count[slot]; k++) {
        int64_t i = a->ids[slot][k];
        a->hashes[i] = env_record(&a->h, a->hashes[i], i);
        a->steps[i]++;
        a->busy[i] = false;
        done += env_done(&a->h, i);
        a->h.mask[i] = a->h.cfg.autoreset_mode == ENVD_AUTORESET_DISABLED && env_done(&a->h, i);
    }
    CHECK(rc == done, "%s: finish returned %d, %lld of the batch's envs done", a->what, rc,
          (long long)done);
    CHECK(envd_vec_batch_finish(vec, b) == ENVD_ESTATE, "%s: second finish", a->what);
    a->flying[slot] = false;
}

/* Every env one step, by envd_vec_step or the split API, between batches. */
static void async_whole_step(async_run_t *a)
{
    envd_vec_t *vec = a->h.vec;
    for (int64_t i = 0; i < a->h.n; i++)
        env_action(&a->h, i, a->steps[i]);
    int rc;
    if (rnd(&a->r) % 2) {
        rc = envd_vec_step(vec);
    } else {
        envd_vec_stats_t before, after;
        envd_vec_get_stats(vec, &before);
        CHECK(envd_vec_step_submit(vec) == ENVD_OK, "%s: step submit", a->what);
        envd_vec_get_stats(vec, &after);
        a->expected += (uint64_t)(after.pooled_jobs - before.pooled_jobs);
        const double deadline = now_s() + 30.0;
        while (!envd_vec_step_done(vec)) {
            CHECK(now_s() < deadline, "%s: step not done after 30 s", a->what);
            sched_yield();
        }
        rc = envd_vec_step_finish(vec);
    }
    CHECK(rc >= 0 && rc == envd_vec_num_done(vec), "%s: whole step between batches: %s",
          a->what, rc < 0 ? envd_strerror(rc) : "num_done differs");
    int64_t done = 0;
    for (int64_t i = 0; i < a->h.n; i++) {
        a->hashes[i] = env_record(&a->h, a->hashes[i], i);
        a->steps[i]++;
        done += env_done(&a->h, i);
        a->h.mask[i] = a->h.cfg.autoreset_mode == ENVD_AUTORESET_DISABLED && env_done(&a->h, i);
    }
    CHECK(rc == done, "%s: step returned %d, %lld envs done", a->what, rc, (long long)done);
}

/* Random rounds: submit 1-3 batches on a random subset of the idle envs (in
 * random order), then finish a random part of the batches in flight in random
 * order; now and then a whole-vec step while nothing is in flight.  Envs that
 * have taken `steps` steps are no longer sent.  Each env's hash must equal the
 * reference's; the eventfd must count exactly the pooled NOTIFY runs. */
static void async_run(const envd_env_def_t *def, int64_t n, int mode, envd_pool_t *pool,
                      int64_t chunk, int steps, const uint64_t *want)
{
    async_run_t a;
    memset(&a, 0, sizeof a);
    const int threads = pool ? envd_pool_num_threads(pool) : 0;
    snprintf(a.what, sizeof a.what, "batches %s n=%lld %s threads=%d chunk=%lld", def->id,
             (long long)n, mode_name(mode), threads, (long long)chunk);
    harness_init(&a.h, def, n, mode, BATCH_TIME_LIMIT, action_seed(n));
    harness_create(&a.h, pool, chunk);
    harness_reset(&a.h, SEED_BASE);
    a.forced = threads > 0 && chunk > 0 && g_max_threads != 0;
    a.r = mix64((uint64_t)n * 1000003u + (uint64_t)mode * 101u + (uint64_t)threads * 13u +
                (uint64_t)chunk * 3u + (pool != NULL)) | 1;
    a.steps = xcalloc((size_t)n, sizeof *a.steps);
    a.busy = xcalloc((size_t)n, sizeof *a.busy);
    a.hashes = xcalloc((size_t)n, sizeof *a.hashes);
    int64_t *cand = xcalloc((size_t)n, sizeof *cand);
    for (int64_t i = 0; i < n; i++)
        a.hashes[i] = env_hash(&a.h, 0xcbf29ce484222325ull, i);
    for (int s = 0; s < MAX_BATCHES; s++) {
        /* capacities from 1 (only single-env batches) to n */
        a.cap[s] = s == 0 ? 1 : s == 1 ? (n + 1) / 2 : n;
        int rc = envd_vec_batch_create(&a.batch[s], a.cap[s]);
        CHECK(rc == ENVD_OK, "batch create: %s", envd_strerror(rc));
        a.ids[s] = xcalloc((size_t)n, sizeof *a.ids[s]);
    }
    a.efd = pool ? envd_pool_eventfd(pool) : -1;
    if (a.efd >= 0)
        while (drain_eventfd(a.efd))
            ; /* counts left by earlier tests on this pool */

    for (;;) {
        int64_t nc = 0;
        for (int64_t i = 0; i < n; i++)
            if (!a.busy[i] && !a.h.mask[i] && a.steps[i] < steps)
                cand[nc++] = i;
        int flying = 0;
        for (int s = 0; s < MAX_BATCHES; s++)
            flying += a.flying[s];
        if (flying == 0) {
            bool resets = false;
            for (int64_t i = 0; i < n; i++)
                resets |= a.h.mask[i];
            if (resets) {
                reset_masked(&a.h, a.hashes);
                continue;
            }
            if (nc == 0)
                break; /* every env took `steps` steps */
            if (nc == n && rnd(&a.r) % 6 == 0) {
                async_whole_step(&a);
                continue;
            }
        }
        if (nc > 0 && flying < MAX_BATCHES) {
            for (int64_t k = nc - 1; k > 0; k--) {
                int64_t j = (int64_t)(rnd(&a.r) % (uint64_t)(k + 1));
                int64_t t = cand[k];
                cand[k] = cand[j];
                cand[j] = t;
            }
            int64_t m = 1 + (int64_t)(rnd(&a.r) % (uint64_t)nc), off = 0;
            int parts = 1 + (int)(rnd(&a.r) % 3);
            for (int s = 0; s < MAX_BATCHES && off < m && parts > 0; s++) {
                if (a.flying[s])
                    continue;
                int64_t left = m - off;
                int64_t size = parts == 1 ? left : 1 + (int64_t)(rnd(&a.r) % (uint64_t)left);
                if (size > a.cap[s])
                    size = a.cap[s];
                async_submit(&a, s, cand + off, size);
                off += size;
                parts--;
            }
        }
        int order[MAX_BATCHES], num = 0;
        bool all = rnd(&a.r) % 4 == 0;
        for (int s = 0; s < MAX_BATCHES; s++)
            if (a.flying[s] && (all || rnd(&a.r) % 2))
                order[num++] = s;
        if (num == 0)
            for (int s = (int)(rnd(&a.r) % MAX_BATCHES); num == 0; s = (s + 1) % MAX_BATCHES)
                if (a.flying[s])
                    order[num++] = s;
        for (int k = num - 1; k > 0; k--) {
            int j = (int)(rnd(&a.r) % (uint64_t)(k + 1));
            int t = order[k];
            order[k] = order[j];
            order[j] = t;
        }
        for (int k = 0; k < num; k++)
            async_finish(&a, order[k]);
        async_drain(&a);
    }

    for (int64_t i = 0; i < n; i++) {
        CHECK(a.steps[i] == steps, "%s: env %lld took %lld steps", a.what, (long long)i,
              (long long)a.steps[i]);
        CHECK(a.hashes[i] == want[i], "%s: env %lld differs from the envd_vec_step run",
              a.what, (long long)i);
    }
    if (a.efd >= 0) {
        /* completion is flagged before the eventfd write */
        const double deadline = now_s() + 30.0;
        while (a.counted < a.expected) {
            struct pollfd pfd = {.fd = a.efd, .events = POLLIN};
            CHECK(poll(&pfd, 1, 100) >= 0, "poll: %s", strerror(errno));
            async_drain(&a);
            CHECK(now_s() < deadline, "%s: eventfd total %llu of %llu", a.what,
                  (unsigned long long)a.counted, (unsigned long long)a.expected);
        }
        CHECK(a.counted == a.expected, "%s: eventfd counted %llu, pooled NOTIFY runs %llu",
              a.what, (unsigned long long)a.counted, (unsigned long long)a.expected);
        CHECK(drain_eventfd(a.efd) == 0, "%s: eventfd has extra counts", a.what);
    }
    for (int s = 0; s < MAX_BATCHES; s++) {
        envd_vec_batch_destroy(a.batch[s]);
        free(a.ids[s]);
    }
    harness_free(&a.h);
    free(a.steps);
    free(a.busy);
    free(a.hashes);
    free(cand);
}

static void test_batches(envd_pool_t *const *pools, int num_pools, int steps)
{
    static const int64_t sizes[] = {1, 11};
    uint64_t *want = xcalloc(11, sizeof *want);
    for (int e = 0; e < builtin_count(); e++) {
        const envd_env_def_t *def = builtin_get(e);
        for (size_t si = 0; si < COUNT(sizes); si++) {
            int64_t n = sizes[si];
            for (int mode = 0; mode < 3; mode++) {
                batch_reference(def, n, mode, steps, want);
                async_run(def, n, mode, NULL, 0, steps, want);
                for (int p = 0; p < num_pools; p++) {
                    static const int64_t chunks[] = {0, 1, 3};
                    int num_chunks = envd_pool_num_threads(pools[p]) > 0 ? (int)COUNT(chunks) : 1;
                    for (int c = 0; c < num_chunks; c++)
                        async_run(def, n, mode, pools[p], chunks[c], steps, want);
                }
            }
        }
    }
    free(want);
}

/* ---- async batches: error paths, in flight, failing callbacks -------------------- */
/* Hash of the outputs of the envs not marked in skip (NULL: none marked); a
 * batch in flight may be writing the marked ones. */
static uint64_t quiet_digest(const harness_t *h, const bool *skip)
{
    uint64_t d = 0xcbf29ce484222325ull;
    for (int64_t i = 0; i < h->n; i++)
        if (!skip || !skip[i])
            d = env_hash(h, d, i);
    return d;
}

/* A submit that must be refused with `want` and start nothing: no run
 * counted, no output written, the batch not in flight (if it was idle);
 * index >= 0: the env envd_vec_error_index must name. */
static void expect_batch_rejected(harness_t *h, envd_vec_batch_t *b, bool batch_idle,
                                  const int64_t *ids, int64_t count, int flags, int want,
                                  int64_t index, const bool *skip, const char *what)
{
    uint64_t before = quiet_digest(h, skip);
    envd_vec_stats_t s0, s1;
    envd_vec_get_stats(h->vec, &s0);
    int rc = envd_vec_batch_submit(h->vec, b, ids, count, flags);
    CHECK(rc == want, "%s: got %s, want %s", what, envd_strerror(rc), envd_strerror(want));
    if (index >= 0)
        CHECK(envd_vec_error_index(h->vec) == index, "%s: error index %lld, want %lld", what,
              (long long)envd_vec_error_index(h->vec), (long long)index);
    envd_vec_get_stats(h->vec, &s1);
    CHECK(s1.inline_jobs == s0.inline_jobs && s1.pooled_jobs == s0.pooled_jobs,
          "%s: a rejected submit ran", what);
    CHECK(quiet_digest(h, skip) == before, "%s: a rejected submit wrote outputs", what);
    if (batch_idle)
        CHECK(envd_vec_batch_finish(h->vec, b) == ENVD_ESTATE,
              "%s: the rejected batch is in flight", what);
}

/* Waits for a submitted batch of ids and finishes it: the number of its envs
 * done must come back. */
static int batch_wait_finish(harness_t *h, envd_vec_batch_t *b, const int64_t *ids,
                             int64_t count, const char *what)
{
    envd_vec_batch_wait(h->vec, b);
    CHECK(envd_vec_batch_done(b), "%s: not done after wait", what);
    int rc = envd_vec_batch_finish(h->vec, b);
    CHECK(rc >= 0, "%s: finish: %s (env %lld)", what, envd_strerror(rc),
          (long long)envd_vec_error_index(h->vec));
    int64_t done = 0;
    for (int64_t k = 0; k < count; k++)
        done += env_done(h, ids[k]);
    CHECK(rc == done, "%s: finish returned %d, %lld envs done", what, rc, (long long)done);
    return rc;
}

static int batch_run(harness_t *h, envd_vec_batch_t *b, const int64_t *ids, int64_t count,
                     int flags, const char *what)
{
    int rc = envd_vec_batch_submit(h->vec, b, ids, count, flags);
    CHECK(rc == ENVD_OK, "%s: submit: %s (env %lld)", what, envd_strerror(rc),
          (long long)envd_vec_error_index(h->vec));
    return batch_wait_finish(h, b, ids, count, what);
}

/* A vec under test and its twin (serial, never sees a rejected call),
 * stepped with the same per-env action sequences (t: steps taken). */
typedef struct twin_pair {
    harness_t h, twin;
    envd_vec_batch_t *tb; /* the twin's batch, capacity n */
    int64_t t[8];  /* n <= 8 */
    bool all[8];   /* skip mask for quiet_digest: every env */
} twin_pair_t;

static void pair_actions(twin_pair_t *p, const int64_t *ids, int64_t count)
{
    for (int64_t k = 0; k < count; k++) {
        env_action(&p->h, ids[k], p->t[ids[k]]);
        env_action(&p->twin, ids[k], p->t[ids[k]]);
    }
}

static void pair_same(twin_pair_t *p, const char *what)
{
    CHECK(digest(&p->h) == digest(&p->twin), "%s: the vec differs from its twin", what);
}

/* ids already stepped on h (finished): the same on the twin. */
static void pair_twin_batch(twin_pair_t *p, const int64_t *ids, int64_t count, int rc,
                            const char *what)
{
    CHECK(batch_run(&p->twin, p->tb, ids, count, 0, what) == rc, "%s: twin differs", what);
    for (int64_t k = 0; k < count; k++)
        p->t[ids[k]]++;
}

static void pair_batch(twin_pair_t *p, envd_vec_batch_t *b, const int64_t *ids, int64_t count,
                       const char *what)
{
    pair_actions(p, ids, count);
    int rc = batch_run(&p->h, b, ids, count, ENVD_JOB_NOTIFY, what);
    pair_twin_batch(p, ids, count, rc, what);
    pair_same(p, what);
}

static void pair_step(twin_pair_t *p, const char *what)
{
    static const int64_t every[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    pair_actions(p, every, p->h.n);
    step_ok(&p->h, what);
    step_ok(&p->twin, what);
    for (int64_t i = 0; i < p->h.n; i++)
        p->t[i]++;
    pair_same(p, what);
}

/* DISABLED mode: reset the done envs of both (nothing in flight). */
static void pair_settle(twin_pair_t *p)
{
    if (p->h.cfg.autoreset_mode != ENVD_AUTORESET_DISABLED)
        return;
    bool any = false;
    for (int64_t i = 0; i < p->h.n; i++) {
        p->h.mask[i] = p->twin.mask[i] = env_done(&p->h, i);
        any |= p->h.mask[i];
    }
    if (!any)
        return;
    CHECK(envd_vec_reset(p->h.vec, NULL, p->h.mask) == ENVD_OK, "settle reset");
    CHECK(envd_vec_reset(p->twin.vec, NULL, p->twin.mask) == ENVD_OK, "settle reset (twin)");
    pair_same(p, "settle");
}

/* Whole-vec calls while a batch is in flight: EBUSY, nothing written. */
static void expect_vec_busy(harness_t *h, const bool *skip, const char *what)
{
    uint64_t before = quiet_digest(h, skip);
    envd_vec_stats_t s0, s1;
    envd_vec_get_stats(h->vec, &s0);
    bool mask[8] = {false};
    for (int64_t i = 0; i < h->n; i++)
        mask[i] = !skip[i];
    CHECK(envd_vec_step(h->vec) == ENVD_EBUSY, "%s: step", what);
    CHECK(envd_vec_step_submit(h->vec) == ENVD_EBUSY, "%s: step_submit", what);
    CHECK(envd_vec_step_finish(h->vec) == ENVD_ESTATE, "%s: step_finish", what);
    CHECK(envd_vec_reset(h->vec, NULL, NULL) == ENVD_EBUSY, "%s: reset", what);
    CHECK(envd_vec_reset(h->vec, NULL, mask) == ENVD_EBUSY, "%s: masked reset", what);
    envd_vec_get_stats(h->vec, &s1);
    CHECK(s1.inline_jobs == s0.inline_jobs && s1.pooled_jobs == s0.pooled_jobs,
          "%s: a refused call ran", what);
    CHECK(quiet_digest(h, skip) == before, "%s: a refused call wrote outputs", what);
}

#define IDS(...) ((const int64_t[]){__VA_ARGS__}), (int64_t)COUNT(((const int64_t[]){__VA_ARGS__}))

/* Every documented refusal of envd_vec_batch_submit, with nothing in flight,
 * with a batch in flight and with a whole-vec step pending; after each the
 * vec continues exactly like a twin that never saw the refused call, and the
 * refused envs can be sent. */
static void test_batch_errors(envd_pool_t *pool, int64_t chunk, int mode)
{
    test_env_setup();
    enum { N = 8, CAP = 5 };
    const int64_t n = N;
    twin_pair_t pair, *p = &pair;
    memset(p, 0, sizeof *p);
    for (int i = 0; i < N; i++)
        p->all[i] = true;
    harness_init(&p->h, &test_env, n, mode, 0, 12);
    harness_init(&p->twin, &test_env, n, mode, 0, 12);
    harness_create(&p->h, pool, chunk);
    g_test.init_calls = 0; /* the test env's instance numbers restart for the twin */
    harness_create(&p->twin, NULL, 0);
    harness_t *h = &p->h;
    envd_vec_batch_t *b0, *b1;
    CHECK(envd_vec_batch_create(&b0, CAP) == ENVD_OK && envd_vec_batch_create(&b1, CAP) ==
              ENVD_OK && envd_vec_batch_create(&p->tb, n) == ENVD_OK, "batch create");

    /* capacity outside [1, ENVD_VEC_MAX_ENVS] */
    const int64_t bad_caps[] = {0, -1, INT64_MIN, ENVD_VEC_MAX_ENVS + 1, INT64_MAX};
    for (size_t i = 0; i < COUNT(bad_caps); i++) {
        envd_vec_batch_t *bad = (envd_vec_batch_t *)(void *)&not_null_target;
        CHECK(envd_vec_batch_create(&bad, bad_caps[i]) == ENVD_EINVAL && bad == NULL,
              "batch capacity %lld accepted", (long long)bad_caps[i]);
    }
    envd_vec_batch_t *big = NULL;
    CHECK(envd_vec_batch_create(&big, ENVD_VEC_MAX_ENVS) == ENVD_OK && big,
          "batch of ENVD_VEC_MAX_ENVS");
    envd_vec_batch_destroy(big);
    envd_vec_batch_destroy(NULL);

    /* envs never reset: ESTATE naming the env */
    CHECK(envd_vec_batch_finish(h->vec, b0) == ENVD_ESTATE, "finish without a submit");
    expect_batch_rejected(h, b0, true, IDS(3), 0, ENVD_ESTATE, 3, NULL, "batch before reset");
    const bool first[N] = {true, true, true, true, true, false, true, true};
    CHECK(envd_vec_reset(h->vec, NULL, first) == ENVD_OK, "masked first reset");
    CHECK(envd_vec_reset(p->twin.vec, NULL, first) == ENVD_OK, "masked first reset (twin)");
    expect_batch_rejected(h, b0, true, IDS(1, 5, 2), ENVD_JOB_NOTIFY, ENVD_ESTATE, 5, NULL,
                          "batch with env 5 never reset");
    pair_batch(p, b0, IDS(2, 1), "the envs of a refused batch");
    harness_reset(h, 21);
    harness_reset(&p->twin, 21);
    pair_same(p, "reset");

    /* bad ids, counts and flags, nothing in flight */
    const struct {
        int64_t ids[CAP + 1];
        int64_t count;
        int flags, want;
        const char *what;
    } cases[] = {
        {{3, N}, 2, 0, ENVD_EINVAL, "id num_envs"},
        {{-1}, 1, 0, ENVD_EINVAL, "id -1"},
        {{INT64_MIN}, 1, ENVD_JOB_NOTIFY, ENVD_EINVAL, "id INT64_MIN"},
        {{0, INT64_MAX}, 2, 0, ENVD_EINVAL, "id INT64_MAX"},
        {{2, 2}, 2, 0, ENVD_EBUSY, "id twice"},
        {{4, 1, 4}, 3, ENVD_JOB_NOTIFY, ENVD_EBUSY, "id twice, apart"},
        {{0}, 0, 0, ENVD_EINVAL, "count 0"},
        {{0}, -1, 0, ENVD_EINVAL, "count -1"},
        {{0, 1, 2, 3, 4, 5}, CAP + 1, 0, ENVD_EINVAL, "count above capacity"},
        {{0}, 1, 4, ENVD_EINVAL, "flags 4"},
        {{0}, 1, -1, ENVD_EINVAL, "flags -1"},
        {{0}, 1, ENVD_JOB_NOTIFY | 4, ENVD_EINVAL, "flags NOTIFY | 4"},
    };
    for (size_t c = 0; c < COUNT(cases); c++)
        expect_batch_rejected(h, b0, true, cases[c].ids, cases[c].count, cases[c].flags,
                              cases[c].want, -1, NULL, cases[c].what);
    /* runs of ids (claimed as one block when accepted: claim_run) that are
     * not in range: past num_envs, or a run only in wrapping arithmetic;
     * the per-env loop names the first bad id */
    expect_batch_rejected(h, b0, true, IDS(6, 7, 8), 0, ENVD_EINVAL, 8, NULL, "a run past N");
    expect_batch_rejected(h, b0, true, IDS(INT64_MAX, INT64_MIN), 0, ENVD_EINVAL, INT64_MAX,
                          NULL, "a run wrapping past INT64_MAX");
    /* discrete actions out of range (test env: start -1, n 3) */
    const int64_t bad_actions[] = {-2, 2, INT64_MIN, INT64_MAX};
    int64_t *act = (int64_t *)h->actions;
    for (size_t k = 0; k < COUNT(bad_actions); k++) {
        int64_t good = act[6];
        act[6] = bad_actions[k];
        expect_batch_rejected(h, b0, true, IDS(0, 6), 0, ENVD_ERANGE, 6, NULL, "bad action");
        act[6] = good;
    }
    pair_batch(p, b0, IDS(2, 4, 0, 6), "the envs of refused batches");
    pair_batch(p, b1, IDS(1, 3, 5, 7), "the other envs");
    pair_settle(p);

    /* a batch in flight (maybe still running: its envs are not looked at) */
    bool flying[N] = {false};
    pair_actions(p, IDS(0, 1, 2));
    CHECK(envd_vec_batch_submit(h->vec, b0, IDS(0, 1, 2), ENVD_JOB_NOTIFY) == ENVD_OK,
          "submit");
    flying[0] = flying[1] = flying[2] = true;
    expect_batch_rejected(h, b1, true, IDS(3, 1), 0, ENVD_EBUSY, -1, flying,
                          "env in a batch in flight");
    expect_batch_rejected(h, b1, true, IDS(3, 3), 0, ENVD_EBUSY, -1, flying, "id twice");
    expect_batch_rejected(h, b1, true, IDS(2, 3, 4), 0, ENVD_EBUSY, 2, flying,
                          "a run starting on an env in flight");
    expect_batch_rejected(h, b1, true, IDS(-1, 0, 1), 0, ENVD_EINVAL, -1, flying,
                          "a run from -1 over envs in flight");
    expect_batch_rejected(h, b0, false, IDS(4), 0, ENVD_EBUSY, -1, flying, "batch in flight");
    expect_batch_rejected(h, b0, false, IDS(0), ENVD_JOB_NOTIFY, ENVD_EBUSY, -1, flying,
                          "batch in flight, its own env");
    expect_batch_rejected(h, b1, true, IDS(4, N), 0, ENVD_EINVAL, -1, flying, "id num_envs");
    expect_batch_rejected(h, b1, true, IDS(4), 8, ENVD_EINVAL, -1, flying, "flags 8");
    act[4] = 2;
    expect_batch_rejected(h, b1, true, IDS(3, 4), 0, ENVD_ERANGE, 4, flying, "bad action");
    expect_vec_busy(h, flying, "batch in flight");
    CHECK(envd_vec_batch_finish(p->twin.vec, b0) == ENVD_ESTATE, "finish on another vec");
    pair_actions(p, IDS(4, 3));
    CHECK(envd_vec_batch_submit(h->vec, b1, IDS(4, 3), 0) == ENVD_OK,
          "the envs of refused batches, next to a batch in flight");
    int rc1 = batch_wait_finish(h, b1, IDS(4, 3), "second batch");
    int rc0 = batch_wait_finish(h, b0, IDS(0, 1, 2), "first batch");
    pair_twin_batch(p, IDS(0, 1, 2), rc0, "first batch");
    pair_twin_batch(p, IDS(4, 3), rc1, "second batch");
    pair_same(p, "after the refusals in flight");
    pair_settle(p);

    /* a run whose middle or last env is in flight (claim_run looks at every
     * env of a run; the per-env loop names the one in flight) */
    bool five[N] = {false};
    five[5] = true;
    pair_actions(p, IDS(5));
    CHECK(envd_vec_batch_submit(h->vec, b0, IDS(5), 0) == ENVD_OK, "submit env 5");
    expect_batch_rejected(h, b1, true, IDS(3, 4, 5, 6), 0, ENVD_EBUSY, 5, five,
                          "a run over an env in flight");
    expect_batch_rejected(h, b1, true, IDS(4, 5), ENVD_JOB_NOTIFY, ENVD_EBUSY, 5, five,
                          "a run ending on an env in flight");
    rc0 = batch_wait_finish(h, b0, IDS(5), "env 5");
    pair_twin_batch(p, IDS(5), rc0, "env 5");
    pair_same(p, "after the runs refused");
    pair_settle(p);
    pair_batch(p, b1, IDS(3, 4, 5, 6), "the run refused");
    pair_settle(p);

    /* a whole-vec step pending */
    pair_actions(p, IDS(0, 1, 2, 3, 4, 5, 6, 7));
    CHECK(envd_vec_step_submit(h->vec) == ENVD_OK, "step submit");
    expect_batch_rejected(h, b0, true, IDS(0), 0, ENVD_EBUSY, -1, p->all, "whole step pending");
    const double deadline = now_s() + 30.0;
    while (!envd_vec_step_done(h->vec)) {
        CHECK(now_s() < deadline, "step not done after 30 s");
        sched_yield();
    }
    int rc = envd_vec_step_finish(h->vec);
    CHECK(rc >= 0 && rc == envd_vec_step(p->twin.vec), "split step vs twin");
    for (int i = 0; i < N; i++)
        p->t[i]++;
    pair_same(p, "whole step after a refused batch");
    pair_settle(p);

    /* batches and whole-vec steps interleaved */
    for (int round = 0; round < 3; round++) {
        pair_batch(p, b0, IDS(5, 6, 7), "batch before a step");
        pair_batch(p, b1, IDS(0), "batch before a step");
        pair_settle(p);
        pair_step(p, "step between batches");
        pair_settle(p);
        pair_batch(p, b1, IDS(1, 2, 3, 4), "batch after a step");
        pair_settle(p);
    }

    /* DISABLED: an env done and not reset is refused until a masked reset */
    if (mode == ENVD_AUTORESET_DISABLED) {
        int64_t d = -1;
        for (int s = 0; s < 10 && d < 0; s++) {
            pair_step(p, "step to an episode end");
            for (int64_t i = 0; i < n && d < 0; i++)
                if (env_done(h, i))
                    d = i;
        }
        CHECK(d >= 0, "no episode ended in 10 steps");
        int64_t other = -1;
        for (int64_t i = 0; i < n && other < 0; i++)
            if (!env_done(h, i))
                other = i;
        CHECK(other >= 0, "every env done");
        const int64_t ids[2] = {other, d};
        expect_batch_rejected(h, b0, true, ids, 2, 0, ENVD_ESTATE, d, NULL,
                              "DISABLED batch with a done env");
        pair_settle(p);
        pair_batch(p, b0, ids, 2, "the done env after its reset");
    }

    envd_vec_batch_destroy(b0);
    envd_vec_batch_destroy(b1);
    envd_vec_batch_destroy(p->tb);
    harness_free(&p->h);
    harness_free(&p->twin);
    CHECK(g_test.close_calls == 2 * n && g_test.bad_closes == 0, "closes %d, bad %d",
          g_test.close_calls, g_test.bad_closes);
}

/* A batch blocked in an env step: not done, finish says EBUSY and keeps its
 * envs; whole-vec calls are refused; a second batch on other envs can be sent
 * meanwhile; once released both complete. */
static void test_batch_in_flight(envd_pool_t *pool)
{
    test_env_setup();
    envd_env_def_t gated = test_env;
    gated.step = gate_step;
    harness_t h;
    harness_init(&h, &gated, 4, ENVD_AUTORESET_NEXT_STEP, 0, 7);
    harness_create(&h, pool, 2); /* one chunk per batch: a worker runs it */
    harness_reset(&h, 1);
    envd_vec_batch_t *b0, *b1;
    CHECK(envd_vec_batch_create(&b0, 2) == ENVD_OK && envd_vec_batch_create(&b1, 4) == ENVD_OK,
          "batch create");
    atomic_store(&g_gate_started, 0);
    atomic_store(&g_gate_release, 0);
    fill_actions(&h);
    CHECK(envd_vec_batch_submit(h.vec, b0, IDS(0, 1), ENVD_JOB_NOTIFY) == ENVD_OK, "submit");
    const double deadline = now_s() + 30.0;
    while (!atomic_load(&g_gate_started))
        CHECK(now_s() < deadline, "gated batch never started");
    CHECK(!envd_vec_batch_done(b0), "batch done while blocked");
    CHECK(envd_vec_batch_finish(h.vec, b0) == ENVD_EBUSY, "finish of a batch in flight");
    CHECK(!envd_vec_batch_done(b0), "batch done while blocked");
    const bool flying[4] = {true, true, false, false};
    /* the EBUSY finish did not release the envs or the batch */
    expect_batch_rejected(&h, b1, true, IDS(2, 1), 0, ENVD_EBUSY, -1, flying,
                          "env of a batch not finished");
    expect_batch_rejected(&h, b0, false, IDS(2), 0, ENVD_EBUSY, -1, flying,
                          "batch not finished");
    expect_vec_busy(&h, flying, "batch blocked");
    CHECK(envd_vec_batch_submit(h.vec, b1, IDS(3, 2), 0) == ENVD_OK, "second batch");
    atomic_store(&g_gate_release, 1);
    batch_wait_finish(&h, b1, IDS(3, 2), "second batch");
    while (!envd_vec_batch_done(b0)) {
        CHECK(now_s() < deadline, "released batch not done");
        sched_yield();
    }
    batch_wait_finish(&h, b0, IDS(0, 1), "released batch");
    for (int i = 0; i < 4; i++)
        CHECK(h.rewards[i] == (float)(((int64_t *)h.actions)[i] + 0.5), "reward of env %d", i);
    step_ok(&h, "step after the batches");
    envd_vec_batch_destroy(b0);
    envd_vec_batch_destroy(b1);
    harness_free(&h);
}

/* A failing env callback inside a batch, next to another batch in flight:
 * finish returns ENVD_EENV naming the env, and the envs are released. */
static void test_batch_callback_failure(envd_pool_t *pool, int64_t chunk)
{
    const int64_t n = 16;
    envd_vec_batch_t *b0, *b1;
    CHECK(envd_vec_batch_create(&b0, 4) == ENVD_OK && envd_vec_batch_create(&b1, 4) == ENVD_OK,
          "batch create");
    for (int entry = 0; entry < 2; entry++) {
        /* entry 0: a failing step; entry 1: a failing SAME_STEP autoreset */
        test_env_setup();
        harness_t h;
        harness_init(&h, &test_env, n, entry ? ENVD_AUTORESET_SAME_STEP : ENVD_AUTORESET_NEXT_STEP,
                     0, 6);
        harness_create(&h, pool, chunk);
        harness_reset(&h, 9);
        int64_t bad = entry ? 6 : 11;
        if (entry)
            g_test.fail_reset_id = 6; /* instance 6's episodes last 4 steps */
        else {
            g_test.fail_step_id = 11; /* instance 11: fails at its episode's step 2 */
            g_test.fail_step_at = 2;
        }
        const int steps_to_fail = entry ? 4 : 2;
        int rc = ENVD_OK;
        for (int s = 1; s <= steps_to_fail; s++) {
            fill_actions(&h);
            CHECK(envd_vec_batch_submit(h.vec, b0, IDS(3, bad, 7), ENVD_JOB_NOTIFY) == ENVD_OK,
                  "submit %d", s);
            CHECK(envd_vec_batch_submit(h.vec, b1, IDS(4, 5), 0) == ENVD_OK, "submit %d", s);
            batch_wait_finish(&h, b1, IDS(4, 5), "batch next to the failing one");
            envd_vec_batch_wait(h.vec, b0);
            rc = envd_vec_batch_finish(h.vec, b0);
            if (s < steps_to_fail)
                CHECK(rc >= 0, "step %d before the failing one: %s", s, envd_strerror(rc));
        }
        CHECK(rc == ENVD_EENV && envd_vec_error_index(h.vec) == bad,
              "failing batch (%s): %s, index %lld", entry ? "reset" : "step",
              envd_strerror(rc), (long long)envd_vec_error_index(h.vec));
        CHECK(envd_vec_batch_finish(h.vec, b0) == ENVD_ESTATE, "finish after the failure");
        g_test.fail_reset_id = g_test.fail_step_id = -1;
        fill_actions(&h);
        batch_run(&h, b0, IDS(bad, 7, 3), 0, "the envs of the failed batch");
        fill_actions(&h);
        step_ok(&h, "step after the failed batch");
        harness_free(&h);
        CHECK(g_test.close_calls == n && g_test.bad_closes == 0, "closes %d, bad %d",
              g_test.close_calls, g_test.bad_closes);
    }
    envd_vec_batch_destroy(b0);
    envd_vec_batch_destroy(b1);
}

/* create / reset / step / destroy over many shapes; LeakSanitizer checks that
 * nothing is left, including after failed creates. */
static void test_create_destroy(envd_pool_t *const *pools, int num_pools, int iters)
{
    uint64_t s = 0x0ddba11ull;
    for (int i = 0; i < iters; i++) {
        test_env_setup();
        int e = (int)(rnd(&s) % (uint64_t)(builtin_count() + 1));
        const envd_env_def_t *def = e < builtin_count() ? builtin_get(e) : &test_env;
        int64_t n = 1 + (int64_t)(rnd(&s) % 40);
        int mode = (int)(rnd(&s) % 3);
        envd_pool_t *pool = pools[rnd(&s) % (uint64_t)num_pools];
        harness_t h;
        harness_init(&h, def, n, mode, 5, rnd(&s));
        if (def == &test_env && i % 3 == 0) {
            g_test.fail_init_at = (int)(rnd(&s) % (uint64_t)n);
            envd_vec_t *vec = NULL;
            CHECK(envd_vec_create(&vec, def, &h.cfg, &h.bufs, pool) == ENVD_EENV,
                  "failing init");
            CHECK(g_test.close_calls == g_test.fail_init_at, "closes after failed init");
        } else {
            harness_create(&h, pool, (int64_t)(rnd(&s) % 4));
            if (i % 2) {
                harness_reset(&h, (uint64_t)i);
                for (int k = 0; k < 6; k++) {
                    fill_actions(&h);
                    step_ok(&h, "create/destroy loop");
                    after_step(&h);
                }
            }
        }
        harness_free(&h);
    }
}

/* The determinism and batch runs under caps on a pool of 4 threads; the
 * setter's refusals (a cap below ENVD_VEC_NO_CAP; any cap while a step is
 * pending).  The cap itself (at most K threads at once) is pool_stress.c's. */
static void test_max_threads(envd_pool_t *pool)
{
    harness_t h;
    harness_init(&h, envd_builtin_get(0), 8, 0, TIME_LIMIT, 1);
    harness_create(&h, pool, 1);
    CHECK(envd_vec_set_max_threads(h.vec, -2) == ENVD_EINVAL, "cap -2");
    harness_reset(&h, 1);
    fill_actions(&h);
    CHECK(envd_vec_step_submit(h.vec) == ENVD_OK, "submit");
    CHECK(envd_vec_set_max_threads(h.vec, 1) == ENVD_EBUSY, "cap while a step is pending");
    const double deadline = now_s() + 30.0;
    while (!envd_vec_step_done(h.vec))
        CHECK(now_s() < deadline, "step not done after 30 s");
    CHECK(envd_vec_step_finish(h.vec) >= 0, "finish");
    CHECK(envd_vec_set_max_threads(h.vec, 1) == ENVD_OK, "cap after the step");
    harness_free(&h);
    static const int caps[] = {0, 1, 2};
    for (size_t c = 0; c < COUNT(caps); c++) {
        g_max_threads = caps[c];
        test_determinism(&pool, 1, scaled(100, 20));
        test_batches(&pool, 1, scaled(30, 8));
    }
    g_max_threads = ENVD_VEC_NO_CAP;
}


/* ---- ABI 5: an env that resets itself, its seed callback and episode log ----------- */
/* Env i (seeded s_i) ends its episode itself every 2 + s_i % 3 steps, sets
 * terminated then, and reports it through episode_end: [the episode's summed
 * reward, its length, the episodes so far].  Its init fails if another init
 * of it runs at the same time (SERIAL_INIT must prevent that) or if seed did
 * not come first. */
typedef struct self_state {
    uint64_t seed;
    int64_t seed_calls, steps, episodes, pending;
    double episode_sum, last_sum;
    float *bound; /* bind_obs's row (ENVD_ENV_OBS_ROWS), NULL while unbound */
} self_state_t;

static _Atomic int g_self_inits_running;
/* bind_obs calls; a bind out of order or an obs other than the bound row */
static _Atomic long g_self_binds;
static _Atomic int g_self_wrong_row;

/* Where env s writes its observation: its bound row (the obs the host
 * gives it must be that row), else obs. */
static float *self_row(const self_state_t *s, void *obs)
{
    if (s->bound != NULL && (void *)s->bound != obs)
        atomic_store(&g_self_wrong_row, 1);
    return s->bound != NULL ? s->bound : obs;
}

static int self_bind_obs(void *state, void *obs)
{
    self_state_t *s = state;
    if (s->seed_calls != 1 || s->bound != NULL || obs == NULL) /* after init, once */
        atomic_store(&g_self_wrong_row, 1);
    s->bound = obs;
    atomic_fetch_add(&g_self_binds, 1);
    return ENVD_OK;
}

static int self_seed(void *state, uint64_t seed)
{
    self_state_t *s = state;
    s->seed = seed;
    s->seed_calls++;
    return ENVD_OK;
}

static int self_init(void *state, const double *params)
{
    (void)params;
    const self_state_t *s = state;
    if (atomic_fetch_add(&g_self_inits_running, 1) != 0) {
        atomic_fetch_sub(&g_self_inits_running, 1);
        return ENVD_EINVAL;
    }
    for (volatile int spin = 0; spin < 2000; spin++)
        ;
    int rc = s->seed_calls == 1 ? ENVD_OK : ENVD_ESTATE;
    atomic_fetch_sub(&g_self_inits_running, 1);
    return rc;
}

static void self_obs(const self_state_t *s, float *o)
{
    o[0] = (float)(s->seed % 100000);
    o[1] = (float)s->steps;
    o[2] = (float)s->episodes;
    o[3] = (float)s->seed_calls;
}

static int self_reset(void *state, envd_rng_t *rng, void *obs)
{
    (void)rng;
    self_state_t *s = state;
    s->steps = 0;
    s->episodes = 0;
    s->episode_sum = 0.0;
    self_obs(s, self_row(s, obs));
    return ENVD_OK;
}

static int64_t self_len(uint64_t seed) { return 2 + (int64_t)(seed % 3); }

static int self_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                     double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    (void)truncated;
    self_state_t *s = state;
    *reward = (double)*(const int64_t *)action + 0.5;
    s->episode_sum += *reward;
    if (++s->steps == self_len(s->seed)) {
        *terminated = true;
        s->last_sum = s->episode_sum;
        s->episode_sum = 0.0;
        s->steps = 0;
        s->episodes++;
        s->pending++;
    }
    self_obs(s, self_row(s, obs));
    return ENVD_OK;
}

static int self_episode_end(void *state, double *values)
{
    self_state_t *s = state;
    int n = (int)s->pending;
    s->pending = 0;
    values[0] = s->last_sum;
    values[1] = (double)self_len(s->seed);
    values[2] = (double)s->episodes;
    return n;
}

/* self_step for count envs in a row (envd.h's step_envs). */
static int64_t self_step_envs(void *state, size_t stride, int64_t count, const void *actions,
                              size_t action_bytes, void *obs, size_t obs_bytes, double *rewards,
                              bool *terminated, bool *ended)
{
    for (int64_t k = 0; k < count; k++) {
        self_state_t *s = (self_state_t *)((char *)state + (size_t)k * stride);
        self_step(s, NULL, (const char *)actions + (size_t)k * action_bytes,
                  (char *)obs + (size_t)k * obs_bytes, &rewards[k], &terminated[k], NULL);
        ended[k] = s->pending > 0;
    }
    return count;
}

static const char *const self_fields[] = {"episode_return", "episode_length", "episodes"};
/* the same values under other names: the host reports its own sums */
static const char *const self_fields_renamed[] = {"return", "length", "episodes"};

static const envd_env_def_t self_env = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "VecStressSelf-v0",
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                          .shape = {4}},
    .action_space = {.kind = ENVD_SPACE_DISCRETE, .dtype = ENVD_DTYPE_INT64, .n = 3, .start = -1},
    .state_size = sizeof(self_state_t),
    .num_agents = 1,
    .init = self_init,
    .reset = self_reset,
    .step = self_step,
    .flags = ENVD_ENV_RESETS_ITSELF | ENVD_ENV_SERIAL_INIT,
    .seed = self_seed,
    .episode_fields = self_fields,
    .num_episode_fields = 3,
    .episode_end = self_episode_end,
};

/* The same env with step_envs (the vec's whole steps go through it), and
 * that one with its log fields renamed: the statistics are the host's sums
 * then, which self_check expects alike. */
static envd_env_def_t self_env_envs, self_env_sums, self_env_rows, self_env_private;

/* The definition test_resets_itself makes: self_env, then self_env_envs. */
static const envd_env_def_t *g_self_def = &self_env;

typedef struct self_vec {
    harness_t h;
    uint64_t *seeds;
    bool *dones;
    double *log;
} self_vec_t;

static void self_create(self_vec_t *v, envd_pool_t *pool, int64_t n, int64_t chunk,
                        uint64_t base)
{
    harness_init(&v->h, g_self_def, n, ENVD_AUTORESET_NEXT_STEP, 0, 3);
    v->seeds = xcalloc((size_t)n, sizeof *v->seeds);
    v->dones = xcalloc((size_t)n, sizeof *v->dones);
    v->log = xcalloc((size_t)n * 3, sizeof *v->log);
    for (int64_t i = 0; i < n; i++)
        v->seeds[i] = base + (uint64_t)i;
    v->h.cfg.seeds = v->seeds;
    v->h.bufs.dones = v->dones;
    v->h.bufs.episode_log = v->log;
    harness_create(&v->h, pool, chunk);
}

static void self_free(self_vec_t *v)
{
    harness_free(&v->h);
    free(v->seeds);
    free(v->dones);
    free(v->log);
}

/* Env i's outputs after `steps` steps of action 0 since its episode counter
 * started (reward 0.5 a step), checked against the model above. */
static void self_check(const self_vec_t *v, int64_t i, int64_t steps, uint64_t seed,
                       int64_t seed_calls, const char *what)
{
    const float *o = (const float *)v->h.obs + 4 * i;
    const int64_t len = self_len(seed);
    const bool ended = steps > 0 && steps % len == 0;
    CHECK(o[0] == (float)(seed % 100000) && o[3] == (float)seed_calls,
          "%s: env %lld seed %f calls %f", what, (long long)i, o[0], o[3]);
    CHECK(o[1] == (float)(steps % len) && o[2] == (float)(steps / len),
          "%s: env %lld at step %lld shows %f/%f (no host reset may happen)", what,
          (long long)i, (long long)steps, o[1], o[2]);
    CHECK(!v->h.truncs[i] && v->h.terms[i] == ended && v->dones[i] == ended,
          "%s: env %lld flags", what, (long long)i);
    if (ended) {
        CHECK(v->h.returns[i] == 0.5 * (double)len && v->h.lengths[i] == len,
              "%s: env %lld stats %f %lld", what, (long long)i, v->h.returns[i],
              (long long)v->h.lengths[i]);
        CHECK(v->log[3 * i + 2] == (double)(steps / len), "%s: env %lld log", what,
              (long long)i);
    } else {
        CHECK(v->h.returns[i] == 0.0 && v->h.lengths[i] == 0, "%s: env %lld stats", what,
              (long long)i);
        /* (after a step: a reset leaves the log as it is) */
        CHECK(steps == 0 || (v->log[3 * i] == 0.0 && v->log[3 * i + 1] == 0.0 &&
                             v->log[3 * i + 2] == 0.0),
              "%s: env %lld log not 0 without an episode end", what, (long long)i);
    }
}

static void *self_create_many(void *arg)
{
    envd_pool_t *pool = arg;
    for (int k = 0; k < scaled(20, 4); k++) {
        self_vec_t v;
        self_create(&v, pool, 16, 0, 7);
        self_free(&v);
    }
    return NULL;
}

/* Steps from..to of the 23 envs of v as two async batches, ids1 (12 envs)
 * and ids2 (11), each env checked after each (seeded 50 + i at a reset). */
static void self_batch_steps(self_vec_t *v, envd_vec_batch_t *b1, const int64_t *ids1,
                             envd_vec_batch_t *b2, const int64_t *ids2, int64_t from, int64_t to,
                             const char *what)
{
    for (int64_t t = from; t <= to; t++) {
        CHECK(envd_vec_batch_submit(v->h.vec, b1, ids1, 12, 0) == ENVD_OK &&
                  envd_vec_batch_submit(v->h.vec, b2, ids2, 11, 0) == ENVD_OK,
              "%s: submit", what);
        envd_vec_batch_wait(v->h.vec, b1);
        envd_vec_batch_wait(v->h.vec, b2);
        CHECK(envd_vec_batch_finish(v->h.vec, b1) >= 0 &&
                  envd_vec_batch_finish(v->h.vec, b2) >= 0, "%s: finish", what);
        for (int64_t i = 0; i < 23; i++)
            self_check(v, i, t, 50 + (uint64_t)i, 2, what);
    }
}

/* The vec never resets nor truncates a RESETS_ITSELF env, seeds it before
 * init and at seeded resets only, reports its episodes from episode_end, in
 * whole steps and async batches, on every pool; refuses a time limit or
 * another autoreset mode; inits run one at a time across threads. */
static void test_resets_itself(envd_pool_t *const *pools, int num_pools)
{
    const int64_t n = 23;
    for (int p = 0; p < num_pools; p++) {
        for (int64_t chunk = 0; chunk <= 3; chunk += 3) {
            char what[96];
            snprintf(what, sizeof what, "self-resetting %s threads=%d chunk=%lld", g_self_def->id,
                     envd_pool_num_threads(pools[p]), (long long)chunk);
            self_vec_t v;
            self_create(&v, pools[p], n, chunk, 1000);
            CHECK(envd_vec_reset(v.h.vec, NULL, NULL) == ENVD_OK, "%s: reset", what);
            for (int64_t i = 0; i < n; i++)
                self_check(&v, i, 0, 1000 + (uint64_t)i, 1, what);
            const int64_t steps = scaled(40, 10);
            for (int64_t t = 1; t <= steps; t++) {
                step_ok(&v.h, what);
                for (int64_t i = 0; i < n; i++)
                    self_check(&v, i, t, 1000 + (uint64_t)i, 1, what);
            }
            /* a seeded reset calls seed, an unseeded one does not */
            uint64_t seeds[23];
            for (int64_t i = 0; i < n; i++)
                seeds[i] = 50 + (uint64_t)i;
            CHECK(envd_vec_reset(v.h.vec, seeds, NULL) == ENVD_OK, "%s: seeded reset", what);
            CHECK(envd_vec_reset(v.h.vec, NULL, NULL) == ENVD_OK, "%s: reset", what);
            /* async batches: the even envs, then the odd ones, several times */
            int64_t even[12], odd[11];
            for (int64_t i = 0; i < n; i++)
                (i % 2 ? odd : even)[i / 2] = i;
            envd_vec_batch_t *b1, *b2;
            CHECK(envd_vec_batch_create(&b1, 12) == ENVD_OK &&
                      envd_vec_batch_create(&b2, 11) == ENVD_OK, "batch create");
            self_batch_steps(&v, b1, even, b2, odd, 1, 7, what);
            /* and runs of envs in a row (step_envs steps those) */
            int64_t low[12], high[11];
            for (int64_t i = 0; i < n; i++)
                (i < 12 ? low : high)[i < 12 ? i : i - 12] = i;
            self_batch_steps(&v, b1, low, b2, high, 8, 12, what);
            envd_vec_batch_destroy(b1);
            envd_vec_batch_destroy(b2);
            self_free(&v);
        }
    }
    /* no time limit and no other autoreset mode for it */
    for (int mode = 0; mode < 3; mode++) {
        self_vec_t v;
        harness_init(&v.h, &self_env, 2, mode, mode == 0 ? 10 : 0, 3);
        v.h.bufs.episode_log = xcalloc(6, sizeof(double));
        envd_vec_t *vec = NULL;
        CHECK(envd_vec_create(&vec, &self_env, &v.h.cfg, &v.h.bufs, NULL) == ENVD_EINVAL &&
                  vec == NULL, "a RESETS_ITSELF env with mode %d / a time limit was accepted",
              mode);
        free(v.h.bufs.episode_log);
        harness_free(&v.h);
    }
    /* inits on several threads at once run one at a time */
    pthread_t threads[3];
    for (int k = 0; k < 3; k++)
        CHECK(pthread_create(&threads[k], NULL, self_create_many, pools[k % num_pools]) == 0,
              "thread");
    for (int k = 0; k < 3; k++)
        pthread_join(threads[k], NULL);
}

/* A bind_obs that fails (for env 2 of 4) fails the create: every env that
 * initialised is closed once, env 2 too (LeakSanitizer sees the rest). */
static _Atomic int g_self_closes;
static void self_close(void *state)
{
    (void)state;
    atomic_fetch_add(&g_self_closes, 1);
}

static int self_bind_fails(void *state, void *obs)
{
    const self_state_t *s = state;
    (void)obs;
    return s->seed == 9 ? ENVD_EINVAL : ENVD_OK;
}

static void test_bind_failure(envd_pool_t *pool)
{
    envd_env_def_t def = self_env_rows;
    def.bind_obs = self_bind_fails;
    def.close = self_close;
    self_vec_t v;
    harness_init(&v.h, &def, 4, ENVD_AUTORESET_NEXT_STEP, 0, 3);
    uint64_t seeds[4] = {7, 8, 9, 10};
    double log[12];
    v.h.cfg.seeds = seeds;
    v.h.bufs.episode_log = log;
    atomic_store(&g_self_closes, 0);
    envd_vec_t *vec = NULL;
    CHECK(envd_vec_create(&vec, &def, &v.h.cfg, &v.h.bufs, pool) == ENVD_EENV && vec == NULL,
          "a failing bind_obs did not fail the create");
    CHECK(atomic_load(&g_self_closes) == 3, "after a failed bind: %d closes (3 expected)",
          atomic_load(&g_self_closes));
    harness_free(&v.h);
}

/* ENVD_ENV_OBS_ROWS_PRIVATE: an env bound only where the config says the rows
 * are private memory; it steps alike either way. */
static void test_private_rows(envd_pool_t *pool)
{
    for (int private_rows = 0; private_rows < 2; private_rows++) {
        const long before = atomic_load(&g_self_binds);
        self_vec_t v;
        harness_init(&v.h, &self_env_private, 5, ENVD_AUTORESET_NEXT_STEP, 0, 3);
        v.seeds = xcalloc(5, sizeof *v.seeds);
        v.dones = xcalloc(5, sizeof *v.dones);
        v.log = xcalloc(15, sizeof *v.log);
        for (int64_t i = 0; i < 5; i++)
            v.seeds[i] = 7 + (uint64_t)i;
        v.h.cfg.seeds = v.seeds;
        v.h.cfg.private_rows = private_rows;
        v.h.bufs.dones = v.dones;
        v.h.bufs.episode_log = v.log;
        harness_create(&v.h, pool, 0);
        CHECK(atomic_load(&g_self_binds) - before == (private_rows ? 5 : 0),
              "private_rows=%d: %ld binds", private_rows, atomic_load(&g_self_binds) - before);
        CHECK(envd_vec_reset(v.h.vec, NULL, NULL) == ENVD_OK, "private rows: reset");
        for (int64_t t = 1; t <= 6; t++) {
            step_ok(&v.h, "private rows");
            for (int64_t i = 0; i < 5; i++)
                self_check(&v, i, t, 7 + (uint64_t)i, 1, "private rows");
        }
        self_free(&v);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1)
        g_div = atoi(argv[1]) > 0 ? atoi(argv[1]) : 1;
    test_env_setup();
    static const int thread_counts[] = {0, 1, 2, 4};
    envd_pool_t *pools[COUNT(thread_counts)];
    for (size_t i = 0; i < COUNT(thread_counts); i++)
        CHECK(envd_pool_create(&pools[i], thread_counts[i], NULL) == ENVD_OK, "pool create");
    const int num_pools = (int)COUNT(pools);

    for (int p = 0; p < num_pools; p++) {
        envd_pool_t *pool = pools[p];
        test_create_errors(pool);
        test_step_before_reset(pool);
        test_seeding(pool);
        for (int e = 0; e < builtin_count(); e++)
            if (builtin_get(e)->action_space.kind == ENVD_SPACE_DISCRETE)
                test_action_range(pool, builtin_get(e), 1 + p % 3);
        test_action_range(pool, &test_env, 2);
        test_render(pool);
        test_inputs_copied(pool, 1 + p % 3);
        test_disabled_done(pool, 1 + p % 3);
        test_init_failure(pool);
        test_callback_failure(pool, 0);
        test_callback_failure(pool, 3);
        if (envd_pool_num_threads(pool) > 0)
            test_in_flight(pool);
        for (int mode = 0; mode < 3; mode++)
            test_batch_errors(pool, (mode + p) % 4, mode);
        test_batch_callback_failure(pool, 0);
        test_batch_callback_failure(pool, 2);
        if (envd_pool_num_threads(pool) > 0)
            test_batch_in_flight(pool);
    }
    test_create_errors(NULL);
    test_callback_failure(NULL, 0);
    test_inputs_copied(NULL, 0);
    for (int mode = 0; mode < 3; mode++)
        test_batch_errors(NULL, 0, mode);
    test_batch_callback_failure(NULL, 0);
    test_create_destroy(pools, num_pools, scaled(600, 20));
    test_split(pools, num_pools, scaled(200, 20));
    test_determinism(pools, num_pools, scaled(300, 40));
    test_batches(pools, num_pools, scaled(60, 16));
    test_max_threads(pools[num_pools - 1]);
    test_resets_itself(pools, num_pools);
    self_env_envs = self_env;
    self_env_envs.id = "VecStressSelfEnvs-v0";
    self_env_envs.step_envs = self_step_envs;
    self_env_envs.flags |= ENVD_ENV_STEP_ENVS;
    g_self_def = &self_env_envs;
    test_resets_itself(pools, num_pools);
    self_env_sums = self_env_envs;
    self_env_sums.id = "VecStressSelfSums-v0";
    self_env_sums.episode_fields = self_fields_renamed;
    g_self_def = &self_env_sums;
    test_resets_itself(pools, num_pools);
    self_env_rows = self_env_envs;
    self_env_rows.id = "VecStressSelfRows-v0";
    self_env_rows.bind_obs = self_bind_obs;
    self_env_rows.flags |= ENVD_ENV_OBS_ROWS;
    CHECK(atomic_load(&g_self_binds) == 0, "an env without ENVD_ENV_OBS_ROWS was bound");
    g_self_def = &self_env_rows;
    test_resets_itself(pools, num_pools);
    CHECK(atomic_load(&g_self_binds) > 0 && !atomic_load(&g_self_wrong_row),
          "bound rows: %ld binds, a wrong row %d", atomic_load(&g_self_binds),
          atomic_load(&g_self_wrong_row));
    self_env_private = self_env_rows;
    self_env_private.id = "VecStressSelfPrivate-v0";
    self_env_private.flags |= ENVD_ENV_OBS_ROWS_PRIVATE;
    for (int p = 0; p < num_pools; p++)
        test_private_rows(pools[p]);
    test_bind_failure(pools[0]);
    CHECK(!atomic_load(&g_self_wrong_row), "private rows: a wrong row");

    for (int p = 0; p < num_pools; p++)
        envd_pool_destroy(pools[p]);
    printf("vec_stress: ok\n");
    return 0;
}
