/*
 * pool_stress.c -- stress test for native/src/pool.c; exits non-zero on any
 * failure.  Usage: pool_stress [divisor]; loop counts are divided by divisor
 * (sanitizer builds run slower and pass e.g. 20).
 *
 * Task functions write per-item counters and stamps with plain (non-atomic)
 * stores: within a job each item belongs to one chunk, so under
 * -fsanitize=thread any missing happens-before edge between a chunk and the
 * code that reads or reuses its items after the job is reported done shows
 * up as a data race, and without a sanitizer a late chunk shows up as a count
 * of 2 or a stale stamp.
 */
#define _GNU_SOURCE
#include "pool.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "envd.h"
#include "stress_check.h"

static int g_div = 1;

static int scaled(int count)
{
    return count / g_div > 0 ? count / g_div : 1;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Busy-poll envd_job_done (no helping: only workers run the job). */
static void poll_done(const envd_job_t *job)
{
    const double deadline = now_s() + 20.0;
    while (!envd_job_done(job)) {
        CHECK(now_s() < deadline, "job not done after 20 s");
        sched_yield();
    }
}

/* ---- recording task ----------------------------------------------------------- */
typedef struct {
    int64_t seq, chunk, cap;
    int32_t *count;
    int64_t *stamp;
} rec_t;

static void rec_init(rec_t *r, int64_t cap)
{
    r->seq = 0;
    r->cap = cap;
    r->count = calloc(cap, sizeof *r->count);
    r->stamp = calloc(cap, sizeof *r->stamp);
    CHECK(r->count && r->stamp, "out of memory");
}

static void rec_free(rec_t *r)
{
    free(r->count);
    free(r->stamp);
}

static void rec_fn(void *ctx, int64_t begin, int64_t end)
{
    rec_t *r = ctx;
    CHECK(begin >= 0 && begin < end && end - begin <= r->chunk && begin % r->chunk == 0,
          "bad range [%lld, %lld) chunk %lld", (long long)begin, (long long)end,
          (long long)r->chunk);
    for (int64_t i = begin; i < end; i++) {
        r->count[i]++;
        r->stamp[i] = r->seq;
    }
}

/* Every item of [0, n) ran exactly once for this seq, nothing past n ran;
 * clears the counters for the next job. */
static void rec_verify(rec_t *r, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        CHECK(r->count[i] == 1 && r->stamp[i] == r->seq, "seq %lld item %lld: count %d stamp %lld",
              (long long)r->seq, (long long)i, r->count[i], (long long)r->stamp[i]);
        r->count[i] = 0;
    }
    for (int64_t i = n; i < r->cap; i++)
        CHECK(r->count[i] == 0, "seq %lld item %lld past n=%lld ran", (long long)r->seq,
              (long long)i, (long long)n);
}

static int submit_rec(envd_pool_t *pool, envd_job_t *job, rec_t *r, int64_t n, int64_t chunk,
                      int flags)
{
    r->seq++;
    r->chunk = chunk < n ? chunk : (n > 0 ? n : 1); /* the pool clamps chunk to n */
    return envd_pool_submit(pool, job, rec_fn, r, n, chunk, flags);
}

/* ---- tests ------------------------------------------------------------------------ */

/* Many tiny jobs back to back through one reused job struct.  mode 0: run
 * (caller helps), 1: submit + poll done (workers only). */
static void test_tiny_jobs(int threads, int jobs, int mode)
{
    envd_pool_t *pool;
    CHECK(envd_pool_create(&pool, threads, NULL) == ENVD_OK, "create");
    envd_job_t job = {0};
    rec_t r;
    rec_init(&r, 8);
    uint64_t s = 0x9e3779b97f4a7c15ull + (uint64_t)threads;
    for (int k = 0; k < jobs; k++) {
        int64_t n = 1 + rnd(&s) % 8, chunk = 1 + rnd(&s) % 3;
        CHECK(submit_rec(pool, &job, &r, n, chunk, 0) == ENVD_OK, "submit");
        if (mode == 0)
            envd_pool_wait(pool, &job);
        else
            poll_done(&job);
        CHECK(envd_job_done(&job), "done after wait");
        rec_verify(&r, n);
    }
    envd_pool_destroy(pool);
    rec_free(&r);
}

/* Three jobs in flight at once, waited in every order; a random subset are
 * NOTIFY jobs, which the eventfd must count exactly. */
static void test_in_flight(int threads, int rounds)
{
    envd_pool_t *pool;
    CHECK(envd_pool_create(&pool, threads, NULL) == ENVD_OK, "create");
    static const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    envd_job_t jobs[3] = {{0}};
    rec_t recs[3];
    int64_t ns[3];
    for (int j = 0; j < 3; j++)
        rec_init(&recs[j], 64);
    uint64_t s = 0x2545f4914f6cdd1dull, notified = 0;
    for (int k = 0; k < rounds; k++) {
        for (int j = 0; j < 3; j++) {
            ns[j] = 1 + rnd(&s) % 64;
            int flags = rnd(&s) % 2 ? ENVD_JOB_NOTIFY : 0;
            notified += flags != 0;
            /* HELPED wakes fewer workers; a job no one helps still ends
             * (poll_done).  ALONE wakes none: only in rounds that wait. */
            flags |= rnd(&s) % 3 == 0 ? ENVD_JOB_HELPED : 0;
            if ((flags & ENVD_JOB_HELPED) && k % 7 != 3 && rnd(&s) % 2)
                flags |= ENVD_JOB_ALONE;
            CHECK(submit_rec(pool, &jobs[j], &recs[j], ns[j], 1 + rnd(&s) % 8, flags) == ENVD_OK,
                  "submit");
        }
        for (int i = 0; i < 3; i++) {
            int j = orders[k % 6][i];
            if (k % 7 == 3)
                poll_done(&jobs[j]);
            else
                envd_pool_wait(pool, &jobs[j]);
            rec_verify(&recs[j], ns[j]);
        }
    }
    /* Completion is flagged before the eventfd write, so the last writes may
     * still be on their way: read until the total is reached. */
    uint64_t total = 0, value;
    const double deadline = now_s() + 20.0;
    while (total < notified) {
        struct pollfd pfd = {.fd = envd_pool_eventfd(pool), .events = POLLIN};
        CHECK(poll(&pfd, 1, 100) >= 0, "poll: %s", strerror(errno));
        if (read(pfd.fd, &value, sizeof value) == sizeof value)
            total += value;
        CHECK(now_s() < deadline, "eventfd total %llu of %llu", (unsigned long long)total,
              (unsigned long long)notified);
    }
    CHECK(total == notified, "eventfd total %llu != %llu", (unsigned long long)total,
          (unsigned long long)notified);
    CHECK(read(envd_pool_eventfd(pool), &value, sizeof value) < 0 && errno == EAGAIN,
          "eventfd has extra counts");
    envd_pool_destroy(pool);
    for (int j = 0; j < 3; j++)
        rec_free(&recs[j]);
}

/* ---- helping without waiting (envd_pool_help) ----------------------------------------- */
typedef struct {
    int chunks_left; /* leave once this many chunks ran (0: before the first,
                        claiming none; negative: never) */
} leave_after_t;

static int leave_after(void *arg)
{
    leave_after_t *l = arg;
    return l->chunks_left >= 0 && l->chunks_left-- == 0;
}

/* A HELPED job helped by its submitter, who leaves after a random number of
 * chunks (or never) and only then waits or polls: every item runs exactly
 * once, the job completes, and a reference is refused for a job that is
 * complete, never submitted or has every chunk claimed. */
static void test_help(int threads, int rounds)
{
    envd_pool_t *pool;
    CHECK(envd_pool_create(&pool, threads, NULL) == ENVD_OK, "create");
    envd_job_t job = {0};
    CHECK(!envd_pool_help_ref(&job), "a reference to a job never submitted");
    rec_t r;
    rec_init(&r, 256);
    uint64_t s = 0x51ed270b7a3c49f1ull + (uint64_t)threads;
    for (int k = 0; k < rounds; k++) {
        int64_t n = 1 + rnd(&s) % 256, chunk = 1 + rnd(&s) % 16;
        CHECK(submit_rec(pool, &job, &r, n, chunk, ENVD_JOB_HELPED) == ENVD_OK, "submit");
        if (envd_pool_help_ref(&job)) {
            leave_after_t l = {(int)(rnd(&s) % 5) - 1};
            envd_pool_help(pool, &job, leave_after, &l);
        }
        if (k % 2)
            envd_pool_wait(pool, &job);
        else
            poll_done(&job);
        rec_verify(&r, n);
        CHECK(!envd_pool_help_ref(&job), "a reference to a complete job");
    }
    /* Every chunk claimed by a helper that never leaves: nothing left to help. */
    CHECK(submit_rec(pool, &job, &r, 8, 8, ENVD_JOB_HELPED) == ENVD_OK, "submit");
    if (envd_pool_help_ref(&job)) {
        leave_after_t never = {-1};
        envd_pool_help(pool, &job, leave_after, &never);
    }
    CHECK(!envd_pool_help_ref(&job), "a reference to a job with every chunk claimed");
    envd_pool_wait(pool, &job);
    rec_verify(&r, 8);
    envd_pool_destroy(pool);
    rec_free(&r);
}

/* ---- a helped job that wakes no worker (ENVD_JOB_ALONE) ------------------------- */
static pid_t thread_id(void)
{
    return (pid_t)syscall(SYS_gettid);
}

static _Atomic pid_t g_ran_on;

static void note_thread(void *ctx, int64_t begin, int64_t end)
{
    (void)ctx, (void)begin, (void)end;
    atomic_store(&g_ran_on, thread_id());
}

/* The syscall thread tid of this process is blocked in and its first
 * argument (/proc/self/task/<tid>/syscall); -2 where that file cannot be
 * read (a kernel or sandbox without it). */
static long blocked_in(pid_t tid, unsigned long *arg0)
{
    char path[64], text[128] = {0};
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -2;
    const int got = fgets(text, sizeof text, f) != NULL;
    fclose(f);
    *arg0 = 0;
    long nr = -1;
    return got && sscanf(text, "%ld %lx", &nr, arg0) >= 1 ? nr : -1;
}

/* Thread tid sleeps on one futex word: twice, 1 ms apart, the same one (a
 * sanitizer's own short waits do not count). */
static int sleeps_in_futex(pid_t tid)
{
    unsigned long first = 0, second = 0;
    if (blocked_in(tid, &first) != SYS_futex)
        return 0;
    usleep(1000);
    return blocked_in(tid, &second) == SYS_futex && first == second;
}

typedef struct {
    pid_t caller;
    _Atomic int elsewhere; /* chunks run by another thread */
} alone_t;

static void alone_fn(void *ctx, int64_t begin, int64_t end)
{
    alone_t *a = ctx;
    (void)begin, (void)end;
    if (thread_id() != a->caller)
        atomic_fetch_add(&a->elsewhere, 1);
    /* Long enough for a woken worker to arrive while chunks are left. */
    const double until = now_s() + 200e-6;
    while (now_s() < until)
        ;
}

/* A HELPED | ALONE job wakes no worker: with the pool's one worker asleep
 * on the futex, every chunk runs on the submitter (which waits, running
 * them).  Then the same job HELPED only, for the record (a worker is woken:
 * whether it arrives before the chunks run out is the scheduler's). */
static void test_alone(void)
{
    envd_pool_t *pool;
    CHECK(envd_pool_create(&pool, 1, NULL) == ENVD_OK, "create");
    envd_job_t job = {0};
    int woken_took = -1;
    for (int alone = 1; alone >= 0; alone--) {
        /* the worker's thread id: a job only it runs */
        CHECK(envd_pool_submit(pool, &job, note_thread, NULL, 1, 1, 0) == ENVD_OK, "submit");
        poll_done(&job);
        const pid_t worker = atomic_load(&g_ran_on);
        unsigned long arg0;
        if (blocked_in(worker, &arg0) == -2) {
            printf("pool_stress: alone: skipped (no /proc/self/task/<tid>/syscall here)\n");
            break;
        }
        const double deadline = now_s() + 30.0;
        while (!sleeps_in_futex(worker)) {
            CHECK(now_s() < deadline, "the pool's worker never went to sleep");
            usleep(100);
        }
        alone_t a = {.caller = thread_id()};
        const int flags = ENVD_JOB_HELPED | (alone ? ENVD_JOB_ALONE : 0);
        CHECK(envd_pool_submit(pool, &job, alone_fn, &a, 32, 1, flags) == ENVD_OK, "submit");
        envd_pool_wait(pool, &job);
        if (alone)
            CHECK(atomic_load(&a.elsewhere) == 0, "an ALONE job woke a worker: %d of its 32 "
                  "chunks ran elsewhere", atomic_load(&a.elsewhere));
        else
            woken_took = atomic_load(&a.elsewhere);
    }
    if (woken_took >= 0)
        printf("pool_stress: alone: none of 32 chunks elsewhere; helped only: %d\n",
               woken_took);
    envd_pool_destroy(pool);
}

/* ---- capped jobs ---------------------------------------------------------------- */
/* A recording task that also counts how many threads run chunks of any job
 * under one cap at the same moment, keeping the highest count seen. */
typedef struct {
    rec_t rec;
    _Atomic int *running, *most;
} capped_t;

static void capped_fn(void *ctx, int64_t begin, int64_t end)
{
    capped_t *c = ctx;
    int now = atomic_fetch_add(c->running, 1) + 1;
    int most = atomic_load(c->most);
    while (now > most && !atomic_compare_exchange_weak(c->most, &most, now))
        ;
    for (volatile int spin = 0; spin < 200; spin++) /* widen the window for overlaps */
        ;
    rec_fn(&c->rec, begin, end);
    atomic_fetch_sub(c->running, 1);
}

/* Three jobs under one cap of max_workers and one uncapped job in flight at
 * once on a pool of `threads`.  Polled rounds (no thread helps): at most
 * max_workers threads ever run the capped jobs' chunks at once (C1).  Waited
 * rounds: the one helping waiter comes on top (it holds no slot).  Every job
 * completes, every item once (C3: no capped job is stranded), and the cap
 * is free again after each round (C2). */
static void test_capped(int threads, int max_workers, int rounds)
{
    envd_pool_t *pool;
    CHECK(envd_pool_create(&pool, threads, NULL) == ENVD_OK, "create");
    envd_pool_cap_t cap = {.max_workers = max_workers};
    _Atomic int running = 0, most = 0;
    envd_job_t jobs[4] = {{0}};
    capped_t tasks[4];
    int64_t ns[4];
    for (int j = 0; j < 4; j++) {
        rec_init(&tasks[j].rec, 256);
        tasks[j].running = &running;
        tasks[j].most = &most;
        CHECK(envd_job_set_cap(&jobs[j], j < 3 ? &cap : NULL) == ENVD_OK, "set_cap");
    }
    _Atomic int other_running = 0, other_most = 0; /* the uncapped job counts apart */
    tasks[3].running = &other_running;
    tasks[3].most = &other_most;
    uint64_t s = 0x51ed2701a3b4c5d6ull + (uint64_t)(threads * 8 + max_workers);
    for (int k = 0; k < rounds; k++) {
        const int helped = k % 4 == 3;
        atomic_store(&most, 0);
        for (int j = 0; j < 4; j++) {
            ns[j] = 1 + rnd(&s) % 256;
            tasks[j].rec.seq++;
            int64_t chunk = 1 + rnd(&s) % 16;
            tasks[j].rec.chunk = chunk < ns[j] ? chunk : ns[j];
            CHECK(envd_pool_submit(pool, &jobs[j], capped_fn, &tasks[j], ns[j], chunk,
                                   rnd(&s) % 2 ? ENVD_JOB_NOTIFY : 0) == ENVD_OK, "submit");
        }
        for (int j = 0; j < 4; j++) {
            if (helped)
                envd_pool_wait(pool, &jobs[j]);
            else
                poll_done(&jobs[j]);
            rec_verify(&tasks[j].rec, ns[j]);
        }
        CHECK(atomic_load(&most) <= max_workers + helped,
              "%d threads ran capped jobs at once under a cap of %d (helped %d)",
              atomic_load(&most), max_workers, helped);
        CHECK(atomic_load(&cap.active) == 0, "cap still holds %d slots after the round",
              atomic_load(&cap.active));
    }
    envd_pool_destroy(pool);
    for (int j = 0; j < 4; j++)
        rec_free(&tasks[j].rec);
}

/* ---- helped jobs ---------------------------------------------------------------- */
static _Thread_local int t_submitter; /* set on the thread that submits and helps */

/* A recording task that counts the pool threads (not the helping submitter)
 * running its chunks at the same moment, keeping the highest count seen. */
static void helped_fn(void *ctx, int64_t begin, int64_t end)
{
    capped_t *c = ctx;
    if (t_submitter) {
        rec_fn(&c->rec, begin, end);
        return;
    }
    int now = atomic_fetch_add(c->running, 1) + 1;
    int most = atomic_load(c->most);
    while (now > most && !atomic_compare_exchange_weak(c->most, &most, now))
        ;
    for (volatile int spin = 0; spin < 2000; spin++) /* widen the window for overlaps */
        ;
    rec_fn(&c->rec, begin, end);
    atomic_fetch_sub(c->running, 1);
}

/* H1: a HELPED job is run by at most max(1, CPUs - 1) pool threads at once,
 * whatever the pool's size, also while every worker is awake (an unhelped
 * job in flight beside it keeps them taking chunks, and each returns to the
 * queue when a job is submitted).  Every third round its submitter does not
 * help but polls: the limited workers still complete it (not stranded). */
static void test_helped_limit(int rounds)
{
    envd_pool_t *pool;
    CHECK(envd_pool_create(&pool, 8, NULL) == ENVD_OK, "create"); /* more than the limit here */
    const int cpus = envd_pool_cpus(pool);
    const int limit = cpus > 2 ? cpus - 1 : 1;
    _Atomic int running = 0, most = 0, other_running = 0, other_most = 0;
    envd_job_t helped = {0}, other = {0};
    capped_t task = {.running = &running, .most = &most};
    capped_t other_task = {.running = &other_running, .most = &other_most};
    rec_init(&task.rec, 512);
    rec_init(&other_task.rec, 512);
    uint64_t s = 0x6a09e667f3bcc908ull;
    t_submitter = 1;
    for (int k = 0; k < rounds; k++) {
        const int64_t n = 64 + rnd(&s) % 448, other_n = 64 + rnd(&s) % 448;
        CHECK(submit_rec(pool, &other, &other_task.rec, other_n, 1, 0) == ENVD_OK, "submit");
        task.rec.seq++;
        task.rec.chunk = 1 + rnd(&s) % 8;
        CHECK(envd_pool_submit(pool, &helped, helped_fn, &task, n, task.rec.chunk,
                               ENVD_JOB_HELPED) == ENVD_OK, "submit helped");
        if (k % 3 == 2)
            poll_done(&helped);
        else
            envd_pool_wait(pool, &helped);
        rec_verify(&task.rec, n);
        poll_done(&other);
        rec_verify(&other_task.rec, other_n);
        CHECK(atomic_load(&most) <= limit, "%d pool threads ran a HELPED job at once (limit %d)",
              atomic_load(&most), limit);
    }
    t_submitter = 0;
    envd_pool_destroy(pool);
    rec_free(&task.rec);
    rec_free(&other_task.rec);
}

/* Large jobs with many chunks, waited with and without helping. */
static void test_large(int threads, int64_t n, int reps)
{
    envd_pool_t *pool;
    CHECK(envd_pool_create(&pool, threads, NULL) == ENVD_OK, "create");
    const int64_t chunks[] = {1, 3, 7, 1000, n, 2 * n};
    envd_job_t job = {0};
    rec_t r;
    rec_init(&r, n);
    for (int rep = 0; rep < reps; rep++) {
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
            CHECK(submit_rec(pool, &job, &r, n, chunks[c], 0) == ENVD_OK, "submit");
            if (rep % 2)
                poll_done(&job);
            else
                envd_pool_wait(pool, &job);
            rec_verify(&r, n);
        }
    }
    envd_pool_destroy(pool);
    rec_free(&r);
}

/* Sessions submitting to one shared pool from their own threads. */
typedef struct {
    envd_pool_t *pool;
    int jobs;
    uint64_t seed;
} client_t;

static void *client_main(void *arg)
{
    client_t *c = arg;
    envd_job_t job = {0};
    rec_t r;
    rec_init(&r, 16);
    for (int k = 0; k < c->jobs; k++) {
        int64_t n = 1 + rnd(&c->seed) % 16;
        CHECK(submit_rec(c->pool, &job, &r, n, 1 + rnd(&c->seed) % 4, 0) == ENVD_OK, "submit");
        envd_pool_wait(c->pool, &job);
        rec_verify(&r, n);
    }
    rec_free(&r);
    return NULL;
}

static void test_clients(int threads, int clients, int jobs)
{
    envd_pool_t *pool;
    CHECK(envd_pool_create(&pool, threads, NULL) == ENVD_OK, "create");
    pthread_t tids[8];
    client_t cs[8];
    for (int i = 0; i < clients; i++) {
        cs[i] = (client_t){pool, jobs, 0x1234567ull * (uint64_t)(i + 1)};
        CHECK(pthread_create(&tids[i], NULL, client_main, &cs[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < clients; i++)
        pthread_join(tids[i], NULL);
    envd_pool_destroy(pool);
}

/* A job that blocks its worker until released. */
typedef struct {
    _Atomic int started, release;
} gate_t;

static void gate_fn(void *ctx, int64_t begin, int64_t end)
{
    gate_t *g = ctx;
    (void)begin;
    (void)end;
    atomic_store(&g->started, 1);
    const double deadline = now_s() + 20.0;
    while (!atomic_load(&g->release))
        CHECK(now_s() < deadline, "gate never released");
}

/* EBUSY for an in-flight struct; a second job overtakes a blocked one
 * (workers move on once a job is fully claimed). */
static void test_busy_and_overlap(void)
{
    envd_pool_t *pool;
    CHECK(envd_pool_create(&pool, 2, NULL) == ENVD_OK, "create");
    gate_t gate = {0};
    envd_job_t blocked = {0}, next = {0};
    rec_t r;
    rec_init(&r, 4);
    /* envd_pool_saturated: at least max(1, CPUs - 1) jobs in flight. */
    cpu_set_t set;
    const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    const int limit = cpus > 2 ? cpus - 1 : 1;
    CHECK(envd_pool_jobs_in_flight(pool) == 0 && !envd_pool_saturated(pool), "idle pool busy");
    CHECK(envd_pool_submit(pool, &blocked, gate_fn, &gate, 1, 1, 0) == ENVD_OK, "submit");
    CHECK(envd_pool_submit(pool, &blocked, gate_fn, &gate, 1, 1, 0) == ENVD_EBUSY, "EBUSY");
    CHECK(envd_pool_jobs_in_flight(pool) == 1, "in flight %d, want 1 (a refused submit "
          "counted?)", envd_pool_jobs_in_flight(pool));
    CHECK(envd_pool_saturated(pool) == (1 >= limit), "saturated with 1 job, %d CPUs", cpus);
    while (!atomic_load(&gate.started))
        sched_yield();
    CHECK(!envd_job_done(&blocked), "blocked job done");
    CHECK(submit_rec(pool, &next, &r, 4, 1, 0) == ENVD_OK, "submit second");
    poll_done(&next); /* only the other worker can run it */
    rec_verify(&r, 4);
    CHECK(envd_pool_jobs_in_flight(pool) == 1, "in flight %d after the second job ended",
          envd_pool_jobs_in_flight(pool));
    CHECK(!envd_job_done(&blocked), "blocked job done");
    atomic_store(&gate.release, 1);
    envd_pool_wait(pool, &blocked);
    CHECK(envd_pool_jobs_in_flight(pool) == 0 && !envd_pool_saturated(pool),
          "in flight %d after every job ended", envd_pool_jobs_in_flight(pool));
    CHECK(envd_pool_submit(pool, &blocked, gate_fn, &gate, 1, 1, 0) == ENVD_OK, "resubmit");
    envd_pool_wait(pool, &blocked);
    envd_pool_destroy(pool);
    rec_free(&r);
}

/* envd_job_unstarted: a job never submitted, complete, or with a chunk
 * claimed is not; one queued behind a job that holds the only worker is,
 * until a helper claims a chunk of it. */
static void test_unstarted(void)
{
    envd_pool_t *pool;
    CHECK(envd_pool_create(&pool, 1, NULL) == ENVD_OK, "create");
    gate_t gate = {0};
    envd_job_t blocked = {0}, queued = {0};
    rec_t r;
    rec_init(&r, 4);
    CHECK(!envd_job_unstarted(&queued) && !envd_job_unstarted(NULL), "a job never submitted");
    CHECK(envd_pool_submit(pool, &blocked, gate_fn, &gate, 1, 1, 0) == ENVD_OK, "submit");
    while (!atomic_load(&gate.started))
        sched_yield();
    CHECK(!envd_job_unstarted(&blocked), "a job its worker runs is unstarted");
    CHECK(submit_rec(pool, &queued, &r, 4, 1, ENVD_JOB_HELPED) == ENVD_OK, "submit queued");
    CHECK(envd_job_unstarted(&queued), "a job behind the held worker is started");
    CHECK(envd_pool_help_ref(&queued), "a reference to the queued job");
    leave_after_t one = {1};
    envd_pool_help(pool, &queued, leave_after, &one); /* one chunk of four */
    CHECK(!envd_job_done(&queued) && !envd_job_unstarted(&queued),
          "a job with one chunk run: done %d, unstarted %d", envd_job_done(&queued),
          envd_job_unstarted(&queued));
    envd_pool_wait(pool, &queued); /* this thread runs the rest */
    rec_verify(&r, 4);
    CHECK(!envd_job_unstarted(&queued), "a complete job is unstarted");
    atomic_store(&gate.release, 1);
    envd_pool_wait(pool, &blocked);
    envd_pool_destroy(pool);
    rec_free(&r);
}

static uint64_t drain_eventfd(envd_pool_t *pool)
{
    uint64_t value = 0;
    if (read(envd_pool_eventfd(pool), &value, sizeof value) != sizeof value)
        return 0;
    return value;
}

/* num_threads == 0 runs inline; n == 0 completes at once; envd_pool_notify
 * counts one event. */
static void test_inline(void)
{
    envd_pool_t *pool;
    CHECK(envd_pool_create(&pool, 0, NULL) == ENVD_OK, "create");
    CHECK(envd_pool_num_threads(pool) == 0, "num_threads");
    envd_job_t job = {0};
    rec_t r;
    rec_init(&r, 10);
    CHECK(submit_rec(pool, &job, &r, 10, 3, ENVD_JOB_NOTIFY) == ENVD_OK, "submit");
    CHECK(envd_job_done(&job), "inline job not done on return");
    rec_verify(&r, 10);
    CHECK(drain_eventfd(pool) == 1, "eventfd");
    CHECK(submit_rec(pool, &job, &r, 7, 100, 0) == ENVD_OK, "submit");
    envd_pool_wait(pool, &job);
    rec_verify(&r, 7);
    CHECK(drain_eventfd(pool) == 0, "eventfd counted a plain job");
    r.chunk = 2;
    r.seq++;
    CHECK(envd_pool_run(pool, &job, rec_fn, &r, 5, 2) == ENVD_OK, "run");
    rec_verify(&r, 5);
    envd_pool_destroy(pool);

    CHECK(envd_pool_create(&pool, 2, NULL) == ENVD_OK, "create");
    CHECK(submit_rec(pool, &job, &r, 0, 1, ENVD_JOB_NOTIFY) == ENVD_OK, "submit n=0");
    CHECK(envd_job_done(&job), "n=0 job not done");
    CHECK(drain_eventfd(pool) == 1, "eventfd n=0");
    /* work announced without a job (envd_pool_notify): one count each */
    envd_pool_notify(pool);
    envd_pool_notify(pool);
    CHECK(drain_eventfd(pool) == 2, "envd_pool_notify counts one event a call");
    CHECK(drain_eventfd(pool) == 0, "envd_pool_notify counted more");
    envd_pool_destroy(pool);
    rec_free(&r);
}

static void test_bad_args(void)
{
    envd_pool_t *pool;
    envd_job_t job = {0};
    rec_t r = {0};
    CHECK(envd_pool_create(NULL, 1, NULL) == ENVD_EINVAL, "NULL out");
    CHECK(envd_pool_create(&pool, -1, NULL) == ENVD_EINVAL, "-1 threads");
    CHECK(envd_pool_create(&pool, ENVD_POOL_MAX_THREADS + 1, NULL) == ENVD_EINVAL, "too many");
    const int bad_cpu[1] = {-1};
    CHECK(envd_pool_create(&pool, 1, bad_cpu) == ENVD_EINVAL, "cpu -1");
    CHECK(envd_pool_create(&pool, 1, NULL) == ENVD_OK, "create");
    envd_pool_wait(pool, &job); /* never submitted: returns at once */
    CHECK(envd_pool_submit(NULL, &job, rec_fn, &r, 1, 1, 0) == ENVD_EINVAL, "NULL pool");
    CHECK(envd_pool_submit(pool, NULL, rec_fn, &r, 1, 1, 0) == ENVD_EINVAL, "NULL job");
    CHECK(envd_pool_submit(pool, &job, NULL, &r, 1, 1, 0) == ENVD_EINVAL, "NULL fn");
    CHECK(envd_pool_submit(pool, &job, rec_fn, &r, -1, 1, 0) == ENVD_EINVAL, "n < 0");
    CHECK(envd_pool_submit(pool, &job, rec_fn, &r, 1, 0, 0) == ENVD_EINVAL, "chunk 0");
    CHECK(envd_pool_submit(pool, &job, rec_fn, &r, 1, 1, 8) == ENVD_EINVAL, "flags");
    CHECK(envd_pool_submit(pool, &job, rec_fn, &r, 1, 1, ENVD_JOB_ALONE) == ENVD_EINVAL,
          "ALONE without HELPED");
    CHECK(envd_pool_submit(pool, &job, rec_fn, &r, INT64_MAX, 1, 0) == ENVD_EINVAL, "huge n");
    CHECK(envd_pool_run(pool, &job, rec_fn, &r, 1, -5) == ENVD_EINVAL, "run chunk");
    envd_pool_cap_t no_workers = {.max_workers = 0};
    CHECK(envd_job_set_cap(&job, &no_workers) == ENVD_EINVAL, "cap of 0 workers");
    CHECK(envd_job_set_cap(NULL, NULL) == ENVD_EINVAL, "NULL job cap");
    CHECK(envd_pool_cpus(pool) >= 1, "cpus %d", envd_pool_cpus(pool));
    CHECK(envd_pool_cpus(NULL) == ENVD_EINVAL, "cpus of NULL");
    envd_pool_destroy(pool);
    envd_pool_destroy(NULL);
}

static int first_allowed_cpu(void)
{
    cpu_set_t set;
    CHECK(sched_getaffinity(0, sizeof set, &set) == 0, "sched_getaffinity");
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set))
            return c;
    return -1;
}

static void cpu_fn(void *ctx, int64_t begin, int64_t end)
{
    (void)begin;
    (void)end;
    *(int *)ctx = sched_getcpu();
}

static void test_pinning(void)
{
    envd_pool_t *pool;
    int cpu = first_allowed_cpu(), seen = -1;
    CHECK(envd_pool_create(&pool, 1, &cpu) == ENVD_OK, "create pinned");
    envd_job_t job = {0};
    for (int k = 0; k < 20; k++) {
        CHECK(envd_pool_submit(pool, &job, cpu_fn, &seen, 1, 1, 0) == ENVD_OK, "submit");
        poll_done(&job); /* the worker runs it, not this thread */
        CHECK(seen == cpu, "worker ran on cpu %d, pinned to %d", seen, cpu);
    }
    envd_pool_destroy(pool);
    /* A CPU outside the affinity mask cannot be pinned to: ENVD_ESYS, and
     * the workers already started are joined (the thread count check in
     * test_create_destroy runs after this). */
    cpu_set_t set;
    CHECK(sched_getaffinity(0, sizeof set, &set) == 0, "sched_getaffinity");
    int cpus[2] = {cpu, CPU_SETSIZE - 1};
    if (!CPU_ISSET(cpus[1], &set))
        CHECK(envd_pool_create(&pool, 2, cpus) == ENVD_ESYS, "pin to absent cpu");
}

/* The pool counts the CPUs its workers are pinned to, not those its creator
 * may run on (`taskset -c 0 envd --threads 4 --pin-cpus 4,5,6,7`): created
 * from a thread confined to one CPU, a pool pinned to two counts two (and
 * its limits follow: pool.c, H1); pinned to one CPU three times, one. */
static void test_pinned_cpus(void)
{
    cpu_set_t all, one;
    CHECK(sched_getaffinity(0, sizeof all, &all) == 0, "sched_getaffinity");
    int allowed[2], n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &all))
            allowed[n++] = c;
    if (n < 2) {
        printf("pool_stress: one CPU: pinned CPU count not tried\n");
        return;
    }
    CPU_ZERO(&one);
    CPU_SET((size_t)allowed[0], &one);
    CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "confine to CPU %d", allowed[0]);
    envd_pool_t *pool;
    CHECK(envd_pool_create(&pool, 2, allowed) == ENVD_OK, "create pinned to two CPUs");
    CHECK(envd_pool_cpus(pool) == 2, "a pool pinned to CPUs %d and %d, created on one, counts %d",
          allowed[0], allowed[1], envd_pool_cpus(pool));
    envd_pool_destroy(pool);
    CHECK(sched_setaffinity(0, sizeof all, &all) == 0, "unconfine");
    const int same[3] = {allowed[1], allowed[1], allowed[1]};
    CHECK(envd_pool_create(&pool, 3, same) == ENVD_OK, "create pinned to one CPU");
    CHECK(envd_pool_cpus(pool) == 1, "a pool pinned to CPU %d only counts %d", allowed[1],
          envd_pool_cpus(pool));
    CHECK(envd_pool_helped_workers(pool) == 1, "helped workers %d on one CPU",
          envd_pool_helped_workers(pool));
    envd_pool_destroy(pool);
}

static int count_tasks(void)
{
    DIR *d = opendir("/proc/self/task");
    CHECK(d, "opendir /proc/self/task");
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* A joined thread can linger in /proc for a moment after pthread_join. */
static int tasks_settle(int want)
{
    int n = count_tasks();
    for (int i = 0; i < 200 && n != want; i++) {
        usleep(10000);
        n = count_tasks();
    }
    return n;
}

static void test_create_destroy(int iters, int baseline)
{
    envd_job_t job = {0};
    rec_t r;
    rec_init(&r, 8);
    for (int i = 0; i < iters; i++) {
        envd_pool_t *pool;
        CHECK(envd_pool_create(&pool, i % 5, NULL) == ENVD_OK, "create");
        if (i % 2) {
            CHECK(submit_rec(pool, &job, &r, 8, 1 + i % 3, ENVD_JOB_NOTIFY) == ENVD_OK, "submit");
            envd_pool_wait(pool, &job);
            rec_verify(&r, 8);
        }
        envd_pool_destroy(pool);
    }
    rec_free(&r);
    int n = tasks_settle(baseline);
    CHECK(n == baseline, "%d threads left, baseline %d", n, baseline);
}

static void *noop_thread(void *arg)
{
    return arg;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        g_div = atoi(argv[1]) > 0 ? atoi(argv[1]) : 1;
    /* Start and join one plain thread first: sanitizer runtimes start their
     * own helper thread on the first pthread_create. */
    pthread_t warmup;
    CHECK(pthread_create(&warmup, NULL, noop_thread, NULL) == 0, "pthread_create");
    pthread_join(warmup, NULL);
    usleep(20000); /* let the joined thread leave /proc */
    const int baseline = count_tasks();
    test_bad_args();
    test_inline();
    test_busy_and_overlap();
    test_unstarted();
    test_pinning();
    test_pinned_cpus();
    test_alone();
    test_helped_limit(scaled(4000));
    static const int thread_counts[] = {1, 2, 4};
    for (int t = 0; t < 3; t++) {
        int threads = thread_counts[t];
        test_tiny_jobs(threads, scaled(200000), 0);
        test_tiny_jobs(threads, scaled(20000), 1);
        test_in_flight(threads, scaled(20000));
        test_help(threads, scaled(20000));
        test_large(threads, 100000 / g_div + 10, 2);
        test_clients(threads, 3, scaled(20000));
        for (int cap = 1; cap < threads; cap++)
            test_capped(threads, cap, scaled(4000));
    }
    test_create_destroy(scaled(500), baseline);
    printf("pool_stress: ok\n");
    return 0;
}
