/*
 * pool.h -- a persistent pthread pool that runs jobs split into chunks.
 *
 * A job is "call fn(ctx, begin, end) over [0, n) in chunks of `chunk` items".
 * Chunks are claimed with an atomic counter, so any thread may run any chunk;
 * fn must therefore be safe to call concurrently on disjoint ranges.
 *
 * Jobs are caller-owned structs (no allocation per job).  A submitted job
 * must stay alive and untouched until it is complete (envd_job_done() returns
 * true, or envd_pool_wait() returned).  Several jobs may be in flight at once
 * (e.g. steps of different daemon sessions); they share the workers chunk by
 * chunk: a worker always takes the job served least so far (fewest items
 * claimed), and after each chunk moves on if a job was submitted meanwhile,
 * so a small job never waits for the whole of a large one.
 *
 * Completion is visible three ways: envd_job_done() (a poll),
 * envd_pool_wait() (blocks; the calling thread helps run the job's chunks),
 * and, for jobs submitted with ENVD_JOB_NOTIFY, the pool's eventfd, which is
 * incremented once per completed NOTIFY job (the daemon's event loop watches
 * it, reads it, then polls envd_job_done() on its in-flight jobs).
 *
 * num_threads == 0 is a valid pool: submit runs the job inline on the calling
 * thread before returning (and still signals the eventfd for NOTIFY jobs).
 */
#ifndef ENVD_POOL_H
#define ENVD_POOL_H

#include <stdatomic.h>
#include <stdint.h>

/* cffi:begin */
#define ENVD_POOL_MAX_THREADS 256

typedef struct envd_pool envd_pool_t;
typedef void (*envd_task_fn)(void *ctx, int64_t begin, int64_t end);

/* NOTIFY: count the job's completion on the eventfd.  HELPED: the submitter
 * runs chunks too (envd_pool_wait right after, as envd_pool_run does, or
 * envd_pool_help): at most max(1, CPUs - 1) workers run its chunks at once
 * (and no more are woken for it), so that the workers and the helping caller
 * do not outnumber the CPUs, whatever the pool's size: a third runner on two
 * CPUs only preempts one holding a chunk, and the job waits for that chunk.
 * ALONE (with HELPED; EINVAL without): wake no worker, for a job too short
 * to be worth one; workers awake anyway may take its chunks, and the
 * submitter must eventually run the rest (help it until none is left, or
 * wait for it): nobody else is woken for them. */
enum { ENVD_JOB_NOTIFY = 1, ENVD_JOB_HELPED = 2, ENVD_JOB_ALONE = 4 };

/* cffi:end */
/* A cap on how many workers may run the chunks of a group of jobs at once
 * (every job of one daemon session: its step and its async batches).  The
 * caller owns it, sets max_workers (>= 1) and zeroes active before any job
 * of the group is submitted, and keeps it alive until each is complete.
 * Threads that wait for a job (envd_pool_wait) run its chunks too and are
 * not counted: the cap counts pool threads only.  Fields other than
 * max_workers are private to pool.c. */
typedef struct envd_pool_cap {
    int max_workers;
    _Atomic int active; /* workers holding a slot (taken under the pool's lock) */
} envd_pool_cap_t;

/* Caller-owned job.  Fields are private to pool.c; zero-initialise it once
 * (or let envd_pool_submit initialise it) and reuse it for later jobs. */
typedef struct envd_job {
    envd_task_fn fn;
    void *ctx;
    int64_t n, chunk;
    int flags;
    _Atomic int64_t next;   /* next unclaimed item */
    _Atomic int32_t refs;   /* queue reference + threads working on it */
    _Atomic uint32_t done;  /* futex word: 1 when complete; 0 while in flight,
                               2 while in flight with a waiter asleep on it */
    struct envd_job *queue_next;
    _Atomic int workers;    /* workers holding the job (a HELPED job's limit) */
    envd_pool_cap_t *cap;   /* NULL: any number of workers (envd_job_set_cap) */
} envd_job_t;

/* cffi:begin */
/* Create a pool with num_threads workers (0..ENVD_POOL_MAX_THREADS).
 * cpus, if not NULL, has num_threads CPU ids: worker i is pinned to cpus[i].
 * Returns ENVD_OK or ENVD_EINVAL (bad argument or CPU id outside
 * [0, CPU_SETSIZE)), ENVD_ENOMEM, or ENVD_ESYS (a thread could not be
 * created or pinned, errno says why; nothing is left running). */
int envd_pool_create(envd_pool_t **out, int num_threads, const int *cpus);

/* Stop and join every worker, close the eventfd, free the pool.  No job may
 * be in flight.  NULL is allowed. */
void envd_pool_destroy(envd_pool_t *pool);

int envd_pool_num_threads(const envd_pool_t *pool);

/* The eventfd (EFD_NONBLOCK) counting completed NOTIFY jobs. */
int envd_pool_eventfd(const envd_pool_t *pool);

/* cffi:end */
/* Count one event on the eventfd, as a NOTIFY job's end does: for work
 * announced to the event loop that ran without a job (a NOTIFY batch the vec
 * ran inline, envd_vec_notify).  After the work's done flag is written. */
void envd_pool_notify(envd_pool_t *pool);

/* Start a job.  0 <= n <= 2^47, chunk >= 1 (a chunk larger than n is
 * clamped to n).  Returns at once (except with zero workers, where the job
 * runs inline; a job with n == 0 completes at once).  ENVD_EINVAL on bad
 * arguments (fn NULL, flags other than NOTIFY, HELPED and ALONE, ALONE
 * without HELPED), ENVD_EBUSY if this job struct is still in flight. */
int envd_pool_submit(envd_pool_t *pool, envd_job_t *job, envd_task_fn fn,
                     void *ctx, int64_t n, int64_t chunk, int flags);

/* Put this job (and every later submit of it) under cap, or under none
 * (NULL).  Not while the job is in flight; ENVD_EINVAL for a cap whose
 * max_workers is below 1 (a job nobody may run would never complete: a
 * caller that wants no workers runs the work itself). */
int envd_job_set_cap(envd_job_t *job, envd_pool_cap_t *cap);

/* Block until the job is complete; the caller runs chunks meanwhile.
 * Returns at once for a zeroed job that was never submitted. */
void envd_pool_wait(envd_pool_t *pool, envd_job_t *job);

/* Helping a job without waiting for it (the doorbell's server thread runs
 * its session's batches in flight while it waits for its client's next
 * request): envd_pool_help_ref takes a reference to a job in flight that
 * still has unclaimed chunks (1; 0 otherwise: nothing to help with).  While
 * it is held the job cannot complete, so it cannot be resubmitted either;
 * the caller must not wait for the job meanwhile.  Taking it races with a
 * resubmit of the same job struct (a complete job may be reused): the
 * caller keeps resubmits out meanwhile (the doorbell holds the session's
 * lock, under which every batch is submitted).  envd_pool_help then runs the
 * job's chunks until none is left unclaimed, or until leave(arg), asked
 * before the first chunk and after each, returns non-zero (before the first:
 * it claims none), and drops the reference.  Submit such a job with
 * ENVD_JOB_HELPED: the helper's CPU is not a worker's. */
int envd_pool_help_ref(envd_job_t *job);
void envd_pool_help(envd_pool_t *pool, envd_job_t *job, int (*leave)(void *), void *arg);

/* submit + wait: run fn over [0, n) with the caller helping. */
int envd_pool_run(envd_pool_t *pool, envd_job_t *job, envd_task_fn fn,
                  void *ctx, int64_t n, int64_t chunk);

/* The CPUs the pool's workers run on: the distinct CPUs of the pin set when
 * the pool was created with one, else those this process could run on then;
 * ENVD_EINVAL for NULL. */
int envd_pool_cpus(const envd_pool_t *pool);

/* The most workers that run a HELPED job at once: max(1, CPUs - 1) (pool.h,
 * ENVD_JOB_HELPED), whatever num_threads; a caller splitting such a job
 * counts these workers and itself. */
int envd_pool_helped_workers(const envd_pool_t *pool);

/* Jobs submitted and not complete yet, by any thread: a snapshot (it may
 * change at once), for dispatch decisions only. */
int envd_pool_jobs_in_flight(const envd_pool_t *pool);

/* Whether the jobs in flight already keep this process's CPUs busy: at least
 * one, and at least all CPUs but one (each blocking job's caller runs chunks
 * on a CPU of its own, next to the workers).  A caller that would wait for a
 * new job had then better run it itself: splitting it buys no parallelism,
 * only wake-ups and chunks preempted midway.  A snapshot, like the above. */
int envd_pool_saturated(const envd_pool_t *pool);

/* Threads outside the pool that spin for a client in another process (the
 * doorbell's server threads, doorbell.c) count themselves here (+1 while awake,
 * -1 as they sleep): idle workers spin only on the CPUs left over, so that
 * the client -- whose next request a spinning server catches at once -- has a
 * CPU to run on between requests (a 2-CPU daemon whose worker and server
 * both spun kept the client waiting 15-20 us for a CPU after every step).
 * Process-wide, shared by every pool. */
void envd_pool_reserve_cpus(int delta);

/* Non-zero once the job is complete (acquire ordering: everything the job
 * wrote is visible to the caller after this returns true).  Zero for a job
 * that was never submitted. */
int envd_job_done(const envd_job_t *job);

/* Non-zero while the job is in flight and no thread has claimed a chunk of
 * it yet (nobody runs it: its workers are busy or not scheduled).  A
 * snapshot, for dispatch decisions only: a worker may claim one at once. */
int envd_job_unstarted(const envd_job_t *job);

#endif /* ENVD_POOL_H */
