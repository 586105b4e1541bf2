/*
 * pool.c -- a persistent pthread pool that runs jobs split into chunks.
 *
 * Shape (see pool.h for the API):
 *   - A pool owns num_threads workers, a queue (in submit order) of jobs that
 *     still have unclaimed chunks, served least-claimed first (see
 *     pool_take_job), a 32-bit generation word that every submit bumps (the
 *     futex the idle workers sleep on) and an eventfd for NOTIFY jobs.
 *   - Threads claim chunks with atomic_fetch_add on job->next; any thread may
 *     run any chunk, including the thread blocked in envd_pool_wait().
 *   - A job's lifetime is a reference count (job->refs); whoever drops the
 *     last reference completes the job.  Nothing touches a job after dropping
 *     its reference, so a late worker can never run into the next job that
 *     reuses the same struct.
 *
 * Lock order: pool->lock is the only lock and is never held while running a
 * chunk, completing a job or making a syscall.  Everything else is atomics.
 *
 * Job invariants (J1-J5), relied on below:
 *   J1  While a job is linked in pool->queue, the queue holds one reference,
 *       so refs >= 1 and the job cannot complete.
 *   J2  A worker takes a reference only under pool->lock, while the job is
 *       still linked (so J1 keeps it alive while it does).  A waiter (or a
 *       helper: envd_pool_help_ref) takes one only by incrementing a
 *       non-zero refs (refs == 0 is terminal).  A helper may drop its
 *       reference having claimed nothing (envd_pool_help): the thread that
 *       claims the last chunk still makes the claim past n (J3).
 *   J3  Claimed offsets are 0, chunk, 2*chunk, ...; the first claim at or
 *       past n lies in [n, n + chunk) and is seen by exactly one thread: that
 *       thread unlinks the job (under pool->lock) and drops the queue's
 *       reference.  Threads skip linked jobs whose next >= n.
 *   J4  Every thread runs the chunks it claimed before dropping its
 *       reference; so refs == 0 implies every chunk has finished.  The
 *       acq_rel decrements form a release sequence, so the last dropper sees
 *       every chunk's writes and publishes them with the release on done.
 *   J5  The completer reads what it needs from the job (flags) before storing
 *       done = JOB_DONE and touches only the address of done afterwards (a
 *       futex wake on a recycled address is at worst a spurious wake-up).
 *
 * Wake-up invariants (W1-W4):
 *   W1  A worker reads pool->gen before looking at the queue and sleeps only
 *       while gen still equals what it read (FUTEX_WAIT checks atomically);
 *       submit links the job before bumping gen.  So a job submitted after
 *       the worker looked always changes gen first: no lost wake-up.
 *   W2  A worker increments pool->sleepers before FUTEX_WAIT and submit
 *       bumps gen before reading sleepers (both seq_cst): either submit sees
 *       the sleeper and wakes it, or the sleeper's FUTEX_WAIT sees the new gen.
 *   W3  A worker that took a job goes back to the queue before it sleeps, so
 *       waking fewer workers than the job has chunks never strands a job.
 *       (An ALONE job wakes none: its submitter runs what no awake worker
 *       takes, pool.h.)
 *   W4  Submit wakes min(chunks - spinners, sleepers) workers: a spinner needs
 *       no wake-up.  Every counted spinner either read gen before this
 *       submit's bump (it sees the bump, in its spin or in its FUTEX_WAIT) or
 *       after it (then it looked at the queue after the job was linked, and
 *       found its chunks all claimed).  A worker stops spinning (relaxed
 *       decrement) before it counts itself a sleeper (seq_cst), and submit
 *       loads sleepers before spinners, so no worker is counted as both.
 *
 * Cap invariants (C1-C3), for jobs under an envd_pool_cap_t (pool.h):
 *   C1  A worker takes a slot (cap->active + 1) only in pool_take_job, under
 *       pool->lock, and only while active < max_workers; releases only lower
 *       active.  So at most max_workers workers run the cap's jobs at once.
 *   C2  A worker releases its slot after its last chunk of the job and
 *       before it drops its reference: the cap belongs to the job's owner,
 *       which may free it once the job is complete (J5).
 *   C3  A job skipped because its cap is full has a slot holder, and a slot
 *       holder goes back to the queue after releasing (W3) before it may
 *       sleep: a capped job with chunks left is never stranded.  Submit wakes
 *       at most max_workers workers for a capped job (W4 otherwise).
 *
 * Helped jobs (H1): a HELPED job is held by at most pool->helped_workers
 * workers at once (job->workers, taken and released as a cap's slot: C1-C3
 * hold for it word for word), so that its workers and its helping caller do
 * not outnumber the CPUs.  A worker's hold ends before its reference (C2),
 * and a job skipped for it has a holder that goes back to the queue (C3).
 */
#define _GNU_SOURCE
#include "pool.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "envd.h"
#include "futex.h"
#include "spin.h"

/* n is capped so that job->next cannot overflow: each thread that holds a
 * reference makes at most one claim past n (J3 and the next < n checks
 * before taking a reference), each of at most chunk <= n items. */
#define POOL_MAX_ITEMS (INT64_C(1) << 47)

/* How long an idle thread spins before it sleeps: about the cost of a
 * cross-CPU wake-up (docs/benchmarks.md), so a spin catches back-to-back jobs
 * without burning a meaningful share of a CPU when none come. */
#define SPIN_NS 20000
#define SPIN_CHECK_EVERY 64 /* pause iterations between clock reads */

/* job->done values.  JOB_WAITING means "in flight and a waiter may be asleep
 * on this word", so the completer makes the wake syscall only when needed. */
enum { JOB_RUNNING = 0, JOB_DONE = 1, JOB_WAITING = 2 };

struct envd_pool {
    int num_threads;
    int num_started;  /* workers actually created (create's error path) */
    int max_spinners; /* idle workers allowed to spin at once */
    int helped_workers; /* workers a HELPED job may have at once (H1) */
    int cpus;         /* CPUs the workers run on: the pin set's, else the process's at create */
    int efd;
    pthread_t *threads;
    pthread_mutex_t lock;
    envd_job_t *head, *tail; /* guarded by lock: submitted, not yet unlinked (J3) */
    _Atomic uint32_t gen;    /* futex word: bumped by each submit / destroy */
    _Atomic int sleepers;    /* workers in (or about to enter) FUTEX_WAIT */
    _Atomic int spinners;    /* workers spinning on gen */
    _Atomic int in_flight;   /* jobs submitted and not complete (a hint for callers) */
    _Atomic int shutdown;
};

/* ---- small helpers --------------------------------------------------------- */
/* Spin for up to SPIN_NS while *word == value; non-zero if it changed. */
static int spin_while_equal(_Atomic uint32_t *word, uint32_t value)
{
    const int64_t deadline = envd_now_ns() + SPIN_NS;
    for (;;) {
        for (int i = 0; i < SPIN_CHECK_EVERY; i++) {
            if (atomic_load_explicit(word, memory_order_acquire) != value)
                return 1;
            envd_cpu_relax();
        }
        if (envd_now_ns() >= deadline)
            return 0;
    }
}

/* ---- job lifetime ------------------------------------------------------------ */

/* J5: runs once per job, on the thread that dropped the last reference. */
static void job_complete(envd_pool_t *pool, envd_job_t *job)
{
    const int notify = job->flags & ENVD_JOB_NOTIFY;
    /* Before done: a caller that saw its job done never counts it. */
    atomic_fetch_sub_explicit(&pool->in_flight, 1, memory_order_relaxed);
    uint32_t old = atomic_exchange_explicit(&job->done, JOB_DONE, memory_order_acq_rel);
    if (old == JOB_WAITING)
        envd_futex_wake(&job->done, INT_MAX, ENVD_FUTEX_PRIVATE);
    if (notify) /* (after the done store: see envd_pool_notify) */
        envd_pool_notify(pool);
}

static void job_unref(envd_pool_t *pool, envd_job_t *job)
{
    if (atomic_fetch_sub_explicit(&job->refs, 1, memory_order_acq_rel) == 1)
        job_complete(pool, job);
}

/* J3: called by the one thread whose claim landed in [n, n + chunk). */
static void job_unlink(envd_pool_t *pool, envd_job_t *job)
{
    pthread_mutex_lock(&pool->lock);
    envd_job_t *prev = NULL;
    for (envd_job_t *j = pool->head; j != job; j = j->queue_next)
        prev = j;
    if (prev)
        prev->queue_next = job->queue_next;
    else
        pool->head = job->queue_next;
    if (pool->tail == job)
        pool->tail = prev;
    pthread_mutex_unlock(&pool->lock);
    job_unref(pool, job); /* the queue's reference; ours is still held */
}

static int job_exhausted(const envd_job_t *job)
{
    return atomic_load_explicit(&job->next, memory_order_relaxed) >= job->n;
}

/* Claim and run chunks until none is left, then drop the caller's reference
 * (J4: every chunk claimed here has finished by then).  A pool worker
 * (is_worker) also stops after a chunk when a job was submitted since it took
 * this one (gen moved past `taken`), and goes back to pool_take_job: so a
 * small job submitted behind a large one waits for a chunk, not for the whole
 * job.  A helper (envd_pool_help) stops after a chunk once leave(leave_arg)
 * says so, leaving the rest to the workers.  A worker holds a slot of the
 * job's cap, if it has one (C1), and releases it before its reference (C2);
 * a waiter or a helper holds none. */
static void job_run_chunks(envd_pool_t *pool, envd_job_t *job, int is_worker, uint32_t taken,
                           int (*leave)(void *), void *leave_arg)
{
    const int64_t n = job->n, chunk = job->chunk;
    for (;;) {
        int64_t begin = atomic_fetch_add_explicit(&job->next, chunk, memory_order_relaxed);
        if (begin >= n) {
            if (begin < n + chunk)
                job_unlink(pool, job);
            break;
        }
        job->fn(job->ctx, begin, begin + chunk < n ? begin + chunk : n);
        /* Leave only while chunks remain unclaimed: then whoever claims the
         * last one goes on to the claim past n that unlinks the job (J3). */
        if (((is_worker && atomic_load_explicit(&pool->gen, memory_order_relaxed) != taken) ||
             (leave && leave(leave_arg))) &&
            atomic_load_explicit(&job->next, memory_order_relaxed) < n)
            break; /* the job stays linked (J1) and takeable (next < n) */
    }
    if (is_worker) {
        atomic_fetch_sub_explicit(&job->workers, 1, memory_order_relaxed);
        if (job->cap)
            atomic_fetch_sub_explicit(&job->cap->active, 1, memory_order_relaxed);
    }
    job_unref(pool, job);
}

/* ---- workers ----------------------------------------------------------------- */

/* C1: whether a worker may take a slot of the job's cap now (under pool->lock). */
static int cap_has_room(const envd_job_t *job)
{
    return !job->cap ||
           atomic_load_explicit(&job->cap->active, memory_order_relaxed) < job->cap->max_workers;
}

/* H1: whether a HELPED job already has all the workers it may have (under
 * pool->lock). */
static int helped_full(const envd_pool_t *pool, const envd_job_t *job)
{
    return (job->flags & ENVD_JOB_HELPED) &&
           atomic_load_explicit(&job->workers, memory_order_relaxed) >= pool->helped_workers;
}

/* J2: the queued job with unclaimed chunks and room under its cap and its
 * helped limit that has been served least (fewest items claimed; the oldest
 * among equals), with a reference, a slot of its cap (C1) and a hold (H1)
 * taken.  Jobs therefore share the workers chunk by chunk, and a session's
 * small step is not starved by another's large one.  *crowded: a HELPED job
 * with chunks left was passed over for its limit (H1): its workers and its
 * helping caller fill the CPUs. */
static envd_job_t *pool_take_job(envd_pool_t *pool, int *crowded)
{
    pthread_mutex_lock(&pool->lock);
    envd_job_t *job = NULL;
    int64_t least = INT64_MAX;
    *crowded = 0;
    for (envd_job_t *j = pool->head; j; j = j->queue_next) {
        int64_t claimed = atomic_load_explicit(&j->next, memory_order_relaxed);
        if (claimed >= j->n)
            continue;
        if (helped_full(pool, j))
            *crowded = 1;
        else if (claimed < least && cap_has_room(j)) {
            job = j;
            least = claimed;
        }
    }
    if (job) {
        atomic_fetch_add_explicit(&job->refs, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&job->workers, 1, memory_order_relaxed);
        if (job->cap)
            atomic_fetch_add_explicit(&job->cap->active, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&pool->lock);
    return job;
}

/* Threads of this process outside any pool that keep a CPU busy for a client
 * in another process (envd_pool_reserve_cpus). */
static _Atomic int g_reserved_cpus;

void envd_pool_reserve_cpus(int delta)
{
    atomic_fetch_add_explicit(&g_reserved_cpus, delta, memory_order_relaxed);
}

/* Nothing to do: spin (if fewer than max_spinners, less the CPUs reserved,
 * already do, and not `crowded`: a spinner would take a CPU from a HELPED
 * job's runners, pool_take_job), then sleep until gen moves past `seen` (W1,
 * W2).  Returns on any change of gen, which may be spurious; the caller
 * re-checks. */
static void worker_idle(envd_pool_t *pool, uint32_t seen, int crowded)
{
    const int limit = crowded ? 0
                              : pool->max_spinners -
                                    atomic_load_explicit(&g_reserved_cpus, memory_order_relaxed);
    int s = atomic_load_explicit(&pool->spinners, memory_order_relaxed);
    while (s < limit &&
           !atomic_compare_exchange_weak_explicit(&pool->spinners, &s, s + 1,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
    if (s < limit) {
        int changed = spin_while_equal(&pool->gen, seen);
        atomic_fetch_sub_explicit(&pool->spinners, 1, memory_order_relaxed);
        if (changed)
            return;
    }
    atomic_fetch_add(&pool->sleepers, 1);
    envd_futex_wait(&pool->gen, seen, ENVD_FUTEX_FOREVER, ENVD_FUTEX_PRIVATE);
    atomic_fetch_sub(&pool->sleepers, 1);
}

/* Workers run under SCHED_BATCH (no privilege needed; best effort: a
 * sandbox may refuse it).  Under SCHED_OTHER a worker woken by a submit
 * preempts the submitting thread on its CPU (wake-up preemption): an async
 * send then returned only once the worker had stepped much of the batch
 * (in-process, 2 CPUs: 138 us of wall time for 28 us of CPU), so the
 * trainer's learner started late and overlapped nothing.  A batch worker
 * goes to an idle CPU, or waits for the submitter to block; a blocking step's
 * caller runs chunks itself meanwhile (docs/benchmarks.md). */
static void worker_set_batch_policy(void)
{
    /* Only from SCHED_OTHER: a worker that inherited SCHED_IDLE or a
     * real-time policy (the operator's chrt, systemd's CPUSchedulingPolicy)
     * keeps what the operator asked for. */
    int policy;
    struct sched_param param = {0};
    if (pthread_getschedparam(pthread_self(), &policy, &param) != 0 || policy != SCHED_OTHER)
        return;
    param.sched_priority = 0;
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
}

static void *worker_main(void *arg)
{
    envd_pool_t *pool = arg;
    worker_set_batch_policy();
    for (;;) {
        /* W1: read gen before looking at the queue. */
        uint32_t seen = atomic_load(&pool->gen);
        int crowded;
        envd_job_t *job = pool_take_job(pool, &crowded);
        if (job) {
            job_run_chunks(pool, job, 1, seen, NULL, NULL);
            continue; /* W3 */
        }
        if (atomic_load(&pool->shutdown))
            return NULL;
        worker_idle(pool, seen, crowded);
    }
}

/* ---- create / destroy ---------------------------------------------------------- */

/* Stop and join the workers that were started, then free everything. */
static void pool_teardown(envd_pool_t *pool)
{
    atomic_store(&pool->shutdown, 1);
    atomic_fetch_add(&pool->gen, 1);
    envd_futex_wake(&pool->gen, INT_MAX, ENVD_FUTEX_PRIVATE);
    for (int i = 0; i < pool->num_started; i++)
        pthread_join(pool->threads[i], NULL);
    if (pool->efd >= 0)
        close(pool->efd);
    pthread_mutex_destroy(&pool->lock);
    free(pool->threads);
    free(pool);
}

static int pin_thread(pthread_t thread, int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((size_t)cpu, &set);
    int err = pthread_setaffinity_np(thread, sizeof set, &set);
    if (err == 0)
        return ENVD_OK;
    errno = err;
    return ENVD_ESYS;
}

/* Workers block every signal (they inherit the creator's mask), so signals
 * meant for the daemon are delivered to its own threads -- except the ones a
 * fault raises in the faulting thread: a blocked SIGBUS is fatal whatever the
 * handler, and segment_guard.c's handler must run when a worker touches a
 * segment its client truncated. */
static int pool_start_workers(envd_pool_t *pool, const int *cpus)
{
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = ENVD_OK;
    for (int i = 0; i < pool->num_threads && rc == ENVD_OK; i++) {
        int err = pthread_create(&pool->threads[i], NULL, worker_main, pool);
        if (err != 0) {
            errno = err;
            rc = ENVD_ESYS;
            break;
        }
        pool->num_started++;
        if (cpus)
            rc = pin_thread(pool->threads[i], cpus[i]);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* The CPUs the workers will run on: the distinct ones pinned to when pins
 * are given (the creator's own mask says nothing of them: `taskset -c 0
 * envd --threads 4 --pin-cpus 4,5,6,7` runs its workers on four), else the
 * ones this process may run on. */
static int worker_cpus(int num_threads, const int *cpus)
{
    if (cpus == NULL || num_threads == 0)
        return envd_usable_cpus();
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < num_threads; i++)
        CPU_SET((size_t)cpus[i], &set);
    return CPU_COUNT(&set);
}

int envd_pool_create(envd_pool_t **out, int num_threads, const int *cpus)
{
    if (!out || num_threads < 0 || num_threads > ENVD_POOL_MAX_THREADS)
        return ENVD_EINVAL;
    *out = NULL;
    for (int i = 0; cpus && i < num_threads; i++)
        if (cpus[i] < 0 || cpus[i] >= CPU_SETSIZE)
            return ENVD_EINVAL;
    envd_pool_t *pool = calloc(1, sizeof *pool);
    if (!pool)
        return ENVD_ENOMEM;
    pool->num_threads = num_threads;
    /* The submitting thread keeps one CPU busy; more spinners than the
     * remaining CPUs would only steal time from the threads doing work. */
    pool->cpus = worker_cpus(num_threads, cpus);
    pool->max_spinners = pool->cpus - 1;
    if (pool->max_spinners < 0)
        pool->max_spinners = 0;
    pool->helped_workers = pool->cpus > 2 ? pool->cpus - 1 : 1;
    pool->threads = calloc(num_threads > 0 ? (size_t)num_threads : 1, sizeof *pool->threads);
    pool->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&pool->lock, NULL);
    int rc = !pool->threads ? ENVD_ENOMEM : pool->efd < 0 ? ENVD_ESYS : ENVD_OK;
    if (rc == ENVD_OK)
        rc = pool_start_workers(pool, cpus);
    if (rc != ENVD_OK) {
        int err = errno; /* keep the failing call's errno for ENVD_ESYS */
        pool_teardown(pool);
        errno = err;
        return rc;
    }
    *out = pool;
    return ENVD_OK;
}

void envd_pool_destroy(envd_pool_t *pool)
{
    if (pool)
        pool_teardown(pool);
}

int envd_pool_num_threads(const envd_pool_t *pool)
{
    return pool ? pool->num_threads : ENVD_EINVAL;
}

int envd_pool_eventfd(const envd_pool_t *pool)
{
    return pool ? pool->efd : ENVD_EINVAL;
}

void envd_pool_notify(envd_pool_t *pool)
{
    /* The caller wrote what the event announces first: the event loop reads
     * the eventfd and then polls done, so it must never see the event before
     * the flag.  A write can only fail if the counter is about to overflow,
     * in which case the fd is readable anyway. */
    const uint64_t one = 1;
    while (write(pool->efd, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

/* ---- jobs ------------------------------------------------------------------- */

static int64_t job_num_chunks(const envd_job_t *job)
{
    return (job->n + job->chunk - 1) / job->chunk;
}

/* Zero workers, or nothing to do: run every chunk here and complete. */
static void job_run_inline(envd_pool_t *pool, envd_job_t *job)
{
    for (int64_t b = 0; b < job->n; b += job->chunk)
        job->fn(job->ctx, b, b + job->chunk < job->n ? b + job->chunk : job->n);
    atomic_store_explicit(&job->next, job->n, memory_order_relaxed);
    job_unref(pool, job);
}

/* Link the job (J1: refs is already 1 for the queue), bump gen after linking
 * (W1), then wake as many sleepers as the job can use (W2, W4). */
static void pool_enqueue(envd_pool_t *pool, envd_job_t *job)
{
    pthread_mutex_lock(&pool->lock);
    if (pool->tail)
        pool->tail->queue_next = job;
    else
        pool->head = job;
    pool->tail = job;
    pthread_mutex_unlock(&pool->lock);
    atomic_fetch_add(&pool->gen, 1);
    int sleepers = atomic_load(&pool->sleepers);
    if (sleepers > 0 && !(job->flags & ENVD_JOB_ALONE)) {
        /* The limits first, then the spinners: a spinning worker takes the
         * job too, so it counts against them (were they subtracted first, a
         * helped job would wake helped_workers sleepers on top of them). */
        int64_t want = job_num_chunks(job);
        if ((job->flags & ENVD_JOB_HELPED) && want > pool->helped_workers)
            want = pool->helped_workers; /* H1: more could not take it */
        if (job->cap && want > job->cap->max_workers)
            want = job->cap->max_workers; /* C3: more could not take it */
        want -= atomic_load(&pool->spinners);
        if (want > 0)
            envd_futex_wake(&pool->gen, want < sleepers ? (int)want : sleepers,
                            ENVD_FUTEX_PRIVATE);
    }
}

int envd_pool_submit(envd_pool_t *pool, envd_job_t *job, envd_task_fn fn,
                     void *ctx, int64_t n, int64_t chunk, int flags)
{
    if (!pool || !job || !fn || n < 0 || n > POOL_MAX_ITEMS || chunk < 1 ||
        (flags & ~(ENVD_JOB_NOTIFY | ENVD_JOB_HELPED | ENVD_JOB_ALONE)) ||
        (flags & (ENVD_JOB_HELPED | ENVD_JOB_ALONE)) == ENVD_JOB_ALONE)
        return ENVD_EINVAL;
    /* fn == NULL marks a struct that was never submitted (zeroed). */
    if (job->fn && atomic_load_explicit(&job->done, memory_order_acquire) != JOB_DONE)
        return ENVD_EBUSY;
    job->fn = fn;
    job->ctx = ctx;
    job->n = n;
    job->chunk = chunk < n ? chunk : (n > 0 ? n : 1); /* bounds next, see POOL_MAX_ITEMS */
    job->flags = flags;
    job->queue_next = NULL;
    atomic_store_explicit(&job->next, 0, memory_order_relaxed);
    atomic_store_explicit(&job->refs, 1, memory_order_relaxed);
    atomic_store_explicit(&job->workers, 0, memory_order_relaxed);
    atomic_store_explicit(&job->done, JOB_RUNNING, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->in_flight, 1, memory_order_relaxed);
    if (pool->num_threads == 0 || n == 0)
        job_run_inline(pool, job);
    else
        pool_enqueue(pool, job);
    return ENVD_OK;
}

int envd_job_set_cap(envd_job_t *job, envd_pool_cap_t *cap)
{
    if (!job || (cap && cap->max_workers < 1))
        return ENVD_EINVAL;
    if (job->fn && atomic_load_explicit(&job->done, memory_order_acquire) != JOB_DONE)
        return ENVD_EBUSY;
    job->cap = cap;
    return ENVD_OK;
}

/* J2 for waiters: a reference only while the job has chunks left and is not
 * complete (refs > 0; a zero count never rises again). */
static int job_try_ref(envd_job_t *job)
{
    if (job_exhausted(job))
        return 0;
    int32_t r = atomic_load_explicit(&job->refs, memory_order_relaxed);
    while (r > 0)
        if (atomic_compare_exchange_weak_explicit(&job->refs, &r, r + 1, memory_order_relaxed,
                                                  memory_order_relaxed))
            return 1;
    return 0;
}

/* Spin briefly, then sleep on done, announcing the sleeper with JOB_WAITING
 * so that the completer knows to wake it (J5). */
static void job_wait_done(envd_job_t *job)
{
    spin_while_equal(&job->done, JOB_RUNNING);
    for (;;) {
        uint32_t d = atomic_load_explicit(&job->done, memory_order_acquire);
        if (d == JOB_DONE)
            return;
        if (d == JOB_RUNNING &&
            !atomic_compare_exchange_strong_explicit(&job->done, &d, JOB_WAITING,
                                                     memory_order_acquire, memory_order_acquire))
            continue;
        envd_futex_wait(&job->done, JOB_WAITING, ENVD_FUTEX_FOREVER, ENVD_FUTEX_PRIVATE);
    }
}

void envd_pool_wait(envd_pool_t *pool, envd_job_t *job)
{
    if (!pool || !job || !job->fn)
        return;
    if (job_try_ref(job))
        job_run_chunks(pool, job, 0, 0, NULL, NULL);
    job_wait_done(job);
}

int envd_pool_help_ref(envd_job_t *job)
{
    return job && job->fn && job_try_ref(job);
}

void envd_pool_help(envd_pool_t *pool, envd_job_t *job, int (*leave)(void *), void *arg)
{
    if (leave != NULL && leave(arg))
        job_unref(pool, job); /* nothing claimed: others claim past n (J3) */
    else
        job_run_chunks(pool, job, 0, 0, leave, arg);
}

int envd_pool_run(envd_pool_t *pool, envd_job_t *job, envd_task_fn fn,
                  void *ctx, int64_t n, int64_t chunk)
{
    int rc = envd_pool_submit(pool, job, fn, ctx, n, chunk, ENVD_JOB_HELPED);
    if (rc == ENVD_OK)
        envd_pool_wait(pool, job);
    return rc;
}

int envd_pool_cpus(const envd_pool_t *pool)
{
    return pool ? pool->cpus : ENVD_EINVAL;
}

int envd_pool_helped_workers(const envd_pool_t *pool)
{
    return pool ? pool->helped_workers : ENVD_EINVAL;
}

int envd_pool_jobs_in_flight(const envd_pool_t *pool)
{
    return atomic_load_explicit(&((envd_pool_t *)pool)->in_flight, memory_order_relaxed);
}

int envd_pool_saturated(const envd_pool_t *pool)
{
    const int limit = pool->cpus > 2 ? pool->cpus - 1 : 1;
    return envd_pool_jobs_in_flight(pool) >= limit;
}

int envd_job_done(const envd_job_t *job)
{
    return job && atomic_load_explicit(&job->done, memory_order_acquire) == JOB_DONE;
}

int envd_job_unstarted(const envd_job_t *job)
{
    /* A job with n == 0 completes at submit, so "in flight" implies n > 0. */
    return job && job->fn && atomic_load_explicit(&job->done, memory_order_acquire) != JOB_DONE &&
           atomic_load_explicit(&job->next, memory_order_relaxed) == 0;
}
