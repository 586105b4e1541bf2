/*
 * doorbell_alongside.c -- when the doorbell's server thread yields from the
 * start of its spin (client_alongside in native/src/doorbell.c).
 *
 * It does so after a request that came while one of its yields let another
 * thread run on its CPU (its client, likely), and stops as soon as a request
 * comes without that: before any yield, or after yields that gave the CPU to
 * nobody (a client ringing from another CPU).  Whether another thread ran is
 * a matter of time, so this program decides time for the server thread: it
 * defines clock_gettime and sched_yield (the program's own definitions bind
 * the calls of the doorbell compiled into it).  For the server thread only,
 * the clock advances STEP_NS per read, a yield takes no time unless the
 * script says another thread ran (then RAN_NS), and the client's ring is
 * made from inside those calls at the moment the script names -- so each
 * run sees the same sequence, however loaded the machine.  Every other
 * thread gets the real calls.
 *
 * The script, one entry per request: SOON rings 1 us (virtual) after the
 * answer, well inside the 4 us a spin stays alone (SPIN_ALONE_NS), and counts
 * the yields before it; SHARED rings inside the spin's first yield, which
 * then lasts RAN_NS (the client ran on this CPU); ELSEWHERE rings inside the
 * first yield, which lasts nothing (the client rang from another CPU).
 * Checked: no yield before a SOON ring at first, some after SHARED requests,
 * none again after ELSEWHERE ones.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "builtin_envs.h"
#include "doorbell.h"
#include "envd.h"
#include "stress_check.h"
#include "stress_harness.h"
#include "stress_tasks.h"
#include "stress_util.h"

#define STEP_NS 250      /* the server's clock per read */
#define SOON_NS 1000     /* a SOON ring, after the answer */
#define RAN_NS 50000     /* a yield that let the client run */

enum { MAIN, SOON, SHARED, ELSEWHERE };
/* seq -> how its request is rung (MAIN: by the client thread, below) */
static const int g_script[] = {
    MAIN,                         /* 1: the server sleeps before its first request */
    SOON, SOON,                   /* 2-3: alone at first: no yield */
    SHARED, SHARED, SHARED, SOON, /* 4-7: after SHARED, the probe at 7 yields */
    SHARED, SHARED, ELSEWHERE, ELSEWHERE, SOON, SOON, SOON, /* 8-14: alone again */
};
#define REQUESTS ((uint32_t)COUNT(g_script))

static envd_doorbell_header_t *g_header;
static _Atomic pid_t g_server;        /* the server thread's id (0: none yet) */
static _Atomic int64_t g_vnow = 1000000000LL;
static _Atomic uint32_t g_done_seen;  /* the answer the marks below follow */
static _Atomic int64_t g_answered;    /* the server's clock at that answer */
static _Atomic int g_yields[COUNT(g_script) + 2]; /* yields before each seq's ring */
static _Atomic int g_rang_by_script[COUNT(g_script) + 2];

static pid_t my_tid(void)
{
    return (pid_t)syscall(SYS_gettid);
}

static bool on_server(void)
{
    const pid_t server = atomic_load(&g_server);
    return server != 0 && my_tid() == server;
}

static int script_of(uint32_t seq)
{
    return seq >= 1 && seq <= REQUESTS ? g_script[seq - 1] : MAIN;
}

/* Ring the request after the last answer (seq done + 1) if nobody has: the
 * script and the client thread race through one compare-and-swap. */
static bool ring_next(uint32_t done)
{
    uint32_t expected = done;
    return atomic_compare_exchange_strong(&g_header->req_seq, &expected, done + 1);
}

/* The next request's seq, following the answers as the server reads its clock. */
static uint32_t follow_answers(int64_t now)
{
    const uint32_t done = atomic_load(&g_header->done_seq);
    if (done != atomic_load(&g_done_seen)) {
        atomic_store(&g_done_seen, done);
        atomic_store(&g_answered, now); /* (the server reads it first: answered_ns) */
    }
    return done + 1;
}

int clock_gettime(clockid_t clock, struct timespec *ts)
{
    if (clock != CLOCK_MONOTONIC || !on_server())
        return (int)syscall(SYS_clock_gettime, clock, ts);
    const int64_t now = atomic_fetch_add(&g_vnow, STEP_NS) + STEP_NS;
    const uint32_t next = follow_answers(now);
    if (script_of(next) == SOON && now >= atomic_load(&g_answered) + SOON_NS &&
        ring_next(next - 1))
        atomic_store(&g_rang_by_script[next], 1);
    ts->tv_sec = now / 1000000000LL;
    ts->tv_nsec = now % 1000000000LL;
    return 0;
}

int sched_yield(void)
{
    if (!on_server())
        return (int)syscall(SYS_sched_yield);
    const uint32_t next = follow_answers(atomic_load(&g_vnow));
    if (atomic_load(&g_header->req_seq) == next - 1)
        atomic_fetch_add(&g_yields[next], 1);
    const int how = script_of(next);
    if ((how == SHARED || how == ELSEWHERE) && ring_next(next - 1)) {
        atomic_store(&g_rang_by_script[next], 1);
        if (how == SHARED)
            atomic_fetch_add(&g_vnow, RAN_NS);
    }
    return 0;
}

static void sleep_us(int us)
{
    struct timespec t = {.tv_sec = 0, .tv_nsec = (long)us * 1000};
    nanosleep(&t, NULL);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    harness_t h;
    harness_init(&h, &envd_builtin_cartpole, 2, NULL, 0);
    unsigned char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(page != MAP_FAILED, "mmap: %s", strerror(errno));
    g_header = (envd_doorbell_header_t *)(page + ENVD_DOORBELL_OFFSET);
    atomic_store(&g_header->req_kind, ENVD_DOORBELL_STEP);
    int64_t ids[2] = {0, 1};
    envd_doorbell_set_max_spinners(1);
    pid_t before[64], after[64];
    const int nb = list_tasks_once(before, 64);
    CHECK(nb >= 0, "/proc/self/task is not listed");
    envd_doorbell_t *bell = NULL;
    /* A spin limit no spin here reaches (the clock advances per read). */
    CHECK(envd_doorbell_start(&bell, h.s, g_header, ids, 1000000000LL) == ENVD_OK, "start");
    pid_t server = 0;
    for (double deadline = now_s() + 30.0; server == 0; sleep_us(1000)) {
        /* the task envd_doorbell_start added: listed now, not before */
        const int na = list_tasks_once(after, 64);
        for (int i = 0; i < na; i++)
            if (!has_task(before, nb, after[i]))
                server = after[i];
        CHECK(server != 0 || now_s() < deadline, "the server thread is not listed");
    }
    atomic_store(&g_server, server);

    /* The client: waits for each answer (the script rings most requests
     * from the server's own calls, one after another's answer), and rings
     * itself only the MAIN requests and any the script could not ring
     * because the server slept. */
    for (uint32_t seq = 1; seq <= REQUESTS; seq++) {
        const double deadline = now_s() + 60.0;
        if (script_of(seq) == MAIN && ring_next(seq - 1))
            syscall(SYS_futex, &g_header->req_seq, FUTEX_WAKE, 1, NULL, NULL, 0);
        while (atomic_load(&g_header->done_seq) < seq) {
            CHECK(now_s() < deadline, "request %u: no answer in 60 s", seq);
            if (atomic_load(&g_header->server_asleep) && ring_next(seq - 1))
                syscall(SYS_futex, &g_header->req_seq, FUTEX_WAKE, 1, NULL, NULL, 0);
            sleep_us(100);
        }
    }
    atomic_store(&g_server, 0);
    /* (every request stepped: a refused one is not counted) */
    CHECK(envd_doorbell_stop(bell, NULL) == REQUESTS, "served");

    for (uint32_t seq = 1; seq <= REQUESTS; seq++) {
        printf("doorbell_alongside: request %2u (%s): %d yields before it%s\n", seq,
               (const char *[]){"main", "soon", "shared", "elsewhere"}[script_of(seq)],
               atomic_load(&g_yields[seq]),
               script_of(seq) == MAIN || atomic_load(&g_rang_by_script[seq]) ? ""
                                                                             : " (the server slept)");
        CHECK(script_of(seq) == MAIN || atomic_load(&g_rang_by_script[seq]),
              "request %u: the server slept before its scripted ring", seq);
    }
    for (uint32_t seq = 2; seq <= REQUESTS; seq++) {
        if (script_of(seq) != SOON)
            continue;
        const bool after_shared = seq == 7;
        const int yields = atomic_load(&g_yields[seq]);
        CHECK(after_shared ? yields > 0 : yields == 0,
              "request %u, rung %d ns after its answer: %d yields before it (%s)", seq,
              SOON_NS, yields,
              after_shared ? "its client shared the CPU: the spin should yield from its start"
                           : "its client rings from another CPU: the spin stays alone 4 us");
    }
    munmap(page, 4096);
    harness_free(&h);
    printf("doorbell_alongside: ok\n");
    return 0;
}
