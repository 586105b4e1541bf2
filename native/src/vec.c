/*
 * vec.c -- N env instances over caller buffers; see vec.h.
 *
 * Memory layout: one cache-line aligned block per env holding its RNG and
 * slot (env_slot.h: time limit and episode counters) followed by its state, so a chunk of
 * envs touches contiguous memory and two chunks never share a cache line.
 *
 * Trust boundary: the caller's input buffers (actions, reset seeds and mask)
 * may be shared memory another process writes at any moment (a daemon's
 * session segment).  Every call copies the inputs it will act on into the
 * vec's private copies first, checks the copies and runs from them; nothing
 * reads an input buffer twice.  So the range check of a discrete action holds
 * for the action the env's step callback receives (a pointer into the
 * private copy), whatever the other process writes meanwhile.
 */
#include "vec.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "env_slot.h"
#include "ids_run.h"
#include "step_choice.h"

#define CACHE_LINE 64

/* Dispatch policy.  A batch cheaper than INLINE_BELOW_NS, about what waking a
 * sleeping worker costs (docs/benchmarks.md), runs on the calling thread.  Chunks carry at least MIN_CHUNK_NS of work (the
 * atomic claim and a cold cache line stay negligible) and there are about
 * CHUNKS_PER_THREAD chunks per participating thread, which balances load when
 * envs differ in cost or a thread is preempted. */
#define INLINE_BELOW_NS 40000.0
/* An async batch's caller (the trainer's thread in-process, the doorbell's
 * thread a client waits on) wants the send back at once: the batch overlaps
 * its work only on the pool.  It runs inline only when cheaper than the
 * submit's own wake-up call (a futex syscall, a few microseconds).  A batch
 * for an event loop (NOTIFY: the socket path) keeps INLINE_BELOW_NS, which
 * spares it an eventfd round trip through the loop. */
#define INLINE_BATCH_BELOW_NS 5000.0
#define MIN_CHUNK_NS 5000.0
/* A batch submitted ENVD_JOB_HELPED is helped (envd_vec_batch_help_ref)
 * only if one of its chunks is measured to take less than this (else it is
 * submitted without the flag, waking every worker it can use): the helper --
 * the fast path's serving thread -- leaves only between chunks, so a chunk is
 * how late its client's next answer (or a stop) can come.  So a helped
 * batch's chunks are also cut to about HELP_CHUNK_NS (one env at least):
 * Acrobot's 2048-env batch on 2 threads made chunks of 56 us, and a send
 * rung while the helper was in one waited 28 us at p75 (53 at p90). */
#define HELP_CHUNK_MAX_NS 100000.0
#define HELP_CHUNK_NS 10000.0
/* A helped batch measured to take less than this in all wakes no worker
 * (ENVD_JOB_ALONE): its helper runs it.  Only on a pool of at most 2 CPUs,
 * where a worker woken for it starts 20-40 us later (a cross-CPU wake-up,
 * docs/benchmarks.md), needs a CPU that the trainer or another daemon's
 * thread holds, and then steps a small share of it at best: two daemons'
 * CartPole loop (2048 envs a batch) went 1.18x faster without it; one
 * daemon's, with or without a learner, was unchanged (0.99-1.04x).  (More
 * CPUs were not measured: there a woken worker keeps an idle CPU busy.)
 * And only while fewer than ALONE_MAX_IN_FLIGHT other batches are in
 * flight: the helper takes a few batches at a time (session.h), and a batch
 * it skips must not wait for its next request with no worker woken. */
#define HELP_ALONE_BELOW_NS 100000.0
#define ALONE_MAX_IN_FLIGHT 2
#define CHUNKS_PER_THREAD 4
/* A blocking step estimated under UNTIMED_BELOW_NS runs inline and only one
 * in TIMED_EVERY is timed: its estimate decides nothing but that (an 8-fold
 * rise is needed to reach the threshold, and the estimate follows within a
 * few dozen steps), and the two clock reads of a timed step (20-50 ns each
 * on a VM) were a sixth of a cheap env's whole native step at N=64
 * (puffer:squared). */
#define UNTIMED_BELOW_NS (INLINE_BELOW_NS / 8)
#define TIMED_EVERY 8
#define COST_EWMA_WEIGHT 0.125

/* The most work a run for an event loop (a NOTIFY run: the daemon's socket
 * path) may do inline under a cap of 0 threads.  The loop serves every other
 * session meanwhile, so a costlier run, or one not measured yet, goes to one
 * pool thread instead (see envd_vec_set_max_threads). */
#define LOOP_INLINE_MAX_NS 1000000.0

/* A step submitted with envd_vec_step_submit and not yet finished. */
typedef enum pending { PENDING_NONE = 0, PENDING_INLINE, PENDING_POOLED } pending_t;

/* An env's block is its head (its RNG, its slot of env_slot.h), then its
 * state.  The head's alignment makes its size a multiple of max_align_t's,
 * so the state (blocks are cache-line aligned) is aligned for any type an
 * env may keep in it (envd.h promises). */
typedef struct env_head {
    _Alignas(max_align_t) envd_rng_t rng;
    envd_env_slot_t slot;
} env_head_t;
_Static_assert(sizeof(env_head_t) % _Alignof(max_align_t) == 0, "state must stay aligned");

/* One run over envs: the whole vec (ids == NULL: env k is index k) or an
 * async batch (env k is ids[k]).  Written by the caller before dispatch, read
 * by the threads running chunks; the pool's done handshake orders both.  The
 * atomics collect what the chunks report. */
typedef struct run {
    envd_vec_t *vec;
    const int64_t *ids;
    int64_t first_id;   /* >= 0: ids are first_id, first_id + 1, ... (a run of
                           envs in a row: step_envs can step them) */
    envd_job_t job;
    pending_t pending;  /* submitted and not finished yet */
    bool helped;        /* a batch submitted ENVD_JOB_HELPED and kept so
                           (its chunks are short enough: run_start) */
    int inline_result;  /* PENDING_INLINE: what finish returns */
    _Atomic int first_error;
    _Atomic int64_t error_index;
    _Atomic int64_t num_done;
    _Atomic int64_t chunk_ns, chunk_items;
    double submitted_ns; /* a blocking step's submit to the pool (step_choice.h) */
} run_t;

struct envd_vec_batch {
    run_t run;
    int64_t capacity;
    int64_t count; /* envs of the last submit */
    int64_t *ids;  /* capacity entries; the first count are this batch's */
};

struct envd_vec {
    const envd_env_def_t *def;
    envd_vec_config_t config;
    envd_vec_buffers_t buf;
    envd_pool_t *pool;
    size_t obs_bytes, action_bytes, stride; /* an env's: all its agents' rows */
    size_t info_bytes[ENVD_MAX_INFO_FIELDS]; /* one env's slots of each info field */
    int64_t agents;        /* def->num_agents: rows per env */
    /* ABI 5 (all NULL before): its seed callback, its episode log, its loop
     * of steps */
    int (*seed_env)(void *state, uint64_t seed);
    int (*episode_end)(void *state, double *values);
    int64_t (*step_envs)(void *state, size_t stride, int64_t count, const void *actions,
                         size_t action_bytes, void *obs, size_t obs_bytes, double *rewards,
                         bool *terminated, bool *ended);
    /* The per-env rules' settings and books beyond the slots (env_slot.h),
     * over the output rows of buf. */
    envd_slot_books_t books;
    unsigned char *blocks; /* num_envs blocks of `stride` bytes */
    bool all_started;      /* every env has been reset at least once */

    /* Private copies of the inputs (see "Trust boundary" above), num_envs
     * entries each.  A row of actions is written by the caller thread only
     * while its env is in no run in flight, and read by the run's chunks. */
    unsigned char *actions;
    uint64_t *seeds;
    bool *mask;
    /* Caller thread only: env i is in an async batch in flight.  Kept apart
     * from the env blocks, which the threads stepping them write: a send or
     * a finish that touched 2048 envs' blocks paid a cross-CPU cache miss per
     * env (most of a cheap env's send; docs/benchmarks.md). */
    bool *in_batch;

    run_t whole;                /* steps and resets of every env */
    const uint64_t *reset_seeds;
    const bool *reset_mask;
    int64_t batches_in_flight;  /* async batches submitted, not finished */
    int64_t reset_count;        /* envs the last reset selected */

    /* Caller thread only. */
    int64_t error_index;        /* the env the last refused or failed call names */
    int64_t forced_chunk;
    int max_threads;            /* pool threads a run may use: ENVD_VEC_NO_CAP, 0 (inline), ... */
    envd_pool_cap_t cap;        /* every run's job is under it while capped */
    bool capped;                /* a cap below the pool's threads (0 keeps one slot) */
    envd_step_choice_t choice;  /* inline or pooled, for a blocking step over the threshold */
    envd_vec_stats_t stats;
};

static double now_ns(void) { return envd_slot_now_ns(); }

static env_head_t *head_of(const envd_vec_t *vec, int64_t i)
{
    return (env_head_t *)(vec->blocks + (size_t)i * vec->stride);
}

static envd_env_slot_t *slot_of(const envd_vec_t *vec, int64_t i) { return &head_of(vec, i)->slot; }

static envd_rng_t *rng_of(const envd_vec_t *vec, int64_t i) { return &head_of(vec, i)->rng; }

static void *state_of(const envd_vec_t *vec, int64_t i)
{
    return vec->blocks + (size_t)i * vec->stride + sizeof(env_head_t);
}

static void record_error(run_t *run, int rc, int64_t i)
{
    int expected = ENVD_OK;
    if (atomic_compare_exchange_strong(&run->first_error, &expected, rc))
        atomic_store(&run->error_index, i);
}

/* ---- per-env work ----------------------------------------------------------
 * The rules are env_slot.h's; here the env's callbacks are called and their
 * failures recorded. */
/* The env's info fields of env i, written into its slot of each field buffer
 * (write_info_fields: only for envs that have some). */
static int write_info_fields(const envd_vec_t *vec, int64_t i)
{
    int num_fields = vec->def->num_info_fields;
    void *fields[ENVD_MAX_INFO_FIELDS];
    for (int k = 0; k < num_fields; k++)
        fields[k] = (unsigned char *)vec->buf.info_fields[k] + (size_t)i * vec->info_bytes[k];
    return vec->def->write_info(state_of(vec, i), fields);
}

/* Envs without info fields pay one predictable branch, inlined: the call it
 * replaced was about 0.8 ns of pong's step per env (perf, N=1024). */
static inline int write_info(const envd_vec_t *vec, int64_t i)
{
    return vec->def->num_info_fields == 0 ? ENVD_OK : write_info_fields(vec, i);
}

static int reset_env(envd_vec_t *vec, int64_t i, void *obs, envd_slot_clock_t *clock)
{
    envd_env_slot_t *slot = slot_of(vec, i);
    envd_slot_begin_episode(&vec->books, slot, i, clock);
    int rc = vec->def->reset(state_of(vec, i), rng_of(vec, i), obs);
    return rc == ENVD_OK ? write_info(vec, i) : rc;
}

static void reset_range(void *ctx, int64_t begin, int64_t end)
{
    run_t *run = ctx;
    envd_vec_t *vec = run->vec;
    unsigned char *obs = vec->buf.observations;
    envd_slot_clock_t clock = {0};
    for (int64_t i = begin; i < end; i++) {
        if (vec->reset_mask && !vec->reset_mask[i])
            continue;
        int rc = ENVD_OK;
        if (vec->reset_seeds) {
            envd_rng_seed(rng_of(vec, i), vec->reset_seeds[i]);
            if (vec->seed_env)
                rc = vec->seed_env(state_of(vec, i), vec->reset_seeds[i]);
        }
        if (rc == ENVD_OK)
            rc = reset_env(vec, i, obs + (size_t)i * vec->obs_bytes, &clock);
        envd_slot_reset_rows(&vec->books, i);
        if (rc != ENVD_OK)
            record_error(run, ENVD_EENV, i);
    }
}

/* step_env for an env of A > 1 agents (rows i*A .. i*A + A - 1).  Returns the
 * rows whose agent ended in this step. */
static int64_t step_multi_agent_env(run_t *run, envd_vec_t *vec, int64_t i,
                                    envd_slot_clock_t *clock)
{
    envd_env_slot_t *slot = slot_of(vec, i);
    const envd_vec_buffers_t *b = &vec->buf;
    const int64_t A = vec->agents;
    void *obs = (unsigned char *)b->observations + (size_t)i * vec->obs_bytes;
    int rc;
    if (slot->needs_reset) {
        /* NEXT_STEP autoreset of the whole env: actions ignored */
        rc = reset_env(vec, i, obs, clock);
        envd_slot_autoreset_agent_rows(&vec->books, i, clock);
        if (rc != ENVD_OK)
            record_error(run, ENVD_EENV, i);
        return 0;
    }
    /* A <= ENVD_MAX_AGENTS: at most 40 KiB on the stepping thread's stack */
    double reward[A];
    bool term[A], trunc[A];
    memset(reward, 0, sizeof reward);
    memset(term, 0, sizeof term);
    memset(trunc, 0, sizeof trunc);
    const void *action = vec->actions + (size_t)i * vec->action_bytes; /* the checked copy */
    rc = vec->def->step(state_of(vec, i), rng_of(vec, i), action, obs, reward, term, trunc);
    if (rc == ENVD_OK)
        rc = write_info(vec, i);
    bool all_done;
    int64_t ended = envd_slot_finish_agent_rows(&vec->books, slot, i, obs,
                                                vec->obs_bytes / (size_t)A, reward, term, trunc,
                                                &all_done, clock);
    if (all_done && envd_slot_resets_at_once(&vec->books) && rc == ENVD_OK) {
        memcpy((unsigned char *)b->final_observations + (size_t)i * vec->obs_bytes, obs,
               vec->obs_bytes);
        rc = reset_env(vec, i, obs, clock);
        envd_slot_live_rows(&vec->books, i); /* the reset's rows are the next episode's */
    }
    if (rc != ENVD_OK)
        record_error(run, ENVD_EENV, i);
    return ended;
}

/* One env step with time limit, episode statistics and autoreset.  Returns
 * whether the episode ended.  Forced inline into the chunk loop: gcc keeps it
 * out of line, and the call is a measurable share of a cheap env's step
 * (docs/benchmarks.md). */
static inline __attribute__((always_inline)) bool step_env(run_t *run, envd_vec_t *vec,
                                                           int64_t i, envd_slot_clock_t *clock)
{
    envd_env_slot_t *slot = slot_of(vec, i);
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
        const void *action = vec->actions + (size_t)i * vec->action_bytes; /* the checked copy */
        rc = vec->def->step(state_of(vec, i), rng_of(vec, i), action, obs, &reward, &term, &trunc);
        if (rc == ENVD_OK)
            rc = write_info(vec, i);
        done = envd_slot_account_step(&vec->books, slot, reward, term, &trunc);
    }
    envd_slot_write_row(&vec->books, slot, i, reward, term, trunc, done, clock);
    if (done && envd_slot_resets_at_once(&vec->books) && rc == ENVD_OK) {
        memcpy((unsigned char *)b->final_observations + (size_t)i * vec->obs_bytes, obs,
               vec->obs_bytes);
        rc = reset_env(vec, i, obs, clock);
    }
    if (rc != ENVD_OK)
        record_error(run, ENVD_EENV, i);
    return done;
}

/* The books of env i, an env that resets itself (ENVD_ENV_RESETS_ITSELF),
 * after its step, beyond its rewards and terminated flags (the caller wrote
 * those, and added the rewards to the host's sums): its rows as of a step
 * whose episode did not end if they held other values, its info fields, and
 * whether its episode ended (episode_end says so, asked only when
 * may_have_ended; env_slot.h then writes the episode's books).  rc: the
 * step's.  Returns the rows whose episode ended.  A is vec->agents, a
 * constant 1 in step_range's loops for single-agent envs: inlined there,
 * the loops over agents are gone. */
static inline __attribute__((always_inline)) int64_t
finish_flagged_env(run_t *run, envd_vec_t *vec, int64_t i, const int64_t A, bool may_have_ended,
                   int rc, envd_slot_clock_t *clock)
{
    envd_slot_self_reset_clear(&vec->books, i, A);
    if (rc == ENVD_OK)
        rc = write_info(vec, i);
    int ended = 0;
    /* Only the env's num_log fields; cleared so that a log that writes fewer
     * leaks no stack into the rows. */
    double values[ENVD_MAX_EPISODE_FIELDS];
    if (rc == ENVD_OK && may_have_ended && vec->episode_end) {
        envd_fill_bytes(values, 0, (size_t)vec->books.num_log * sizeof *values);
        ended = vec->episode_end(state_of(vec, i), values);
        if (ended < 0) {
            rc = ENVD_EENV;
            ended = 0;
        }
    }
    int64_t rows = ended ? envd_slot_self_reset_ended(&vec->books, i, A, values, clock) : 0;
    if (rc != ENVD_OK)
        record_error(run, ENVD_EENV, i);
    return rows;
}

/* What follows an env's step for an env that resets itself: its raw
 * outputs into its rows (env_slot.h), then finish_flagged_env. */
static inline __attribute__((always_inline)) int64_t
finish_self_resetting_env(run_t *run, envd_vec_t *vec, int64_t i, const int64_t A,
                          const double *reward, const bool *term, bool may_have_ended, int rc,
                          envd_slot_clock_t *clock)
{
    envd_slot_self_reset_outputs(&vec->books, i, A, reward, term);
    return finish_flagged_env(run, vec, i, A, may_have_ended, rc, clock);
}

/* One step of env i, an env that resets itself, through its step callback. */
static inline __attribute__((always_inline)) int64_t
step_self_resetting_env(run_t *run, envd_vec_t *vec, int64_t i, const int64_t A,
                        envd_slot_clock_t *clock)
{
    /* A <= ENVD_MAX_AGENTS: at most 40 KiB on the stepping thread's stack.
     * Cleared by a loop, not memset: for the usual A of 1 it is three stores
     * instead of three calls, a visible share of a cheap env's step. */
    double reward[A];
    bool term[A], trunc[A];
    for (int64_t a = 0; a < A; a++) {
        reward[a] = 0.0;
        term[a] = trunc[a] = false;
    }
    const void *action = vec->actions + (size_t)i * vec->action_bytes; /* the checked copy */
    void *obs = (unsigned char *)vec->buf.observations + (size_t)i * vec->obs_bytes;
    int rc = vec->def->step(state_of(vec, i), rng_of(vec, i), action, obs, reward, term,
                            trunc);
    return finish_self_resetting_env(run, vec, i, A, reward, term, true, rc, clock);
}

/* Rows whose rewards one step_envs call leaves on the stepping thread's
 * stack for the books after it (as many envs as fit, one at least). */
#define STEP_ENVS_ROWS 256

/* Eight bools read as one word: the mask of flag j, and the first flag set
 * (w != 0), whatever the byte order. */
static inline uint64_t flag_mask(int j)
{
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (uint64_t)0xff << (56 - 8 * j);
#else
    return (uint64_t)0xff << (8 * j);
#endif
}

static inline int first_flag(uint64_t w)
{
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return __builtin_clzll(w) >> 3;
#else
    return __builtin_ctzll(w) >> 3;
#endif
}

/* The books of the envs first..first+count-1 that a step_envs call stepped
 * without error (their terminated flags are already in their rows): the
 * rewards and the host's sums array by array, one pass each; then only the
 * envs step_envs flagged (ended) and those whose rows hold an ended
 * episode's books (rows_set) go through finish_flagged_env (every env where
 * the env has info fields), found eight flags at a time.  The rows of the
 * others already read as a step whose episode did not end: clearing every
 * row of the books each step (six arrays) cost about 2% of cartpole's step
 * at N=1024 and the rows' stores (perf).  Returns the rows whose episode
 * ended. */
static inline __attribute__((always_inline)) int64_t
finish_self_resetting_rows(run_t *run, envd_vec_t *vec, int64_t first, int64_t count,
                           const int64_t A, const double *reward, const bool *ended,
                           envd_slot_clock_t *clock)
{
    envd_slot_self_reset_rewards(&vec->books, first * A, (size_t)(count * A), reward);
    int64_t done = 0;
    if (vec->def->num_info_fields > 0) {
        for (int64_t k = 0; k < count; k++)
            done += finish_flagged_env(run, vec, first + k, A, ended[k], ENVD_OK, clock);
        return done;
    }
    const bool *rows_set = vec->books.rows_set + first;
    int64_t k = 0;
    _Static_assert(sizeof(bool) == 1, "eight flags are a uint64_t");
    for (; k + 8 <= count; k += 8) {
        uint64_t flags, set;
        memcpy(&flags, ended + k, sizeof flags);
        memcpy(&set, rows_set + k, sizeof set);
        for (flags |= set; flags != 0;) {
            const int j = first_flag(flags);
            flags &= ~flag_mask(j);
            done += finish_flagged_env(run, vec, first + k + j, A, ended[k + j], ENVD_OK, clock);
        }
    }
    for (; k < count; k++)
        if (ended[k] || rows_set[k])
            done += finish_flagged_env(run, vec, first + k, A, ended[k], ENVD_OK, clock);
    return done;
}

/* Envs begin..end-1, envs that reset themselves, through their step_envs
 * callback: a call steps up to STEP_ENVS_ROWS rows' envs in one loop of the
 * env's own, writing their terminated flags straight into their rows
 * (cleared first: the callback's flags start false), then the host's books
 * run over them (finish_self_resetting_rows).  A call that returns k < count
 * (env k failed) is resumed after env k; a return outside 0..count fails the
 * call's envs not yet finished.  Returns the rows whose episode ended.  A as
 * in finish_flagged_env. */
static inline __attribute__((always_inline)) int64_t
step_self_resetting_envs(run_t *run, envd_vec_t *vec, int64_t begin, int64_t end,
                         const int64_t A, envd_slot_clock_t *clock)
{
    const int64_t per_call = A < STEP_ENVS_ROWS ? STEP_ENVS_ROWS / A : 1;
    /* per_call * A <= max(STEP_ENVS_ROWS, ENVD_MAX_AGENTS): at most 32 KiB */
    double reward[per_call * A];
    bool ended[per_call];
    bool *terms = vec->buf.terminations;
    unsigned char *obs = vec->buf.observations;
    int64_t done = 0;
    for (int64_t first = begin; first < end; first += per_call) {
        const int64_t count = end - first < per_call ? end - first : per_call;
        envd_fill_bytes(reward, 0, (size_t)(count * A) * sizeof *reward);
        envd_fill_bytes(terms + first * A, 0, (size_t)(count * A) * sizeof *terms);
        /* an env whose ended[k] the callback left unwritten: episode_end decides */
        envd_fill_bytes(ended, true, (size_t)count * sizeof *ended);
        for (int64_t k = 0; k < count;) {
            const int64_t i = first + k;
            int64_t got = vec->step_envs(state_of(vec, i), vec->stride, count - k,
                                         vec->actions + (size_t)i * vec->action_bytes,
                                         vec->action_bytes, obs + (size_t)i * vec->obs_bytes,
                                         vec->obs_bytes, reward + k * A, terms + i * A,
                                         ended + k);
            /* A return outside 0..count-k says nothing of which envs it
             * stepped: every env of the call fails, none is stepped again. */
            const bool broken = got < 0 || got > count - k;
            if (broken)
                got = 0;
            done += finish_self_resetting_rows(run, vec, i, got, A, reward + k * A, ended + k,
                                               clock);
            k += got;
            for (const int64_t last = broken ? count : k + 1; k < count && k < last; k++) {
                /* env first + k failed: its outputs are not the env's */
                bool no_terms[A];
                for (int64_t a = 0; a < A; a++) {
                    reward[k * A + a] = 0.0;
                    no_terms[a] = false;
                }
                done += finish_self_resetting_env(run, vec, first + k, A, reward + k * A,
                                                  no_terms, false, ENVD_EENV, clock);
            }
        }
    }
    return done;
}

/* Items [begin, end) of a run: envs begin..end-1, or those ids of a batch
 * (two loops, so the whole-vec step keeps its plain one); returns the rows
 * whose episode ended (a pooled chunk adds them to the run's count, an
 * inline run stores them: no locked add on the inline path).  started_ns: the
 * clock read as the range started (its caller times it), which is the
 * range's episode clock: a read more in a step of a cheap env that ends an
 * episode was about a tenth of the step (a clock read costs 20-50 ns on a
 * VM; squared at N=64). */
static int64_t step_range(run_t *run, int64_t begin, int64_t end, double started_ns)
{
    envd_vec_t *vec = run->vec;
    int64_t done = 0;
    envd_slot_clock_t clock = {started_ns * 1e-9};
    const int64_t base = run->ids ? run->first_id : 0; /* items are envs base + k */
    if (vec->step_envs && base >= 0)
        done = vec->agents == 1
                   ? step_self_resetting_envs(run, vec, base + begin, base + end, 1, &clock)
                   : step_self_resetting_envs(run, vec, base + begin, base + end, vec->agents,
                                              &clock);
    else if (vec->books.resets_itself && vec->agents == 1)
        for (int64_t k = begin; k < end; k++)
            done += step_self_resetting_env(run, vec, run->ids ? run->ids[k] : k, 1, &clock);
    else if (vec->books.resets_itself)
        for (int64_t k = begin; k < end; k++)
            done += step_self_resetting_env(run, vec, run->ids ? run->ids[k] : k, vec->agents,
                                            &clock);
    else if (vec->agents > 1)
        for (int64_t k = begin; k < end; k++)
            done += step_multi_agent_env(run, vec, run->ids ? run->ids[k] : k, &clock);
    else if (run->ids)
        for (int64_t k = begin; k < end; k++)
            done += step_env(run, vec, run->ids[k], &clock);
    else
        for (int64_t i = begin; i < end; i++)
            done += step_env(run, vec, i, &clock);
    return done;
}

/* A pooled chunk also measures itself, feeding the cost estimate. */
static void timed_step_range(void *ctx, int64_t begin, int64_t end)
{
    run_t *run = ctx;
    double t0 = now_ns();
    const int64_t done = step_range(run, begin, end, t0);
    if (done)
        atomic_fetch_add(&run->num_done, done);
    atomic_fetch_add_explicit(&run->chunk_ns, (int64_t)(now_ns() - t0), memory_order_relaxed);
    atomic_fetch_add_explicit(&run->chunk_items, end - begin, memory_order_relaxed);
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

/* Chunk size for a pooled call over n envs, or 0 to run inline.  An
 * unmeasured vec runs its first step inline to measure it -- except when the
 * caller must not run an unknown amount of env work (off_caller: a step for an
 * event loop, an async batch): that one goes to the pool in balanced chunks.
 * A blocking step over the inline threshold runs the way its steps were
 * measured faster, pooled or inline (step_choice.h); the threshold alone
 * decides the others.
 * A blocking step (envd_vec_step: the caller waits, and helps) also runs
 * inline while the pool is saturated by other jobs (envd_pool_saturated:
 * e.g. several daemon sessions stepping at once on a small machine; see
 * docs/architecture.md, "Dispatch").  Results never depend on the dispatch. */
static int64_t choose_chunk(envd_vec_t *vec, int64_t n, bool off_caller, bool blocking,
                            bool for_loop)
{
    int threads = vec->pool ? envd_pool_num_threads(vec->pool) : 0;
    if (vec->max_threads != ENVD_VEC_NO_CAP && vec->max_threads < threads) {
        threads = vec->max_threads; /* split for the threads that may run it */
        double cost = vec->stats.cost_ns_per_env;
        if (threads == 0 && for_loop && (cost == 0.0 || cost * (double)n > LOOP_INLINE_MAX_NS))
            threads = 1; /* not on the event loop: one pool thread (the cap's one slot) */
    }
    if (threads == 0)
        return 0;
    /* A job its caller helps (a blocking step, a reset) runs on at most the
     * pool's helped workers beside the caller (pool.h): split it for those,
     * so that num_threads=2 on 2 CPUs splits as auto's one thread does. */
    if (!off_caller && threads > envd_pool_helped_workers(vec->pool))
        threads = envd_pool_helped_workers(vec->pool);
    if (vec->forced_chunk > 0)
        return vec->forced_chunk;
    if (blocking && envd_pool_saturated(vec->pool))
        return 0;
    double cost = vec->stats.cost_ns_per_env;
    bool unmeasured_notify = cost == 0.0 && off_caller;
    double inline_below = off_caller && !for_loop ? INLINE_BATCH_BELOW_NS : INLINE_BELOW_NS;
    /* unmeasured yet, or too cheap to pay for a wake-up */
    const bool under = !unmeasured_notify && (cost == 0.0 || cost * (double)n < inline_below);
    if (blocking ? envd_choice_pick(&vec->choice, !under) == ENVD_WAY_INLINE : under)
        return 0;
    /* (cost is 0 here only for an unmeasured NOTIFY run) */
    int64_t by_cost = cost == 0.0 ? 1 : (int64_t)(MIN_CHUNK_NS / cost) + 1;
    int64_t by_balance = (n + CHUNKS_PER_THREAD * (threads + 1) - 1) /
                         (CHUNKS_PER_THREAD * (threads + 1));
    int64_t chunk = by_cost > by_balance ? by_cost : by_balance;
    return chunk < n ? chunk : n;
}

/* Before a run starts: relaxed stores (a seq_cst store is a locked
 * instruction on x86, five of them a visible share of a cheap env's step);
 * the pool's submit, or the inline run on this thread, orders them before
 * any chunk's updates. */
static void clear_results(run_t *run)
{
    atomic_store_explicit(&run->first_error, ENVD_OK, memory_order_relaxed);
    atomic_store_explicit(&run->error_index, -1, memory_order_relaxed);
    atomic_store_explicit(&run->num_done, 0, memory_order_relaxed);
    atomic_store_explicit(&run->chunk_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&run->chunk_items, 0, memory_order_relaxed);
}

/* What a step returns: the first error (the vec's error index then names its
 * env), else the number of envs done (an int: num_envs <= ENVD_VEC_MAX_ENVS). */
static int run_result(envd_vec_t *vec, run_t *run)
{
    int rc = atomic_load(&run->first_error);
    if (rc != ENVD_OK) {
        vec->error_index = atomic_load(&run->error_index);
        return rc;
    }
    return (int)atomic_load(&run->num_done);
}

/* ---- validation ---------------------------------------------------------------- */
/* Whether the Discrete actions of envs ids[0..count) (ids NULL: envs
 * 0..count-1), every agent's, all lie in the space: one branch-free pass over
 * the private copy.  The common case of validate_step and claim_batch, where
 * a per-env call cost 5 ns an env (11 us of a 2048-CartPole async send on a
 * slow 2-CPU host, serial before any worker starts; docs/benchmarks.md).
 * false sends the caller to the per-env loop, which names the env; so does a
 * space other than Discrete. */
static bool discrete_actions_in_space(const envd_vec_t *vec, const int64_t *ids, int64_t count)
{
    const envd_space_t *as = &vec->def->action_space;
    const int64_t agents = vec->agents;
    /* (Discrete actions are int64, errors.c: the size test guards the cast) */
    if (as->kind != ENVD_SPACE_DISCRETE || vec->action_bytes != (size_t)agents * sizeof(int64_t))
        return false;
    const int64_t *actions = (const int64_t *)vec->actions;
    const int64_t start = as->start, n = as->n;
    bool bad = false;
    if (ids == NULL) {
        /* The largest offset: a compare and a conditional move an action,
         * unrolled (the loop of a test and a branch per action was 10
         * instructions an action, callgrind of squared at N=64). */
        uint64_t worst = 0;
#pragma GCC unroll 8
        for (int64_t k = 0; k < count * agents; k++) {
            const uint64_t d = envd_discrete_offset(actions[k], start);
            worst = d > worst ? d : worst;
        }
        bad = worst >= (uint64_t)n;
    } else {
        for (int64_t k = 0; k < count; k++) {
            const int64_t *row = actions + ids[k] * agents;
            for (int64_t a = 0; a < agents; a++)
                bad |= !envd_in_discrete_range(row[a], start, n);
        }
    }
    return !bad;
}

/* The private copy of env i's actions: every agent's, dead rows' included. */
static int actions_in_space(const envd_vec_t *vec, int64_t i)
{
    return envd_slot_actions_in_space(&vec->def->action_space, vec->agents, vec->action_bytes,
                                      vec->actions + (size_t)i * vec->action_bytes);
}

/* Whether an env's state may refuse a step: only then is each env's slot
 * read. */
static bool states_matter(const envd_vec_t *vec)
{
    return envd_slot_states_matter(&vec->books, vec->all_started);
}

static int env_startable(const envd_vec_t *vec, int64_t i)
{
    int rc = envd_slot_startable(&vec->books, slot_of(vec, i));
    return rc != ENVD_OK ? rc : actions_in_space(vec, i);
}

/* The whole batch is checked before any env moves, so a refused step leaves
 * every env as it was.  Only integer actions (every kind but Box), DISABLED
 * mode and envs never reset need a look at each env; Discrete actions alone
 * get one pass over the private copy. */
static int validate_step(envd_vec_t *vec)
{
    const int64_t n = vec->config.num_envs;
    const bool per_env_state = states_matter(vec);
    if (!per_env_state && (vec->def->action_space.kind == ENVD_SPACE_BOX ||
                           discrete_actions_in_space(vec, NULL, n)))
        return ENVD_OK;
    for (int64_t i = 0; i < n; i++) {
        int rc = per_env_state ? env_startable(vec, i) : actions_in_space(vec, i);
        if (rc != ENVD_OK) {
            vec->error_index = i;
            return rc;
        }
    }
    return ENVD_OK;
}

/* ---- steps ------------------------------------------------------------------------- */

/* The front half of every step: refuse while a submitted step is pending (its
 * chunks may still run, and its results are not collected), validate, choose
 * the dispatch.  Returns ENVD_OK and the chunk (0: inline) or a code. */
/* A batch's caller offered to help (ENVD_JOB_HELPED in *flags): its chunk,
 * cut to about HELP_CHUNK_NS unless the vec's chunk is forced; the flag is
 * dropped (and the chunk kept) when even that chunk is not measured under
 * HELP_CHUNK_MAX_NS: nobody will help, wake every worker it can use. */
static int64_t helped_chunk(const envd_vec_t *vec, int64_t chunk, int *flags)
{
    const double cost = vec->stats.cost_ns_per_env;
    int64_t cut = chunk;
    if (vec->forced_chunk == 0 && cost * (double)chunk > HELP_CHUNK_NS)
        cut = cost < HELP_CHUNK_NS ? (int64_t)(HELP_CHUNK_NS / cost) : 1;
    const double cut_ns = cost * (double)cut;
    if (!(cut_ns > 0.0 && cut_ns < HELP_CHUNK_MAX_NS)) {
        *flags &= ~ENVD_JOB_HELPED;
        return chunk;
    }
    return cut;
}

/* Start a validated run of n items: inline now (timed for the cost
 * estimate), or on the pool with the given job flags.  On success the run is
 * pending until run_finish. */
static int run_start(envd_vec_t *vec, run_t *run, int64_t n, int job_flags)
{
    const bool batch = run->ids != NULL;
    const bool blocking = job_flags == 0 && !batch; /* envd_vec_step */
    int64_t chunk = choose_chunk(vec, n, (job_flags & ENVD_JOB_NOTIFY) || batch, blocking,
                                 job_flags & ENVD_JOB_NOTIFY);
    if (chunk == 0) {
        vec->stats.inline_jobs++;
        const double cost = vec->stats.cost_ns_per_env;
        if (blocking && cost > 0.0 && cost * (double)n < UNTIMED_BELOW_NS &&
            vec->stats.inline_jobs % TIMED_EVERY != 0) {
            atomic_store_explicit(&run->num_done, step_range(run, 0, n, 0.0),
                                  memory_order_relaxed);
            run->pending = PENDING_INLINE;
            return ENVD_OK;
        }
        double t0 = now_ns();
        atomic_store_explicit(&run->num_done, step_range(run, 0, n, t0), memory_order_relaxed);
        const double ns = now_ns() - t0;
        update_cost(vec, ns, n);
        if (blocking)
            envd_choice_record(&vec->choice, ENVD_WAY_INLINE, ns, n);
        run->pending = PENDING_INLINE;
        return ENVD_OK;
    }
    /* A blocking step's caller waits in envd_pool_wait and runs chunks too.
     * A batch's caller offered to help: it may, while its chunks are short. */
    int flags = job_flags == 0 && !batch ? ENVD_JOB_HELPED : job_flags;
    if (batch && (flags & ENVD_JOB_HELPED))
        chunk = helped_chunk(vec, chunk, &flags);
    run->helped = batch && (flags & ENVD_JOB_HELPED);
    if (run->helped && !(flags & ENVD_JOB_NOTIFY) &&
        vec->stats.cost_ns_per_env * (double)n < HELP_ALONE_BELOW_NS &&
        vec->batches_in_flight < ALONE_MAX_IN_FLIGHT && envd_pool_cpus(vec->pool) <= 2)
        flags |= ENVD_JOB_ALONE; /* the helper runs it all: wake no worker */
    if (blocking)
        run->submitted_ns = now_ns();
    int rc = envd_pool_submit(vec->pool, &run->job, timed_step_range, run, n, chunk, flags);
    if (rc != ENVD_OK)
        return rc;
    vec->stats.pooled_jobs++;
    vec->stats.last_chunk = chunk;
    run->pending = PENDING_POOLED;
    return ENVD_OK;
}

static int run_done(const run_t *run)
{
    return run->pending != PENDING_POOLED || envd_job_done(&run->job);
}

/* Collect a completed run: feed a pooled run's chunk timing to the estimate,
 * return what the step returns. */
static int run_finish(envd_vec_t *vec, run_t *run)
{
    switch (run->pending) {
    case PENDING_INLINE:
        run->pending = PENDING_NONE;
        return run_result(vec, run);
    case PENDING_POOLED:
        if (!envd_job_done(&run->job))
            return ENVD_EBUSY;
        run->pending = PENDING_NONE;
        update_cost(vec, (double)atomic_load(&run->chunk_ns), atomic_load(&run->chunk_items));
        return run_result(vec, run);
    default:
        return ENVD_ESTATE; /* nothing was submitted */
    }
}

/* The front half of every whole-vec step: refuse while a submitted step or a
 * batch is pending (its chunks may still run, and its results are not
 * collected), validate, start. */
static int step_start(envd_vec_t *vec, int job_flags)
{
    if (vec->whole.pending != PENDING_NONE || vec->batches_in_flight > 0)
        return ENVD_EBUSY;
    /* No run is in flight: no chunk reads the private copy while it changes. */
    memcpy(vec->actions, vec->buf.actions, (size_t)vec->config.num_envs * vec->action_bytes);
    clear_results(&vec->whole);
    int rc = validate_step(vec);
    if (rc != ENVD_OK)
        return rc;
    vec->whole.ids = NULL;
    return run_start(vec, &vec->whole, vec->config.num_envs, job_flags);
}

int envd_vec_step(envd_vec_t *vec)
{
    int rc = step_start(vec, 0);
    if (rc != ENVD_OK)
        return rc;
    if (vec->whole.pending == PENDING_POOLED) {
        envd_pool_wait(vec->pool, &vec->whole.job); /* the calling thread runs chunks too */
        envd_choice_record(&vec->choice, ENVD_WAY_POOLED, now_ns() - vec->whole.submitted_ns,
                           vec->config.num_envs);
    }
    return run_finish(vec, &vec->whole);
}

int envd_vec_step_submit(envd_vec_t *vec) { return step_start(vec, ENVD_JOB_NOTIFY); }

int envd_vec_step_done(const envd_vec_t *vec) { return run_done(&vec->whole); }

int envd_vec_step_finish(envd_vec_t *vec) { return run_finish(vec, &vec->whole); }

/* ---- async batches ------------------------------------------------------------------ */
int envd_vec_batch_create(envd_vec_batch_t **out, int64_t capacity)
{
    *out = NULL;
    if (capacity < 1 || capacity > ENVD_VEC_MAX_ENVS)
        return ENVD_EINVAL;
    envd_vec_batch_t *batch = calloc(1, sizeof *batch);
    if (!batch)
        return ENVD_ENOMEM;
    batch->ids = malloc((size_t)capacity * sizeof *batch->ids);
    if (!batch->ids) {
        free(batch);
        return ENVD_ENOMEM;
    }
    batch->capacity = capacity;
    *out = batch;
    return ENVD_OK;
}

uint64_t envd_vec_batch_memory_bytes(int64_t capacity)
{
    return sizeof(envd_vec_batch_t) + (uint64_t)(capacity > 0 ? capacity : 0) * sizeof(int64_t);
}

void envd_vec_batch_destroy(envd_vec_batch_t *batch)
{
    if (!batch)
        return;
    free(batch->ids);
    free(batch);
}

static void unmark(envd_vec_t *vec, const int64_t *ids, int64_t count)
{
    for (int64_t k = 0; k < count; k++)
        vec->in_batch[ids[k]] = false;
}

/* Copy the batch's rows of the actions buffer into the private copy.  A
 * memcpy of a constant size compiles to a move: a call per 8-byte row was a
 * visible share of a cheap env's send (docs/benchmarks.md). */
#define COPY_ROWS_OF(size)                                                        \
    for (int64_t k = 0; k < count; k++)                                           \
        memcpy(vec->actions + (size_t)ids[k] * (size),                            \
               (const unsigned char *)vec->buf.actions + (size_t)ids[k] * (size), (size))

static void copy_action_rows(envd_vec_t *vec, const int64_t *ids, int64_t count)
{
    const size_t row = vec->action_bytes;
    switch (row) {
    case 1: COPY_ROWS_OF(1); break;
    case 4: COPY_ROWS_OF(4); break;
    case 8: COPY_ROWS_OF(8); break;
    default: COPY_ROWS_OF(row);
    }
}

/* A run's envs (envd_ids_are_run_within) marked in flight and their action
 * rows copied, each as one block; false, with nothing done, when ids are not
 * a run in range or one of its envs is in flight (the per-env loop then
 * names it). */
static bool claim_run(envd_vec_t *vec, const int64_t *ids, int64_t count)
{
    if (!envd_ids_are_run_within(ids, count, vec->config.num_envs))
        return false;
    bool *marks = vec->in_batch + ids[0];
    bool any = false;
    for (int64_t k = 0; k < count; k++)
        any |= marks[k];
    if (any)
        return false;
    memset(marks, true, (size_t)count * sizeof *marks);
    const size_t row = vec->action_bytes, offset = (size_t)ids[0] * row;
    memcpy(vec->actions + offset, (const unsigned char *)vec->buf.actions + offset,
           (size_t)count * row);
    return true;
}

/* Check a batch's ids (the vec's private copy) and mark its envs in flight;
 * then copy their actions into the private copy (only now: until an env is
 * marked, a batch in flight may be reading its row) and check those.  On
 * error nothing stays marked and the error index names the env.  *is_run:
 * the ids are envs in a row (claim_run). */
static int claim_batch(envd_vec_t *vec, const int64_t *ids, int64_t count, bool *is_run)
{
    int rc = ENVD_OK;
    int64_t k = 0;
    const bool run = claim_run(vec, ids, count);
    *is_run = run;
    for (; !run && k < count; k++) {
        int64_t i = ids[k];
        if (i < 0 || i >= vec->config.num_envs)
            rc = ENVD_EINVAL;
        else if (vec->in_batch[i])
            rc = ENVD_EBUSY; /* in flight, or twice in this batch */
        if (rc != ENVD_OK) {
            unmark(vec, ids, k);
            vec->error_index = i;
            return rc;
        }
        vec->in_batch[i] = true;
    }
    if (!run)
        copy_action_rows(vec, ids, count);
    /* As validate_step: an env's block (written by the threads stepping it)
     * is read only when its state may refuse it; integer actions are checked
     * on the private copy. */
    const bool per_env_state = states_matter(vec);
    const bool per_env_action = !per_env_state &&
                                vec->def->action_space.kind != ENVD_SPACE_BOX &&
                                !discrete_actions_in_space(vec, ids, count);
    for (k = 0; (per_env_state || per_env_action) && k < count; k++) {
        rc = per_env_state ? env_startable(vec, ids[k]) : actions_in_space(vec, ids[k]);
        if (rc != ENVD_OK) {
            unmark(vec, ids, count);
            vec->error_index = ids[k];
            return rc;
        }
    }
    return ENVD_OK;
}

int envd_vec_batch_submit(envd_vec_t *vec, envd_vec_batch_t *batch, const int64_t *env_ids,
                          int64_t count, int flags)
{
    /* A refusal that names no env must not leave an earlier call's index
     * for the caller to report (claim_batch sets it when an env is named). */
    vec->error_index = -1;
    if (count < 1 || count > batch->capacity || (flags & ~(ENVD_JOB_NOTIFY | ENVD_JOB_HELPED)))
        return ENVD_EINVAL;
    if (vec->whole.pending != PENDING_NONE || batch->run.pending != PENDING_NONE)
        return ENVD_EBUSY;
    /* Not in flight (pending NONE), so the job takes the vec's cap. */
    envd_job_set_cap(&batch->run.job, vec->capped ? &vec->cap : NULL);
    /* Copied before anything reads them: env_ids may lie in shared memory. */
    memcpy(batch->ids, env_ids, (size_t)count * sizeof *env_ids);
    bool is_run;
    int rc = claim_batch(vec, batch->ids, count, &is_run);
    if (rc != ENVD_OK)
        return rc;
    batch->count = count;
    batch->run.vec = vec;
    batch->run.ids = batch->ids;
    batch->run.first_id = is_run ? batch->ids[0] : -1;
    clear_results(&batch->run);
    rc = run_start(vec, &batch->run, count, flags);
    if (rc != ENVD_OK) {
        unmark(vec, batch->ids, count);
        return rc;
    }
    vec->batches_in_flight++;
    return ENVD_OK;
}

int envd_vec_batch_done(const envd_vec_batch_t *batch) { return run_done(&batch->run); }

void envd_vec_batch_wait(envd_vec_t *vec, envd_vec_batch_t *batch)
{
    if (batch->run.pending == PENDING_POOLED)
        envd_pool_wait(vec->pool, &batch->run.job);
}

int envd_vec_batch_unstarted(const envd_vec_batch_t *batch)
{
    return batch->run.pending == PENDING_POOLED && envd_job_unstarted(&batch->run.job);
}

int envd_vec_batch_help_ref(envd_vec_batch_t *batch)
{
    return batch->run.pending == PENDING_POOLED && batch->run.helped &&
           envd_pool_help_ref(&batch->run.job);
}

void envd_vec_batch_help(envd_vec_t *vec, envd_vec_batch_t *batch, int (*leave)(void *),
                         void *arg)
{
    envd_pool_help(vec->pool, &batch->run.job, leave, arg);
}

int envd_vec_batch_finish(envd_vec_t *vec, envd_vec_batch_t *batch)
{
    if (batch->run.pending == PENDING_NONE || batch->run.vec != vec)
        return ENVD_ESTATE;
    int rc = run_finish(vec, &batch->run);
    if (rc == ENVD_EBUSY && batch->run.pending == PENDING_POOLED)
        return rc; /* not done yet */
    unmark(vec, batch->ids, batch->count);
    vec->batches_in_flight--;
    return rc;
}

int64_t envd_vec_batch_size(const envd_vec_batch_t *batch) { return batch->count; }

/* ---- resets ------------------------------------------------------------------------ */
void envd_vec_seed(envd_vec_t *vec, const uint64_t *seeds)
{
    for (int64_t i = 0; i < vec->config.num_envs; i++)
        envd_rng_seed(rng_of(vec, i), seeds[i]);
}

/* Copy a reset's mask into the private copy, each entry read once as a byte
 * (any non-zero byte selects: a client may write a bool that is neither 0
 * nor 1); how many envs it selects. */
static int64_t copy_mask(envd_vec_t *vec, const bool *mask)
{
    const unsigned char *bytes = (const unsigned char *)mask;
    int64_t selected = 0;
    for (int64_t i = 0; i < vec->config.num_envs; i++) {
        vec->mask[i] = bytes[i] != 0;
        selected += vec->mask[i];
    }
    return selected;
}

int envd_vec_reset(envd_vec_t *vec, const uint64_t *seeds, const bool *mask)
{
    if (vec->whole.pending != PENDING_NONE || vec->batches_in_flight > 0)
        return ENVD_EBUSY;
    /* The inputs are copied once, then only the copies are read. */
    vec->reset_count = mask ? copy_mask(vec, mask) : vec->config.num_envs;
    if (seeds)
        memcpy(vec->seeds, seeds, (size_t)vec->config.num_envs * sizeof *seeds);
    clear_results(&vec->whole);
    vec->reset_seeds = seeds ? vec->seeds : NULL;
    vec->reset_mask = mask ? vec->mask : NULL;
    int64_t chunk = choose_chunk(vec, vec->config.num_envs, false, false, false);
    int rc = ENVD_OK;
    if (chunk == 0)
        reset_range(&vec->whole, 0, vec->config.num_envs);
    else
        rc = envd_pool_run(vec->pool, &vec->whole.job, reset_range, &vec->whole,
                           vec->config.num_envs, chunk);
    vec->reset_seeds = NULL;
    vec->reset_mask = NULL;
    if (rc != ENVD_OK)
        return rc;
    rc = atomic_load(&vec->whole.first_error);
    if (rc != ENVD_OK)
        vec->error_index = atomic_load(&vec->whole.error_index);
    for (int64_t i = 0; !vec->all_started && i < vec->config.num_envs; i++)
        if (!slot_of(vec, i)->started)
            return rc;
    vec->all_started = true;
    return rc;
}

/* ---- rendering ---------------------------------------------------------------------- */
uint64_t envd_vec_frame_bytes(const envd_vec_t *vec)
{
    int32_t width = 0, height = 0;
    if (!envd_env_def_render_info(vec->def, &width, &height, NULL))
        return 0;
    return (uint64_t)width * (uint64_t)height * 3u;
}

/* Rendering reads env states on the calling thread, so nothing may step them
 * meanwhile: no whole-vec step pending and no batch in flight. */
int envd_vec_render(envd_vec_t *vec, int64_t index, uint8_t *rgb)
{
    if (envd_vec_frame_bytes(vec) == 0 || rgb == NULL)
        return ENVD_EINVAL;
    if (index < 0 || index >= vec->config.num_envs)
        return ENVD_ERANGE;
    if (vec->whole.pending != PENDING_NONE || vec->batches_in_flight > 0)
        return ENVD_EBUSY;
    if (!slot_of(vec, index)->started)
        return ENVD_ESTATE;
    vec->error_index = index;
    int rc = vec->def->render(state_of(vec, index), rgb);
    return rc == ENVD_OK ? ENVD_OK : ENVD_EENV;
}

/* ---- queries ------------------------------------------------------------------------ */
int64_t envd_vec_error_index(const envd_vec_t *vec) { return vec->error_index; }

int envd_vec_env_started(const envd_vec_t *vec, int64_t index)
{
    if (index < 0 || index >= vec->config.num_envs)
        return ENVD_ERANGE;
    return slot_of(vec, index)->started ? 1 : 0;
}

const void *envd_vec_checked_actions(const envd_vec_t *vec) { return vec->actions; }

int64_t envd_vec_reset_count(const envd_vec_t *vec) { return vec->reset_count; }

int64_t envd_vec_num_done(const envd_vec_t *vec) { return atomic_load(&vec->whole.num_done); }

void envd_vec_set_chunk(envd_vec_t *vec, int64_t chunk) { vec->forced_chunk = chunk > 0 ? chunk : 0; }

void envd_vec_notify(envd_vec_t *vec)
{
    if (vec->pool != NULL)
        envd_pool_notify(vec->pool);
}

/* The cap is shared by the vec's whole-vec job and its batches' jobs (set at
 * each batch submit), so it bounds the pool threads on all of them together.
 * Changed only while no run is in flight: then no worker holds a slot (C2 of
 * pool.c), and active is 0. */
int envd_vec_set_max_threads(envd_vec_t *vec, int max_threads)
{
    if (max_threads < ENVD_VEC_NO_CAP)
        return ENVD_EINVAL;
    if (vec->whole.pending != PENDING_NONE || vec->batches_in_flight > 0)
        return ENVD_EBUSY;
    int threads = vec->pool ? envd_pool_num_threads(vec->pool) : 0;
    /* A cap of 0 keeps one slot: for the event loop's costly runs (choose_chunk). */
    const int slots = max_threads > 0 ? max_threads : 1;
    const bool capped = max_threads != ENVD_VEC_NO_CAP && slots < threads;
    vec->cap.max_workers = slots;
    atomic_store_explicit(&vec->cap.active, 0, memory_order_relaxed);
    int rc = envd_job_set_cap(&vec->whole.job, capped ? &vec->cap : NULL);
    if (rc != ENVD_OK)
        return rc;
    vec->max_threads = max_threads;
    vec->capped = capped;
    envd_choice_init(&vec->choice); /* the times measured were the old cap's */
    return ENVD_OK;
}

int envd_vec_max_threads(const envd_vec_t *vec) { return vec->max_threads; }

void envd_vec_get_stats(const envd_vec_t *vec, envd_vec_stats_t *stats)
{
    *stats = vec->stats;
    stats->inline_step_ns_per_env = vec->choice.inline_ns.ns;
    stats->pooled_step_ns_per_env = vec->choice.pooled_ns.ns;
}

/* ---- lifecycle ---------------------------------------------------------------------- */
static int check_args(const envd_env_def_t *def, const envd_vec_config_t *c,
                      const envd_vec_buffers_t *b)
{
    int rc = envd_env_def_validate(def);
    if (rc != ENVD_OK)
        return rc;
    /* rows, not envs, are capped: a multi-agent env's agents are rows of
     * every buffer (num_agents >= 1 is validated above; no overflow) */
    if (c->num_envs < 1 || c->num_envs > ENVD_VEC_MAX_ENVS / def->num_agents ||
        c->max_episode_steps < 0)
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
    if (def->num_agents > 1 && !b->agent_mask)
        return ENVD_EINVAL;
    for (int k = 0; k < def->num_info_fields; k++)
        if (!b->info_fields[k])
            return ENVD_EINVAL;
    const envd_env_def_t *v5 = envd_env_def_v5(def);
    if (v5 && (v5->flags & ENVD_ENV_RESETS_ITSELF) &&
        (c->autoreset_mode != ENVD_AUTORESET_NEXT_STEP || c->max_episode_steps != 0 ||
         (v5->num_episode_fields > 0 && !b->episode_log)))
        return ENVD_EINVAL;
    return ENVD_OK;
}

/* One process-wide lock per init callback of the definitions with
 * ENVD_ENV_SERIAL_INIT (striped: two inits may share a stripe, which only
 * serialises them more).  Keyed by the callback, not the definition: a
 * described definition (describe.h) is a copy whose init is the same. */
#define INIT_LOCK_STRIPES 16
static pthread_mutex_t init_locks[INIT_LOCK_STRIPES] = {
    [0 ... INIT_LOCK_STRIPES - 1] = PTHREAD_MUTEX_INITIALIZER};

static pthread_mutex_t *init_lock_of(const envd_env_def_t *def)
{
    uintptr_t key = (uintptr_t)(void *)def->init;
    return &init_locks[(key >> 4) % INIT_LOCK_STRIPES];
}

/* Env i's seed callback (with a seed) and init, under its definition's init
 * lock when it asks for serial inits. */
static int init_env(envd_vec_t *vec, int64_t i, const double *params, bool serial)
{
    const envd_vec_config_t *c = &vec->config;
    void *state = state_of(vec, i);
    pthread_mutex_t *lock = serial ? init_lock_of(vec->def) : NULL;
    if (lock)
        pthread_mutex_lock(lock);
    int rc = ENVD_OK;
    if (c->seeds && vec->seed_env)
        rc = vec->seed_env(state, vec->seeds[i]);
    if (rc == ENVD_OK)
        rc = vec->def->init(state, params);
    if (lock)
        pthread_mutex_unlock(lock);
    return rc;
}

static size_t space_bytes(const envd_space_t *space)
{
    return (size_t)envd_space_numel(space) * envd_dtype_size(space->dtype);
}

/* The bytes of one env's block: its slot and state, cache-line aligned. */
static size_t stride_of(const envd_env_def_t *def)
{
    size_t block = sizeof(env_head_t) + def->state_size;
    return (block + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE;
}

/* a * b + c, or UINT64_MAX where that does not fit. */
static uint64_t mul_add(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r) || __builtin_add_overflow(r, c, &r))
        return UINT64_MAX;
    return r;
}

uint64_t envd_vec_memory_bytes(const envd_env_def_t *def, int64_t num_envs)
{
    if (envd_env_def_validate(def) != ENVD_OK || num_envs < 1)
        return UINT64_MAX;
    /* per env: its block, the private copies of its action, seed and mask, its
     * in-batch flag, and the books of the rules beyond its slot */
    uint64_t action = mul_add((uint64_t)envd_space_numel(&def->action_space),
                              envd_dtype_size(def->action_space.dtype), 0);
    action = mul_add(action, (uint64_t)def->num_agents, 0);
    const envd_slot_config_t rules = envd_slot_config_of(def, ENVD_AUTORESET_NEXT_STEP, 0);
    uint64_t per_env = mul_add(1, action, stride_of(def) + sizeof(uint64_t) + 2 * sizeof(bool) +
                                              envd_slot_books_bytes_per_env(&rules));
    return mul_add(per_env, (uint64_t)num_envs, sizeof(envd_vec_t));
}

static void free_buffers(envd_vec_t *vec)
{
    free(vec->blocks);
    free(vec->actions);
    free(vec->seeds);
    free(vec->mask);
    free(vec->in_batch);
    envd_slot_books_free(&vec->books);
}

int envd_vec_create(envd_vec_t **out, const envd_env_def_t *def,
                    const envd_vec_config_t *config,
                    const envd_vec_buffers_t *buffers, envd_pool_t *pool)
{
    *out = NULL;
    int rc = check_args(def, config, buffers);
    if (rc != ENVD_OK)
        return rc;
    if (envd_vec_memory_bytes(def, config->num_envs) > SIZE_MAX / 2)
        return ENVD_ENOMEM; /* (sizes below cannot overflow then) */
    envd_vec_t *vec = calloc(1, sizeof *vec);
    if (!vec)
        return ENVD_ENOMEM;
    vec->def = def;
    vec->config = *config;
    vec->buf = *buffers;
    vec->pool = pool;
    vec->agents = def->num_agents;
    vec->obs_bytes = space_bytes(&def->observation_space) * (size_t)vec->agents;
    vec->action_bytes = space_bytes(&def->action_space) * (size_t)vec->agents;
    for (int k = 0; k < def->num_info_fields; k++) {
        const envd_info_field_t *f = &def->info_fields[k];
        size_t n = (size_t)vec->agents;
        for (int d = 0; d < f->ndim; d++)
            n *= (size_t)f->shape[d];
        vec->info_bytes[k] = n * envd_dtype_size(f->dtype);
    }
    vec->stride = stride_of(def);
    const size_t n = (size_t)config->num_envs;
    size_t total = vec->stride * n;
    vec->blocks = aligned_alloc(CACHE_LINE, total);
    vec->actions = malloc(n * vec->action_bytes);
    vec->seeds = malloc(n * sizeof *vec->seeds);
    vec->mask = malloc(n * sizeof *vec->mask);
    vec->in_batch = calloc(n, sizeof *vec->in_batch);
    const envd_slot_rows_t rows = {
        .rewards = buffers->rewards,
        .terminations = buffers->terminations,
        .truncations = buffers->truncations,
        .episode_returns = buffers->episode_returns,
        .episode_lengths = buffers->episode_lengths,
        .episode_times = buffers->episode_times,
        .dones = buffers->dones,
        .agent_mask = buffers->agent_mask,
        .episode_log = buffers->episode_log,
    };
    const envd_slot_config_t rules =
        envd_slot_config_of(def, config->autoreset_mode, config->max_episode_steps);
    rc = envd_slot_books_init(&vec->books, &rules, &rows, config->num_envs);
    if (rc != ENVD_OK || !vec->blocks || !vec->actions || !vec->seeds || !vec->mask ||
        !vec->in_batch) {
        free_buffers(vec);
        free(vec);
        return ENVD_ENOMEM;
    }
    memset(vec->blocks, 0, total);
    vec->whole.vec = vec;
    vec->error_index = -1;
    vec->max_threads = ENVD_VEC_NO_CAP;
    envd_choice_init(&vec->choice);
    clear_results(&vec->whole);
    const envd_env_def_t *v5 = envd_env_def_v5(def);
    const bool serial = v5 && (v5->flags & ENVD_ENV_SERIAL_INIT);
    if (v5) {
        vec->seed_env = v5->seed;
        vec->episode_end = v5->episode_end;
        vec->step_envs = (v5->flags & ENVD_ENV_STEP_ENVS) ? v5->step_envs : NULL;
    }
    /* Env i's rows never move (row i * A + a is always agent a of env i, in
     * steps, resets and async batches alike), and a self-resetting env's rows
     * are written by no one but the env: it may write them directly. */
    int (*bind_obs)(void *, void *) = NULL;
    if (v5 && (v5->flags & ENVD_ENV_OBS_ROWS) &&
        (!(v5->flags & ENVD_ENV_OBS_ROWS_PRIVATE) || config->private_rows))
        bind_obs = v5->bind_obs;
    /* the create's seeds are copied (they may lie in shared memory) */
    if (config->seeds)
        memcpy(vec->seeds, config->seeds, n * sizeof *vec->seeds);
    vec->config.seeds = config->seeds ? vec->seeds : NULL;
    for (int64_t i = 0; i < config->num_envs; i++) {
        const size_t row = config->per_env_params ? (size_t)i * (size_t)def->num_params : 0;
        if (config->seeds)
            envd_rng_seed(rng_of(vec, i), vec->seeds[i]);
        rc = init_env(vec, i, config->params + row, serial);
        if (rc == ENVD_OK && bind_obs) {
            rc = bind_obs(state_of(vec, i), (unsigned char *)buffers->observations +
                                                (size_t)i * vec->obs_bytes);
            if (rc != ENVD_OK && def->close) /* env i did initialise: closed here */
                def->close(state_of(vec, i));
        }
        if (rc != ENVD_OK) {
            /* close the envs that did initialise; env i cleaned up after itself */
            vec->config.num_envs = i;
            envd_vec_destroy(vec);
            return ENVD_EENV;
        }
    }
    vec->config.seeds = NULL; /* (vec->seeds is the resets' copy from now on) */
    *out = vec;
    return ENVD_OK;
}

void envd_vec_destroy(envd_vec_t *vec)
{
    if (!vec)
        return;
    /* A submitted step may still run on the pool: its chunks use this memory.
     * (Batches in flight are the caller's to finish first: it owns them.) */
    if (vec->whole.pending == PENDING_POOLED)
        envd_pool_wait(vec->pool, &vec->whole.job);
    if (vec->def->close)
        for (int64_t i = 0; i < vec->config.num_envs; i++)
            vec->def->close(state_of(vec, i));
    free_buffers(vec);
    free(vec);
}

/* (read by the session after every step, which publishes whether its next
 * step is short: a forced chunk sends every step to the pool) */
double envd_vec_step_estimate_ns(const envd_vec_t *vec)
{
    return vec->forced_chunk > 0 ? 0.0 : vec->stats.cost_ns_per_env * (double)vec->config.num_envs;
}
