/*
 * vec.h -- N instances of one env stepped over caller-provided buffers.
 *
 * The vec owns the env states, their RNGs, time limits and episode
 * statistics; the caller owns every batch buffer (numpy arrays in-process,
 * a shared-memory segment in the daemon), so results land where the trainer
 * reads them without a copy.
 *
 * Threading: one vec call at a time (a vec is not re-entrant; callers
 * serialise, e.g. the Python VecEnv with a lock).  Within a call
 * env i is touched by exactly one thread, whichever claimed the chunk holding
 * i, so results do not depend on the thread count or the chunking.
 *
 * Dispatch: each call either runs inline on the calling thread or is split
 * into chunks on the pool.  The vec measures its cost per env step and runs
 * inline whenever the whole batch costs less than waking a thread would; chunk
 * sizes are derived from the same measurement (see vec.c).
 */
#ifndef ENVD_VEC_H
#define ENVD_VEC_H

#include <stdbool.h>
#include <stdint.h>

#include "env_slot.h" /* envd_autoreset_mode_t */
#include "envd.h"
#include "pool.h"

/* cffi:begin */
/* envd_vec_set_max_threads: no cap, every pool thread may run the vec's work. */
#define ENVD_VEC_NO_CAP (-1)

/* Largest num_envs a vec accepts (buffers stay well inside 64-bit sizes and a
 * host's memory; a daemon applies its own, lower, per-client limit). */
#define ENVD_VEC_MAX_ENVS (INT64_C(1) << 20)

/* Rows: an env of def->num_agents = A agents has A rows in every per-row
 * buffer, agent-major (row i * A + a is agent a of env i; envd.h "Multi-agent
 * envs").  "num_envs" below counts rows where a buffer is marked per row;
 * reset seeds and masks, batch ids and error indices count envs. */
typedef struct envd_vec_buffers {
    void *observations;       /* per row: one sample of the observation space */
    const void *actions;      /* per row: one sample of the action space */
    float *rewards;           /* num_envs (per row, like every buffer to dones) */
    bool *terminations;       /* num_envs */
    bool *truncations;        /* num_envs */
    void *final_observations; /* SAME_STEP: like observations, else may be NULL */
    double *episode_returns;  /* per env: return of the episode that ended in
                                 this step, 0 where none ended */
    int64_t *episode_lengths; /* likewise, its length in steps */
    /* Optional (may be NULL): */
    double *episode_times;    /* likewise, its wall time in seconds, rounded
                                 to microseconds (gymnasium's "t") */
    bool *dones;              /* terminations | truncations; with A > 1: the
                                 row's agent ended in this step (a dead row
                                 repeats its flags but is not done again) */
    /* The env's info fields (def->info_fields), num_envs slots each; required
     * for the first def->num_info_fields entries.  Written after every reset
     * and step, so they describe the state of the observation beside them. */
    void *info_fields[ENVD_MAX_INFO_FIELDS];
    bool *agent_mask; /* per row, required when A > 1 (else unused): the
                         row's agent is live (envd.h "Multi-agent envs") */
    /* An env that resets itself (ENVD_ENV_RESETS_ITSELF, ABI 5) with F =
     * def->num_episode_fields > 0: per row F doubles (row r's field k at
     * [r * F + k]), written with episode_end's values for every row of an env
     * whose episode ended in the step (dones then marks them) and 0 for the
     * other envs it stepped (so a whole-vec step's log needs no mask; a
     * reset leaves the rows as they are); required then, else unused. */
    double *episode_log;
} envd_vec_buffers_t;

typedef struct envd_vec_config {
    int64_t num_envs;          /* 1 .. ENVD_VEC_MAX_ENVS */
    int autoreset_mode;        /* envd_autoreset_mode_t */
    int64_t max_episode_steps; /* time limit; 0 = none */
    const double *params;      /* validated values: def->num_params for every
                                  env, or with per_env_params num_envs rows of
                                  them (env i's at params + i * num_params) */
    bool per_env_params;
    /* Env i's seed (num_envs entries, copied; may be NULL): at create each
     * env's RNG is seeded with it and the definition's seed callback (ABI 5)
     * gets it before init.  NULL: no seed callback, RNGs unseeded until
     * envd_vec_seed. */
    const uint64_t *seeds;
    /* The observation buffer is the caller's private memory (in-process), not
     * memory another process can write (a daemon's shared memory): envs with
     * ENVD_ENV_OBS_ROWS_PRIVATE get their rows bound only then. */
    bool private_rows;
} envd_vec_config_t;

typedef struct envd_vec envd_vec_t;

/* Inputs: the caller's actions buffer and a reset's seeds and mask may be
 * memory another process writes while the vec runs (a daemon's shared-memory
 * segment).  Each call copies the inputs it acts on into memory of the vec
 * (envd_vec_step: every action; envd_vec_batch_submit: the env ids, then
 * their actions; envd_vec_reset: seeds and mask) before it checks them, and
 * runs from the copies: an env's step callback gets a pointer into the vec's
 * copy of the actions, never into the caller's buffer, so a range check made
 * holds for the action the env sees. */

/* Bytes the vec of num_envs envs of def allocates (env states and slots,
 * the private input copies, the vec itself): what a daemon counts against
 * --max-state-bytes before it creates one.  UINT64_MAX if def is invalid
 * or the size does not fit 64 bits. */
uint64_t envd_vec_memory_bytes(const envd_env_def_t *def, int64_t num_envs);

/* pool may be NULL (always serial).  The pool must outlive the vec, and so
 * must def (a described definition too, describe.h).  An env that resets
 * itself (ENVD_ENV_RESETS_ITSELF) takes autoreset_mode NEXT_STEP and
 * max_episode_steps 0 only (else ENVD_EINVAL): its vec never resets it nor
 * truncates it; its step writes the env's terminated flags, truncated false
 * and, for dones and the episode statistics, the episodes episode_end
 * reports (every row of the env).  Inits of a definition with
 * ENVD_ENV_SERIAL_INIT run under one process-wide lock per init callback. */
int envd_vec_create(envd_vec_t **out, const envd_env_def_t *def,
                    const envd_vec_config_t *config,
                    const envd_vec_buffers_t *buffers, envd_pool_t *pool);
void envd_vec_destroy(envd_vec_t *vec);

/* Seed every env's RNG (seeds has num_envs entries) without resetting it
 * (and without the definition's seed callback, which gets the seeds of
 * create and of a reset):
 * the next reset draws from the new streams.  Not while a step or a batch is
 * in flight (their workers use the RNGs). */
void envd_vec_seed(envd_vec_t *vec, const uint64_t *seeds);

/* Reset the envs selected by mask (NULL: all; any non-zero byte selects).
 * seeds, if not NULL, has num_envs entries and reseeds each selected env's
 * RNG first (and calls the definition's seed callback, ABI 5, with it).
 * Both are copied before they are read (see "Inputs" above). */
int envd_vec_reset(envd_vec_t *vec, const uint64_t *seeds, const bool *mask);
/* How many envs the last envd_vec_reset selected (its copy of the mask):
 * a caller that refuses an empty mask checks this, not its buffer. */
int64_t envd_vec_reset_count(const envd_vec_t *vec);

/* Step every env with the actions buffer.  Returns the number of envs whose
 * episode ended (>= 0), or a negative code.  Validates first and steps nothing
 * on error: ENVD_ESTATE (an env never reset, or DISABLED and an env is done)
 * or ENVD_ERANGE (a discrete action out of range); envd_vec_error_index()
 * then names the env.  ENVD_EENV if an env callback failed. */
int envd_vec_step(envd_vec_t *vec);

/* The same as envd_vec_step, split for an event loop: submit validates and
 * starts the step on the pool (NOTIFY job, completion on the pool's eventfd)
 * or runs it inline when it is cheap -- then no eventfd event comes, so check
 * envd_vec_step_done() right after submit.  Once it is true, finish returns
 * what envd_vec_step would have.  Until then step, submit and reset return
 * ENVD_EBUSY, and destroy waits for the step; finish without a submit
 * returns ENVD_ESTATE. */
int envd_vec_step_submit(envd_vec_t *vec);
int envd_vec_step_done(const envd_vec_t *vec);
int envd_vec_step_finish(envd_vec_t *vec);

/* ---- async batches ----
 * A batch steps a subset of the envs (env_ids) while the caller goes on;
 * several batches may be in flight at once, on disjoint envs.  Batches are
 * caller-owned (create once, reuse).  While any batch is in flight,
 * envd_vec_step, envd_vec_step_submit and envd_vec_reset return ENVD_EBUSY;
 * the caller finishes every batch before destroying the vec. */
typedef struct envd_vec_batch envd_vec_batch_t;

/* A batch of up to capacity envs (1 .. ENVD_VEC_MAX_ENVS). */
int envd_vec_batch_create(envd_vec_batch_t **out, int64_t capacity);
/* Bytes a batch of capacity envs allocates. */
uint64_t envd_vec_batch_memory_bytes(int64_t capacity);
/* Not while it is in flight.  NULL is allowed. */
void envd_vec_batch_destroy(envd_vec_batch_t *batch);

/* Validate, then start stepping env_ids[0 .. count) (copied) with their
 * actions from the actions buffer: on the pool (flags ENVD_JOB_NOTIFY: the
 * pool's eventfd counts its completion; ENVD_JOB_HELPED: the caller offers
 * to help, envd_vec_batch_help -- kept only while a chunk is measured to take
 * under 100 us; its chunks are then cut to about 10 us, and a batch measured
 * under 100 us in all, on a pool of at most 2 CPUs, wakes no worker
 * (ENVD_JOB_ALONE, pool.h): its caller must eventually help it to the end
 * or wait for it), or inline when cheap.  Nothing starts
 * on error: ENVD_EINVAL (count outside [1, capacity], an id outside
 * [0, num_envs)), ENVD_EBUSY (an env already in a batch in flight or twice in
 * this one, a whole-vec step pending, or this batch in flight), ENVD_ESTATE /
 * ENVD_ERANGE as envd_vec_step; envd_vec_error_index() names the env. */
int envd_vec_batch_submit(envd_vec_t *vec, envd_vec_batch_t *batch, const int64_t *env_ids,
                          int64_t count, int flags);
int envd_vec_batch_done(const envd_vec_batch_t *batch);
/* Block until the batch is done; the caller runs its chunks meanwhile. */
void envd_vec_batch_wait(envd_vec_t *vec, envd_vec_batch_t *batch);
/* cffi:end */
/* Non-zero while the batch waits in the pool with none of its chunks claimed
 * (envd_job_unstarted: a snapshot); 0 for an inline or finished batch. */
int envd_vec_batch_unstarted(const envd_vec_batch_t *batch);
/* Help a batch in flight without waiting for it (pool.h, envd_pool_help):
 * _ref takes a reference while its chunks are not all claimed, if it was
 * submitted ENVD_JOB_HELPED and kept the flag (a chunk measured to take
 * under 100 us: a helper leaves only between chunks; else 0), with the
 * vec's caller's serialisation (the session's lock) held, which keeps the
 * batch from being resubmitted; _help,
 * called with or without it, runs chunks until none is left or leave(arg)
 * says stop, and drops the reference. */
int envd_vec_batch_help_ref(envd_vec_batch_t *batch);
void envd_vec_batch_help(envd_vec_t *vec, envd_vec_batch_t *batch, int (*leave)(void *),
                         void *arg);
/* cffi:begin */
/* Once done: end the batch (its envs may be sent again) and return the number
 * of its envs whose episode ended, or ENVD_EENV (error index: the env).
 * ENVD_EBUSY while not done; ENVD_ESTATE if it is not in flight on vec. */
int envd_vec_batch_finish(envd_vec_t *vec, envd_vec_batch_t *batch);
/* Envs in the batch's last submit. */
int64_t envd_vec_batch_size(const envd_vec_batch_t *batch);

/* ---- rendering ----
 * Bytes of one env's frame (render_height x render_width x 3), 0 when the env
 * does not render (see envd_env_def_render_info). */
uint64_t envd_vec_frame_bytes(const envd_vec_t *vec);
/* Draw env index's current state into rgb (envd_vec_frame_bytes bytes), on
 * the calling thread.  ENVD_EINVAL (the env does not render), ENVD_ERANGE (no
 * such env), ENVD_EBUSY (a step or a batch is in flight), ENVD_ESTATE (the env
 * was never reset), ENVD_EENV (its render callback failed). */
int envd_vec_render(envd_vec_t *vec, int64_t index, uint8_t *rgb);

int64_t envd_vec_error_index(const envd_vec_t *vec);
/* The vec's copy of the actions the last step or send checked (num_envs
 * samples; a send's rows only): for error messages that name the refused
 * action as the vec saw it. */
const void *envd_vec_checked_actions(const envd_vec_t *vec);
/* cffi:end */
/* 1 once env index was reset (a refused step's ENVD_ESTATE then means "done,
 * autoreset disabled"), 0 while it never was, ENVD_ERANGE out of range. */
int envd_vec_env_started(const envd_vec_t *vec, int64_t index);
/* cffi:begin */
/* Envs whose episode ended (terminated or truncated) in the last step. */
int64_t envd_vec_num_done(const envd_vec_t *vec);

/* Force a chunk size (>= 1: always dispatch to the pool with that chunk, for
 * tests) or return to adaptive dispatch (0). */
void envd_vec_set_chunk(envd_vec_t *vec, int64_t chunk);
/* Count one event on the pool's eventfd, as a NOTIFY batch's end on the pool
 * does (envd_pool_notify): for a NOTIFY batch run inline, which writes none
 * (its caller looks at it instead), when the caller must announce it after
 * all.  No pool: nothing. */
void envd_vec_notify(envd_vec_t *vec);
/* A blocking step's measured wall time, ns (its cost per env times the
 * envs); 0 while unmeasured, or while a forced chunk (set_chunk) sends
 * every step to the pool. */
double envd_vec_step_estimate_ns(const envd_vec_t *vec);

/* Cap the pool threads that step this vec's envs at once, over its whole-vec
 * steps, resets and async batches together: ENVD_VEC_NO_CAP (the default,
 * any thread of the pool), 0 (every call runs inline on the calling thread:
 * no pool wake-up, a forced chunk ignored -- except a NOTIFY run, whose
 * caller is an event loop serving others: one not measured yet, or measured
 * above 1 ms, runs on one pool thread) or K >= 1 (runs are split for K
 * threads and at most K pool threads run them at once; K at or above the
 * pool's size is no cap).  A thread blocked in the call (envd_vec_step's
 * caller, a batch wait) still runs chunks beside them: the cap counts pool
 * threads.  Results never depend on it.  ENVD_EINVAL below
 * ENVD_VEC_NO_CAP, ENVD_EBUSY while a step or a batch is in flight. */
int envd_vec_set_max_threads(envd_vec_t *vec, int max_threads);
int envd_vec_max_threads(const envd_vec_t *vec);

typedef struct envd_vec_stats {
    double cost_ns_per_env; /* measured cost of one env step, 0 before any */
    int64_t inline_jobs;    /* steps run on the calling thread */
    int64_t pooled_jobs;    /* steps split over the pool */
    int64_t last_chunk;     /* chunk size of the last pooled step */
    /* a blocking step's wall time per env, as run inline and as pooled
     * (envd_vec_step's choice between them, step_choice.h); 0 before any */
    double inline_step_ns_per_env;
    double pooled_step_ns_per_env;
} envd_vec_stats_t;

void envd_vec_get_stats(const envd_vec_t *vec, envd_vec_stats_t *stats);
/* cffi:end */

#endif /* ENVD_VEC_H */
