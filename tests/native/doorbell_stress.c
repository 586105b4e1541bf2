/*
 * doorbell_stress.c -- tests of native/src/doorbell.c (the same-host fast path's
 * server thread, serving a native session: session.h); exits non-zero on any
 * failure.  Each harness's vec is wrapped in a session (backend_pool.c's
 * envd_backend_pool_wrap), so the twin and the checks can still drive the
 * vec directly, as the doorbell's server drives it through the session.  Usage: doorbell_stress
 * [divisor]; request and loop counts are divided by divisor (sanitizer builds
 * run slower).
 *
 * The trainer is played by threads of this process that use the doorbell
 * exactly as client/doorbell.py does: write req_count and req_kind, then
 * req_seq + 1, then (after a full barrier) FUTEX_WAKE req_seq if
 * server_asleep is set; wait for done_seq == seq by spinning, by sleeping on
 * done_seq's futex (client_waiting = 1, in slices, checking closed), or both.
 * The header lies in a MAP_SHARED page at ENVD_DOORBELL_OFFSET, as in the daemon,
 * so the shared (not private) futexes are the ones exercised.
 *
 * Checks:
 *   - results: for pools of 0, 1 and 2 threads, CartPole, Acrobot and
 *     ConnectFour, N in {1, 7, 256}, two autoreset modes: after every answer
 *     every output buffer is bit-identical to a twin vec stepped serially with
 *     the same actions, status is ENVD_OK, result and envd_doorbell_served are
 *     what envd_vec_step returned / counted; the client spins, sleeps or
 *     both, with pauses shorter and longer than the server's spin, under
 *     max_spinners 0, 1 and 2; a client asleep on done_seq is woken by its
 *     answer (it sleeps in 1 s slices here: none may run out after the
 *     answer came);
 *   - errors: an out-of-range discrete action (ENVD_ERANGE, error_index names
 *     the env), an unknown req_kind (ENVD_EINVAL), a never-reset vec and a
 *     done env in DISABLED mode (ENVD_ESTATE); nothing is stepped (the twin
 *     that never saw the request stays identical) and served does not count;
 *   - lock: a locker thread takes envd_doorbell_lock, resets the vec, unlocks,
 *     at random times while the client rings: no env step runs while it holds
 *     the lock (the vec's env is CartPole wrapped by a step that checks a flag
 *     the locker sets), no request runs inside the locked region (the served count stays), and
 *     a twin that replays resets and steps in the order the lock imposed
 *     (the locker logs the served count with each reset) stays bit-identical; a
 *     request rung while the lock is held is answered only after unlock;
 *     envd_doorbell_trylock takes the lock of an idle server and fails while
 *     the lock is held or a request is in service; a client that sees its
 *     answer finds the lock free (the server unlocks before publishing);
 *   - drain: after envd_doorbell_drain every request (any kind) answers
 *     ENVD_DOORBELL_SHUTTING_DOWN and steps nothing;
 *   - stop: with nothing pending (served count returned, closed == 1,
 *     done_seq unchanged); during a request in service (it is answered and
 *     counted); with a request rung after stop began while a client sleeps on
 *     done_seq (never answered; the sleeper is woken by stop's wake and sees
 *     closed); right after an answer, as the server heads for its sleep;
 *     stop/start cycles on one header (LeakSanitizer sees leaks),
 *     each start serving only requests rung after it, across the 2^32 wrap of
 *     the sequence numbers, and every stop returns promptly;
 *   - spinners: two sessions whose servers spin for 20 s after a request,
 *     each server thread's CPU measured against a busy reference thread:
 *     with max_spinners 0 (or negative) neither spins, yet both answer; with
 *     1 exactly one spins; with 2 both do (the measurement works);
 *   - async (SEND, RECV, SENDRECV): for pools of 0, 1 and 2 threads, CartPole,
 *     Acrobot and ConnectFour, N in {7, 64, 256}, two autoreset modes, the
 *     client keeps a random number of batches in flight: it SENDs random
 *     subsets of the idle envs with random actions (a quarter of them as
 *     SENDRECV, answered as a RECV of their count with sent == 1) and RECVs
 *     random counts (<= envs out),
 *     with a whole-vec STEP now and then when nothing is out, waiting by
 *     spinning, sleeping or both, and calls envd_doorbell_collect (as a daemon's
 *     statistics do, from another thread) between requests.  Each SEND answers OK, result 0; after each
 *     RECV: status OK, result in [count, envs out], every id returned was
 *     sent and not returned before, whole batches come back, each contiguous
 *     in its send order (with no pool thread every batch runs inline at SEND:
 *     then every env out comes back, batches in submit order), and every
 *     returned env's output rows (obs, reward, flags, episode return and
 *     length, final obs, info fields) are bit-identical to a twin vec that
 *     ran the same batches serially at send time; at the end every env sent
 *     came back once, envd_doorbell_pending is 0, the whole buffers match, and
 *     envd_doorbell_batch_envs and stop's *batch_envs equal the envs received;
 *   - async errors (SENDRECV's too: refused as its SEND, with sent == 0; a
 *     SENDRECV over a failing env answers ENVD_EENV with sent == 1 and the
 *     next RECV returns its batch): SEND and RECV counts outside [1, num_envs] (EINVAL,
 *     index -1), an id out of range (EINVAL naming it), an env twice in one
 *     SEND or already in flight (EBUSY naming it), an action out of range
 *     (ERANGE naming the env), a never-reset env and a done env in DISABLED
 *     mode (ESTATE naming it), a RECV of more than is out (ESTATE, index -1):
 *     nothing starts or is taken (envd_doorbell_pending unchanged, no idle env's
 *     rows written) and the refused envs can be sent next; a STEP with envs
 *     in flight is EBUSY, steps nothing and is not counted; an env whose
 *     step callback fails makes a RECV that waits for its batch answer
 *     ENVD_EENV naming it, with its batch's envs kept (pending unchanged),
 *     and the next RECV returns them; the failed env can be sent again;
 *   - async stop: with batches in flight, with ready ids not received (after
 *     an env failed), and with a batch held running (by the server thread,
 *     which helps it, or a pool thread; stop
 *     waits for it: the doorbell is not closed before it ends): stop returns
 *     promptly, served 0, closed == 1, *batch_envs == envd_doorbell_batch_envs
 *     (== the envs RECV found, where it is deterministic), no leak; the vec
 *     then steps whole, and a new session sends the envs that were in
 *     flight; drain: SEND, RECV, STEP and SENDRECV answer
 *     ENVD_DOORBELL_SHUTTING_DOWN (sent == 0) and start or take nothing;
 *   - no spin after a SENDRECV: a client pausing 1 ms between SENDRECVs,
 *     the spin limit 20 s: the server's CPU stays under half the pauses;
 *   - a SENDRECV held in its batch by a gate: stop waits for the batch and
 *     closes the doorbell (the request answered in full or not at all), and
 *     the RECV half's claim in the engine's book (the session) is released; a
 *     drain then still answers its RECV half (its batch started); a client
 *     that rewrites req_kind and req_count meanwhile gets the RECV of the
 *     count it sent.
 */
#define _GNU_SOURCE
#include "doorbell.h"
#include "session.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "builtin_envs.h"
#include "envd.h"
#include "pool.h"
#include "spin.h"
#include "stress_hold.h"
#include "stress_tasks.h"
#include "stress_util.h"
#include "vec.h"

static void sleep_us(int64_t us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static pid_t thread_id(void)
{
    return (pid_t)syscall(SYS_gettid);
}

/* ---- futexes, as the Python client calls them (shared, not PRIVATE) ------------ */
/* Returns 0 when woken, else errno (EAGAIN: the word differed; ETIMEDOUT). */
static int futex_wait(_Atomic uint32_t *word, uint32_t value, int64_t timeout_ns)
{
    struct timespec ts = {timeout_ns / 1000000000LL, timeout_ns % 1000000000LL};
    long rc = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, value, &ts, NULL, 0);
    return rc == 0 ? 0 : errno;
}

static void futex_wake(_Atomic uint32_t *word, int count)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, count, NULL, NULL, 0);
}

/* The FUTEX_WAKEs of req_seq the client's rings made (ring_count). */
static _Atomic int g_ring_wakes;

/* The system call thread tid is blocked in (its first argument in *arg0), -1
 * when it runs, -2 when /proc does not say (then callers fall back to a
 * pause). */
static long blocked_in(pid_t tid, unsigned long *arg0)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -2;
    char *got = fgets(line, sizeof line, f);
    fclose(f);
    if (got == NULL)
        return -2;
    if (strncmp(line, "running", 7) == 0)
        return -1;
    long nr;
    *arg0 = 0;
    if (sscanf(line, "%ld 0x%lx", &nr, arg0) < 1)
        return -2;
    return nr;
}

/* Is the thread asleep in futex(2) on addr? */
static bool sleeps_on(long nr, unsigned long arg0, const void *addr)
{
    return nr == SYS_futex && arg0 == (unsigned long)(uintptr_t)addr;
}

/* Is the thread in envd_doorbell_stop asleep past its store of the stop flag: in
 * a sleep, or in a futex wait that is not one on the doorbell's words (the
 * join)?  Before that store it makes no blocking call. */
static bool stopping(long nr, unsigned long arg0, const envd_doorbell_header_t *h)
{
    if (nr == SYS_nanosleep || nr == SYS_clock_nanosleep)
        return true;
    return nr == SYS_futex && !sleeps_on(nr, arg0, &h->req_seq) &&
           !sleeps_on(nr, arg0, &h->done_seq);
}

/* Waits until thread tid is asleep on the doorbell word addr (or, for addr
 * NULL, stopping() on h) in three reads a millisecond apart.  Returns false
 * when /proc cannot tell (after a generous pause instead). */
static bool wait_asleep(pid_t tid, const void *addr, const envd_doorbell_header_t *h)
{
    const double deadline = now_s() + 30.0;
    for (int streak = 0; streak < 3;) {
        unsigned long arg0;
        long nr = blocked_in(tid, &arg0);
        if (nr == -2) {
            sleep_us(200000);
            return false;
        }
        bool asleep = addr ? sleeps_on(nr, arg0, addr) : stopping(nr, arg0, h);
        streak = asleep ? streak + 1 : 0;
        CHECK(now_s() < deadline, "thread %d never fell asleep (syscall %ld)", (int)tid, nr);
        sleep_us(1000);
    }
    return true;
}

typedef struct harness harness_t;
typedef struct doorbell doorbell_t;

/* ---- the doorbell and its client ------------------------------------------------ */
struct doorbell {
    unsigned char *page; /* MAP_SHARED, as the session's segment */
    envd_doorbell_header_t *h;
    uint32_t seq;        /* the last request rung */
};

static void doorbell_map(doorbell_t *d)
{
    d->page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(d->page != MAP_FAILED, "mmap: %s", strerror(errno));
    d->h = (envd_doorbell_header_t *)(d->page + ENVD_DOORBELL_OFFSET);
    d->seq = atomic_load(&d->h->req_seq);
}

static void doorbell_unmap(doorbell_t *d)
{
    munmap(d->page, 4096);
    d->page = NULL;
    d->h = NULL;
}

/* Rings request kind with req_count count (SEND: the ids written to the ids
 * array; RECV: the envs wanted), written before req_kind as the client does. */
static void ring_count(doorbell_t *d, uint32_t kind, uint32_t count)
{
    d->seq++;
    atomic_store(&d->h->req_count, count);
    atomic_store(&d->h->req_kind, kind);
    atomic_store(&d->h->req_seq, d->seq); /* (seq_cst: the barrier before the read) */
    if (atomic_load(&d->h->server_asleep)) {
        futex_wake(&d->h->req_seq, 1);
        atomic_fetch_add(&g_ring_wakes, 1);
    }
}

static void ring(doorbell_t *d, uint32_t kind)
{
    ring_count(d, kind, 0);
}

static bool is_answered(const doorbell_t *d)
{
    return atomic_load_explicit(&d->h->done_seq, memory_order_acquire) == d->seq;
}

enum { WAIT_SPIN, WAIT_SLEEP, WAIT_MIXED };
static const char *wait_names[] = {"spin", "sleep", "mixed"};
#define SLICE_NS 20000000LL /* the Python client's slice */
/* A slice no step here comes near: a sleep that runs to its end although the
 * answer came meanwhile is a wake-up the server owed (g_late_wakes). */
#define LONG_SLICE_NS 1000000000LL
static _Atomic int g_late_wakes;

typedef struct answer {
    bool answered;
    int32_t status;
    int64_t result, index;
} answer_t;

/* The client's wait for the last request: spin (WAIT_SPIN: only; WAIT_MIXED:
 * for up to 150 us), then sleep on done_seq in slices while it is not ours,
 * with client_waiting set, until it is answered or the doorbell is closed. */
static answer_t wait_answer(doorbell_t *d, int mode, int64_t slice_ns)
{
    const double start = now_s(), deadline = start + 30.0;
    if (mode != WAIT_SLEEP) {
        const double spin_until = mode == WAIT_SPIN ? deadline : start + 150e-6;
        unsigned i = 0;
        while (!is_answered(d) && !atomic_load(&d->h->closed) && now_s() < spin_until) {
            envd_cpu_relax();
            if (++i % 256 == 0)
                sched_yield(); /* a loaded 2-core box: let the server run */
        }
    }
    while (!is_answered(d)) {
        if (atomic_load(&d->h->closed))
            break;
        CHECK(now_s() < deadline, "request %u: no answer after 30 s (%s wait)", d->seq,
              wait_names[mode]);
        atomic_store(&d->h->client_waiting, 1);
        uint32_t current = atomic_load(&d->h->done_seq);
        if (current != d->seq && futex_wait(&d->h->done_seq, current, slice_ns) == ETIMEDOUT &&
            is_answered(d))
            atomic_fetch_add(&g_late_wakes, 1);
        atomic_store(&d->h->client_waiting, 0);
    }
    answer_t a = {.answered = is_answered(d), .status = 0, .result = 0, .index = 0};
    if (a.answered) {
        a.status = atomic_load_explicit(&d->h->status, memory_order_relaxed);
        a.result = atomic_load_explicit(&d->h->result, memory_order_relaxed);
        a.index = atomic_load_explicit(&d->h->error_index, memory_order_relaxed);
    }
    return a;
}

static int64_t g_slice_ns = SLICE_NS; /* the slice of request()'s waits */

static answer_t request_count(doorbell_t *d, uint32_t kind, uint32_t count, int mode)
{
    ring_count(d, kind, count);
    answer_t a = wait_answer(d, mode, g_slice_ns);
    CHECK(a.answered, "request %u: doorbell closed without an answer", d->seq);
    CHECK(g_slice_ns != LONG_SLICE_NS || atomic_load(&g_late_wakes) == 0,
          "request %u: a sleeping client was not woken by its answer", d->seq);
    return a;
}

static answer_t request(doorbell_t *d, uint32_t kind, int mode)
{
    return request_count(d, kind, 0, mode);
}

/* ---- a vec with its buffers ------------------------------------------------------- */
struct harness {
    const envd_env_def_t *def;
    envd_vec_t *vec;
    envd_session_t *session; /* over vec (not owning it): what the doorbell serves */
    int64_t n;
    size_t obs_bytes, act_bytes;
    unsigned char *obs, *final_obs, *actions;
    float *rewards;
    bool *terms, *truncs, *mask;
    double *returns;
    int64_t *lengths;
    int64_t *ids;        /* the doorbell's env ids (SEND, RECV) */
    unsigned char *info[ENVD_MAX_INFO_FIELDS];
    double params[8];
    envd_vec_buffers_t bufs;
    envd_vec_config_t cfg;
};

static size_t space_bytes(const envd_space_t *space)
{
    return (size_t)envd_space_numel(space) * envd_dtype_size(space->dtype);
}

static size_t info_field_bytes(const envd_info_field_t *f)
{
    size_t bytes = envd_dtype_size(f->dtype);
    for (int d = 0; d < f->ndim; d++)
        bytes *= (size_t)f->shape[d];
    return bytes;
}

enum { TIME_LIMIT = 50 };

/* Buffers, config and the vec (pool may be NULL; chunk 0 is adaptive). */
static void harness_init(harness_t *h, const envd_env_def_t *def, int64_t n, int mode,
                         envd_pool_t *pool, int64_t chunk)
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
    h->ids = xcalloc((size_t)n, sizeof *h->ids);
    for (int k = 0; k < def->num_info_fields; k++)
        h->info[k] = xcalloc((size_t)n, info_field_bytes(&def->info_fields[k]));
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
        .num_envs = n, .autoreset_mode = mode, .max_episode_steps = TIME_LIMIT,
        .params = h->params};
    int rc = envd_vec_create(&h->vec, def, &h->cfg, &h->bufs, pool);
    CHECK(rc == ENVD_OK, "%s: create: %s", def->id, envd_strerror(rc));
    envd_vec_set_chunk(h->vec, chunk);
    envd_backend_t *backend = NULL;
    rc = envd_backend_pool_wrap(&backend, h->vec, n);
    CHECK(rc == ENVD_OK, "wrap: %s", envd_strerror(rc));
    rc = envd_session_create(&h->session, backend);
    CHECK(rc == ENVD_OK, "session: %s", envd_strerror(rc));
}

static void harness_free(harness_t *h)
{
    envd_session_destroy(h->session);
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
    free(h->ids);
    for (int k = 0; k < ENVD_MAX_INFO_FIELDS; k++)
        free(h->info[k]);
    h->vec = NULL;
}

/* Every env seeded with base + i (mask NULL: all). */
static void harness_reset(harness_t *h, uint64_t base, const bool *mask)
{
    uint64_t *seeds = xcalloc((size_t)h->n, sizeof *seeds);
    for (int64_t i = 0; i < h->n; i++)
        seeds[i] = base + (uint64_t)i;
    int rc = envd_vec_reset(h->vec, seeds, mask);
    CHECK(rc == ENVD_OK, "%s: reset: %s", h->def->id, envd_strerror(rc));
    free(seeds);
}

/* Valid random actions (discrete spaces only: the envs used here). */
/* h on pool (chunk 0: adaptive) and its twin, serial, over the same env,
 * both reset with seeds base + i: the twin replays what h is asked. */
static void twins_init(harness_t *h, harness_t *twin, const envd_env_def_t *def, int64_t n,
                       int mode, envd_pool_t *pool, int64_t chunk, uint64_t base)
{
    harness_init(h, def, n, mode, pool, chunk);
    harness_init(twin, def, n, mode, NULL, 0);
    harness_reset(h, base, NULL);
    harness_reset(twin, base, NULL);
}

static void fill_actions(harness_t *h, uint64_t *s)
{
    const envd_space_t *as = &h->def->action_space;
    CHECK(as->kind == ENVD_SPACE_DISCRETE, "%s: only discrete actions here", h->def->id);
    for (int64_t i = 0; i < h->n; i++)
        ((int64_t *)h->actions)[i] = as->start + (int64_t)(rnd(s) % (uint64_t)as->n);
}

static void copy_actions(harness_t *to, const harness_t *from)
{
    memcpy(to->actions, from->actions, (size_t)from->n * from->act_bytes);
}

/* Every output buffer bit-identical. */
static bool same_buffers(const harness_t *a, const harness_t *b)
{
    size_t n = (size_t)a->n;
    if (memcmp(a->obs, b->obs, n * a->obs_bytes) || memcmp(a->rewards, b->rewards, n * 4) ||
        memcmp(a->terms, b->terms, n) || memcmp(a->truncs, b->truncs, n) ||
        memcmp(a->returns, b->returns, n * 8) || memcmp(a->lengths, b->lengths, n * 8))
        return false;
    if (a->final_obs && memcmp(a->final_obs, b->final_obs, n * a->obs_bytes))
        return false;
    for (int k = 0; k < a->def->num_info_fields; k++)
        if (memcmp(a->info[k], b->info[k], n * info_field_bytes(&a->def->info_fields[k])))
            return false;
    return true;
}

/* ... and num_done, after a step that ran (a refused step leaves the buffers
 * but not the count: envd_vec_num_done is about the last step). */
static bool same_outputs(const harness_t *a, const harness_t *b)
{
    return same_buffers(a, b) && envd_vec_num_done(a->vec) == envd_vec_num_done(b->vec);
}

static envd_doorbell_t *bell_start(harness_t *h, doorbell_t *d, int64_t spin_ns)
{
    envd_doorbell_t *f = NULL;
    int rc = envd_doorbell_start(&f, h->session, d->h, h->ids, spin_ns);
    CHECK(rc == ENVD_OK && f != NULL, "envd_doorbell_start: %s", envd_strerror(rc));
    CHECK(atomic_load(&d->h->closed) == 0, "closed after start");
    CHECK(atomic_load(&d->h->done_seq) == atomic_load(&d->h->req_seq),
          "start: done_seq %u, req_seq %u", atomic_load(&d->h->done_seq),
          atomic_load(&d->h->req_seq));
    return f;
}

/* Every ring of a sleeping server woke it: none was slept through to the
 * end of a 200 ms slice (the answer would still come, only late). */
static void check_no_missed_rings(const doorbell_t *d)
{
    CHECK(atomic_load(&d->h->missed_rings) == 0,
          "the server slept through %u rings to the end of its slice",
          atomic_load(&d->h->missed_rings));
}

/* Stops and checks the closed doorbell: served count, closed, done_seq left
 * at the last answer, no ring missed. */
static void bell_stop(envd_doorbell_t *f, doorbell_t *d, int64_t want_served)
{
    check_no_missed_rings(d);
    uint32_t done = atomic_load(&d->h->done_seq);
    int64_t served = envd_doorbell_stop(f, NULL);
    CHECK(served == want_served, "stop returned %lld served, want %lld", (long long)served,
          (long long)want_served);
    CHECK(atomic_load(&d->h->closed) == 1, "not closed after stop");
    CHECK(atomic_load(&d->h->done_seq) == done, "stop moved done_seq %u -> %u", done,
          atomic_load(&d->h->done_seq));
}

/* A request that must run one step: the twin steps with the same actions,
 * the answer carries its num_done and every buffer matches. */
static void step_checked(harness_t *h, harness_t *twin, envd_doorbell_t *f, doorbell_t *d,
                         int mode, int64_t *ok, const char *what)
{
    copy_actions(twin, h);
    answer_t a = request(d, ENVD_DOORBELL_STEP, mode);
    int rc = envd_vec_step(twin->vec);
    CHECK(rc >= 0, "%s: twin step: %s", what, envd_strerror(rc));
    CHECK(a.status == ENVD_OK && a.result == rc && a.index == -1,
          "%s: request %u: status %d result %lld index %lld, twin returned %d", what, d->seq,
          a.status, (long long)a.result, (long long)a.index, rc);
    CHECK(same_outputs(h, twin), "%s: request %u: outputs differ from the twin", what, d->seq);
    ++*ok;
    CHECK(envd_doorbell_served(f) == *ok, "%s: served %lld, want %lld", what,
          (long long)envd_doorbell_served(f), (long long)*ok);
}

/* A request the server must refuse: the status and index, and nothing
 * stepped (the twin, not stepped, still matches). */
static void step_refused(harness_t *h, harness_t *twin, envd_doorbell_t *f, doorbell_t *d,
                         uint32_t kind, int mode, int want, int64_t index, int64_t ok,
                         const char *what)
{
    answer_t a = request(d, kind, mode);
    CHECK(a.status == want && a.index == index && a.result == 0,
          "%s: status %d (want %d) index %lld (want %lld) result %lld", what, a.status, want,
          (long long)a.index, (long long)index, (long long)a.result);
    CHECK(same_buffers(h, twin), "%s: a refused request wrote outputs", what);
    CHECK(envd_doorbell_served(f) == ok, "%s: served %lld, want %lld", what,
          (long long)envd_doorbell_served(f), (long long)ok);
}

static const envd_env_def_t *const g_envs[] = {
    &envd_builtin_cartpole, &envd_builtin_acrobot, &envd_builtin_connect_four};

/* ---- 1. results ----------------------------------------------------------------- */
static void test_results(envd_pool_t *const *pools, int num_pools, int requests)
{
    static const int64_t sizes[] = {1, 7, 256};
    /* Pauses between requests, in us: none, shorter and longer than the spin. */
    static const int64_t pauses[] = {0, 0, 5, 30, 200, 1000};
    uint64_t s = 0x5eedfa57ull;
    int config = 0;
    g_slice_ns = LONG_SLICE_NS;
    atomic_store(&g_late_wakes, 0);
    for (int p = 0; p < num_pools; p++) {
        for (size_t e = 0; e < COUNT(g_envs); e++) {
            for (size_t si = 0; si < COUNT(sizes); si++, config++) {
                /* A Latin square: per pool, every (max_spinners, wait) pair
                 * once, and every size and env with each spinner setting and
                 * each wait. */
                const int max_spinners = (int)(si + e + (size_t)p) % 3;
                const int policy = (int)(si + 2 * e + (size_t)p) % 3; /* spin, sleep, random */
                const int mode = config % 2 ? ENVD_AUTORESET_SAME_STEP : ENVD_AUTORESET_NEXT_STEP;
                const int64_t chunk = config % 4 == 1 ? 3 : 0;  /* pooled or adaptive */
                const int64_t spin_ns = config % 5 == 0 ? 0 : 100000;
                envd_doorbell_set_max_spinners(max_spinners);
                char what[160];
                snprintf(what, sizeof what, "%s n=%lld threads=%d spinners=%d wait=%s",
                         g_envs[e]->id, (long long)sizes[si], envd_pool_num_threads(pools[p]),
                         max_spinners, policy == 2 ? "random" : wait_names[policy]);
                harness_t h, twin;
                twins_init(&h, &twin, g_envs[e], sizes[si], mode, pools[p], chunk,
                           100 + (uint64_t)config);
                doorbell_t d;
                doorbell_map(&d);
                envd_doorbell_t *f = bell_start(&h, &d, spin_ns);
                int64_t ok = 0;
                for (int r = 0; r < requests; r++) {
                    fill_actions(&h, &s);
                    int wait = policy == 2 ? (int)(rnd(&s) % 3) : policy;
                    step_checked(&h, &twin, f, &d, wait, &ok, what);
                    int64_t pause = pauses[rnd(&s) % COUNT(pauses)];
                    if (pause)
                        sleep_us(pause);
                }
                bell_stop(f, &d, ok);
                CHECK(d.seq == (uint32_t)requests, "%s: %u requests rung", what, d.seq);
                doorbell_unmap(&d);
                harness_free(&h);
                harness_free(&twin);
            }
        }
    }
    envd_doorbell_set_max_spinners(1);
    g_slice_ns = SLICE_NS;
    CHECK(atomic_load(&g_late_wakes) == 0, "%d sleeping clients were not woken by their answer",
          atomic_load(&g_late_wakes));
}

/* ---- 2. errors ------------------------------------------------------------------- */
static void test_errors(envd_pool_t *pool, int chunk)
{
    uint64_t s = 0xe770ull + (uint64_t)chunk;
    for (size_t e = 0; e < COUNT(g_envs); e++) {
        const envd_env_def_t *def = g_envs[e];
        const envd_space_t *as = &def->action_space;
        const int64_t n = 9;
        harness_t h, twin;
        harness_init(&h, def, n, ENVD_AUTORESET_NEXT_STEP, pool, chunk);
        harness_init(&twin, def, n, ENVD_AUTORESET_NEXT_STEP, NULL, 0);
        doorbell_t d;
        doorbell_map(&d);
        envd_doorbell_t *f = bell_start(&h, &d, 20000);
        int64_t ok = 0;

        /* Never reset: ESTATE naming env 0, for every wait. */
        for (int w = 0; w < 3; w++)
            step_refused(&h, &twin, f, &d, ENVD_DOORBELL_STEP, w, ENVD_ESTATE, 0, ok,
                         "step before reset");
        /* A reset under the lock (as the daemon does), then steps. */
        envd_doorbell_lock(f);
        harness_reset(&h, 7, NULL);
        envd_doorbell_unlock(f);
        harness_reset(&twin, 7, NULL);
        const int64_t bad[] = {as->start - 1, as->start + as->n, INT64_MIN, INT64_MAX};
        const int64_t where[] = {0, n - 1, 4};
        const uint32_t bad_kinds[] = {0, 4, 77, UINT32_MAX};
        for (int round = 0; round < 12; round++) {
            fill_actions(&h, &s);
            int64_t k = where[round % COUNT(where)];
            int64_t *a = (int64_t *)h.actions;
            int64_t good = a[k];
            a[k] = bad[round % COUNT(bad)];
            char what[128];
            snprintf(what, sizeof what, "%s: action %lld at env %lld", def->id, (long long)a[k],
                     (long long)k);
            step_refused(&h, &twin, f, &d, ENVD_DOORBELL_STEP, round % 3, ENVD_ERANGE, k, ok, what);
            a[k] = good;
            snprintf(what, sizeof what, "%s: req_kind %u", def->id, bad_kinds[round % 4]);
            step_refused(&h, &twin, f, &d, bad_kinds[round % 4], (round + 1) % 3, ENVD_EINVAL,
                         -1, ok, what);
            step_checked(&h, &twin, f, &d, (round + 2) % 3, &ok, "step after refusals");
        }
        bell_stop(f, &d, ok);
        doorbell_unmap(&d);
        harness_free(&h);
        harness_free(&twin);
    }

    /* DISABLED mode: the step after an episode ended is refused (ESTATE naming
     * the first done env) until the daemon resets it under the lock. */
    harness_t h, twin;
    twins_init(&h, &twin, &envd_builtin_cartpole, 16, ENVD_AUTORESET_DISABLED, pool, chunk,
               40);
    doorbell_t d;
    doorbell_map(&d);
    envd_doorbell_t *f = bell_start(&h, &d, 20000);
    int64_t ok = 0;
    int refusals = 0;
    for (int r = 0; r < 200 && refusals < 4; r++) {
        fill_actions(&h, &s);
        step_checked(&h, &twin, f, &d, r % 3, &ok, "disabled mode");
        if (envd_vec_num_done(twin.vec) == 0)
            continue;
        int64_t first = 0;
        while (!(twin.terms[first] || twin.truncs[first]))
            first++;
        step_refused(&h, &twin, f, &d, ENVD_DOORBELL_STEP, r % 3, ENVD_ESTATE, first, ok,
                     "step with a done env in DISABLED mode");
        CHECK(envd_vec_step(twin.vec) == ENVD_ESTATE && envd_vec_error_index(twin.vec) == first,
              "the twin disagrees");
        refusals++;
        for (int64_t i = 0; i < twin.n; i++)
            twin.mask[i] = twin.terms[i] || twin.truncs[i];
        envd_doorbell_lock(f);
        harness_reset(&h, 1000 + (uint64_t)r, twin.mask);
        envd_doorbell_unlock(f);
        harness_reset(&twin, 1000 + (uint64_t)r, twin.mask);
        CHECK(same_outputs(&h, &twin), "masked reset differs");
    }
    CHECK(refusals == 4, "only %d episodes ended in 200 steps", refusals);
    bell_stop(f, &d, ok);
    doorbell_unmap(&d);
    harness_free(&h);
    harness_free(&twin);
}

/* ---- 3. lock ------------------------------------------------------------------- */
/* CartPole whose step checks that the locker does not hold the lock. */
static _Atomic int g_locked;
static envd_env_def_t g_guarded;

static int guarded_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                        double *reward, bool *terminated, bool *truncated)
{
    CHECK(!atomic_load(&g_locked), "an env step ran while envd_doorbell_lock was held");
    return envd_builtin_cartpole.step(state, rng, action, obs, reward, terminated, truncated);
}

typedef struct lock_run {
    harness_t h, twin;
    doorbell_t d;
    envd_doorbell_t *f;
    _Atomic int client_done;
    /* Resets in lock order, each with the seq of the last request run
     * before it, as seen inside the lock (the server publishes an answer
     * after it unlocks, so done_seq may lag: the served count, counted
     * while the request runs under the lock, does not).  Written by the
     * locker and read by the client, both inside envd_doorbell_lock. */
    struct { uint32_t after; uint64_t seed; } log[4096];
    int logged, applied;
    int locks;
    uint32_t seq_base; /* a request's seq minus the served count once it ran */
} lock_run_t;

static void *locker_main(void *arg)
{
    lock_run_t *L = arg;
    uint64_t s = 0x10cull;
    while (!atomic_load(&L->client_done)) {
        sleep_us((int64_t)(rnd(&s) % 300));
        envd_doorbell_lock(L->f);
        atomic_store(&g_locked, 1);
        const int64_t served = envd_doorbell_served(L->f);
        const uint32_t done = (uint32_t)served + L->seq_base;
        if (L->logged < (int)COUNT(L->log) && rnd(&s) % 2) {
            uint64_t seed = rnd(&s) % 100000;
            harness_reset(&L->h, seed, NULL);
            L->log[L->logged].after = done;
            L->log[L->logged].seed = seed;
            L->logged++;
        }
        if (rnd(&s) % 3 == 0)
            sleep_us((int64_t)(rnd(&s) % 500)); /* hold it while the client rings */
        CHECK(envd_doorbell_served(L->f) == served,
              "a request ran while envd_doorbell_lock was held (%lld -> %lld served)",
              (long long)served, (long long)envd_doorbell_served(L->f));
        L->locks++;
        atomic_store(&g_locked, 0);
        envd_doorbell_unlock(L->f);
    }
    return NULL;
}

/* Applies the logged resets that came after request `after` (in order). */
static void replay_resets(lock_run_t *L, uint32_t after)
{
    while (L->applied < L->logged && L->log[L->applied].after == after) {
        harness_reset(&L->twin, L->log[L->applied].seed, NULL);
        L->applied++;
    }
}

static void *trylock_main(void *arg)
{
    envd_doorbell_t *f = arg;
    const int taken = envd_doorbell_trylock(f);
    if (taken)
        envd_doorbell_unlock(f);
    return (void *)(intptr_t)taken;
}

/* envd_doorbell_trylock from another thread (the lock is recursive for its holder). */
static int trylock_elsewhere(envd_doorbell_t *f)
{
    pthread_t t;
    void *taken = NULL;
    CHECK(pthread_create(&t, NULL, trylock_main, f) == 0, "pthread_create");
    pthread_join(t, &taken);
    return (int)(intptr_t)taken;
}

static void test_lock(envd_pool_t *pool, int requests)
{
    g_guarded = envd_builtin_cartpole;
    g_guarded.step = guarded_step;
    lock_run_t *L = xcalloc(1, sizeof *L);
    harness_init(&L->h, &g_guarded, 33, ENVD_AUTORESET_NEXT_STEP, pool, 4);
    harness_init(&L->twin, &envd_builtin_cartpole, 33, ENVD_AUTORESET_NEXT_STEP, NULL, 0);
    harness_reset(&L->h, 5, NULL);
    harness_reset(&L->twin, 5, NULL);
    doorbell_map(&L->d);
    L->f = bell_start(&L->h, &L->d, 50000);
    uint64_t s = 0xc11eull;
    g_slice_ns = LONG_SLICE_NS;
    atomic_store(&g_late_wakes, 0);
    int64_t ok = 0;

    /* A request rung while the lock is held (by envd_doorbell_lock or a
     * successful envd_doorbell_trylock) waits for the unlock; trylock fails
     * while it is held. */
    for (int r = 0; r < 6; r++) {
        fill_actions(&L->h, &s);
        copy_actions(&L->twin, &L->h);
        if (r % 2)
            envd_doorbell_lock(L->f);
        else  /* (the previous request was answered: the server unlocked before) */
            CHECK(envd_doorbell_trylock(L->f) == 1,
                  "envd_doorbell_trylock fails on an idle server");
        CHECK(trylock_elsewhere(L->f) == 0,
              "envd_doorbell_trylock succeeded on another thread while locked");
        /* The session's lock is recursive: its holder may take it again. */
        CHECK(envd_doorbell_trylock(L->f) == 1, "the holder's envd_doorbell_trylock failed");
        envd_doorbell_unlock(L->f);
        atomic_store(&g_locked, 1);
        ring(&L->d, ENVD_DOORBELL_STEP);
        sleep_us(r % 2 ? 2000 : 200);
        CHECK(!is_answered(&L->d), "a request was answered while envd_doorbell_lock was held");
        atomic_store(&g_locked, 0);
        envd_doorbell_unlock(L->f);
        answer_t a = wait_answer(&L->d, r % 3, LONG_SLICE_NS);
        int rc = envd_vec_step(L->twin.vec);
        CHECK(a.answered && a.status == ENVD_OK && a.result == rc, "held request: status %d",
              a.status);
        CHECK(same_outputs(&L->h, &L->twin), "held request: outputs differ");
        ok++;
    }

    /* An answered request leaves the session unlocked: the server releases
     * the lock before it publishes done_seq, so a client's next call (a reset
     * or "fast off" over the socket, which never waits for the lock) is not
     * refused as busy right after its answer came. */
    for (int r = 0; r < 10 * requests; r++) {
        fill_actions(&L->h, &s);
        copy_actions(&L->twin, &L->h);
        answer_t a = request(&L->d, ENVD_DOORBELL_STEP, 0);  /* spin: see it at once */
        CHECK(a.status == ENVD_OK, "unlocked answer %d: status %d", r, a.status);
        CHECK(envd_doorbell_trylock(L->f) == 1,
              "request %d was answered while the server still held the session's lock", r);
        envd_doorbell_unlock(L->f);
        CHECK(envd_vec_step(L->twin.vec) == a.result, "unlocked answer %d: result", r);
        ok++;
    }

    /* The locker resets at random times while the client rings: at least
     * `requests` requests, and on until the locker has both reset and locked
     * without resetting in between requests (counted inside the lock, where
     * the locker counts them): a loaded machine may not run the locker
     * during the first ones, which must not fail the test or leave the
     * interleaving untried.  A locker that never runs in a minute fails. */
    L->seq_base = L->d.seq - (uint32_t)envd_doorbell_served(L->f);
    pthread_t locker;
    CHECK(pthread_create(&locker, NULL, locker_main, L) == 0, "pthread_create");
    const double interleaved_by = now_s() + 60.0;
    bool interleaved = false;
    int r = 0;
    for (; r < requests || (!interleaved && now_s() < interleaved_by); r++) {
        fill_actions(&L->h, &s);
        copy_actions(&L->twin, &L->h);
        const uint32_t seq = L->d.seq + 1;
        answer_t a = request(&L->d, ENVD_DOORBELL_STEP, (int)(rnd(&s) % 3));
        CHECK(a.status == ENVD_OK, "request %u: status %d", seq, a.status);
        ok++;
        envd_doorbell_lock(L->f);
        CHECK(atomic_load(&L->d.h->done_seq) == seq, "done_seq moved");
        replay_resets(L, seq - 1); /* the resets between the previous request and this one */
        int rc = envd_vec_step(L->twin.vec);
        CHECK(rc == a.result, "request %u: result %lld, twin %d", seq, (long long)a.result, rc);
        replay_resets(L, seq);     /* and those since this one */
        CHECK(L->applied == L->logged, "request %u: a reset logged out of order", seq);
        CHECK(same_outputs(&L->h, &L->twin), "request %u: outputs differ from the twin", seq);
        interleaved = L->logged > 0 && L->locks > L->logged;
        envd_doorbell_unlock(L->f);
        if (rnd(&s) % 4 == 0)
            sleep_us((int64_t)(rnd(&s) % 200));
    }
    atomic_store(&L->client_done, 1);
    pthread_join(locker, NULL);
    CHECK(interleaved, "the locker hardly ran in %d requests over 60 s: %d locks, %d resets",
          r, L->locks, L->logged);
    g_slice_ns = SLICE_NS;
    CHECK(atomic_load(&g_late_wakes) == 0, "%d sleeping clients were not woken by their answer",
          atomic_load(&g_late_wakes));
    printf("doorbell_stress: lock, %d threads: %d requests, %d locks, %d resets\n",
           pool ? envd_pool_num_threads(pool) : 0, r, L->locks, L->logged);
    bell_stop(L->f, &L->d, ok);
    doorbell_unmap(&L->d);
    harness_free(&L->h);
    harness_free(&L->twin);
    free(L);
}

/* ---- 4. drain -------------------------------------------------------------------- */
static void test_drain(envd_pool_t *pool)
{
    uint64_t s = 0xd4a1ull;
    harness_t h, twin;
    twins_init(&h, &twin, &envd_builtin_acrobot, 7, ENVD_AUTORESET_NEXT_STEP, pool, 2,
               3);
    doorbell_t d;
    doorbell_map(&d);
    envd_doorbell_t *f = bell_start(&h, &d, 20000);
    int64_t ok = 0;
    for (int r = 0; r < 5; r++) {
        fill_actions(&h, &s);
        step_checked(&h, &twin, f, &d, r % 3, &ok, "before drain");
    }
    envd_doorbell_drain(f);
    for (int r = 0; r < 9; r++) {
        fill_actions(&h, &s);
        if (r == 4)
            ((int64_t *)h.actions)[2] = 99; /* drained before validated */
        step_refused(&h, &twin, f, &d, r % 3 == 2 ? 5 : ENVD_DOORBELL_STEP, r % 3,
                     ENVD_DOORBELL_SHUTTING_DOWN, -1, ok, "after drain");
    }
    bell_stop(f, &d, ok);
    doorbell_unmap(&d);
    harness_free(&h);
    harness_free(&twin);
}

/* ---- 5. stop ------------------------------------------------------------------- */
/* CartPole whose step can be held, to stop the server in the middle of one. */
static _Atomic int g_gate_armed, g_gate_started, g_gate_release;
static envd_env_def_t g_gated;
/* The states gated_step stepped, in order, while g_order_on (help_oldest_first). */
#define ORDER_MAX 64
static _Atomic int g_order_on, g_order_len;
static _Atomic int g_order_written; /* entries stored (after g_order_len's claim) */
static _Atomic(void *) g_order[ORDER_MAX];

static int gated_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                      double *reward, bool *terminated, bool *truncated)
{
    if (atomic_load(&g_order_on)) {
        const int k = atomic_fetch_add(&g_order_len, 1);
        if (k < ORDER_MAX)
            atomic_store(&g_order[k], state);
        atomic_fetch_add(&g_order_written, 1);
    }
    if (atomic_load(&g_gate_armed)) {
        atomic_store(&g_gate_started, 1);
        const double deadline = now_s() + 30.0;
        while (!atomic_load(&g_gate_release)) {
            CHECK(now_s() < deadline, "gate never released");
            sched_yield();
        }
    }
    return envd_builtin_cartpole.step(state, rng, action, obs, reward, terminated, truncated);
}

static void gate_reset(void)
{
    atomic_store(&g_gate_armed, 0);
    atomic_store(&g_gate_started, 0);
    atomic_store(&g_gate_release, 0);
}

static void gate_wait_started(void)
{
    const double deadline = now_s() + 30.0;
    while (!atomic_load(&g_gate_started)) {
        CHECK(now_s() < deadline, "the gated step never started");
        sleep_us(100);
    }
}

typedef struct stopper {
    envd_doorbell_t *f;
    _Atomic pid_t tid;
    int64_t served;
    double took;
} stopper_t;

static void *stopper_main(void *arg)
{
    stopper_t *st = arg;
    atomic_store(&st->tid, thread_id());
    double t0 = now_s();
    st->served = envd_doorbell_stop(st->f, NULL);
    st->took = now_s() - t0;
    return NULL;
}

static pid_t wait_tid(_Atomic pid_t *tid)
{
    while (atomic_load(tid) == 0)
        sched_yield();
    return atomic_load(tid);
}

/* A client thread that rings one request (after stop began) and sleeps on
 * done_seq for it.  raw: one FUTEX_WAIT of up to 10 s with client_waiting
 * left 0, so that only stop's unconditional wake of done_seq (not the answer
 * to the earlier request) can end it; else the Python client's wait. */
typedef struct sleeper {
    doorbell_t *d;
    bool raw;
    _Atomic pid_t tid;
    uint32_t seen_done;
    int futex_rc;
    answer_t a;
    bool closed;
} sleeper_t;

static void *sleeper_main(void *arg)
{
    sleeper_t *sl = arg;
    doorbell_t *d = sl->d;
    ring(d, ENVD_DOORBELL_STEP);
    if (sl->raw) {
        uint32_t current = atomic_load(&d->h->done_seq);
        atomic_store(&sl->tid, thread_id());
        sl->futex_rc = futex_wait(&d->h->done_seq, current, 10000000000LL);
        sl->a.answered = is_answered(d);
    } else {
        atomic_store(&sl->tid, thread_id());
        sl->a = wait_answer(d, WAIT_SLEEP, SLICE_NS);
    }
    sl->seen_done = atomic_load(&d->h->done_seq);
    sl->closed = atomic_load(&d->h->closed);
    return NULL;
}

/* Stop while a request is in service; a second request is rung once stop has
 * begun (the stopper thread is asleep in envd_doorbell_stop, past its store of
 * the stop flag), by a client that then sleeps on done_seq: the first is
 * answered and counted, the second never, and the sleeper is woken by the
 * close.  Returns false when /proc could not confirm the order (then only the
 * loose checks ran). */
static bool stop_during_request(bool raw)
{
    g_gated = envd_builtin_cartpole;
    g_gated.step = gated_step;
    gate_reset();
    harness_t h, twin;
    harness_init(&h, &g_gated, 1, ENVD_AUTORESET_NEXT_STEP, NULL, 0);
    harness_init(&twin, &envd_builtin_cartpole, 1, ENVD_AUTORESET_NEXT_STEP, NULL, 0);
    harness_reset(&h, 9, NULL);
    harness_reset(&twin, 9, NULL);
    doorbell_t d;
    doorbell_map(&d);
    envd_doorbell_t *f = bell_start(&h, &d, 10000);
    int64_t ok = 0;
    step_checked(&h, &twin, f, &d, WAIT_SLEEP, &ok, "before the gated request");

    atomic_store(&g_gate_armed, 1);
    ring(&d, ENVD_DOORBELL_STEP);
    const uint32_t first = d.seq;
    gate_wait_started();
    CHECK(envd_doorbell_trylock(f) == 0, "envd_doorbell_trylock succeeded during a request");

    stopper_t st = {.f = f};
    pthread_t stopper, sleeper_thread;
    CHECK(pthread_create(&stopper, NULL, stopper_main, &st) == 0, "pthread_create");
    bool sure = wait_asleep(wait_tid(&st.tid), NULL, d.h);
    CHECK(atomic_load(&d.h->closed) == 0, "closed before the request in service ended");

    sleeper_t sl = {.d = &d, .raw = raw};
    CHECK(pthread_create(&sleeper_thread, NULL, sleeper_main, &sl) == 0, "pthread_create");
    sure &= wait_asleep(wait_tid(&sl.tid), &d.h->done_seq, d.h);
    atomic_store(&g_gate_release, 1);
    pthread_join(stopper, NULL);
    pthread_join(sleeper_thread, NULL);
    gate_reset();

    /* The request in service was answered (and counted) before the stop. */
    CHECK(st.served == ok + 1 || (!sure && st.served == ok + 2),
          "stop during a request: served %lld, want %lld", (long long)st.served,
          (long long)ok + 1);
    CHECK(atomic_load(&d.h->closed) == 1, "not closed");
    CHECK(d.seq == first + 1, "sleeper did not ring");
    if (sure) {
        CHECK(atomic_load(&d.h->done_seq) == first && sl.seen_done == first,
              "done_seq %u (sleeper saw %u), want %u: a request rung after stop began was "
              "answered", atomic_load(&d.h->done_seq), sl.seen_done, first);
        CHECK(!sl.a.answered && sl.closed, "the sleeper did not see the close");
        if (raw)
            CHECK(sl.futex_rc == 0, "the sleeper on done_seq was not woken by the close (%s)",
                  strerror(sl.futex_rc));
    } else {
        CHECK(sl.closed || sl.a.answered, "the sleeper saw neither an answer nor the close");
    }
    copy_actions(&twin, &h);
    CHECK(envd_vec_step(twin.vec) >= 0, "twin");
    if (st.served == ok + 1)
        CHECK(same_outputs(&h, &twin), "the request in service ran differently");
    doorbell_unmap(&d);
    harness_free(&h);
    harness_free(&twin);
    return sure;
}

/* Stops over 100 ms allowed in n: a badly loaded machine delays a stop now
 * and then, not in 1 of 25; the lost wake-up that doorbell.c had (a stop waited
 * out the server's 200 ms sleep slice) showed in about 1 in 10 stops issued
 * right after an answer. */
#define SLOW_STOPS_ALLOWED(n) (2 + (n) / 25)

/* Start/stop cycles on one header, serving one of three vecs (one per pool)
 * in turn: each session starts idle (done_seq == req_seq), serves only what is
 * rung after its start, and every stop is prompt.  The header starts as one
 * left by an earlier session with a request counted but never answered, and
 * the sequence numbers wrap within the run. */
static void test_cycles(envd_pool_t *const *pools, int num_pools, int cycles)
{
    uint64_t s = 0xc7c1e5ull;
    const int nv = num_pools < 3 ? num_pools : 3;
    harness_t h[3], twin[3];
    int64_t served[3] = {0, 0, 0};
    for (int p = 0; p < nv; p++) {
        twins_init(&h[p], &twin[p], &envd_builtin_cartpole, 8, ENVD_AUTORESET_NEXT_STEP,
                   pools[p], p, 77 + (uint64_t)p);
    }
    doorbell_t d;
    doorbell_map(&d);
    const uint32_t start_seq = UINT32_MAX - 40;
    atomic_store(&d.h->req_kind, ENVD_DOORBELL_STEP);
    atomic_store(&d.h->req_seq, start_seq);
    atomic_store(&d.h->done_seq, start_seq - 1);
    atomic_store(&d.h->closed, 1);
    d.seq = start_seq;
    double worst = 0.0;
    int slow = 0;
    for (int c = 0; c < cycles; c++) {
        envd_doorbell_set_max_spinners((int)(rnd(&s) % 3));
        const int p = (int)(rnd(&s) % (uint64_t)nv);
        const uint32_t before = atomic_load(&d.h->req_seq);
        envd_doorbell_t *f = bell_start(&h[p], &d, c % 4 == 0 ? 0 : 30000);
        CHECK(before == d.seq, "req_seq");
        const int requests = (int)(rnd(&s) % 4);
        if (c % 3 == 0) {
            /* The request counted before this start is not served. */
            sleep_us(300);
            CHECK(envd_doorbell_served(f) == 0 && same_outputs(&h[p], &twin[p]),
                  "cycle %d: a request rung before start was served", c);
        }
        int64_t ok = 0;
        for (int r = 0; r < requests; r++) {
            fill_actions(&h[p], &s);
            step_checked(&h[p], &twin[p], f, &d, (int)(rnd(&s) % 3), &ok, "start/stop cycle");
        }
        if (rnd(&s) % 3 == 0)
            sleep_us((int64_t)(rnd(&s) % 400)); /* the server spins or sleeps when stopped */
        const double t0 = now_s();
        bell_stop(f, &d, ok);
        const double took = now_s() - t0;
        worst = took > worst ? took : worst;
        slow += took > 0.1;
        served[p] += ok;
        if (c % 5 == 4) {
            /* A request rung on the closed doorbell: the next start skips it. */
            ring(&d, ENVD_DOORBELL_STEP);
            CHECK(!wait_answer(&d, WAIT_SPIN, SLICE_NS).answered, "closed doorbell answered");
        }
    }
    printf("doorbell_stress: %d start/stop cycles (%lld %lld %lld requests), slowest stop %.1f ms, "
           "%d over 100 ms\n", cycles, (long long)served[0], (long long)served[1],
           (long long)served[2], worst * 1e3, slow);
    /* With no request in service a stop waits only for the server to notice
     * (stop wakes req_seq's futex): slow stops are a badly loaded machine's,
     * rare, or a lost wake-up's. */
    CHECK(slow <= SLOW_STOPS_ALLOWED(cycles), "%d of %d stops took over 100 ms (slowest "
          "%.1f ms): a lost wake-up", slow, cycles, worst * 1e3);
    CHECK(d.seq < start_seq, "the sequence numbers did not wrap (%u)", d.seq);
    envd_doorbell_set_max_spinners(1);
    doorbell_unmap(&d);
    for (int p = 0; p < nv; p++) {
        harness_free(&h[p]);
        harness_free(&twin[p]);
    }
}

/* Stops issued right after an answer, while the server (no spin slot) is on
 * its way to sleep on req_seq.  A wake of req_seq that comes between the
 * server's last look at its stop flag and its FUTEX_WAIT is lost (stop does
 * not change req_seq), and doorbell.c then waited out the server's 200 ms sleep
 * slice, about once in ten here.  An observer thread looks for exactly that
 * state instead of timing it: the thread in envd_doorbell_stop asleep (past its
 * store of the flag) while a thread sleeps on req_seq -- only the server does
 * -- in three looks 2 ms apart.  A server that looked at its flag after the
 * store does not sleep on req_seq again, and one that missed the wake must be
 * woken again at once; a loaded machine delays both threads but cannot make
 * them sleep so. */
static struct {
    _Atomic int in_stop;     /* main is in envd_doorbell_stop number stop_id */
    _Atomic int stop_id;
    _Atomic int quit;
    pid_t stopper;
    const envd_doorbell_header_t *h;
    _Atomic int lost;        /* stops seen in that state */
    _Atomic int looks;       /* looks at /proc */
} g_obs;

/* Is some task of this process asleep on addr? */
static bool someone_sleeps_on(const void *addr)
{
    pid_t tasks[256];
    int n = list_tasks_once(tasks, (int)COUNT(tasks));
    for (int i = 0; i < n; i++) {
        unsigned long a0;
        const long nr = blocked_in(tasks[i], &a0); /* before a0 is read */
        if (sleeps_on(nr, a0, addr))
            return true;
    }
    return false;
}

static void *observer_main(void *arg)
{
    (void)arg;
    int streak = 0, streak_stop = -1;
    while (!atomic_load(&g_obs.quit)) {
        sleep_us(2000);
        const int id = atomic_load(&g_obs.stop_id);
        if (!atomic_load(&g_obs.in_stop)) {
            streak = 0;
            continue;
        }
        unsigned long m0;
        const long nr = blocked_in(g_obs.stopper, &m0); /* before m0 is read */
        const bool lost = stopping(nr, m0, g_obs.h) && someone_sleeps_on(&g_obs.h->req_seq);
        atomic_fetch_add(&g_obs.looks, 1);
        /* Three looks within one stop: a stop that missed the server only
         * for a moment (and wakes it again) is no lost wake-up. */
        if (id != streak_stop || atomic_load(&g_obs.stop_id) != id ||
            !atomic_load(&g_obs.in_stop))
            streak = 0;
        streak_stop = id;
        streak = lost ? streak + 1 : 0;
        if (streak == 3)
            atomic_fetch_add(&g_obs.lost, 1);
    }
    return NULL;
}

static void stop_after_answer(int iterations)
{
    envd_doorbell_set_max_spinners(0);
    harness_t h;
    harness_init(&h, &envd_builtin_cartpole, 1, ENVD_AUTORESET_NEXT_STEP, NULL, 0);
    harness_reset(&h, 4, NULL);
    doorbell_t d;
    doorbell_map(&d);
    g_obs.h = d.h;
    g_obs.stopper = thread_id();
    atomic_store(&g_obs.lost, 0);
    atomic_store(&g_obs.looks, 0);
    atomic_store(&g_obs.quit, 0);
    pid_t probe[4];
    const bool can_look = list_tasks_once(probe, 4) > 0 &&
                          blocked_in(thread_id(), (unsigned long[1]){0}) != -2;
    pthread_t observer;
    CHECK(pthread_create(&observer, NULL, observer_main, NULL) == 0, "pthread_create");
    int slow = 0, i = 0;
    double worst = 0.0;
    for (; i < iterations && atomic_load(&g_obs.lost) == 0; i++) {
        envd_doorbell_t *f = bell_start(&h, &d, 0);
        answer_t a = request(&d, ENVD_DOORBELL_STEP, i % 2 ? WAIT_SPIN : WAIT_MIXED);
        CHECK(a.status == ENVD_OK, "status %d", a.status);
        /* The window is a few hundred ns wide: issue the stop at a sweep of
         * delays after the answer, so that some land in it. */
        for (int k = 0; k < i % 32; k++)
            envd_cpu_relax();
        const double t0 = now_s();
        atomic_store_explicit(&g_obs.stop_id, i, memory_order_relaxed);
        atomic_store_explicit(&g_obs.in_stop, 1, memory_order_relaxed);
        bell_stop(f, &d, 1);
        atomic_store_explicit(&g_obs.in_stop, 0, memory_order_relaxed);
        const double took = now_s() - t0;
        worst = took > worst ? took : worst;
        slow += took > 0.1;
    }
    atomic_store(&g_obs.quit, 1);
    pthread_join(observer, NULL);
    printf("doorbell_stress: %d stops right after an answer, %d over 100 ms (slowest %.1f ms), %d "
           "looks at /proc\n", i, slow, worst * 1e3, atomic_load(&g_obs.looks));
    CHECK(atomic_load(&g_obs.lost) == 0, "stop %d: the server slept on req_seq although stop "
          "had begun and its caller slept: a lost wake-up (slowest stop %.1f ms)", i,
          worst * 1e3);
    if (!can_look) /* /proc cannot tell: times only */
        CHECK(slow <= SLOW_STOPS_ALLOWED(i), "%d of %d stops right after an answer took over "
              "100 ms (slowest %.1f ms): a lost wake-up", slow, i, worst * 1e3);
    envd_doorbell_set_max_spinners(1);
    doorbell_unmap(&d);
    harness_free(&h);
}

static void test_stop(envd_pool_t *const *pools, int num_pools)
{
    /* Nothing pending: served count, closed, done_seq unchanged; and the
     * closed doorbell answers nothing (a request rung now stays unanswered). */
    for (int p = 0; p < num_pools; p++) {
        uint64_t s = 0x570ull + (uint64_t)p;
        harness_t h, twin;
        twins_init(&h, &twin, &envd_builtin_acrobot, 7, ENVD_AUTORESET_NEXT_STEP, pools[p], 0,
                   1);
        doorbell_t d;
        doorbell_map(&d);
        envd_doorbell_t *f = bell_start(&h, &d, 20000);
        int64_t ok = 0;
        for (int r = 0; r < 4 + p; r++) {
            fill_actions(&h, &s);
            step_checked(&h, &twin, f, &d, r % 3, &ok, "before stop");
        }
        step_refused(&h, &twin, f, &d, 4, WAIT_SLEEP, ENVD_EINVAL, -1, ok, "not counted");
        sleep_us(p * 1000); /* stop a spinning and a sleeping server */
        bell_stop(f, &d, ok);
        CHECK(atomic_load(&d.h->done_seq) == d.seq, "done_seq");
        ring(&d, ENVD_DOORBELL_STEP);
        answer_t a = wait_answer(&d, WAIT_MIXED, SLICE_NS);
        CHECK(!a.answered, "a closed doorbell answered");
        CHECK(same_outputs(&h, &twin), "a closed doorbell stepped the vec");
        doorbell_unmap(&d);
        harness_free(&h);
        harness_free(&twin);
    }
    CHECK(envd_doorbell_stop(NULL, NULL) == 0, "stop(NULL)");

    int sure = 0;
    for (int i = 0; i < 6; i++)
        sure += stop_during_request(i % 2 == 0);
    CHECK(sure == 0 || sure == 6, "/proc answered only sometimes");
    if (!sure)
        printf("doorbell_stress: /proc/self/task/*/syscall unreadable: stop-order checks loose\n");
}

/* ---- 6. spinners ------------------------------------------------------------------ */
/* Spinning is measured per server thread, as its CPU time while this thread
 * sleeps, relative to a reference thread that spins all along: about the same
 * share (ratio near 1) when it spins, 0 when it sleeps, however loaded the
 * machine.  A server thread is the task that envd_doorbell_start adds (the vecs
 * here have no pool); its CPU clock is the kernel's per-thread clock id (as
 * pthread_getcpuclockid builds it). */
static _Atomic int g_ref_stop;

static void *reference_spin(void *arg)
{
    (void)arg;
    while (!atomic_load_explicit(&g_ref_stop, memory_order_relaxed))
        envd_cpu_relax();
    return NULL;
}

static double clock_s(clockid_t clock)
{
    struct timespec ts;
    CHECK(clock_gettime(clock, &ts) == 0, "clock_gettime(%d): %s", (int)clock, strerror(errno));
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static clockid_t thread_clock(pid_t tid)
{
    return (clockid_t)((~(unsigned)tid << 3) | 6); /* CPUCLOCK_SCHED | PERTHREAD */
}

/* A listing that two reads in a row agree on: a thread joined a moment ago
 * may still be listed, and one that leaves during a read can make the read
 * skip a live one. */
static int list_tasks(pid_t *out, int cap)
{
    pid_t again[256];
    int n = list_tasks_once(out, cap);
    for (int tries = 0; n >= 0 && tries < 1000; tries++) {
        sleep_us(1000);
        int m = list_tasks_once(again, (int)COUNT(again));
        bool same = m == n;
        for (int i = 0; same && i < n; i++)
            same = has_task(again, m, out[i]);
        if (same)
            return n;
        n = list_tasks_once(out, cap);
    }
    return -1;
}

/* The task envd_doorbell_start added, or 0 when it cannot be told. */
static pid_t start_server(envd_doorbell_t **f, harness_t *h, doorbell_t *d, int64_t spin_ns)
{
    pid_t before[256], after[256];
    int nb = list_tasks(before, 256);
    *f = bell_start(h, d, spin_ns);
    int na = list_tasks(after, 256);
    if (nb < 0 || na != nb + 1)
        return 0;
    pid_t added = 0;
    for (int i = 0; i < na; i++)
        if (!has_task(before, nb, after[i]))
            added = after[i];
    for (int i = 0; i < nb; i++)
        if (!has_task(after, na, before[i]))
            return 0; /* a task left meanwhile: not sure which one is new */
    return added;
}

/* Each server's CPU over a window, relative to the reference thread's;
 * returns the reference's CPU seconds (and the window's in *window). */
static double spin_ratios(const pid_t *tids, int n, double *ratio, double *window)
{
    atomic_store(&g_ref_stop, 0);
    pthread_t ref;
    clockid_t ref_clock;
    double start[4];
    for (int k = 0; k < n; k++)
        start[k] = clock_s(thread_clock(tids[k]));
    CHECK(pthread_create(&ref, NULL, reference_spin, NULL) == 0, "pthread_create");
    CHECK(pthread_getcpuclockid(ref, &ref_clock) == 0, "pthread_getcpuclockid");
    const double t0 = now_s();
    double ref_cpu;
    do {
        sleep_us(20000);
        ref_cpu = clock_s(ref_clock);
    } while ((now_s() - t0 < 0.2 || ref_cpu < 0.03) && now_s() - t0 < 5.0);
    for (int k = 0; k < n; k++)
        ratio[k] = (clock_s(thread_clock(tids[k])) - start[k]) / ref_cpu;
    *window = now_s() - t0;
    atomic_store(&g_ref_stop, 1);
    pthread_join(ref, NULL);
    CHECK(ref_cpu > 0.005, "the reference thread hardly ran (%.4f s)", ref_cpu);
    return ref_cpu;
}

static void test_spinners(void)
{
    const int64_t long_spin = 20LL * 1000000000LL; /* far longer than any window */
    harness_t h[2];
    doorbell_t d[2];
    for (int k = 0; k < 2; k++) {
        harness_init(&h[k], &envd_builtin_cartpole, 3, ENVD_AUTORESET_NEXT_STEP, NULL, 0);
        harness_reset(&h[k], 3, NULL);
        doorbell_map(&d[k]);
    }
    const int settings[] = {0, -5, 1, 2};
    const int want[] = {0, 0, 1, 2};
    /* On 2 CPUs or fewer a spinning server stops once another starts a
     * request (cpus_busy in doorbell.c): the second answer may end the first
     * one's spin, so two slots may show one spinner. */
    const int want_at_least[] = {0, 0, 1, envd_usable_cpus() > 2 ? 2 : 1};
    int measured = 0;
    for (size_t i = 0; i < COUNT(settings); i++) {
        envd_doorbell_set_max_spinners(settings[i]);
        envd_doorbell_t *f[2];
        pid_t tids[2];
        for (int k = 0; k < 2; k++)
            tids[k] = start_server(&f[k], &h[k], &d[k], long_spin);
        /* One request each: a server that has not seen its client ring
         * again yet spins the whole spin_ns (spin_deadline in doorbell.c). */
        for (int k = 0; k < 2; k++) {
            answer_t a = request(&d[k], ENVD_DOORBELL_STEP, k);
            CHECK(a.status == ENVD_OK, "spinners %d: status %d", settings[i], a.status);
        }
        /* Both servers have answered and would spin for 20 s if allowed. */
        if (tids[0] != 0 && tids[1] != 0) {
            /* More spinners than allowed in any window fails; fewer is
             * measured again (a thread can be starved for a window on a
             * badly loaded machine). */
            measured++;
            bool seen[2] = {false, false};
            for (int w = 0; w < 3 && seen[0] + seen[1] < want_at_least[i]; w++) {
                double ratio[2], window;
                const double ref_cpu = spin_ratios(tids, 2, ratio, &window);
                /* Spinning: awake (server_asleep 0) a window after its answer,
                 * where a server without a slot sleeps at once.  Not its CPU:
                 * a spin yields to runnable threads (the reference, or a
                 * loaded host's work; SPIN_ALONE_NS in doorbell.c). */
                bool awake[2];
                for (int k = 0; k < 2; k++)
                    awake[k] = atomic_load(&d[k].h->server_asleep) == 0;
                const int spinning = awake[0] + awake[1];
                printf("doorbell_stress: max_spinners %d: servers awake %d %d, CPU %.2f %.2f of "
                       "a spinning thread's\n", settings[i], awake[0], awake[1], ratio[0],
                       ratio[1]);
                CHECK(spinning <= want[i], "max_spinners %d: %d servers spin (CPU %.2f %.2f of "
                      "a spinning thread's %.3f s in %.3f s; tasks %d %d)", settings[i],
                      spinning, ratio[0], ratio[1], ref_cpu, window, (int)tids[0],
                      (int)tids[1]);
                for (int k = 0; k < 2; k++)
                    seen[k] |= awake[k];
            }
            CHECK(seen[0] + seen[1] >= want_at_least[i] && seen[0] + seen[1] <= want[i],
                  "max_spinners %d: %d servers spin, want %d to %d", settings[i],
                  seen[0] + seen[1], want_at_least[i], want[i]);
        }
        const double t0 = now_s();
        for (int k = 0; k < 2; k++)
            bell_stop(f[k], &d[k], 1);
        CHECK(now_s() - t0 < 5.0, "stopping spinning servers took %.1f s", now_s() - t0);
    }
    if (measured < (int)COUNT(settings))
        printf("doorbell_stress: spinning measured in %d of %d rounds (/proc/self/task)\n",
               measured, (int)COUNT(settings));
    envd_doorbell_set_max_spinners(1);
    for (int k = 0; k < 2; k++) {
        doorbell_unmap(&d[k]);
        harness_free(&h[k]);
    }
}

/* A CartPole harness of 3 envs (reset with seed) and a server for it that
 * spins up to 20 s (one spin slot): the thread's id, or 0 if not found. */
static pid_t start_long_spinner(envd_doorbell_t **f, harness_t *h, doorbell_t *d, uint64_t seed)
{
    harness_init(h, &envd_builtin_cartpole, 3, ENVD_AUTORESET_NEXT_STEP, NULL, 0);
    harness_reset(h, seed, NULL);
    doorbell_map(d);
    envd_doorbell_set_max_spinners(1);
    return start_server(f, h, d, 20LL * 1000000000LL);
}

/* A client that rings every GAP_US makes its server spin for about twice that
 * after an answer (spin_deadline in doorbell.c), not for the whole spin_ns
 * (20 s): counted on the spin the server chose (envd_doorbell_spin_ns), read
 * once it sleeps after its last answer (its spin over, or none: no spin slot
 * or busy CPUs, which load decides and this test does not).  Load only
 * lengthens the gaps the server measures (each at least GAP_US), so the
 * spin lies between two gaps and a bound far below spin_ns. */
static void test_spin_follows_gaps(void)
{
    enum { GAP_US = 10000, REQUESTS = 6 };
    const int64_t spin_limit_ns = 20LL * 1000000000LL;
    harness_t h;
    doorbell_t d;
    envd_doorbell_t *f;
    start_long_spinner(&f, &h, &d, 5);
    for (int r = 0; r < REQUESTS; r++) {
        if (r > 0)
            sleep_us(GAP_US); /* the client's own work between two requests */
        answer_t a = request(&d, ENVD_DOORBELL_STEP, WAIT_SLEEP);
        CHECK(a.status == ENVD_OK, "request %d: status %d", r, a.status);
    }
    const double answered = now_s();
    /* (a server spinning the whole spin_ns sleeps 20 s after its answer) */
    while (atomic_load(&d.h->server_asleep) == 0 && now_s() - answered < 30.0)
        sleep_us(1000);
    CHECK(atomic_load(&d.h->server_asleep) == 1, "the server was still awake %.1f s after "
          "its last answer", now_s() - answered);
    const int64_t spin = envd_doorbell_spin_ns(f);
    CHECK(spin >= 2LL * GAP_US * 1000 * 9 / 10 && spin <= spin_limit_ns / 4,
          "a server whose client rings every %d us chose a spin of %.3f ms after its answer "
          "(twice the gap and a margin expected; its spin limit: 20 s)", GAP_US, spin / 1e6);
    printf("doorbell_stress: gaps of %d us: the server chose a spin of %.1f ms\n", GAP_US,
           spin / 1e6);
    bell_stop(f, &d, REQUESTS);
    doorbell_unmap(&d);
    harness_free(&h);
}

/* A client that shares its server's one CPU (a busy host put both there): the
 * server's spin yields between checks (SPIN_ALONE_NS in doorbell.c, from the
 * spin's start once a request came in while it yielded), so the client runs
 * and rings while the server still spins -- with a spin_ns of 100 ms the
 * spin would otherwise end only when the scheduler preempts it.  Checked:
 * every step's answer and outputs (against a twin), served count, no ring
 * missed; the time per request is printed, not judged (a loaded host decides
 * it).  The pinning applies to this thread and the server it starts. */
static void test_one_cpu(int requests)
{
    cpu_set_t all, one;
    const int cpu = sched_getcpu();
    if (cpu < 0 || sched_getaffinity(0, sizeof all, &all) != 0)
        return;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "pin to CPU %d: %s", cpu, strerror(errno));
    harness_t h, twin;
    doorbell_t d;
    twins_init(&h, &twin, &envd_builtin_cartpole, 16, ENVD_AUTORESET_NEXT_STEP, NULL, 0, 13);
    doorbell_map(&d);
    envd_doorbell_set_max_spinners(1);
    envd_doorbell_t *f = bell_start(&h, &d, 100LL * 1000000LL);
    uint64_t s = 13;
    int64_t ok = 0;
    const double t = now_s();
    for (int r = 0; r < requests; r++) {
        fill_actions(&h, &s);
        step_checked(&h, &twin, f, &d, r % 3 == 2 ? WAIT_MIXED : WAIT_SPIN, &ok, "one CPU");
    }
    printf("doorbell_stress: one CPU for client and server: %.1f us a request\n",
           (now_s() - t) / requests * 1e6);
    bell_stop(f, &d, ok);
    CHECK(sched_setaffinity(0, sizeof all, &all) == 0, "unpin: %s", strerror(errno));
    doorbell_unmap(&d);
    harness_free(&h);
    harness_free(&twin);
}

/* server_asleep (doorbell.h, Ordering): a server asleep on req_seq says so, and
 * the client's ring wakes it; one that spins for the next request says it
 * is awake, and the client rings it without a system call; a ring that does
 * not wake a sleeping server is answered only when its sleep slice (200 ms)
 * runs out, and counted in missed_rings. */
static void test_server_asleep(void)
{
    harness_t h;
    doorbell_t d;
    envd_doorbell_t *f;
    const pid_t tid = start_long_spinner(&f, &h, &d, 11);
    /* Before its first request nothing says one is due: the server sleeps. */
    bool sure = tid != 0 && wait_asleep(tid, &d.h->req_seq, d.h);
    CHECK(!sure || atomic_load(&d.h->server_asleep) == 1,
          "a server asleep on req_seq did not say so");
    atomic_store(&g_ring_wakes, 0);
    answer_t a = request(&d, ENVD_DOORBELL_STEP, WAIT_SLEEP);
    CHECK(a.status == ENVD_OK, "first request: status %d", a.status);
    CHECK(!sure || atomic_load(&g_ring_wakes) == 1, "the ring of a sleeping server made %d "
          "wakes", atomic_load(&g_ring_wakes));
    /* Answered once, with no gap measured yet, the server spins for the
     * whole spin_ns (20 s): awake, and rung without a system call. */
    CHECK(atomic_load(&d.h->server_asleep) == 0, "a spinning server said it was asleep");
    atomic_store(&g_ring_wakes, 0);
    a = request(&d, ENVD_DOORBELL_STEP, WAIT_SLEEP);
    CHECK(a.status == ENVD_OK, "second request: status %d", a.status);
    CHECK(atomic_load(&g_ring_wakes) == 0, "the ring of a spinning server made %d wakes",
          atomic_load(&g_ring_wakes));
    /* A request rung with no wake while the server sleeps: answered at the
     * end of the slice, counted.  (Its gaps are short now: it soon sleeps
     * again.) */
    if (tid != 0 && wait_asleep(tid, &d.h->req_seq, d.h)) {
        d.seq++;
        atomic_store(&d.h->req_kind, ENVD_DOORBELL_STEP);
        atomic_store(&d.h->req_seq, d.seq);
        a = wait_answer(&d, WAIT_SLEEP, SLICE_NS);
        CHECK(a.answered && a.status == ENVD_OK, "the unwoken request: status %d", a.status);
        CHECK(atomic_load(&d.h->missed_rings) == 1, "missed_rings %u after one ring that "
              "woke nobody", atomic_load(&d.h->missed_rings));
        int64_t served = envd_doorbell_stop(f, NULL);
        CHECK(served == 3, "served %lld", (long long)served);
    } else {
        printf("doorbell_stress: server_asleep: /proc cannot tell the server's sleep; the "
               "unwoken ring is not tried\n");
        bell_stop(f, &d, 2);
    }
    doorbell_unmap(&d);
    harness_free(&h);
}

/* After a SENDRECV the server never spins (doorbell.c, spin_deadline): its
 * client drives other daemons before it rings again.  A client that pauses
 * PAUSE_US between SENDRECVs, with a spin limit far longer: the server's CPU
 * stays well under the pauses' time (a spinning server would use about all
 * of it wherever it gets a CPU; a loaded machine can only make it use less).
 * The same with STEPs is printed, to show what the measurement sees. */
static void test_no_spin_after_sendrecv(void)
{
    enum { PAUSE_US = 1000, REQUESTS = 40 };
    static const uint32_t kinds[] = {ENVD_DOORBELL_STEP, ENVD_DOORBELL_SENDRECV};
    for (size_t k = 0; k < COUNT(kinds); k++) {
        harness_t h;
        doorbell_t d;
        envd_doorbell_t *f;
        const pid_t tid = start_long_spinner(&f, &h, &d, 7);
        const double cpu0 = tid != 0 ? clock_s(thread_clock(tid)) : 0.0;
        for (int r = 0; r < REQUESTS; r++) {
            for (int64_t i = 0; i < 3; i++)
                h.ids[i] = i;
            answer_t a = request_count(&d, kinds[k], kinds[k] == ENVD_DOORBELL_STEP ? 0 : 3,
                                       WAIT_SLEEP);
            CHECK(a.status == ENVD_OK, "request %d: status %d", r, a.status);
            sleep_us(PAUSE_US); /* the client's work elsewhere (another daemon's) */
        }
        if (tid != 0) {
            const double cpu = clock_s(thread_clock(tid)) - cpu0;
            const double paused = REQUESTS * PAUSE_US * 1e-6;
            printf("doorbell_stress: %s every %d us: server's CPU %.1f ms of %.1f ms paused\n",
                   kinds[k] == ENVD_DOORBELL_STEP ? "steps" : "sendrecvs", PAUSE_US, cpu * 1e3,
                   paused * 1e3);
            CHECK(kinds[k] == ENVD_DOORBELL_STEP || cpu < 0.5 * paused,
                  "a server answering SENDRECVs spun: %.1f ms of CPU over %.1f ms of pauses",
                  cpu * 1e3, paused * 1e3);
        }
        check_no_missed_rings(&d);
        CHECK(envd_doorbell_stop(f, NULL) == (kinds[k] == ENVD_DOORBELL_STEP ? REQUESTS : 0),
              "no-spin test: served");
        doorbell_unmap(&d);
        harness_free(&h);
    }
}

/* ---- 7. async: SEND and RECV ------------------------------------------------------ */
/* Env i's output rows bit-identical: observation, reward, flags, episode
 * return and length, final observation where kept, info fields. */
static bool same_row(const harness_t *a, const harness_t *b, int64_t i)
{
    const size_t u = (size_t)i, ob = a->obs_bytes;
    if (memcmp(a->obs + u * ob, b->obs + u * ob, ob) ||
        memcmp(&a->rewards[i], &b->rewards[i], sizeof *a->rewards) ||
        memcmp(&a->terms[i], &b->terms[i], 1) || memcmp(&a->truncs[i], &b->truncs[i], 1) ||
        memcmp(&a->returns[i], &b->returns[i], sizeof *a->returns) ||
        memcmp(&a->lengths[i], &b->lengths[i], sizeof *a->lengths))
        return false;
    if (a->final_obs && memcmp(a->final_obs + u * ob, b->final_obs + u * ob, ob))
        return false;
    for (int k = 0; k < a->def->num_info_fields; k++) {
        const size_t fb = info_field_bytes(&a->def->info_fields[k]);
        if (memcmp(a->info[k] + u * fb, b->info[k] + u * fb, fb))
            return false;
    }
    return true;
}

/* Random valid actions in h's rows of envs ids[0 .. k). */
static void fill_rows(harness_t *h, const int64_t *ids, int64_t k, uint64_t *s)
{
    const envd_space_t *as = &h->def->action_space;
    for (int64_t j = 0; j < k; j++)
        ((int64_t *)h->actions)[ids[j]] = as->start + (int64_t)(rnd(s) % (uint64_t)as->n);
}

/* The twin runs a batch at once (serially): envs ids[0 .. k) with the
 * actions h's rows hold. */
static void twin_batch(harness_t *twin, envd_vec_batch_t *tb, const harness_t *h,
                       const int64_t *ids, int64_t k, const char *what)
{
    for (int64_t j = 0; j < k; j++)
        memcpy(twin->actions + (size_t)ids[j] * h->act_bytes,
               h->actions + (size_t)ids[j] * h->act_bytes, h->act_bytes);
    int rc = envd_vec_batch_submit(twin->vec, tb, ids, k, 0);
    CHECK(rc == ENVD_OK, "%s: twin batch submit: %s", what, envd_strerror(rc));
    envd_vec_batch_wait(twin->vec, tb);
    rc = envd_vec_batch_finish(twin->vec, tb);
    CHECK(rc >= 0, "%s: twin batch: %s", what, envd_strerror(rc));
}

/* The test's model of the session's books: each env idle or in one batch
 * sent and not received; a RECV returns exactly its count, so it may cut a
 * batch, whose rest the next RECV returns first. */
typedef struct books {
    int64_t n;
    int64_t *batch_of;   /* the serial of the env's batch, -1 when idle */
    int64_t *pos;        /* its place in that batch's send order */
    int64_t *size;       /* that batch's size */
    int64_t *scratch;
    int64_t out, batches_out, serial, sent, received;
    int64_t cut_serial, cut_next; /* a batch a RECV cut (-1: none), its next place */
} books_t;

static void books_init(books_t *b, int64_t n)
{
    memset(b, 0, sizeof *b);
    b->n = n;
    b->batch_of = xcalloc((size_t)n, sizeof *b->batch_of);
    b->pos = xcalloc((size_t)n, sizeof *b->pos);
    b->size = xcalloc((size_t)n, sizeof *b->size);
    b->scratch = xcalloc((size_t)n, sizeof *b->scratch);
    for (int64_t i = 0; i < n; i++)
        b->batch_of[i] = -1;
    b->cut_serial = -1;
}

static void books_free(books_t *b)
{
    free(b->batch_of);
    free(b->pos);
    free(b->size);
    free(b->scratch);
}

/* k random idle envs, in random order, into ids. */
static void pick_idle(books_t *b, int64_t *ids, int64_t k, uint64_t *s)
{
    int64_t m = 0;
    for (int64_t i = 0; i < b->n; i++)
        if (b->batch_of[i] < 0)
            b->scratch[m++] = i;
    CHECK(k >= 1 && k <= m, "pick %lld of %lld idle", (long long)k, (long long)m);
    for (int64_t j = 0; j < k; j++) {
        int64_t r = j + (int64_t)(rnd(s) % (uint64_t)(m - j));
        int64_t t = b->scratch[j];
        b->scratch[j] = b->scratch[r];
        b->scratch[r] = t;
        ids[j] = b->scratch[j];
    }
}

static void books_send(books_t *b, const int64_t *ids, int64_t k)
{
    for (int64_t j = 0; j < k; j++) {
        b->batch_of[ids[j]] = b->serial;
        b->pos[ids[j]] = j;
        b->size[ids[j]] = k;
    }
    b->serial++;
    b->batches_out++;
    b->out += k;
    b->sent += k;
}

/* The ids a RECV returned: every one sent and not returned before; the
 * ready FIFO's order: each batch's envs contiguous and in their send order,
 * the rest of a batch the last RECV cut first, the last batch possibly cut;
 * in_order: batches in submit order. */
static void books_recv(books_t *b, const int64_t *ids, int64_t got, bool in_order,
                       const char *what)
{
    int64_t prev = -1;
    for (int64_t j = 0; j < got;) {
        const int64_t first = ids[j];
        CHECK(first >= 0 && first < b->n, "%s: recv returned env id %lld", what,
              (long long)first);
        const int64_t serial = b->batch_of[first], k = b->size[first], p = b->pos[first];
        CHECK(serial >= 0, "%s: recv returned env %lld, not in flight (never sent, or "
              "returned before)", what, (long long)first);
        const bool cont = j == 0 && b->cut_serial >= 0;
        CHECK(!cont || serial == b->cut_serial, "%s: recv started with batch %lld, not the "
              "rest of the cut batch %lld", what, (long long)serial, (long long)b->cut_serial);
        CHECK(p == (cont ? b->cut_next : 0), "%s: a batch comes back from env %lld, its #%lld",
              what, (long long)first, (long long)p);
        CHECK(!in_order || serial > prev, "%s: batch %lld came back after batch %lld", what,
              (long long)serial, (long long)prev);
        const int64_t m = k - p < got - j ? k - p : got - j;
        for (int64_t q = 0; q < m; q++) {
            const int64_t id = ids[j + q];
            CHECK(id >= 0 && id < b->n && b->batch_of[id] == serial && b->pos[id] == p + q,
                  "%s: batch %lld: #%lld is env %lld (its batch %lld, #%lld): not contiguous "
                  "in send order", what, (long long)serial, (long long)(p + q), (long long)id,
                  (long long)(id >= 0 && id < b->n ? b->batch_of[id] : -2),
                  (long long)(id >= 0 && id < b->n ? b->pos[id] : -2));
            b->batch_of[id] = -1;
        }
        if (p + m < k) { /* cut: only at the end of the recv */
            b->cut_serial = serial;
            b->cut_next = p + m;
        } else {
            b->cut_serial = -1;
            b->batches_out--;
        }
        prev = serial;
        j += m;
    }
    b->out -= got;
    b->received += got;
}

/* The result a refused request carries (doorbell.h): a SEND of an env not idle
 * that env's state, a RECV of more than are out how many are, a STEP while
 * envs are out how many are in flight or minus how many are ready; else 0. */
static bool refusal_result_ok(const books_t *b, uint32_t kind, int want, int64_t index,
                              int64_t result)
{
    if (kind == ENVD_DOORBELL_SENDRECV) /* refused: its SEND's answer */
        kind = ENVD_DOORBELL_SEND;
    if (kind == ENVD_DOORBELL_SEND && want == ENVD_EBUSY && index >= 0 && index < b->n)
        return b->batch_of[index] >= 0
                   ? result == ENVD_ENV_IN_FLIGHT || result == ENVD_ENV_READY
                   : result == ENVD_ENV_IDLE;
    if (kind == ENVD_DOORBELL_RECV && want == ENVD_ESTATE && index == -1)
        return result == b->out;
    if (kind == ENVD_DOORBELL_STEP && want == ENVD_EBUSY)
        return result > 0 ? result <= b->out : -result == b->out && b->out > 0;
    return result == 0;
}

/* A SEND of ids[0 .. k) (already in h->ids, actions in h's rows) that must
 * start: the twin runs the batch now. */
static void send_checked(harness_t *h, harness_t *twin, envd_vec_batch_t *tb, doorbell_t *d,
                         books_t *b, int64_t k, int wait, const char *what)
{
    twin_batch(twin, tb, h, h->ids, k, what);
    books_send(b, h->ids, k);
    answer_t a = request_count(d, ENVD_DOORBELL_SEND, (uint32_t)k, wait);
    CHECK(a.status == ENVD_OK && a.result == 0 && a.index == -1,
          "%s: send of %lld: status %d result %lld index %lld", what, (long long)k, a.status,
          (long long)a.result, (long long)a.index);
}

/* A RECV of count that must succeed: exactly count ids, which pass
 * books_recv, and every env returned has the twin's rows (skip: an env not
 * compared, or -1).  exact: every env in flight is finished (no pool
 * threads: batches run inline at SEND), so they come back in submit order. */
static int64_t recv_checked(harness_t *h, const harness_t *twin, doorbell_t *d, books_t *b,
                            int64_t count, int wait, bool exact, int64_t skip,
                            const char *what)
{
    const int64_t out = b->out;
    answer_t a = request_count(d, ENVD_DOORBELL_RECV, (uint32_t)count, wait);
    CHECK(a.status == ENVD_OK && a.index == -1 && a.result == count && count <= out,
          "%s: recv %lld of %lld out: status %d result %lld index %lld", what,
          (long long)count, (long long)out, a.status, (long long)a.result, (long long)a.index);
    books_recv(b, h->ids, a.result, exact, what);
    for (int64_t j = 0; j < a.result; j++)
        CHECK(h->ids[j] == skip || same_row(h, twin, h->ids[j]),
              "%s: env %lld's outputs differ from the twin's", what, (long long)h->ids[j]);
    return a.result;
}

/* A SENDRECV of ids[0 .. k) (as send_checked) that must start: answered
 * once, sent == 1, as a RECV of k (as recv_checked). */
static int64_t sendrecv_checked(harness_t *h, harness_t *twin, envd_vec_batch_t *tb,
                                doorbell_t *d, books_t *b, int64_t k, int wait, bool exact,
                                const char *what)
{
    twin_batch(twin, tb, h, h->ids, k, what);
    books_send(b, h->ids, k);
    answer_t a = request_count(d, ENVD_DOORBELL_SENDRECV, (uint32_t)k, wait);
    CHECK(a.status == ENVD_OK && a.index == -1 && a.result == k &&
              atomic_load(&d->h->sent) == 1,
          "%s: sendrecv of %lld: status %d result %lld index %lld sent %u", what,
          (long long)k, a.status, (long long)a.result, (long long)a.index,
          atomic_load(&d->h->sent));
    books_recv(b, h->ids, a.result, exact, what);
    for (int64_t j = 0; j < a.result; j++)
        CHECK(same_row(h, twin, h->ids[j]), "%s: env %lld's outputs differ from the twin's",
              what, (long long)h->ids[j]);
    return a.result;
}

/* 7a. Random SENDs and RECVs, a random number of batches in flight. */
static void async_results(envd_pool_t *const *pools, int num_pools, int requests)
{
    static const int64_t sizes[] = {7, 64, 256};
    static const int64_t pauses[] = {0, 0, 0, 5, 30, 200};
    uint64_t s = 0xa5e17ull;
    int config = 0;
    int64_t sends = 0, recvs = 0, envs = 0;
    g_slice_ns = LONG_SLICE_NS;
    atomic_store(&g_late_wakes, 0);
    for (int p = 0; p < num_pools; p++) {
        const bool exact = envd_pool_num_threads(pools[p]) == 0;
        for (size_t e = 0; e < COUNT(g_envs); e++) {
            for (size_t si = 0; si < COUNT(sizes); si++, config++) {
                const int max_spinners = (int)(si + e + (size_t)p) % 3;
                const int policy = (int)(si + 2 * e + (size_t)p) % 3; /* spin, sleep, random */
                const int mode = config % 2 ? ENVD_AUTORESET_SAME_STEP : ENVD_AUTORESET_NEXT_STEP;
                const int64_t chunk = config % 4 == 1 ? 3 : 0; /* pooled or adaptive */
                const int64_t spin_ns = config % 5 == 0 ? 0 : 100000;
                const int64_t n = sizes[si];
                envd_doorbell_set_max_spinners(max_spinners);
                char what[160];
                snprintf(what, sizeof what, "async %s n=%lld threads=%d spinners=%d wait=%s",
                         g_envs[e]->id, (long long)n, envd_pool_num_threads(pools[p]),
                         max_spinners, policy == 2 ? "random" : wait_names[policy]);
                harness_t h, twin;
                twins_init(&h, &twin, g_envs[e], n, mode, pools[p], chunk,
                           300 + (uint64_t)config);
                envd_vec_batch_t *tb;
                CHECK(envd_vec_batch_create(&tb, n) == ENVD_OK, "batch create");
                books_t b;
                books_init(&b, n);
                doorbell_t d;
                doorbell_map(&d);
                envd_doorbell_t *f = bell_start(&h, &d, spin_ns);
                int64_t steps = 0;
                for (int r = 0; r < requests; r++) {
                    const int wait = policy == 2 ? (int)(rnd(&s) % 3) : policy;
                    const int64_t idle = n - b.out, target = 1 + (int64_t)(rnd(&s) % 4);
                    if (b.out == 0 && rnd(&s) % 6 == 0) {
                        /* A whole-vec STEP between async rounds. */
                        fill_actions(&h, &s);
                        step_checked(&h, &twin, f, &d, wait, &steps, what);
                    } else if (idle > 0 && (b.out == 0 || b.batches_out < target)) {
                        const int64_t most = rnd(&s) % 2 ? idle : (idle < 8 ? idle : 8);
                        const int64_t k = 1 + (int64_t)(rnd(&s) % (uint64_t)most);
                        pick_idle(&b, h.ids, k, &s);
                        fill_rows(&h, h.ids, k, &s);
                        if (rnd(&s) % 4 == 0) { /* answered as a RECV of k */
                            envs += sendrecv_checked(&h, &twin, tb, &d, &b, k, wait, exact,
                                                     what);
                            recvs++;
                        } else {
                            send_checked(&h, &twin, tb, &d, &b, k, wait, what);
                        }
                        sends++;
                    } else {
                        const int64_t count = 1 + (int64_t)(rnd(&s) % (uint64_t)b.out);
                        envs += recv_checked(&h, &twin, &d, &b, count, wait, exact, -1, what);
                        recvs++;
                    }
                    const int64_t pause = pauses[rnd(&s) % COUNT(pauses)];
                    if (pause)
                        sleep_us(pause);
                    if (rnd(&s) % 4 == 0)
                        envd_doorbell_collect(f); /* as a daemon's statistics do */
                }
                while (b.out > 0) {
                    envs += recv_checked(&h, &twin, &d, &b, b.out, (int)(rnd(&s) % 3), exact,
                                         -1, what);
                    recvs++;
                }
                CHECK(b.batches_out == 0 && b.received == b.sent, "%s: sent %lld, received %lld",
                      what, (long long)b.sent, (long long)b.received);
                CHECK(envd_doorbell_batch_envs(f) == b.received,
                      "%s: batch_envs %lld, received %lld", what,
                      (long long)envd_doorbell_batch_envs(f), (long long)b.received);
                envd_doorbell_lock(f);
                CHECK(envd_doorbell_pending(f) == 0, "%s: pending %lld after every recv", what,
                      (long long)envd_doorbell_pending(f));
                CHECK(same_buffers(&h, &twin), "%s: buffers differ from the twin's", what);
                envd_doorbell_unlock(f);
                int64_t batch_envs = -1;
                check_no_missed_rings(&d);
                const int64_t served = envd_doorbell_stop(f, &batch_envs);
                CHECK(served == steps && batch_envs == b.received,
                      "%s: stop: served %lld (want %lld), batch_envs %lld (want %lld)", what,
                      (long long)served, (long long)steps, (long long)batch_envs,
                      (long long)b.received);
                CHECK(atomic_load(&d.h->closed) == 1, "%s: not closed after stop", what);
                doorbell_unmap(&d);
                books_free(&b);
                envd_vec_batch_destroy(tb);
                harness_free(&h);
                harness_free(&twin);
            }
        }
    }
    envd_doorbell_set_max_spinners(1);
    g_slice_ns = SLICE_NS;
    CHECK(atomic_load(&g_late_wakes) == 0, "%d sleeping clients were not woken by their answer",
          atomic_load(&g_late_wakes));
    printf("doorbell_stress: async: %lld sends, %lld recvs, %lld envs\n", (long long)sends,
           (long long)recvs, (long long)envs);
}

/* CartPole whose step fails for the env whose observation row is g_fail_obs
 * (the vec passes env i its row of the observation buffer). */
static _Atomic uintptr_t g_fail_obs;
static envd_env_def_t g_failing;

static int failing_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                        double *reward, bool *terminated, bool *truncated)
{
    if ((uintptr_t)obs == atomic_load(&g_fail_obs))
        return ENVD_EENV;
    return envd_builtin_cartpole.step(state, rng, action, obs, reward, terminated, truncated);
}

/* A request that must be refused with status want naming env index: nothing
 * started (pending unchanged) and no idle env's rows written. */
static void async_refused(harness_t *h, const harness_t *twin, envd_doorbell_t *f, doorbell_t *d,
                          const books_t *b, uint32_t kind, uint32_t count, int wait, int want,
                          int64_t index, const char *what)
{
    answer_t a = request_count(d, kind, count, wait);
    CHECK(a.status == want && refusal_result_ok(b, kind, want, index, a.result) &&
              (index == INT64_MIN || a.index == index) && atomic_load(&d->h->sent) == 0,
          "%s: status %d (want %d) index %lld (want %lld) result %lld sent %u", what,
          a.status, want, (long long)a.index, (long long)index, (long long)a.result,
          atomic_load(&d->h->sent));
    envd_doorbell_lock(f);
    CHECK(envd_doorbell_pending(f) == b->out, "%s: pending %lld, want %lld", what,
          (long long)envd_doorbell_pending(f), (long long)b->out);
    envd_doorbell_unlock(f);
    for (int64_t i = 0; i < h->n; i++)
        CHECK(b->batch_of[i] >= 0 || same_row(h, twin, i), "%s: idle env %lld was stepped", what,
              (long long)i);
}

/* Writes ids into h->ids; returns how many. */
static int64_t set_ids(harness_t *h, const int64_t *ids, int64_t k)
{
    memcpy(h->ids, ids, (size_t)k * sizeof *ids);
    return k;
}

/* 7b. The refusals of SEND, RECV and STEP, and an env that fails. */
static void async_errors(envd_pool_t *pool, int64_t chunk)
{
    uint64_t s = 0xe5e9dull + (uint64_t)chunk;
    const bool exact = envd_pool_num_threads(pool) == 0;
    const int64_t n = 9;
    g_failing = envd_builtin_cartpole;
    g_failing.step = failing_step;
    atomic_store(&g_fail_obs, 0);
    harness_t h, twin;
    harness_init(&h, &g_failing, n, ENVD_AUTORESET_NEXT_STEP, pool, chunk);
    harness_init(&twin, &envd_builtin_cartpole, n, ENVD_AUTORESET_NEXT_STEP, NULL, 0);
    envd_vec_batch_t *tb;
    CHECK(envd_vec_batch_create(&tb, n) == ENVD_OK, "batch create");
    books_t b;
    books_init(&b, n);
    doorbell_t d;
    doorbell_map(&d);
    envd_doorbell_t *f = bell_start(&h, &d, 20000);
    int64_t steps = 0;
    int w = 0;
    char what[160];
#define NEXT_WAIT (w++ % 3)

    /* Never reset: ESTATE naming the env. */
    set_ids(&h, (const int64_t[]){3, 4}, 2);
    async_refused(&h, &twin, f, &d, &b, ENVD_DOORBELL_SEND, 2, NEXT_WAIT, ENVD_ESTATE, 3,
                  "send before reset");
    envd_doorbell_lock(f);
    harness_reset(&h, 11, NULL);
    envd_doorbell_unlock(f);
    harness_reset(&twin, 11, NULL);

    for (int round = 0; round < 3; round++) {
        snprintf(what, sizeof what, "async errors, %d threads, round %d",
                 envd_pool_num_threads(pool), round);
        /* Counts outside [1, num_envs]: EINVAL, index -1. */
        const uint32_t bad_counts[] = {0, (uint32_t)n + 1, UINT32_MAX};
        for (size_t c = 0; c < COUNT(bad_counts); c++) {
            set_ids(&h, (const int64_t[]){0, 1, 2, 3, 4, 5, 6, 7, 8}, n);
            async_refused(&h, &twin, f, &d, &b, ENVD_DOORBELL_SEND, bad_counts[c], NEXT_WAIT,
                          ENVD_EINVAL, -1, "send count out of range");
            async_refused(&h, &twin, f, &d, &b, ENVD_DOORBELL_RECV, bad_counts[c], NEXT_WAIT,
                          ENVD_EINVAL, -1, "recv count out of range");
            async_refused(&h, &twin, f, &d, &b, ENVD_DOORBELL_SENDRECV, bad_counts[c], NEXT_WAIT,
                          ENVD_EINVAL, -1, "sendrecv count out of range");
        }
        /* An id out of range: EINVAL naming it (also after valid ids). */
        set_ids(&h, (const int64_t[]){1, 5, n}, 3);
        async_refused(&h, &twin, f, &d, &b, ENVD_DOORBELL_SEND, 3, NEXT_WAIT, ENVD_EINVAL, n,
                      "send of id n");
        set_ids(&h, (const int64_t[]){INT64_MIN}, 1);
        async_refused(&h, &twin, f, &d, &b, ENVD_DOORBELL_SEND, 1, NEXT_WAIT, ENVD_EINVAL,
                      INT64_MIN, "send of id INT64_MIN");
        /* An env twice in one send: EBUSY naming it. */
        set_ids(&h, (const int64_t[]){4, 2, 4}, 3);
        async_refused(&h, &twin, f, &d, &b, ENVD_DOORBELL_SEND, 3, NEXT_WAIT, ENVD_EBUSY, 4,
                      "send of env 4 twice");
        /* A RECV with nothing in flight: ESTATE, index -1. */
        async_refused(&h, &twin, f, &d, &b, ENVD_DOORBELL_RECV, 1, NEXT_WAIT, ENVD_ESTATE, -1,
                      "recv with nothing sent");

        /* Batch A in flight. */
        fill_actions(&h, &s);
        send_checked(&h, &twin, tb, &d, &b, set_ids(&h, (const int64_t[]){2, 0, 1}, 3),
                     NEXT_WAIT, what);
        /* An env already in flight: EBUSY naming it. */
        set_ids(&h, (const int64_t[]){3, 1}, 2);
        async_refused(&h, &twin, f, &d, &b, ENVD_DOORBELL_SEND, 2, NEXT_WAIT, ENVD_EBUSY, 1,
                      "send of an env in flight");
        async_refused(&h, &twin, f, &d, &b, ENVD_DOORBELL_SENDRECV, 2, NEXT_WAIT, ENVD_EBUSY, 1,
                      "sendrecv of an env in flight");
        /* An action out of range: ERANGE naming the env. */
        const envd_space_t *as = &h.def->action_space;
        ((int64_t *)h.actions)[7] = round % 2 ? as->start + as->n : as->start - 1;
        set_ids(&h, (const int64_t[]){6, 7}, 2);
        async_refused(&h, &twin, f, &d, &b, ENVD_DOORBELL_SEND, 2, NEXT_WAIT, ENVD_ERANGE, 7,
                      "send with an action out of range");
        async_refused(&h, &twin, f, &d, &b, ENVD_DOORBELL_SENDRECV, 2, NEXT_WAIT, ENVD_ERANGE, 7,
                      "sendrecv with an action out of range");
        ((int64_t *)h.actions)[7] = as->start;
        /* STEP with envs in flight: EBUSY, nothing stepped, not counted. */
        fill_rows(&h, (const int64_t[]){3, 4, 5, 6, 7, 8}, 6, &s);
        async_refused(&h, &twin, f, &d, &b, ENVD_DOORBELL_STEP, 0, NEXT_WAIT, ENVD_EBUSY, INT64_MIN,
                      "step with envs in flight");
        CHECK(envd_doorbell_served(f) == steps, "%s: a refused step was counted", what);
        /* A RECV of more than in flight or ready: ESTATE, nothing taken. */
        async_refused(&h, &twin, f, &d, &b, ENVD_DOORBELL_RECV, 4, NEXT_WAIT, ENVD_ESTATE, -1,
                      "recv of more than sent");
        /* The refused envs are idle: sending them works. */
        send_checked(&h, &twin, tb, &d, &b, set_ids(&h, (const int64_t[]){7, 6, 3}, 3),
                     NEXT_WAIT, what);
        fill_rows(&h, (const int64_t[]){4, 5, 8}, 3, &s);
        send_checked(&h, &twin, tb, &d, &b, set_ids(&h, (const int64_t[]){8, 4}, 2),
                     NEXT_WAIT, what);
        recv_checked(&h, &twin, &d, &b, 5, NEXT_WAIT, false, -1, what);
        if (b.out)
            recv_checked(&h, &twin, &d, &b, b.out, NEXT_WAIT, exact, -1, what);

        /* An env callback fails in batch B: RECV answers ENVD_EENV naming it,
         * then the next RECV returns B's envs (and the others finished). */
        const int64_t bad = 5 + round % 2;
        atomic_store(&g_fail_obs, (uintptr_t)(h.obs + (size_t)bad * h.obs_bytes));
        fill_actions(&h, &s);
        send_checked(&h, &twin, tb, &d, &b, set_ids(&h, (const int64_t[]){0, 1}, 2),
                     NEXT_WAIT, what);
        send_checked(&h, &twin, tb, &d, &b, set_ids(&h, (const int64_t[]){7, bad, 2}, 3),
                     NEXT_WAIT, what);
        send_checked(&h, &twin, tb, &d, &b, set_ids(&h, (const int64_t[]){8}, 1), NEXT_WAIT,
                     what);
        /* Wanting all 6, the server must find B finished before it answers. */
        answer_t a = request_count(&d, ENVD_DOORBELL_RECV, 6, NEXT_WAIT);
        CHECK(a.status == ENVD_EENV && a.index == bad && a.result == 0,
              "%s: recv over a failed env: status %d index %lld result %lld", what, a.status,
              (long long)a.index, (long long)a.result);
        envd_doorbell_lock(f);
        CHECK(envd_doorbell_pending(f) == 6, "%s: pending %lld after the failure", what,
              (long long)envd_doorbell_pending(f));
        envd_doorbell_unlock(f);
        atomic_store(&g_fail_obs, 0);
        /* The next RECVs return the failed batch's envs with the others. */
        bool had_bad = false;
        for (int64_t count = 3; b.out > 0; count = b.out) {
            const int64_t got = recv_checked(&h, &twin, &d, &b, count, NEXT_WAIT, exact, bad,
                                             what);
            for (int64_t j = 0; j < got; j++)
                had_bad |= h.ids[j] == bad;
        }
        CHECK(had_bad, "%s: the recvs after the failure did not return env %lld", what,
              (long long)bad);
        /* A SENDRECV whose batch fails: sent, answered ENVD_EENV naming the
         * env; the next RECV returns the batch. */
        atomic_store(&g_fail_obs, (uintptr_t)(h.obs + (size_t)bad * h.obs_bytes));
        fill_rows(&h, (const int64_t[]){bad, 3}, 2, &s);
        set_ids(&h, (const int64_t[]){3, bad}, 2);
        twin_batch(&twin, tb, &h, h.ids, 2, what);
        books_send(&b, h.ids, 2);
        a = request_count(&d, ENVD_DOORBELL_SENDRECV, 2, NEXT_WAIT);
        CHECK(a.status == ENVD_EENV && a.index == bad && atomic_load(&d.h->sent) == 1,
              "%s: sendrecv over a failed env: status %d index %lld sent %u", what, a.status,
              (long long)a.index, atomic_load(&d.h->sent));
        atomic_store(&g_fail_obs, 0);
        recv_checked(&h, &twin, &d, &b, 2, NEXT_WAIT, exact, bad, what);
        /* The failed env is idle: it can be sent again.  (Its state is the
         * wrapper's now: the twin catches up by a masked reset of both.) */
        fill_rows(&h, (const int64_t[]){bad}, 1, &s);
        answer_t sa = request_count(&d, ENVD_DOORBELL_SEND, set_ids(&h, (const int64_t[]){bad}, 1),
                                    NEXT_WAIT);
        CHECK(sa.status == ENVD_OK, "%s: send of the failed env: %d", what, sa.status);
        answer_t ra = request_count(&d, ENVD_DOORBELL_RECV, 1, NEXT_WAIT);
        CHECK(ra.status == ENVD_OK && ra.result == 1 && h.ids[0] == bad,
              "%s: recv of the failed env: status %d result %lld", what, ra.status,
              (long long)ra.result);
        for (int64_t i = 0; i < n; i++)
            h.mask[i] = twin.mask[i] = i == bad;
        envd_doorbell_lock(f);
        harness_reset(&h, 500 + (uint64_t)round, h.mask);
        envd_doorbell_unlock(f);
        harness_reset(&twin, 500 + (uint64_t)round, twin.mask);
        /* With nothing in flight, STEP works again. */
        fill_actions(&h, &s);
        step_checked(&h, &twin, f, &d, NEXT_WAIT, &steps, what);
    }
    CHECK(envd_doorbell_batch_envs(f) == b.received + 3, "batch_envs %lld, want %lld",
          (long long)envd_doorbell_batch_envs(f), (long long)b.received + 3);
    int64_t batch_envs = -1;
    check_no_missed_rings(&d);
    CHECK(envd_doorbell_stop(f, &batch_envs) == steps && batch_envs == b.received + 3,
          "stop: batch_envs %lld", (long long)batch_envs);
    doorbell_unmap(&d);

    /* DISABLED mode: a SEND of a done env is ESTATE naming it, until the
     * daemon resets it under the lock. */
    harness_t hd, td;
    twins_init(&hd, &td, &envd_builtin_cartpole, 4, ENVD_AUTORESET_DISABLED, pool, chunk,
               41);
    books_t bd;
    books_init(&bd, 4);
    doorbell_map(&d);
    f = bell_start(&hd, &d, 20000);
    int refusals = 0;
    for (int r = 0; r < 300 && refusals < 2; r++) {
        const int64_t k = 1 + r % 2;
        set_ids(&hd, (const int64_t[]){k}, 1);
        fill_rows(&hd, hd.ids, 1, &s);
        send_checked(&hd, &td, tb, &d, &bd, 1, NEXT_WAIT, "disabled mode");
        recv_checked(&hd, &td, &d, &bd, 1, NEXT_WAIT, true, -1, "disabled mode");
        if (!(td.terms[k] || td.truncs[k]))
            continue;
        set_ids(&hd, (const int64_t[]){0, k}, 2);
        async_refused(&hd, &td, f, &d, &bd, ENVD_DOORBELL_SEND, 2, NEXT_WAIT, ENVD_ESTATE, k,
                      "send of a done env in DISABLED mode");
        for (int64_t i = 0; i < 4; i++)
            hd.mask[i] = td.mask[i] = i == k;
        envd_doorbell_lock(f);
        harness_reset(&hd, 900 + (uint64_t)r, hd.mask);
        envd_doorbell_unlock(f);
        harness_reset(&td, 900 + (uint64_t)r, td.mask);
        refusals++;
    }
    CHECK(refusals == 2, "only %d episodes ended in DISABLED mode", refusals);
    check_no_missed_rings(&d);
    CHECK(envd_doorbell_stop(f, NULL) == 0, "stop");
#undef NEXT_WAIT
    doorbell_unmap(&d);
    books_free(&bd);
    harness_free(&hd);
    harness_free(&td);
    books_free(&b);
    envd_vec_batch_destroy(tb);
    harness_free(&h);
    harness_free(&twin);
}

typedef struct releaser {
    const envd_doorbell_header_t *h;
    int64_t delay_us;
    _Atomic int closed_early;
} releaser_t;

/* Releases the gate after a delay, noting whether the doorbell was already
 * closed (stop must wait for the batch that the gate holds). */
static void *releaser_main(void *arg)
{
    releaser_t *rl = arg;
    sleep_us(rl->delay_us);
    atomic_store(&rl->closed_early, (int)atomic_load(&rl->h->closed));
    atomic_store(&g_gate_release, 1);
    return NULL;
}

/* 7c. Stop with batches in flight, with ready ids not received, and with a
 * batch still running (held by the gate); drain. */
static void async_stop(envd_pool_t *const *pools, int num_pools)
{
    uint64_t s = 0x5705ull;
    g_failing = envd_builtin_cartpole;
    g_failing.step = failing_step;
    g_gated = envd_builtin_cartpole;
    g_gated.step = gated_step;
    for (int p = 0; p < num_pools; p++) {
        const int threads = envd_pool_num_threads(pools[p]);
        for (int variant = 0; variant < 3; variant++) {
            /* 0: batches in flight; 1: and ready ids after an env failed;
             * 2: a batch held running by the gate (the server thread, which
             *    helps it, or a pool thread runs it). */
            if (variant == 2 && threads == 0)
                continue;
            const envd_env_def_t *def = variant == 2 ? (const envd_env_def_t *)&g_gated
                                                     : &g_failing;
            harness_t h;
            harness_init(&h, def, 12, ENVD_AUTORESET_SAME_STEP, pools[p], variant == 2 ? 1 : 0);
            harness_reset(&h, 60 + (uint64_t)p, NULL);
            doorbell_t d;
            doorbell_map(&d);
            envd_doorbell_t *f = bell_start(&h, &d, 20000);
            int64_t found = 0; /* envs RECV found finished (a lower bound with threads) */
            for (int r = 0; r < 2; r++) {
                fill_actions(&h, &s);
                answer_t a = request_count(&d, ENVD_DOORBELL_SEND,
                                           set_ids(&h, (const int64_t[]){r, 4 + r}, 2), r % 3);
                CHECK(a.status == ENVD_OK, "send: %d", a.status);
                a = request_count(&d, ENVD_DOORBELL_RECV, 2, (r + 1) % 3);
                CHECK(a.status == ENVD_OK && a.result == 2, "recv: %d", a.status);
                found += 2;
            }
            fill_actions(&h, &s);
            answer_t a = request_count(&d, ENVD_DOORBELL_SEND,
                                       set_ids(&h, (const int64_t[]){3, 2, 9}, 3), WAIT_MIXED);
            CHECK(a.status == ENVD_OK, "send: %d", a.status);
            if (variant == 1) {
                atomic_store(&g_fail_obs, (uintptr_t)(h.obs + 7 * h.obs_bytes));
                a = request_count(&d, ENVD_DOORBELL_SEND,
                                  set_ids(&h, (const int64_t[]){7, 8}, 2), WAIT_SPIN);
                CHECK(a.status == ENVD_OK, "send: %d", a.status);
                a = request_count(&d, ENVD_DOORBELL_RECV, 5, WAIT_SLEEP);
                CHECK(a.status == ENVD_EENV && a.index == 7, "recv: status %d index %lld",
                      a.status, (long long)a.index);
                atomic_store(&g_fail_obs, 0);
                found += threads == 0 ? 5 : 2; /* inline: both batches found at once */
            }
            releaser_t rl = {.h = d.h, .delay_us = 30000};
            pthread_t releaser;
            if (variant == 2) {
                /* The server thread helps the batch just sent (doorbell.c, serve)
                 * and answers the next request only after its chunk: let that
                 * batch end before the gate holds any step, so the gated send
                 * is answered while a thread holds its batch. */
                const double deadline = now_s() + 30.0;
                for (int64_t in_flight = 1; in_flight > 0;) {
                    envd_doorbell_lock(f);
                    envd_session_counts(h.session, &in_flight, NULL);
                    envd_doorbell_unlock(f);
                    CHECK(now_s() < deadline, "the batch sent never ended");
                    sched_yield();
                }
                gate_reset();
                atomic_store(&g_gate_armed, 1);
                a = request_count(&d, ENVD_DOORBELL_SEND,
                                  set_ids(&h, (const int64_t[]){10, 11, 6}, 3), WAIT_MIXED);
                CHECK(a.status == ENVD_OK, "send: %d", a.status);
                gate_wait_started();
                CHECK(pthread_create(&releaser, NULL, releaser_main, &rl) == 0, "pthread_create");
            }
            envd_doorbell_lock(f);
            const int64_t pending = envd_doorbell_pending(f);
            envd_doorbell_unlock(f);
            const int64_t want_pending[] = {3, 5, 6};
            CHECK(pending == want_pending[variant], "pending %lld before stop, want %lld",
                  (long long)pending, (long long)want_pending[variant]);
            /* With no pool thread every batch runs inline at SEND, where the
             * session finds it finished: all 7 (9) envs sent count. */
            const int64_t sent_inline = variant == 1 ? 9 : 7;
            const int64_t before = envd_doorbell_batch_envs(f);
            CHECK(threads == 0 ? before == sent_inline : before >= found,
                  "batch_envs %lld, want %s%lld", (long long)before, threads ? ">= " : "",
                  (long long)(threads ? found : sent_inline));
            const double t0 = now_s();
            int64_t batch_envs = -1;
            check_no_missed_rings(&d);
            const int64_t served = envd_doorbell_stop(f, &batch_envs);
            const double took = now_s() - t0;
            if (variant == 2) {
                pthread_join(releaser, NULL);
                gate_reset();
                CHECK(!atomic_load(&rl.closed_early),
                      "stop closed the doorbell before the batch in flight ended (%.1f ms)",
                      took * 1e3);
            }
            CHECK(served == 0 && batch_envs == before, "stop: served %lld, batch_envs %lld "
                  "(want %lld)", (long long)served, (long long)batch_envs, (long long)before);
            CHECK(atomic_load(&d.h->closed) == 1, "not closed after stop");
            CHECK(took < 5.0 + (variant == 2) * rl.delay_us * 1e-6, "stop took %.1f ms",
                  took * 1e3);
            /* The batches were ended: the vec steps whole again, and a new
             * session sends the envs that were in flight. */
            fill_actions(&h, &s);
            CHECK(envd_vec_step(h.vec) >= 0, "the vec is busy after stop");
            f = bell_start(&h, &d, 0);
            a = request_count(&d, ENVD_DOORBELL_SEND,
                              set_ids(&h, (const int64_t[]){3, 2, 9, 7, 8, 10, 11, 6}, 8),
                              WAIT_MIXED);
            CHECK(a.status == ENVD_OK, "send after restart: %d index %lld", a.status,
                  (long long)a.index);
            a = request_count(&d, ENVD_DOORBELL_RECV, 8, WAIT_MIXED);
            CHECK(a.status == ENVD_OK && a.result == 8, "recv after restart: %d", a.status);

            /* Drain with a batch in flight: SEND, RECV and STEP answer
             * SHUTTING_DOWN; nothing starts, nothing is taken. */
            a = request_count(&d, ENVD_DOORBELL_SEND, set_ids(&h, (const int64_t[]){5, 1}, 2),
                              WAIT_SPIN);
            CHECK(a.status == ENVD_OK, "send: %d", a.status);
            envd_doorbell_drain(f);
            const uint32_t kinds[] = {ENVD_DOORBELL_SEND, ENVD_DOORBELL_RECV,
                                      ENVD_DOORBELL_STEP, ENVD_DOORBELL_RECV,
                                      ENVD_DOORBELL_SEND, ENVD_DOORBELL_SENDRECV};
            for (size_t k = 0; k < COUNT(kinds); k++) {
                set_ids(&h, (const int64_t[]){0, 4}, 2);
                a = request_count(&d, kinds[k], k % 2 ? 1 : 2, (int)k % 3);
                CHECK(a.status == ENVD_DOORBELL_SHUTTING_DOWN && a.result == 0 && a.index == -1 &&
                          atomic_load(&d.h->sent) == 0,
                      "drained request %u: status %d", kinds[k], a.status);
            }
            envd_doorbell_lock(f);
            CHECK(envd_doorbell_pending(f) == 2, "drained: pending %lld",
                  (long long)envd_doorbell_pending(f));
            envd_doorbell_unlock(f);
            /* (the drained batch counts once the session found it finished:
             * at its SEND when inline, else maybe at envd_doorbell_pending) */
            check_no_missed_rings(&d);
            CHECK(envd_doorbell_stop(f, &batch_envs) == 0 &&
                  (batch_envs == 10 || (threads > 0 && batch_envs == 8)),
                  "stop after drain: batch_envs %lld", (long long)batch_envs);
            doorbell_unmap(&d);
            harness_free(&h);
        }
    }
}

/* 7d. A SENDRECV out, its batch held running by the gate (on the server
 * thread, which helps it, or a pool thread), then one of:
 *   stop: stop waits for the batch, then closes the doorbell; the request
 *     is answered in full (the server took the lock again before it saw
 *     stop) or not at all;
 *   drain: its batch started, so its RECV half is answered in full;
 *   scribble: the client rewrites req_kind and req_count meanwhile: the
 *     server read them once, and answers the RECV of the count it sent. */
static void sendrecv_held(envd_pool_t *pool)
{
    enum { STOP, DRAIN, SCRIBBLE, MODES };
    static const char *const names[] = {"stop", "drain", "scribble"};
    uint64_t s = 0x5e4d5ull;
    g_gated = envd_builtin_cartpole;
    g_gated.step = gated_step;
    for (int round = 0; round < 2 * MODES; round++) {
        const int mode = round % MODES;
        harness_t h;
        harness_init(&h, &g_gated, 12, ENVD_AUTORESET_SAME_STEP, pool, 1);
        harness_reset(&h, 70 + (uint64_t)round, NULL);
        doorbell_t d;
        doorbell_map(&d);
        envd_doorbell_t *f = bell_start(&h, &d, round % 2 ? 20000 : 0);
        fill_actions(&h, &s);
        gate_reset();
        atomic_store(&g_gate_armed, 1);
        ring_count(&d, ENVD_DOORBELL_SENDRECV,
                   (uint32_t)set_ids(&h, (const int64_t[]){4, 0, 9}, 3));
        gate_wait_started(); /* (the SEND half has run: its batch steps) */
        releaser_t rl = {.h = d.h, .delay_us = 20000};
        pthread_t releaser;
        if (mode == DRAIN)
            envd_doorbell_drain(f);
        if (mode == SCRIBBLE) {
            atomic_store(&d.h->req_kind, ENVD_DOORBELL_STEP);
            atomic_store(&d.h->req_count, UINT32_MAX);
        }
        CHECK(pthread_create(&releaser, NULL, releaser_main, &rl) == 0, "pthread_create");
        if (mode != STOP) {
            const answer_t a = wait_answer(&d, mode == DRAIN ? WAIT_SLEEP : WAIT_MIXED,
                                           SLICE_NS);
            CHECK(a.answered && a.status == ENVD_OK && a.result == 3 &&
                      atomic_load(&d.h->sent) == 1,
                  "sendrecv %s: answered %d status %d result %lld sent %u", names[mode],
                  a.answered, a.status, (long long)a.result, atomic_load(&d.h->sent));
            static const int64_t sent_ids[] = {4, 0, 9};
            for (int64_t j = 0; j < 3; j++)
                CHECK(h.ids[j] == sent_ids[j],
                      "sendrecv %s: #%lld is env %lld", names[mode], (long long)j,
                      (long long)h.ids[j]);
        }
        const double t0 = now_s();
        check_no_missed_rings(&d);
        CHECK(envd_doorbell_stop(f, NULL) == 0, "sendrecv %s: served", names[mode]);
        const double took = now_s() - t0;
        pthread_join(releaser, NULL);
        gate_reset();
        CHECK(!atomic_load(&rl.closed_early), "stop closed the doorbell before the batch ended");
        CHECK(atomic_load(&d.h->closed) == 1, "sendrecv %s: not closed", names[mode]);
        CHECK(took < 5.0 + rl.delay_us * 1e-6, "sendrecv stop took %.1f ms", took * 1e3);
        if (mode == STOP && is_answered(&d))
            CHECK(atomic_load(&d.h->status) == ENVD_OK && atomic_load(&d.h->result) == 3 &&
                      atomic_load(&d.h->sent) == 1,
                  "sendrecv answered around stop: status %d result %lld sent %u",
                  atomic_load(&d.h->status), (long long)atomic_load(&d.h->result),
                  atomic_load(&d.h->sent));
        /* (a stop while the RECV half waited for its batch, its lock let go:
         * the request it claimed in the engine's book is released) */
        envd_session_lock(h.session);
        CHECK(envd_session_claimed(h.session) == 0,
              "sendrecv %s: the session's request still claimed after stop", names[mode]);
        envd_session_unlock(h.session);
        fill_actions(&h, &s);
        CHECK(envd_vec_step(h.vec) >= 0, "the vec is busy after a sendrecv's stop");
        doorbell_unmap(&d);
        harness_free(&h);
    }
}

/* The env whose state gated_step recorded at g_order[k], by the states of
 * envs 0..n-1 (states). */
static int64_t order_env(int k, void *const *states, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (atomic_load(&g_order[k]) == states[i])
            return i;
    return -1;
}

static void wait_order_len(int want, double deadline, const char *what)
{
    while (atomic_load(&g_order_written) < want) {
        CHECK(now_s() < deadline, "help_oldest_first %s: %d of the %d env steps wanted ran "
              "(a batch left to a worker that has no CPU)", what,
              atomic_load(&g_order_written), want);
        sleep_us(100);
    }
}

/* 7e. After answering a send or a recv, the serving thread steps the
 * session's batches in flight, the oldest first -- not only the batch a send
 * started: the client's next recv wants the oldest, and the pool's workers
 * may have no CPU (here: the pool's one worker is held elsewhere).  Batch
 * A's first chunk holds the serving thread (the gate) until the client has
 * rung again: the thread leaves A after that chunk and answers, then must
 * step A's rest, in order --
 *   send: the request is a send of batch B; A's rest comes before B;
 *   recv: the request is a recv of an earlier batch C's ready envs. */
static void help_oldest_first(envd_pool_t *pool)
{
    CHECK(envd_pool_num_threads(pool) == 1, "help_oldest_first: a pool of one worker");
    static const int64_t a_ids[] = {0, 1, 2, 3}, other_ids[] = {4, 5, 6, 7};
    uint64_t s = 0x01d5ull;
    g_gated = envd_builtin_cartpole;
    g_gated.step = gated_step;
    for (int recv_case = 0; recv_case < 2; recv_case++) {
        const char *what = recv_case ? "recv" : "send";
        harness_t h;
        harness_init(&h, &g_gated, 8, ENVD_AUTORESET_SAME_STEP, pool, 1);
        harness_reset(&h, 80 + (uint64_t)recv_case, NULL);
        worker_hold_t hold;
        hold_worker(pool, &hold); /* only this thread and the server step now */
        const double deadline = now_s() + 30.0;
        /* Steps until the vec's cost estimate (what a batch is helped by,
         * vec.h) is short: one preempted chunk can make it look long.  The
         * last one, run by this thread alone chunk by chunk, maps each env's
         * state (gated_step's record) to its index. */
        void *states[8];
        envd_vec_stats_t stats;
        do {
            CHECK(now_s() < deadline, "help_oldest_first: cost estimate never short");
            fill_actions(&h, &s);
            atomic_store(&g_order_len, 0);
            atomic_store(&g_order_written, 0);
            atomic_store(&g_order_on, 1);
            CHECK(envd_vec_step(h.vec) >= 0, "help_oldest_first: step");
            atomic_store(&g_order_on, 0);
            envd_vec_get_stats(h.vec, &stats);
        } while (!(stats.cost_ns_per_env > 0.0 && stats.cost_ns_per_env < 20000.0));
        CHECK(atomic_load(&g_order_len) == 8, "help_oldest_first: the step ran %d envs",
              atomic_load(&g_order_len));
        for (int k = 0; k < 8; k++)
            states[k] = atomic_load(&g_order[k]);
        doorbell_t d;
        doorbell_map(&d);
        envd_doorbell_t *f = bell_start(&h, &d, 0);
        gate_reset();
        atomic_store(&g_order_len, 0);
        atomic_store(&g_order_written, 0);
        atomic_store(&g_order_on, 1);
        answer_t a;
        if (recv_case) {  /* batch C, stepped by the serving thread alone */
            a = request_count(&d, ENVD_DOORBELL_SEND, set_ids(&h, other_ids, 4), WAIT_SPIN);
            CHECK(a.answered && a.status == ENVD_OK, "send C: status %d", a.status);
            wait_order_len(4, deadline, what);
        }
        atomic_store(&g_gate_armed, 1);
        a = request_count(&d, ENVD_DOORBELL_SEND, set_ids(&h, a_ids, 4), WAIT_SPIN);
        CHECK(a.answered && a.status == ENVD_OK, "send A: status %d", a.status);
        gate_wait_started(); /* the serving thread is in A's first chunk */
        if (recv_case)
            ring_count(&d, ENVD_DOORBELL_RECV, 4);
        else
            ring_count(&d, ENVD_DOORBELL_SEND, (uint32_t)set_ids(&h, other_ids, 4));
        atomic_store(&g_gate_release, 1);
        a = wait_answer(&d, WAIT_MIXED, SLICE_NS);
        CHECK(a.answered && a.status == ENVD_OK && a.result == (recv_case ? 4 : 0),
              "%s: status %d result %lld", what, a.status, (long long)a.result);
        for (int64_t j = 0; recv_case && j < 4; j++)
            CHECK(h.ids[j] == other_ids[j], "recv: #%lld is env %lld", (long long)j,
                  (long long)h.ids[j]);
        wait_order_len(8, deadline, what);
        atomic_store(&g_order_on, 0);
        for (int k = 0; k < 8; k++) {
            const int64_t want = recv_case ? (k + 4) % 8 : k;
            CHECK(order_env(k, states, 8) == want, "help_oldest_first %s: step #%d was env "
                  "%lld, not env %lld", what, k, (long long)order_env(k, states, 8),
                  (long long)want);
        }
        release_worker(pool, &hold);
        a = request_count(&d, ENVD_DOORBELL_RECV, recv_case ? 4 : 8, WAIT_MIXED);
        CHECK(a.answered && a.status == ENVD_OK && a.result == (recv_case ? 4 : 8),
              "last recv: status %d result %lld", a.status, (long long)a.result);
        bell_stop(f, &d, 0); /* (it counts steps) */
        gate_reset();
        doorbell_unmap(&d);
        harness_free(&h);
    }
}

static void test_async(envd_pool_t *const *pools, int num_pools, int requests)
{
    help_oldest_first(pools[1]);
    sendrecv_held(pools[num_pools - 1]);
    for (int p = 0; p < num_pools; p++)
        async_errors(pools[p], p == 2 ? 2 : 0);
    async_stop(pools, num_pools);
    async_results(pools, num_pools, requests);
}

static void test_bad_arguments(void)
{
    harness_t h;
    harness_init(&h, &envd_builtin_cartpole, 1, ENVD_AUTORESET_NEXT_STEP, NULL, 0);
    doorbell_t d;
    doorbell_map(&d);
    envd_doorbell_t *f = NULL;
    CHECK(envd_doorbell_start(NULL, h.session, d.h, h.ids, 0) == ENVD_EINVAL, "out NULL");
    CHECK(envd_doorbell_start(&f, NULL, d.h, h.ids, 0) == ENVD_EINVAL && f == NULL,
          "session NULL");
    CHECK(envd_doorbell_start(&f, h.session, NULL, h.ids, 0) == ENVD_EINVAL && f == NULL,
          "header NULL");
    CHECK(envd_doorbell_start(&f, h.session, d.h, NULL, 0) == ENVD_EINVAL && f == NULL,
          "ids NULL");
    CHECK(envd_doorbell_start(&f, h.session, d.h, h.ids, -1) == ENVD_EINVAL && f == NULL,
          "spin_ns < 0");
    envd_backend_t *b = NULL;
    CHECK(envd_backend_pool_wrap(&b, h.vec, 0) == ENVD_EINVAL && b == NULL, "num_envs 0");
    doorbell_unmap(&d);
    harness_free(&h);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        g_div = atoi(argv[1]) > 0 ? atoi(argv[1]) : 1;
    static const int thread_counts[] = {0, 1, 2};
    envd_pool_t *pools[COUNT(thread_counts)];
    for (size_t i = 0; i < COUNT(thread_counts); i++)
        CHECK(envd_pool_create(&pools[i], thread_counts[i], NULL) == ENVD_OK, "pool create");
    const int num_pools = (int)COUNT(pools);
    setvbuf(stdout, NULL, _IOLBF, 0);

    double t = now_s();
    test_bad_arguments();
    test_spinners();
    test_spin_follows_gaps();
    test_no_spin_after_sendrecv();
    test_server_asleep();
    test_one_cpu(scaled(2000, 200));
    printf("doorbell_stress: spinners %.2f s\n", now_s() - t);
    t = now_s();
    for (int p = 0; p < num_pools; p++) {
        test_errors(pools[p], p);
        test_drain(pools[p]);
    }
    printf("doorbell_stress: errors, drain %.2f s\n", now_s() - t);
    t = now_s();
    test_stop(pools, num_pools);
    stop_after_answer(scaled(1500, 200));
    test_cycles(pools, num_pools, scaled(400, 60));
    printf("doorbell_stress: stop %.2f s\n", now_s() - t);
    t = now_s();
    for (int p = 0; p < num_pools; p++)
        test_lock(pools[p], scaled(400, 60));
    printf("doorbell_stress: lock %.2f s\n", now_s() - t);
    t = now_s();
    test_results(pools, num_pools, scaled(40, 8));
    printf("doorbell_stress: results %.2f s\n", now_s() - t);
    t = now_s();
    test_async(pools, num_pools, scaled(60, 16));
    printf("doorbell_stress: async %.2f s\n", now_s() - t);

    for (int p = 0; p < num_pools; p++)
        envd_pool_destroy(pools[p]);
    printf("doorbell_stress: ok\n");
    return 0;
}
