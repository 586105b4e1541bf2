/*
 * env_slot.h -- the per-env rules, written once: what a reset or a step of
 * one env means for its books and its output rows, whoever ran the env.
 *
 * The rules: the refusals (an env never reset; a done env under autoreset
 * DISABLED), the autoreset modes (NEXT_STEP: the step after a done resets,
 * its action ignored; SAME_STEP: the done step resets at once, its final
 * observation kept; DISABLED: the caller resets), the time limit (the step
 * that reaches max_episode_steps is truncated), the episode statistics
 * (return, length, wall time, dones), the dead rows of a multi-agent env's
 * agents, and the books of an env that resets itself (ENVD_ENV_RESETS_ITSELF,
 * ABI 5: its episode ends as its episode_end reports them, its episode log).
 *
 * The functions here never call an env: they take what the env returned
 * (its reward, terminated and truncated flags as the env wrote them: its RAW
 * outputs) and write the books and the rows.  The caller runs the env's
 * callbacks and records their failures.  Two callers:
 *  - vec.c (the pool backend) steps C envs through them; the hot ones are
 *    static inline and forced inline, so the vec's loops run no more
 *    instructions than with the rules inline in vec.c (callgrind,
 *    docs/benchmarks.md).
 *  - backend_workers.c (hosted Python envs) keeps an env slot per env on
 *    the parent's side: before a step it asks envd_slot_next per env
 *    (REFUSED: the request is refused, nothing sent) and writes the answer
 *    as the env's kind word (ENVD_SLOT_RESET: NEXT_STEP's autoreset;
 *    ENVD_SLOT_STEP, with ENVD_SLOT_RESET_IF_DONE in SAME_STEP mode); the
 *    worker runs env.reset / env.step only and writes the raw outputs (and,
 *    for a done step with RESET_IF_DONE, the final observation, then resets
 *    at once); as the acks come in the parent applies the rules to each
 *    env (envd_slot_begin_episode, envd_slot_reset_rows,
 *    envd_slot_account_step, envd_slot_write_outcome), the episode times
 *    on its own clock.  Its books have no time limit: a hosted env's is
 *    the env's own gymnasium TimeLimit wrapper, which truncates inside
 *    env.step as SyncVectorEnv's envs do (so ENVD_SLOT_LAST_STEP is never
 *    asked of a worker), and its rewards are float64, the env's own
 *    (rows.rewards NULL).
 * backend_workers.c keeps the agents' rows of a multi-agent hosted env
 * (agents > 1, or agent_rows: a PettingZoo env of one agent) as vec.c
 * does, through envd_slot_finish_agent_rows,
 * envd_slot_autoreset_agent_rows and envd_slot_live_rows.  client/multi.py's _needs_reset and
 * _validate_step are the one Python mirror of envd_slot_next's refusals
 * (the multi-daemon pre-check; tests/integration/test_refusal_mirror.py).
 *
 * Threading: env i's slot, its agents' books and its rows are touched by the
 * one thread that steps env i (vec.h), or that collects its acks (the
 * workers backend's caller, under its session's mutex).
 */
#ifndef ENVD_ENV_SLOT_H
#define ENVD_ENV_SLOT_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "envd.h"

/* cffi:begin */
typedef enum envd_autoreset_mode {
    ENVD_AUTORESET_NEXT_STEP = 0, /* the step after a done resets, ignoring the action */
    ENVD_AUTORESET_SAME_STEP = 1, /* reset inside the done step; final obs kept */
    ENVD_AUTORESET_DISABLED = 2   /* the caller resets done envs (reset with a mask) */
} envd_autoreset_mode_t;
/* cffi:end */

/* An env's own books (not its RNG: whoever runs the env keeps that).  The
 * vec keeps it beside the env's RNG at the head of the env's block. */
typedef struct envd_env_slot {
    double episode_return;
    int64_t episode_length;
    int64_t elapsed_steps; /* for the time limit */
    bool started;          /* reset at least once */
    bool needs_reset;      /* done, and not reset yet */
} envd_env_slot_t;

/* The books of one agent of a multi-agent env (row order). */
typedef struct envd_agent_books {
    double episode_return;
    int64_t episode_length;
    bool done;        /* ended earlier in this episode: its row is dead */
    bool final_term;  /* the flags it ended with, repeated on its dead row */
    bool final_trunc;
} envd_agent_books_t;

/* The output rows the rules write, per row (envd_vec_buffers_t says what
 * each holds; episode_times, dones may be NULL; agent_mask is used when
 * the books keep agent rows, episode_log by an env that resets itself
 * with a log).
 * rewards may be NULL for envs whose rewards are their own, written where
 * the env ran and only read by the rules (a hosted env's float64 rewards:
 * backend_workers.c calls envd_slot_write_outcome, not envd_slot_write_row,
 * and zeroes a dead agent's reward itself).  (Python fills one in for the
 * workers backend's config: marked for cffi.) */
/* cffi:begin */
typedef struct envd_slot_rows {
    float *rewards;
    bool *terminations;
    bool *truncations;
    double *episode_returns;
    int64_t *episode_lengths;
    double *episode_times;
    bool *dones;
    bool *agent_mask;
    double *episode_log;
} envd_slot_rows_t;
/* cffi:end */

/* The rules' settings and the books of num_envs envs beyond their slots,
 * in dense arrays apart from the slots (below: why each). */
typedef struct envd_slot_books {
    envd_slot_rows_t rows;
    int autoreset_mode;        /* envd_autoreset_mode_t */
    int64_t max_episode_steps; /* 0: no time limit */
    int64_t agents;            /* rows per env */
    /* An env that resets itself (ABI 5): its log has num_log fields, the
     * return and the length at these indices (-1 where it lacks them; then
     * host_sums: the running sums below are reported instead). */
    bool resets_itself;
    bool host_sums;
    int num_log;
    int log_return, log_length;
    /* Per env: when its episode started, CLOCK_MONOTONIC seconds (Python's
     * perf_counter).  Apart from the slots: an episode end of a cheap env
     * that reads nothing else of its slot stalled on the slot's line (perf
     * of puffer:squared at N=64). */
    double *episode_starts;
    envd_agent_books_t *agent_books; /* agents > 1 (or config agent_rows): num_envs *
                                      * agents, row order; NULL otherwise */
    /* An env that resets itself: env i's rows (truncations, episode
     * statistics, dones, episode_log, agent_mask) may hold other values than
     * those of a step whose episode did not end (false, 0, true): written by
     * the step that ended its episode, or before the books (set for every
     * env at init); its next step clears them.  So a step writes the rows of
     * the few flagged envs, not every row: the books' owner is the only
     * writer of its output rows (a daemon's client that writes its own rows
     * in shared memory reads what it wrote there until the env's next
     * episode end, as episode_log always did; the daemon acts on none of
     * them).  Apart from the slots, like the vec's in_batch: read every step
     * of every env, and a slot's line was a cache miss a step for squared
     * at N=4096. */
    bool *rows_set;
    /* host_sums: per row, the running return and length of its episode.
     * Dense, apart from the slots, so a step adds a whole chunk's rewards in
     * one pass (in the slots they were a line per env per step: cartpole,
     * whose Log has no episode_return, perf). */
    double *sum_returns;
    int64_t *sum_lengths;
} envd_slot_books_t;

/* What the rules need to know of an env kind: no env definition, so that
 * a backend whose envs are not C definitions (hosted Python envs) can keep
 * books too. */
typedef struct envd_slot_config {
    int autoreset_mode;        /* envd_autoreset_mode_t */
    int64_t max_episode_steps; /* 0: no time limit */
    int64_t agents;            /* rows per env, >= 1 */
    bool resets_itself;        /* ENVD_ENV_RESETS_ITSELF (ABI 5) */
    const char *const *episode_fields; /* its episode log's names (may be NULL) */
    int num_episode_fields;
    bool agent_rows;           /* agents == 1 kept as a multi-agent env's rows (agent
                                * books, agent_mask): a hosted PettingZoo env of one
                                * agent; agents > 1 always are */
} envd_slot_config_t;

/* The config of def's envs (a valid definition) under these rules. */
envd_slot_config_t envd_slot_config_of(const envd_env_def_t *def, int autoreset_mode,
                                       int64_t max_episode_steps);
/* Set up books for num_envs envs over rows (the config checked by the
 * caller); everything is allocated here and freed by envd_slot_books_free
 * (also after a failed init).  ENVD_ENOMEM. */
int envd_slot_books_init(envd_slot_books_t *books, const envd_slot_config_t *config,
                         const envd_slot_rows_t *rows, int64_t num_envs);
void envd_slot_books_free(envd_slot_books_t *books);
/* The bytes the books allocate per env. */
uint64_t envd_slot_books_bytes_per_env(const envd_slot_config_t *config);

/* ---- the clock of the episode times ---- */
static inline double envd_slot_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* The clock read once per run of envs, and only if one needs it. */
typedef struct envd_slot_clock {
    double seconds; /* 0 until read */
} envd_slot_clock_t;

static inline double envd_slot_clock_seconds(envd_slot_clock_t *clock)
{
    if (clock->seconds == 0.0)
        clock->seconds = envd_slot_now_ns() * 1e-9;
    return clock->seconds;
}

/* memset(to, byte, n) for the few rows a step writes, as plain stores: gcc
 * inlines a memset of a variable size over a double array as `rep stos`,
 * whose start-up costs tens of cycles (a fifth of the host's books of
 * puffer:squared at N=64, perf), and calls memset for the others; a memset
 * of a constant size is a few stores. */
static inline void envd_fill_bytes(void *to, int byte, size_t n)
{
    unsigned char *p = to;
    size_t b = 0;
    for (; b + 64 <= n; b += 64)
        memset(p + b, byte, 64);
    if (n - b >= 32) {
        memset(p + b, byte, 32);
        b += 32;
    }
    if (n - b >= 16) {
        memset(p + b, byte, 16);
        b += 16;
    }
    if (n - b >= 8) {
        memset(p + b, byte, 8);
        b += 8;
    }
    if (n - b >= 4) {
        memset(p + b, byte, 4);
        b += 4;
    }
    if (n - b >= 2) {
        memset(p + b, byte, 2);
        b += 2;
    }
    if (n - b >= 1)
        p[b] = (unsigned char)byte;
}

/* ---- refusals and what a step request means ---- */
/* What a step request of an env means (the workers backend's kind word:
 * backend_workers.h's ENVD_HOSTED_RESET, _STEP and _RESET_IF_DONE equal
 * ENVD_SLOT_RESET, _STEP and _RESET_IF_DONE). */
#define ENVD_SLOT_REFUSED 0       /* never reset, or done under DISABLED: ENVD_ESTATE */
#define ENVD_SLOT_RESET 1         /* NEXT_STEP's autoreset: reset, the action ignored */
#define ENVD_SLOT_STEP 2          /* step the env with its action; flags: */
#define ENVD_SLOT_LAST_STEP 4     /*   the time limit truncates this step */
#define ENVD_SLOT_RESET_IF_DONE 8 /*   SAME_STEP: reset at once if the step ends the episode */

/* Whether the env's next step reaches the time limit (truncated then). */
static inline bool envd_slot_last_step(const envd_slot_books_t *books, const envd_env_slot_t *slot)
{
    return books->max_episode_steps > 0 && slot->elapsed_steps + 1 >= books->max_episode_steps;
}

static inline int envd_slot_next(const envd_slot_books_t *books, const envd_env_slot_t *slot)
{
    if (!slot->started)
        return ENVD_SLOT_REFUSED;
    if (slot->needs_reset)
        return books->autoreset_mode == ENVD_AUTORESET_DISABLED ? ENVD_SLOT_REFUSED
                                                                : ENVD_SLOT_RESET;
    return ENVD_SLOT_STEP | (envd_slot_last_step(books, slot) ? ENVD_SLOT_LAST_STEP : 0) |
           (books->autoreset_mode == ENVD_AUTORESET_SAME_STEP ? ENVD_SLOT_RESET_IF_DONE : 0);
}

/* ENVD_ESTATE where the env's state refuses a step, else ENVD_OK. */
static inline int envd_slot_startable(const envd_slot_books_t *books, const envd_env_slot_t *slot)
{
    return envd_slot_next(books, slot) == ENVD_SLOT_REFUSED ? ENVD_ESTATE : ENVD_OK;
}

/* Whether an env's state may refuse a step at all (an env never reset, or
 * autoreset DISABLED): only then need a caller look at each env's slot. */
static inline bool envd_slot_states_matter(const envd_slot_books_t *books, bool all_started)
{
    return !all_started || books->autoreset_mode == ENVD_AUTORESET_DISABLED;
}

/* v's unsigned distance above start: v is one of start, ..., start + n - 1
 * exactly when it is under n, for every int64 v, given n >= 1 and start +
 * n - 1 within int64 (errors.c refuses other spaces): a v under start wraps
 * to at least 2^64 + INT64_MIN - start = 2^63 - start >= n. */
static inline uint64_t envd_discrete_offset(int64_t v, int64_t start)
{
    return (uint64_t)v - (uint64_t)start;
}

static inline bool envd_in_discrete_range(int64_t v, int64_t start, int64_t n)
{
    return envd_discrete_offset(v, start) < (uint64_t)n;
}

/* ENVD_OK if every element of one action lies in its space: Discrete,
 * MultiDiscrete (element k in nvec_start[k] .. + nvec[k] - 1), MultiBinary
 * (0 or 1); else ENVD_ERANGE.  Box actions are passed as given. */
int envd_slot_action_in_space(const envd_space_t *space, const void *action);
/* The same for an env's agents actions, agents rows of action_bytes / agents
 * bytes each (dead rows' included). */
int envd_slot_actions_in_space(const envd_space_t *space, int64_t agents, size_t action_bytes,
                               const void *actions);

/* ---- resets ---- */
/* Env i's books as a reset starts its episode (before the env's reset). */
static inline void envd_slot_begin_episode(const envd_slot_books_t *books, envd_env_slot_t *slot,
                                           int64_t i, envd_slot_clock_t *clock)
{
    slot->elapsed_steps = 0;
    slot->episode_return = 0.0;
    slot->episode_length = 0;
    books->episode_starts[i] = envd_slot_clock_seconds(clock);
    slot->started = true;
    slot->needs_reset = false;
    const int64_t A = books->agents;
    if (books->agent_books)
        memset(books->agent_books + i * A, 0, (size_t)A * sizeof(envd_agent_books_t));
    if (books->sum_returns) {
        memset(books->sum_returns + i * A, 0, (size_t)A * sizeof(double));
        memset(books->sum_lengths + i * A, 0, (size_t)A * sizeof(int64_t));
    }
}

/* Env i's rows after a reset (envd_vec_reset's): a fresh episode has earned
 * nothing, and an async reset's recv returns these rows as they are. */
void envd_slot_reset_rows(const envd_slot_books_t *books, int64_t i);

/* ---- steps (an env of one agent) ---- */
/* The books of a step that ran with these raw outputs: the time limit
 * (sets *trunc on the step that reaches it), the episode's return and
 * length.  Returns whether the episode ended. */
static inline __attribute__((always_inline)) bool
envd_slot_account_step(const envd_slot_books_t *books, envd_env_slot_t *slot, double reward,
                       bool term, bool *trunc)
{
    if (envd_slot_last_step(books, slot))
        *trunc = true;
    slot->elapsed_steps++;
    slot->episode_return += reward;
    slot->episode_length++;
    return term || *trunc;
}

/* Env i's statistics for this step: its return, length and time if its
 * episode ended, zeros otherwise (gymnasium's np.where(dones, ...)). */
static inline __attribute__((always_inline)) void
envd_slot_write_stats(const envd_slot_books_t *books, const envd_env_slot_t *slot, int64_t i,
                      bool done, envd_slot_clock_t *clock)
{
    const envd_slot_rows_t *r = &books->rows;
    r->episode_returns[i] = done ? slot->episode_return : 0.0;
    r->episode_lengths[i] = done ? slot->episode_length : 0;
    if (r->episode_times)
        r->episode_times[i] =
            done ? rint((envd_slot_clock_seconds(clock) - books->episode_starts[i]) * 1e6) / 1e6
                 : 0.0;
    if (r->dones)
        r->dones[i] = done;
}

/* Env i's row but its reward after a step (the flags after
 * envd_slot_account_step) or after NEXT_STEP's autoreset (flags false, done
 * false): flags, statistics; a done env needs a reset from now on.  Alone:
 * rows whose rewards are the env's own (rows.rewards NULL, below). */
static inline __attribute__((always_inline)) void
envd_slot_write_outcome(const envd_slot_books_t *books, envd_env_slot_t *slot, int64_t i,
                        bool term, bool trunc, bool done, envd_slot_clock_t *clock)
{
    books->rows.terminations[i] = term;
    books->rows.truncations[i] = trunc;
    envd_slot_write_stats(books, slot, i, done, clock);
    if (done)
        slot->needs_reset = true;
}

/* Env i's row after a step or after NEXT_STEP's autoreset (reward 0):
 * reward, flags, statistics (envd_slot_write_outcome). */
static inline __attribute__((always_inline)) void
envd_slot_write_row(const envd_slot_books_t *books, envd_env_slot_t *slot, int64_t i,
                    double reward, bool term, bool trunc, bool done, envd_slot_clock_t *clock)
{
    books->rows.rewards[i] = (float)reward;
    envd_slot_write_outcome(books, slot, i, term, trunc, done, clock);
}

/* Whether a done env resets within its done step (SAME_STEP). */
static inline bool envd_slot_resets_at_once(const envd_slot_books_t *books)
{
    return books->autoreset_mode == ENVD_AUTORESET_SAME_STEP;
}

/* ---- steps of a multi-agent env (rows i*A .. i*A + A - 1) ---- */
/* The rows of env i after NEXT_STEP's autoreset of the whole env (the
 * actions ignored): every row live again with reward 0 (rows.rewards NULL:
 * the caller's), not done. */
void envd_slot_autoreset_agent_rows(const envd_slot_books_t *books, int64_t i,
                                    envd_slot_clock_t *clock);
/* Env i's books and rows after its step with the agents' raw outputs (A
 * each): the step counts towards the time limit; live rows take the step's
 * results (and end when flagged or at the time limit), dead rows are
 * overwritten (their observation obs + a * one_obs zeroed, reward 0 (rows.
 * rewards NULL: the caller zeroes its own), their final flags again;
 * envd.h).  Returns the rows that ended in this step;
 * *all_done: every agent is done, and the env needs a reset from now on. */
int64_t envd_slot_finish_agent_rows(const envd_slot_books_t *books, envd_env_slot_t *slot,
                                    int64_t i, unsigned char *obs, size_t one_obs,
                                    const double *reward, const bool *term, const bool *trunc,
                                    bool *all_done, envd_slot_clock_t *clock);
/* Env i's rows live (a reset within the done step starts the next episode). */
void envd_slot_live_rows(const envd_slot_books_t *books, int64_t i);
/* Env i's rows as a reset of a multi-agent env whose agents may be absent
 * at reset leaves them (backend_workers.c's hosted PettingZoo envs; a C
 * multi-agent env has every agent at reset and never calls this), after
 * the reset's other rules: agent a's row is live unless absent[a] != 0
 * (each byte read once), else dead for the whole episode (its books done
 * with final flags terminated false, truncated true, which its dead rows
 * repeat from its first step on; its row masked, its observation obs + a *
 * one_obs zeroed): no statistics, no action passed.  in_done_step: a
 * SAME_STEP reset within the step that ended the episode, whose rows keep
 * the mask of that step where their agent ended in it. */
void envd_slot_start_agent_rows(const envd_slot_books_t *books, int64_t i,
                                const volatile unsigned char *absent, unsigned char *obs,
                                size_t one_obs, bool in_done_step);

/* ---- an env that resets itself (ENVD_ENV_RESETS_ITSELF) ----
 * No autoreset, no time limit, truncated false; its episode ends are those
 * its episode_end reports, for every row of the env.  A is books->agents,
 * passed as a constant 1 by callers that inline these for single-agent envs
 * (the loops over agents are then gone). */

/* A value of the env's episode log as an episode length: rounded, 0 when
 * not finite or negative, capped at INT64_MAX's neighbourhood. */
static inline int64_t envd_slot_as_length(double value)
{
    if (!(value >= 0.0))
        return 0;
    return value < 9.2e18 ? (int64_t)llround(value) : INT64_C(9200000000000000000);
}

/* Env i's raw step outputs into its rows: rewards, terminated flags, and
 * the host's sums. */
static inline __attribute__((always_inline)) void
envd_slot_self_reset_outputs(const envd_slot_books_t *books, int64_t i, const int64_t A,
                             const double *reward, const bool *term)
{
    for (int64_t a = 0; a < A; a++) {
        const int64_t row = i * A + a;
        if (books->host_sums) {
            books->sum_returns[row] += reward[a];
            books->sum_lengths[row]++;
        }
        books->rows.rewards[row] = (float)reward[a];
        books->rows.terminations[row] = term[a];
    }
}

/* The same for rows r0 .. r0 + rows - 1 of envs stepped together (their
 * terminated flags already in their rows): one pass per array. */
static inline __attribute__((always_inline)) void
envd_slot_self_reset_rewards(const envd_slot_books_t *books, int64_t r0, size_t rows,
                             const double *reward)
{
    /* eight at a time: a loop of a known count, which gcc vectorizes at -O2
     * (a loop of unknown count it leaves scalar: 6 instructions a row) */
    float *rewards = books->rows.rewards + r0;
    size_t r = 0;
    for (; r + 8 <= rows; r += 8)
        for (size_t j = 0; j < 8; j++)
            rewards[r + j] = (float)reward[r + j];
    for (; r < rows; r++)
        rewards[r] = (float)reward[r];
    if (books->host_sums)
        for (r = 0; r < rows; r++) {
            books->sum_returns[r0 + (int64_t)r] += reward[r];
            books->sum_lengths[r0 + (int64_t)r]++;
        }
}

/* Env i's rows as of a step whose episode did not end (truncations false,
 * statistics 0, dones false, agent_mask true, log 0), if they held another
 * step's (rows_set). */
static inline __attribute__((always_inline)) void
envd_slot_self_reset_clear(const envd_slot_books_t *books, int64_t i, const int64_t A)
{
    if (!books->rows_set[i])
        return;
    const envd_slot_rows_t *r = &books->rows;
    const int num_log = books->num_log;
    for (int64_t a = 0; a < A; a++) {
        const int64_t row = i * A + a;
        r->truncations[row] = false;
        if (A > 1)
            r->agent_mask[row] = true;
        r->episode_returns[row] = 0.0;
        r->episode_lengths[row] = 0;
        if (r->episode_times)
            r->episode_times[row] = 0.0;
        if (r->dones)
            r->dones[row] = false;
    }
    if (num_log > 0)
        envd_fill_bytes(r->episode_log + i * A * num_log, 0,
                        (size_t)(A * num_log) * sizeof(double));
    books->rows_set[i] = false;
}

/* Env i's episode ended in this step, values its log (num_log of them, as
 * episode_end wrote them): every row of the env gets the episode's
 * statistics (from the log's return and length where it has them, else the
 * host's running sums, this step's reward included), dones and the log;
 * the next episode starts now.  Returns the rows that ended (A). */
static inline __attribute__((always_inline)) int64_t
envd_slot_self_reset_ended(const envd_slot_books_t *books, int64_t i, const int64_t A,
                           const double *values, envd_slot_clock_t *clock)
{
    const envd_slot_rows_t *r = &books->rows;
    const int num_log = books->num_log;
    const double now = envd_slot_clock_seconds(clock);
    const double seconds = rint((now - books->episode_starts[i]) * 1e6) / 1e6;
    for (int64_t a = 0; a < A; a++) {
        const int64_t row = i * A + a;
        r->episode_returns[row] =
            books->log_return >= 0 ? values[books->log_return] : books->sum_returns[row];
        r->episode_lengths[row] = books->log_length >= 0
                                      ? envd_slot_as_length(values[books->log_length])
                                      : books->sum_lengths[row];
        for (int f = 0; f < num_log; f++)
            r->episode_log[row * num_log + f] = values[f];
        if (books->host_sums) {
            books->sum_returns[row] = 0.0;
            books->sum_lengths[row] = 0;
        }
        if (r->episode_times)
            r->episode_times[row] = seconds;
        if (r->dones)
            r->dones[row] = true;
    }
    books->episode_starts[i] = now;
    books->rows_set[i] = true;
    return A;
}

#endif /* ENVD_ENV_SLOT_H */
