/*
 * fast.c -- the fast path's server thread (see fast.h for the protocol).
 *
 * Thread ownership: the server thread reads the client's words and writes
 * the server's; it touches the vec only while holding fast->lock, as every
 * other user of the vec in the daemon does through envd_fast_lock.
 * fast->last (the request last answered) belongs to the server thread.
 */
#define _GNU_SOURCE
#include "fast.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "envd.h"
#include "spin.h"

_Static_assert(offsetof(envd_fast_header_t, req_seq) == 0, "doorbell layout");
_Static_assert(offsetof(envd_fast_header_t, req_kind) == 4, "doorbell layout");
_Static_assert(offsetof(envd_fast_header_t, client_waiting) == 8, "doorbell layout");
_Static_assert(offsetof(envd_fast_header_t, done_seq) == 64, "doorbell layout");
_Static_assert(offsetof(envd_fast_header_t, status) == 68, "doorbell layout");
_Static_assert(offsetof(envd_fast_header_t, result) == 72, "doorbell layout");
_Static_assert(offsetof(envd_fast_header_t, error_index) == 80, "doorbell layout");
_Static_assert(offsetof(envd_fast_header_t, closed) == 88, "doorbell layout");

/* A sleeping server wakes this often to notice envd_fast_stop even if no
 * client rings (stop also wakes it, repeatedly: a safety net only). */
#define SLEEP_SLICE_NS 200000000LL
#define SPIN_CHECK_EVERY 64

struct envd_fast {
    envd_vec_t *vec;
    envd_fast_header_t *header;
    int64_t spin_ns;
    pthread_t thread;
    pthread_mutex_t lock;   /* held while a request runs on the vec */
    _Atomic int stop;
    _Atomic int exited;     /* set by the server thread as it leaves serve() */
    _Atomic int draining;
    _Atomic int64_t served;
    uint32_t last;          /* server thread only */
};

static _Atomic int g_spinners;        /* server threads spinning now */
static _Atomic int g_max_spinners = 1;

void envd_fast_set_max_spinners(int max_spinners)
{
    atomic_store(&g_max_spinners, max_spinners < 0 ? 0 : max_spinners);
}

static void futex_wait(_Atomic uint32_t *word, uint32_t value, int64_t timeout_ns)
{
    struct timespec ts = {timeout_ns / 1000000000LL, timeout_ns % 1000000000LL};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, value, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
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

/* The next request's seq (!= fast->last), or fast->last when stopping. */
static uint32_t next_request(envd_fast_t *fast)
{
    _Atomic uint32_t *req = &fast->header->req_seq;
    uint32_t seq = atomic_load_explicit(req, memory_order_acquire);
    if (seq != fast->last)
        return seq;
    if (take_spin_slot()) {
        const int64_t deadline = envd_now_ns() + fast->spin_ns;
        do {
            for (int i = 0; i < SPIN_CHECK_EVERY; i++) {
                seq = atomic_load_explicit(req, memory_order_acquire);
                if (seq != fast->last || atomic_load_explicit(&fast->stop, memory_order_relaxed))
                    break;
                envd_cpu_relax();
            }
        } while (seq == fast->last && !atomic_load_explicit(&fast->stop, memory_order_relaxed)
                 && envd_now_ns() < deadline);
        atomic_fetch_sub_explicit(&g_spinners, 1, memory_order_relaxed);
        if (seq != fast->last)
            return seq;
    }
    while (!atomic_load(&fast->stop)) {
        /* The kernel compares req_seq with last atomically: a request rung
         * before this call returns at once, one rung after wakes it. */
        futex_wait(req, fast->last, SLEEP_SLICE_NS);
        seq = atomic_load_explicit(req, memory_order_acquire);
        if (seq != fast->last)
            return seq;
    }
    return fast->last;
}

static void answer(envd_fast_t *fast, uint32_t seq)
{
    envd_fast_header_t *h = fast->header;
    int32_t status = ENVD_OK;
    int64_t result = 0, index = -1;
    if (atomic_load(&fast->draining)) {
        status = ENVD_FAST_SHUTTING_DOWN;
    } else if (atomic_load_explicit(&h->req_kind, memory_order_relaxed) != ENVD_FAST_STEP) {
        status = ENVD_EINVAL;
    } else {
        int rc = envd_vec_step(fast->vec);
        if (rc >= 0) {
            result = rc;
            atomic_fetch_add_explicit(&fast->served, 1, memory_order_relaxed);
        } else {
            status = rc;
            index = envd_vec_error_index(fast->vec);
        }
    }
    atomic_store_explicit(&h->status, status, memory_order_relaxed);
    atomic_store_explicit(&h->result, result, memory_order_relaxed);
    atomic_store_explicit(&h->error_index, index, memory_order_relaxed);
    /* seq_cst: the store of done_seq is ordered before the load of
     * client_waiting (the client sets that flag, then sleeps only while
     * done_seq is still the old value). */
    atomic_store(&h->done_seq, seq);
    if (atomic_load(&h->client_waiting))
        futex_wake(&h->done_seq);
}

static void *serve(void *arg)
{
    envd_fast_t *fast = arg;
    for (;;) {
        uint32_t seq = next_request(fast);
        if (atomic_load(&fast->stop))
            break;
        pthread_mutex_lock(&fast->lock);
        answer(fast, seq);
        pthread_mutex_unlock(&fast->lock);
        fast->last = seq;
    }
    atomic_store(&fast->exited, 1);
    return NULL;
}

int envd_fast_start(envd_fast_t **out, envd_vec_t *vec, envd_fast_header_t *header,
                    int64_t spin_ns)
{
    if (out == NULL || vec == NULL || header == NULL || spin_ns < 0)
        return ENVD_EINVAL;
    envd_fast_t *fast = calloc(1, sizeof *fast);
    if (fast == NULL)
        return ENVD_ENOMEM;
    fast->vec = vec;
    fast->header = header;
    fast->spin_ns = spin_ns;
    /* Requests counted before this start are not ours to answer. */
    fast->last = atomic_load(&header->req_seq);
    atomic_store(&header->done_seq, fast->last);
    atomic_store(&header->closed, 0);
    pthread_mutex_init(&fast->lock, NULL);
    int err = pthread_create(&fast->thread, NULL, serve, fast);
    if (err != 0) {
        pthread_mutex_destroy(&fast->lock);
        free(fast);
        errno = err;
        return ENVD_ESYS;
    }
    *out = fast;
    return ENVD_OK;
}

int64_t envd_fast_stop(envd_fast_t *fast)
{
    if (fast == NULL)
        return 0;
    atomic_store(&fast->stop, 1);
    /* One wake is not enough: the server may have read stop == 0 just before
     * its FUTEX_WAIT on req_seq, and stop leaves req_seq (the word the kernel
     * compares) unchanged, so that wait would sleep a whole SLEEP_SLICE_NS
     * (tests/native/fast_stress.c: about 1 stop in 10 issued right after an
     * answer took 200 ms).  Wake until the thread has left its loop. */
    for (long pause_ns = 20000;; pause_ns = pause_ns < 1000000 ? 2 * pause_ns : pause_ns) {
        futex_wake(&fast->header->req_seq);
        if (atomic_load(&fast->exited))
            break;
        nanosleep(&(struct timespec){0, pause_ns}, NULL);
    }
    pthread_join(fast->thread, NULL);
    /* The client reads closed after waking on done_seq (or before ringing):
     * it then asks the daemon over the socket, which says why. */
    atomic_store(&fast->header->closed, 1);
    futex_wake(&fast->header->done_seq);
    int64_t served = atomic_load(&fast->served);
    pthread_mutex_destroy(&fast->lock);
    free(fast);
    return served;
}

void envd_fast_lock(envd_fast_t *fast)
{
    pthread_mutex_lock(&fast->lock);
}

int envd_fast_trylock(envd_fast_t *fast)
{
    return pthread_mutex_trylock(&fast->lock) == 0;
}

void envd_fast_unlock(envd_fast_t *fast)
{
    pthread_mutex_unlock(&fast->lock);
}

void envd_fast_drain(envd_fast_t *fast)
{
    atomic_store(&fast->draining, 1);
}

int64_t envd_fast_served(const envd_fast_t *fast)
{
    return atomic_load_explicit(&((envd_fast_t *)fast)->served, memory_order_relaxed);
}
