/*
 * doorbell.c -- the doorbell's server thread, the mechanism of the fast path
 * (see doorbell.h for the protocol).
 *
 * Thread ownership: the server thread reads the client's words and writes
 * the server's; it serves a request holding the session's mutex and calling
 * the session's functions, as every other caller of the session does.
 * bell->last (the request last answered) belongs to the server thread.  Once
 * stop is set the thread never takes the mutex again (it waits for it in
 * slices, checking stop), so a stopper may hold the session's lock.
 */
#define _GNU_SOURCE
#include "doorbell.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "envd.h"
#include "futex.h"
#include "pool.h"
#include "session.h"
#include "spin.h"

_Static_assert(offsetof(envd_doorbell_header_t, req_seq) == 0, "doorbell layout");
_Static_assert(offsetof(envd_doorbell_header_t, req_kind) == 4, "doorbell layout");
_Static_assert(offsetof(envd_doorbell_header_t, client_waiting) == 8, "doorbell layout");
_Static_assert(offsetof(envd_doorbell_header_t, req_count) == 12, "doorbell layout");
_Static_assert(offsetof(envd_doorbell_header_t, done_seq) == 64, "doorbell layout");
_Static_assert(offsetof(envd_doorbell_header_t, status) == 68, "doorbell layout");
_Static_assert(offsetof(envd_doorbell_header_t, result) == 72, "doorbell layout");
_Static_assert(offsetof(envd_doorbell_header_t, error_index) == 80, "doorbell layout");
_Static_assert(offsetof(envd_doorbell_header_t, closed) == 88, "doorbell layout");
_Static_assert(offsetof(envd_doorbell_header_t, contended) == 92, "doorbell layout");
_Static_assert(offsetof(envd_doorbell_header_t, sent) == 96, "doorbell layout");
_Static_assert(offsetof(envd_doorbell_header_t, server_asleep) == 100, "doorbell layout");
_Static_assert(offsetof(envd_doorbell_header_t, missed_rings) == 104, "doorbell layout");
_Static_assert(offsetof(envd_doorbell_header_t, message) == 108, "doorbell layout");
_Static_assert(ENVD_DOORBELL_OFFSET + sizeof(envd_doorbell_header_t) <= 4096,
               "the doorbell fits the header page (envd/shm.py HEADER_SIZE)");

/* A sleeping server wakes this often to notice envd_doorbell_stop even if no
 * client rings (stop also wakes it, repeatedly: a safety net only). */
#define SLEEP_SLICE_NS 200000000LL
#define SPIN_CHECK_EVERY 64
/* How often a server waiting for the session's mutex checks stop. */
#define LOCK_SLICE_NS 1000000LL
/* A spin lasts twice the expected gap and this much more (at most spin_ns). */
#define SPIN_MARGIN_NS 20000LL
/* A spin yields its CPU between checks once this long past the answer: a
 * thread runnable on this CPU runs at once instead of after the spin.  On a
 * busy host the trainer itself may be that thread (its CPU taken by other
 * work): it cannot ring until this thread lets it run, its gaps then grow to
 * the whole spin, which keeps the spin at spin_ns -- a 200 us stall per
 * step (docs/benchmarks.md, "The daemon like for like at N=64").  Before
 * this, the trainer of a cheap env on its own CPU rings again (1-3 us): no
 * system call on its way.  A request first seen right after a yield that
 * let another thread run here says its client likely shares this CPU: the
 * next spin yields from its start (client_alongside).  Any other request
 * clears it -- one seen before any yield, or right after a yield that gave
 * the CPU to nobody (its client rang from elsewhere; e.g. a spin that began
 * late, after helping a batch, yields at once, which must not keep it set). */
#define SPIN_ALONE_NS 4000LL
/* A yield that took this long let another thread run on this CPU: a bare
 * sched_yield is a system call (about 1.4 us on a VM), while a thread that
 * runs takes the CPU until it blocks or its slice ends (a trainer ringing
 * in between: its Python alone is several us). */
#define YIELD_RAN_OTHER_NS 5000LL
/* A gap sample counts at most this many spin_ns (a trainer that paused for
 * an evaluation must not keep its thread from spinning for long after). */
#define GAP_SAMPLE_CAP 8

struct envd_doorbell {
    envd_session_t *session;
    int64_t num_envs;
    envd_doorbell_header_t *header;
    int64_t *ids;                /* SEND's and RECV's env ids (in the segment) */
    int64_t spin_ns;
    int64_t async_base;          /* the session's async env steps at start */
    pthread_t thread;
    _Atomic int stop;
    _Atomic int exited;     /* set by the server thread as it leaves serve() */
    _Atomic int draining;
    _Atomic int64_t served;
    /* server thread only: */
    uint32_t last;          /* the request last answered */
    uint32_t last_kind;     /* its kind (req_kind 1..4; 0 for any other) */
    int64_t answered_ns;    /* when its answer was published */
    int64_t gap_ns[ENVD_DOORBELL_SENDRECV + 1]; /* per kind answered: a running mean of how long
                               the client took to ring again (0: not seen) */
    int policy_managed;     /* started under SCHED_OTHER: sleeps under SCHED_BATCH
                               after a SENDRECV (sleep_policy) */
    int batch_policy;       /* under SCHED_BATCH now */
    uint32_t missed_rings;  /* the header's count (never read back from it) */
    int claim_left;         /* stopped in a SENDRECV with its RECV claimed (the
                               stopper releases it, after the join) */
    int client_alongside;   /* the last request spun for was first seen right after
                               a yield that let another thread run here: its client
                               likely shares this CPU, so the next spin yields from
                               its start (SPIN_ALONE_NS) */
};

static _Atomic int g_spinners;        /* server threads spinning now */
static _Atomic int g_max_spinners = 1;
/* Server threads serving a request now, and how many of them leave no CPU
 * to spin on: each one's request runs on a CPU (or, pooled, on several), so
 * once they hold all CPUs but one -- at least one, on a machine of two --
 * a thread that spun would only slow them (four sessions of 1024 CartPoles
 * stepping at once on 2 CPUs: spinning took 12% of the machine in a
 * profile).  Spinning pays when one trainer steps back to back. */
static _Atomic int g_serving;
static _Atomic int g_busy_limit = 1;

void envd_doorbell_set_max_spinners(int max_spinners)
{
    atomic_store(&g_max_spinners, max_spinners < 0 ? 0 : max_spinners);
}

/* Others serve enough requests to need every CPU but this one. */
static int cpus_busy(void)
{
    return atomic_load_explicit(&g_serving, memory_order_relaxed) >=
           atomic_load_explicit(&g_busy_limit, memory_order_relaxed);
}

static int take_spin_slot(void)
{
    int s = atomic_load_explicit(&g_spinners, memory_order_relaxed);
    while (s < atomic_load_explicit(&g_max_spinners, memory_order_relaxed)) {
        if (atomic_compare_exchange_weak_explicit(&g_spinners, &s, s + 1,
                                                  memory_order_relaxed, memory_order_relaxed))
            return 1;
    }
    return 0;
}

/* Until when to spin for the next request: while its client, after this
 * kind of answer, has been ringing again within spin_ns (twice its mean gap
 * and a margin, at most spin_ns after the answer); 0 when it has not (after
 * a send, say, a trainer runs its learner: spinning through that would only
 * keep a CPU from the workers, or from another daemon's on the same host).
 * Never after a SENDRECV: its trainer serves other daemons before it rings
 * here again, and their batches need the CPU; ringing this thread asleep
 * costs that trainer little (sleep_policy).  Two daemons' CartPole loop on
 * 2 CPUs went from 0.74x to 0.92x of one daemon's (docs/benchmarks.md). */
static int64_t spin_deadline(const envd_doorbell_t *bell)
{
    const int64_t gap = bell->gap_ns[bell->last_kind];
    if (bell->answered_ns == 0 || gap >= bell->spin_ns || bell->last_kind == ENVD_DOORBELL_SENDRECV)
        return 0;
    const int64_t spin = gap == 0 || 2 * gap + SPIN_MARGIN_NS > bell->spin_ns
                             ? bell->spin_ns : 2 * gap + SPIN_MARGIN_NS;
    return bell->answered_ns + spin;
}

int64_t envd_doorbell_spin_ns(const envd_doorbell_t *bell)
{
    const int64_t deadline = spin_deadline(bell);
    return deadline == 0 ? 0 : deadline - bell->answered_ns;
}

/* Count the gap between the last answer and the request that followed it. */
static void note_gap(envd_doorbell_t *bell, int64_t now_ns)
{
    int64_t sample = now_ns - bell->answered_ns;
    const int64_t cap = GAP_SAMPLE_CAP * (bell->spin_ns > 0 ? bell->spin_ns : 1);
    sample = sample < 0 ? 0 : sample > cap ? cap : sample;
    int64_t *gap = &bell->gap_ns[bell->last_kind];
    *gap = *gap == 0 ? sample : *gap + (sample - *gap) / 4;
    if (*gap == 0)
        *gap = 1; /* (0 means "not seen") */
}

static int policy_is_other(void)
{
    int policy;
    struct sched_param param;
    return pthread_getschedparam(pthread_self(), &policy, &param) == 0 &&
           policy == SCHED_OTHER;
}

/* The policy to be woken under.  After a SENDRECV, whose trainer rings the
 * next one and goes on (it drives several daemons, client/multi_async.py),
 * SCHED_BATCH: woken, this thread does not preempt the trainer that rang (on
 * 2 CPUs it took the trainer's CPU for about 50 us per ring; the pool's
 * workers run under it for the same reason, pool.c), but takes an idle CPU
 * or waits until the trainer blocks.  After any other request, whose trainer
 * waits for the answer, SCHED_OTHER: a woken thread that waited for a busy
 * machine's next tick would delay every step it serves (a session capped at
 * max_threads=0 next to a CPU-heavy one lost 30% so).  The kind of the
 * request that wakes it is not known yet: the last one's stands for it (a
 * trainer keeps its pattern).  Only a thread that started under SCHED_OTHER
 * switches (the operator's chrt is kept); best effort, and a system call
 * only when the policy changes.  (Threads an env starts from this thread
 * inherit the policy it has then.) */
static void sleep_policy(envd_doorbell_t *bell)
{
    const int batch = bell->last_kind == ENVD_DOORBELL_SENDRECV;
    if (!bell->policy_managed || batch == bell->batch_policy)
        return;
    struct sched_param param = {0};
    if (pthread_setschedparam(pthread_self(), batch ? SCHED_BATCH : SCHED_OTHER, &param) == 0)
        bell->batch_policy = batch;
    else
        bell->policy_managed = 0;  /* refused (a sandbox): stay as we are */
}

/* The next request's seq (!= bell->last), or bell->last when stopping;
 * spinning first if may_spin, the client's gaps say a request is due soon
 * (spin_deadline) and a spin slot is free. */
static uint32_t next_request(envd_doorbell_t *bell, int may_spin)
{
    _Atomic uint32_t *req = &bell->header->req_seq;
    uint32_t seq = atomic_load_explicit(req, memory_order_acquire);
    if (seq != bell->last)
        return seq;
    const int64_t deadline = may_spin ? spin_deadline(bell) : 0;
    if (deadline > envd_now_ns() && take_spin_slot()) {
        const int64_t alone_until =
            bell->answered_ns + (bell->client_alongside ? 0 : SPIN_ALONE_NS);
        int yielded = 0;  /* the checks now running follow a yield that let another run */
        for (;;) {
            for (int i = 0; i < SPIN_CHECK_EVERY; i++) {
                seq = atomic_load_explicit(req, memory_order_acquire);
                if (seq != bell->last || atomic_load_explicit(&bell->stop, memory_order_relaxed))
                    break;
                envd_cpu_relax();
            }
            if (seq != bell->last) {
                bell->client_alongside = yielded;
                break;
            }
            if (atomic_load_explicit(&bell->stop, memory_order_relaxed)
                || cpus_busy() /* others' requests started: they need the CPUs */)
                break;
            const int64_t now = envd_now_ns();
            if (now >= deadline)
                break;
            yielded = 0;
            if (now >= alone_until) {
                sched_yield();
                yielded = envd_now_ns() - now >= YIELD_RAN_OTHER_NS;
            }
        }
        atomic_fetch_sub_explicit(&g_spinners, 1, memory_order_relaxed);
        if (seq != bell->last)
            return seq;
    }
    /* Asleep, this thread leaves its CPU to the pool's spinning workers. */
    envd_pool_reserve_cpus(-1);
    sleep_policy(bell);
    /* seq_cst (a locked exchange): the flag is visible before the kernel
     * reads req_seq, so a client that read it as 0 had stored its req_seq
     * before -- the wait below then returns at once (doorbell.h, Ordering). */
    atomic_store(&bell->header->server_asleep, 1);
    while (!atomic_load(&bell->stop)) {
        /* The kernel compares req_seq with last atomically: a request rung
         * before this call returns at once, one rung after wakes it. */
        const int ran_out = envd_futex_wait(req, bell->last, SLEEP_SLICE_NS, ENVD_FUTEX_SHARED);
        seq = atomic_load_explicit(req, memory_order_acquire);
        if (seq != bell->last) {
            if (ran_out)  /* rung, yet nobody woke this thread */
                atomic_store_explicit(&bell->header->missed_rings,
                                      ++bell->missed_rings, memory_order_relaxed);
            break;
        }
    }
    atomic_store_explicit(&bell->header->server_asleep, 0, memory_order_relaxed);
    envd_pool_reserve_cpus(1);
    return seq; /* (bell->last when stopping) */
}

/* Run a request of kind (STEP, SEND or RECV) for count envs through the
 * request engine (envd_engine_call: the same rules as the daemon's loop):
 * its status; its result and error index through the pointers, worded from
 * the completion for the client. */
static int32_t run(envd_doorbell_t *bell, uint32_t kind, int64_t count, int64_t *result,
                   int64_t *index)
{
    envd_request_t req;
    switch (kind) {
    case ENVD_DOORBELL_STEP:
        req.kind = ENVD_REQ_STEP;
        break;
    case ENVD_DOORBELL_SEND:
        if (count < 1 || count > bell->num_envs)
            return ENVD_EINVAL;  /* (the session's check, without an env to name) */
        /* HELPED: this thread runs the batch too once it has answered (serve;
         * a short one it runs alone: vec.h) */
        req = (envd_request_t){.kind = ENVD_REQ_SEND, .max_count = count, .ids = bell->ids,
                               .flags = ENVD_JOB_HELPED};
        break;
    case ENVD_DOORBELL_RECV:
        if (count < 1 || count > bell->num_envs)
            return ENVD_EINVAL;
        /* exactly count ids, as every path: the rest stay ready in the session */
        req = (envd_request_t){.kind = ENVD_REQ_RECV, .min_count = count, .max_count = count,
                               .out = bell->ids};
        break;
    default:
        return ENVD_EINVAL;
    }
    envd_completion_t done;
    envd_engine_call(bell->session, &req, &done);
    const int64_t rc = done.result;
    if (rc >= 0) {
        if (kind == ENVD_DOORBELL_STEP)
            atomic_fetch_add_explicit(&bell->served, 1, memory_order_relaxed);
        *result = rc;
        return ENVD_OK;
    }
    *index = done.error_index;
    if (kind == ENVD_DOORBELL_STEP && rc == ENVD_EBUSY) {
        /* envs out (no env named): say which, as the other paths do */
        int64_t in_flight = 0, ready = 0;
        envd_session_counts(bell->session, &in_flight, &ready);
        *result = in_flight > 0 ? in_flight : -ready;
    } else if (kind == ENVD_DOORBELL_SEND && rc == ENVD_EBUSY && *index >= 0) {
        *result = envd_session_env_state(bell->session, *index);  /* the client names it */
    } else if (kind == ENVD_DOORBELL_RECV && rc == ENVD_ESTATE && *index < 0) {
        /* too few sent: say how many are */
        int64_t in_flight = 0, ready = 0;
        envd_session_counts(bell->session, &in_flight, &ready);
        *result = in_flight + ready;
    }
    return (int32_t)rc;
}

/* Run a request of kind for count envs, counted in g_serving, and write its
 * answer's fields (not done_seq: publish() does that, after the session's
 * lock is released); whether to spin for the next one, decided before the
 * answer is published (once the client sees it, it may ring another
 * session's doorbell at once: that one's request must not count against
 * this decision, whose point is requests that run meanwhile).  After a
 * send or a recv, the session's batches in flight (the oldest few and the
 * newest, session.h) are taken into help, for serve() to run.  A draining daemon refuses
 * the request, unless started (the RECV half of a SENDRECV whose batch it
 * started).  The status also goes to *status_out (never read back from the
 * header, which the client can write).  Called with the session's lock held. */
static int answer(envd_doorbell_t *bell, uint32_t kind, int64_t count, int started,
                  envd_session_help_t *help, int32_t *status_out)
{
    envd_doorbell_header_t *h = bell->header;
    int32_t status = ENVD_DOORBELL_SHUTTING_DOWN;
    int64_t result = 0, index = -1;
    atomic_fetch_add_explicit(&g_serving, 1, memory_order_relaxed);
    if (started || !atomic_load(&bell->draining))
        status = run(bell, kind, count, &result, &index);
    const int others = atomic_fetch_sub_explicit(&g_serving, 1, memory_order_relaxed) - 1;
    atomic_store_explicit(&h->contended, others > 0, memory_order_relaxed);
    if ((kind == ENVD_DOORBELL_SEND || kind == ENVD_DOORBELL_RECV) && status == ENVD_OK)
        envd_session_take_help(bell->session, help);
    const int may_spin = !cpus_busy();
    atomic_store_explicit(&h->status, status, memory_order_relaxed);
    atomic_store_explicit(&h->result, result, memory_order_relaxed);
    atomic_store_explicit(&h->error_index, index, memory_order_relaxed);
    if (status == ENVD_EENV)  /* (published with done_seq by publish()) */
        envd_session_error_message(bell->session, index, h->message, sizeof h->message);
    *status_out = status;
    return may_spin;
}

/* Publish the answer to request seq (its fields written by answer()).
 * Called after the session's lock is released, so that a client that sees
 * its answer finds the session free: its next call over the socket (a
 * reset, "fast off") is never refused as busy because of a request that
 * has returned.  Nobody else writes the outputs meanwhile: the client, the
 * only one that acts on this session, is waiting for this answer. */
static void publish(envd_doorbell_header_t *h, uint32_t seq)
{
    /* seq_cst: the store of done_seq is ordered before the load of
     * client_waiting (the client sets that flag, then sleeps only while
     * done_seq is still the old value). */
    atomic_store(&h->done_seq, seq);
    if (atomic_load(&h->client_waiting))
        envd_futex_wake(&h->done_seq, INT_MAX, ENVD_FUTEX_SHARED);
}

/* Take the session's lock, or give up once stop is set (0). */
static int lock_unless_stopped(envd_doorbell_t *bell)
{
    if (envd_session_trylock(bell->session))
        return 1;
    for (long pause_ns = 1000; !atomic_load(&bell->stop);) {
        if (envd_session_trylock(bell->session))
            return 1;
        nanosleep(&(struct timespec){0, pause_ns}, NULL);
        pause_ns = pause_ns < LOCK_SLICE_NS ? 2 * pause_ns : LOCK_SLICE_NS;
    }
    return 0;
}

/* Stop helping: the client rang again (its request comes first; the rest
 * of the batches is helped after its answer, or run by a recv that waits
 * for them), or stop was set. */
static int request_waiting(void *arg)
{
    envd_doorbell_t *bell = arg;
    return atomic_load_explicit(&bell->header->req_seq, memory_order_relaxed) != bell->last ||
           atomic_load_explicit(&bell->stop, memory_order_relaxed);
}

/* Stop helping a SENDRECV's batch: only stop can (its client rings nothing
 * before the answer). */
static int stopping(void *arg)
{
    return atomic_load_explicit(&((envd_doorbell_t *)arg)->stop, memory_order_relaxed);
}

/* The RECV half of a SENDRECV whose SEND (answered into the header, not
 * published) started its batch: step the batches in flight here too (help,
 * taken by the SEND), then take the session's lock again and answer the
 * RECV, taking help again for serve() to run; 0 when stop came first (the
 * request is then never answered here: envd_doorbell_stop closes the doorbell). */
static int sendrecv_recv(envd_doorbell_t *bell, int64_t count, envd_session_help_t *help,
                         int *may_spin)
{
    /* The RECV half is this front door's request while the lock is let go:
     * claimed in the engine's book (the session), so that another front door
     * finds the session busy meanwhile, as while the lock is held. */
    const int claimed = envd_session_claim(bell->session, ENVD_REQ_RECV) == ENVD_OK;
    envd_session_unlock(bell->session);
    envd_session_help(help, stopping, bell);
    if (!lock_unless_stopped(bell)) {
        /* (not released here: the stopper may hold the lock; it releases
         * the claim once this thread has left, envd_doorbell_stop) */
        bell->claim_left = claimed;
        return 0;
    }
    if (claimed)
        envd_session_release(bell->session);
    int32_t status; /* (help is empty again: the RECV takes what is still in flight) */
    *may_spin = answer(bell, ENVD_DOORBELL_RECV, count, 1, help, &status);
    return 1;
}

static void *serve(void *arg)
{
    envd_doorbell_t *bell = arg;
    /* Awake (serving, or spinning for the next request), this thread keeps
     * a CPU busy: the pool's idle workers leave it to the client instead of
     * spinning on it too (pool.h). */
    envd_pool_reserve_cpus(1);
    bell->policy_managed = policy_is_other();
    for (int may_spin = 1;;) {
        uint32_t seq = next_request(bell, may_spin);
        if (atomic_load(&bell->stop))
            break;
        if (bell->answered_ns != 0)
            note_gap(bell, envd_now_ns());
        if (!lock_unless_stopped(bell))
            break;
        /* the kind and count read once: the client may write them meanwhile */
        const uint32_t kind = atomic_load_explicit(&bell->header->req_kind,
                                                   memory_order_relaxed);
        const int64_t count = atomic_load_explicit(&bell->header->req_count,
                                                   memory_order_relaxed);
        const int sendrecv = kind == ENVD_DOORBELL_SENDRECV;
        envd_session_help_t help = {0};
        int32_t status;
        may_spin = answer(bell, sendrecv ? ENVD_DOORBELL_SEND : kind, count, 0, &help, &status);
        const int sent = sendrecv && status == ENVD_OK;
        atomic_store_explicit(&bell->header->sent, sent, memory_order_relaxed);
        if (sent && !sendrecv_recv(bell, count, &help, &may_spin))
            break;
        envd_session_unlock(bell->session);
        publish(bell->header, seq);
        bell->answered_ns = envd_now_ns();
        bell->last = seq;
        bell->last_kind = kind <= ENVD_DOORBELL_SENDRECV ? kind : 0; /* (0: a kind refused) */
        /* The session's batches in flight (answer() took their help): step
         * them here too, the oldest first, until the client rings again.  As
         * in-process, where the workers and the trainer's CPU share the
         * machine; spinning idle instead would keep a worker off a CPU, and
         * a batch left to the workers (under SCHED_BATCH, waiting for a CPU
         * that the trainer and this thread hold) would make the client's
         * next recv wait for it: with only a send's own batch helped,
         * EnvPool's loop on 2 CPUs (CartPole, two batches) waited 23 us per
         * recv for the older one.  Without the lock: the session is the
         * client's again; the help keeps its batches in flight (session.h). */
        envd_session_help(&help, request_waiting, bell);
    }
    envd_pool_reserve_cpus(-1);
    atomic_store(&bell->exited, 1);
    return NULL;
}

int envd_doorbell_start(envd_doorbell_t **out, envd_session_t *session,
                        envd_doorbell_header_t *header, int64_t *ids, int64_t spin_ns)
{
    if (out == NULL || session == NULL || header == NULL || ids == NULL || spin_ns < 0)
        return ENVD_EINVAL;
    envd_doorbell_t *bell = calloc(1, sizeof *bell);
    if (bell == NULL)
        return ENVD_ENOMEM;
    const int cpus = envd_usable_cpus();
    atomic_store_explicit(&g_busy_limit, cpus > 2 ? cpus - 1 : 1, memory_order_relaxed);
    bell->session = session;
    bell->num_envs = envd_session_num_envs(session);
    bell->async_base = envd_session_async_env_steps(session);
    bell->header = header;
    bell->ids = ids;
    bell->spin_ns = spin_ns;
    /* Requests counted before this start are not ours to answer. */
    bell->last = atomic_load(&header->req_seq);
    atomic_store(&header->done_seq, bell->last);
    atomic_store(&header->server_asleep, 0);  /* (set again before any sleep) */
    atomic_store(&header->missed_rings, 0);
    atomic_store(&header->closed, 0);
    int err = pthread_create(&bell->thread, NULL, serve, bell);
    if (err == 0)  /* named before start returns: for top -H, ps -L and tests */
        pthread_setname_np(bell->thread, "envd-fast");
    if (err != 0) {
        free(bell);
        errno = err;
        return ENVD_ESYS;
    }
    *out = bell;
    return ENVD_OK;
}

int64_t envd_doorbell_stop(envd_doorbell_t *bell, int64_t *batch_envs)
{
    if (bell == NULL)
        return 0;
    atomic_store(&bell->stop, 1);
    /* One wake is not enough: the server may have read stop == 0 just before
     * its FUTEX_WAIT on req_seq, and stop leaves req_seq (the word the kernel
     * compares) unchanged, so that wait would sleep a whole SLEEP_SLICE_NS
     * (tests/native/doorbell_stress.c: about 1 stop in 10 issued right after an
     * answer took 200 ms).  Wake until the thread has left its loop. */
    for (long pause_ns = 20000;; pause_ns = pause_ns < 1000000 ? 2 * pause_ns : pause_ns) {
        envd_futex_wake(&bell->header->req_seq, INT_MAX, ENVD_FUTEX_SHARED);
        if (atomic_load(&bell->exited))
            break;
        nanosleep(&(struct timespec){0, pause_ns}, NULL);
    }
    pthread_join(bell->thread, NULL);
    if (bell->claim_left)
        envd_session_release(bell->session);
    if (batch_envs != NULL)
        *batch_envs = envd_doorbell_batch_envs(bell);
    envd_session_drop_async(bell->session);  /* before closed: the client may
                                                then reset or close the session */
    /* The client reads closed after waking on done_seq (or before ringing):
     * it then asks the daemon over the socket, which says why. */
    atomic_store(&bell->header->closed, 1);
    envd_futex_wake(&bell->header->done_seq, INT_MAX, ENVD_FUTEX_SHARED);
    int64_t served = atomic_load(&bell->served);
    free(bell);
    return served;
}

/* The doorbell as the session's attached server (session.h). */
static void stop_server(void *bell)
{
    envd_doorbell_stop(bell, NULL);
}

static void drain_server(void *bell)
{
    envd_doorbell_drain(bell);
}

static const envd_session_server_ops_t SERVER_OPS = {.stop = stop_server, .drain = drain_server};

int envd_doorbell_serve(envd_session_t *session, envd_doorbell_header_t *header, int64_t *ids,
                        int64_t spin_ns)
{
    if (session == NULL)
        return ENVD_EINVAL;
    /* Under the session's lock, so that no other server attaches between the
     * check and the attach (the lock is recursive). */
    envd_session_lock(session);
    int rc = ENVD_EBUSY;
    envd_doorbell_t *bell = NULL;
    if (!envd_session_has_server(session))
        rc = envd_doorbell_start(&bell, session, header, ids, spin_ns);
    if (rc == ENVD_OK)
        rc = envd_session_attach_server(session, &SERVER_OPS, bell);  /* ENVD_OK: checked above */
    envd_session_unlock(session);
    return rc;
}

void envd_doorbell_lock(envd_doorbell_t *bell)
{
    envd_session_lock(bell->session);
}

int envd_doorbell_trylock(envd_doorbell_t *bell)
{
    return envd_session_trylock(bell->session);
}

void envd_doorbell_unlock(envd_doorbell_t *bell)
{
    envd_session_unlock(bell->session);
}

void envd_doorbell_drain(envd_doorbell_t *bell)
{
    atomic_store(&bell->draining, 1);
}

int64_t envd_doorbell_served(const envd_doorbell_t *bell)
{
    return atomic_load_explicit(&((envd_doorbell_t *)bell)->served, memory_order_relaxed);
}

int64_t envd_doorbell_batch_envs(const envd_doorbell_t *bell)
{
    return envd_session_async_env_steps(bell->session) - bell->async_base;
}

void envd_doorbell_collect(envd_doorbell_t *bell)
{
    if (!envd_session_trylock(bell->session))
        return;
    envd_session_counts(bell->session, NULL, NULL);
    envd_session_unlock(bell->session);
}

int64_t envd_doorbell_pending(const envd_doorbell_t *bell)
{
    int64_t in_flight = 0, ready = 0;
    envd_session_counts(bell->session, &in_flight, &ready);
    return in_flight + ready;
}
