/*
 * session_stress.c -- tests of native/src/session.c (a native session: the
 * async books over a stepping backend, and its doorbell); exits non-zero on
 * any failure.  Usage: session_stress [divisor] (loop counts are divided by
 * divisor: sanitizer builds run slower).
 *
 * Checks:
 *   - books: for pools of 0, 1 and 2 threads, CartPole N in {1, 7, 64}, a
 *     random mix of sends (random idle subsets, random actions, with or
 *     without ENVD_JOB_NOTIFY) and recvs of random counts (waiting, or not:
 *     then 0 while fewer are ready): every recv returns exactly its count,
 *     each id was out and comes back exactly once; the ids of one send come
 *     back in their send order; with no pool thread (every batch inline)
 *     recvs return the ids in exactly the order they were sent (the FIFO);
 *     counts() always adds up; the reusable batches never hold more than
 *     2 * N ids; every env received has the rows of a twin session stepped
 *     serially with the same batches (bit-identical); the same on the
 *     2-thread pool under thread caps of 0 and 1 (envd_session_set_max_threads);
 *   - refusals, with a batch held in flight on a pool thread by a gated env
 *     (deterministic): a send of an env in flight or ready is ENVD_EBUSY
 *     naming it (envd_session_env_state tells which), of an id out of range
 *     ENVD_EINVAL naming it, of count 0 ENVD_EINVAL (-1), of an env twice
 *     ENVD_EBUSY naming it (still idle); step, step_submit, reset, render
 *     and seed are ENVD_EBUSY (-1) while envs are in flight, step and render
 *     also while envs are ready (seed is not); a recv of more than is out is ENVD_ESTATE (-1), of 0 envs
 *     ENVD_EINVAL; a non-waiting recv of more than is ready returns 0; none
 *     of these changes the books; a reset with envs ready forgets them;
 *   - a failing env: the recv that finds its batch answers ENVD_EENV naming
 *     it, the batch's envs stay ready and the next recv returns them;
 *   - async_reset: with a gated batch in flight (released by another thread
 *     later) it waits for it, drops its results and a kept failure, and
 *     every env is ready in env order;
 *   - the doorbell served concurrently with lock/unlock: a client thread
 *     rings STEP requests while the main thread takes the session's lock
 *     (and, holding it, calls the session: the lock is recursive) at random
 *     times: no request runs while the lock is held (the session's step
 *     count moves by the holder's own steps only), every request is
 *     answered ENVD_OK, and the session's step count is the answers' count
 *     plus the main thread's own steps.
 */
#define _GNU_SOURCE
#include "session.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "builtin_envs.h"
#include "doorbell.h"
#include "envd.h"
#include "pool.h"
#include "stress_harness.h"
#include "stress_hold.h"
#include "stress_util.h"

static void counts(envd_session_t *s, int64_t *in_flight, int64_t *ready)
{
    envd_session_counts(s, in_flight, ready);
}

static bool same_row(const harness_t *a, const harness_t *b, int64_t i)
{
    return memcmp(a->obs + 4 * i, b->obs + 4 * i, 4 * sizeof(float)) == 0 &&
           a->rewards[i] == b->rewards[i] && a->terms[i] == b->terms[i] &&
           a->truncs[i] == b->truncs[i] && a->lengths[i] == b->lengths[i];
}

/* (the gated env: stress_harness.h) */
static envd_env_def_t g_gated;

/* ---- a failing env: its step fails for one observation row --------------------------- */
static _Atomic uintptr_t g_fail_obs;
static envd_env_def_t g_failing;

static int failing_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                        double *reward, bool *terminated, bool *truncated)
{
    if ((uintptr_t)obs == atomic_load(&g_fail_obs))
        return ENVD_EENV;
    return envd_builtin_cartpole.step(state, rng, action, obs, reward, terminated, truncated);
}

/* ---- books ------------------------------------------------------------------------- */
static void test_books(envd_pool_t *pool, int threads, int64_t n, int rounds, uint64_t seed)
{
    harness_t h, twin;
    harness_init(&h, &envd_builtin_cartpole, n, pool, 0);
    harness_init(&twin, &envd_builtin_cartpole, n, NULL, 0);
    CHECK(envd_session_async_reset(h.s, NULL) == ENVD_OK, "async_reset");
    CHECK(envd_session_async_reset(twin.s, NULL) == ENVD_OK, "twin async_reset");
    int64_t *got = xcalloc((size_t)n, sizeof *got), *twin_got = xcalloc((size_t)n, sizeof *got);
    CHECK(envd_session_recv(h.s, n, n, got, 1) == n, "first recv");
    CHECK(envd_session_recv(twin.s, n, n, twin_got, 1) == n, "twin first recv");
    for (int64_t i = 0; i < n; i++)
        CHECK(got[i] == i && twin_got[i] == i, "async_reset: env order");
    /* out[i]: env i is out (sent, not received); batch_of / pos_in: its send
     * and its position there; fifo: the ids in send order (inline check). */
    bool *out = xcalloc((size_t)n, sizeof *out);
    int64_t *batch_of = xcalloc((size_t)n, sizeof *batch_of);
    int64_t *pos_in = xcalloc((size_t)n, sizeof *pos_in);
    int64_t *last_pos = xcalloc((size_t)rounds + 1, sizeof *last_pos);
    int64_t *fifo = xcalloc((size_t)n, sizeof *fifo), *ids = xcalloc((size_t)n, sizeof *ids);
    int64_t fifo_head = 0, fifo_len = 0, num_out = 0, batches = 0;
    uint64_t s = seed;
    for (int r = 0; r < rounds; r++) {
        if (rnd(&s) % 3 != 0 && num_out < n) {  /* send a random subset of the idle envs */
            int64_t k = 0;
            for (int64_t i = 0; i < n; i++)
                if (!out[i] && rnd(&s) % 2)
                    ids[k++] = i;
            for (int64_t a = k - 1; a > 0; a--) {  /* shuffled */
                const int64_t b = (int64_t)(rnd(&s) % (uint64_t)(a + 1)), t = ids[a];
                ids[a] = ids[b];
                ids[b] = t;
            }
            if (k == 0)
                continue;
            for (int64_t j = 0; j < k; j++) {
                h.actions[ids[j]] = twin.actions[ids[j]] = (int64_t)(rnd(&s) % 2);
                out[ids[j]] = true;
                batch_of[ids[j]] = batches;
                pos_in[ids[j]] = j;
                fifo[(fifo_head + fifo_len++) % n] = ids[j];
            }
            last_pos[batches++] = -1;
            const int flags = rnd(&s) % 2 ? ENVD_JOB_NOTIFY : 0;
            CHECK(envd_session_send(h.s, ids, k, flags) == ENVD_OK, "send of %lld", (long long)k);
            CHECK(envd_session_send(twin.s, ids, k, 0) == ENVD_OK, "twin send");
            CHECK(envd_session_recv(twin.s, k, k, twin_got, 0) == k, "twin: inline batches");
            num_out += k;
        }
        int64_t in_flight, ready;
        counts(h.s, &in_flight, &ready);
        CHECK(in_flight + ready == num_out, "counts %lld + %lld, out %lld", (long long)in_flight,
              (long long)ready, (long long)num_out);
        CHECK(envd_session_spare_capacity(h.s) <= 2 * n, "spares hold %lld ids",
              (long long)envd_session_spare_capacity(h.s));
        if (num_out == 0 || rnd(&s) % 2)
            continue;
        const int64_t count = 1 + (int64_t)(rnd(&s) % (uint64_t)num_out);
        const int wait = (int)(rnd(&s) % 3 != 0);
        const int64_t rc = envd_session_recv(h.s, count, count, got, wait);
        if (!wait && rc == 0)
            continue;  /* fewer were ready */
        CHECK(rc == count, "recv of %lld returned %lld", (long long)count, (long long)rc);
        for (int64_t j = 0; j < count; j++) {
            const int64_t i = got[j];
            CHECK(i >= 0 && i < n && out[i], "recv returned env %lld, not out", (long long)i);
            out[i] = false;
            CHECK(pos_in[i] > last_pos[batch_of[i]], "env %lld out of its send's order",
                  (long long)i);
            last_pos[batch_of[i]] = pos_in[i];
            if (threads == 0) {  /* inline: the ready FIFO is the send order */
                CHECK(fifo[fifo_head] == i, "recv returned %lld, the FIFO holds %lld",
                      (long long)i, (long long)fifo[fifo_head]);
            }
            fifo_head = (fifo_head + 1) % n;
            fifo_len--;
            CHECK(same_row(&h, &twin, i), "env %lld differs from the twin", (long long)i);
            CHECK(envd_session_env_state(h.s, i) == ENVD_ENV_IDLE, "received env not idle");
        }
        num_out -= count;
    }
    if (num_out > 0)
        CHECK(envd_session_recv(h.s, num_out, num_out, got, 1) == num_out, "last recv");
    CHECK(envd_session_async_env_steps(h.s) == envd_session_async_env_steps(twin.s),
          "async env steps %lld vs the twin's %lld",
          (long long)envd_session_async_env_steps(h.s),
          (long long)envd_session_async_env_steps(twin.s));
    free(out);
    free(batch_of);
    free(pos_in);
    free(last_pos);
    free(fifo);
    free(ids);
    free(got);
    free(twin_got);
    harness_free(&h);
    harness_free(&twin);
}

/* ---- refusals ------------------------------------------------------------------------ */
static void expect_counts(envd_session_t *s, int64_t in_flight, int64_t ready, const char *what)
{
    int64_t f, r;
    counts(s, &f, &r);
    CHECK(f == in_flight && r == ready, "%s: counts (%lld, %lld), want (%lld, %lld)", what,
          (long long)f, (long long)r, (long long)in_flight, (long long)ready);
}

/* ---- helping the batches in flight (envd_session_take_help) --------------------------- */
/* A helped batch's chunk is cut to about 10 us of measured cost (vec.c),
 * unless the session's chunk is forced; take_help takes the oldest
 * ENVD_SESSION_MAX_HELP - 1 batches in flight and the newest: of five sent
 * with the pool's one worker held, helping steps the 1st, 2nd, 3rd and 5th
 * and leaves the 4th. */
static void test_take_help(envd_pool_t *pool1)
{
    enum { BATCHES = 5, PER = 1024, N = 8 * PER };
    CHECK(ENVD_SESSION_MAX_HELP == 4, "the test's batches assume 3 oldest + the newest");
    harness_t h;
    harness_init(&h, &envd_builtin_cartpole, N, pool1, 0);
    for (int k = 0; k < 3; k++)
        CHECK(envd_session_step(h.s) >= 0, "take_help: a step to measure the cost");
    int64_t *ids = xcalloc(N, sizeof *ids), *out = xcalloc(N, sizeof *out);
    for (int64_t i = 0; i < N; i++)
        ids[i] = i;
    envd_vec_stats_t st;
    for (int forced = 0; forced < 2; forced++) {
        envd_session_set_chunk(h.s, forced ? 700 : 0);
        envd_session_stats(h.s, &st);
        const double cost = st.cost_ns_per_env;
        /* Measured, and far below the 100 us a helped chunk (one env at least)
         * may take (vec.c HELP_CHUNK_MAX_NS), so the batches below stay helped.
         * No tighter bound: under TSan on a loaded machine a CartPole step
         * measured 1.4 us (a CI run failed on a bound of 1 us). */
        CHECK(cost > 0.0 && cost < 50000.0, "take_help: cost %g ns", cost);
        CHECK(envd_session_send(h.s, ids, N, ENVD_JOB_HELPED) == ENVD_OK, "send all");
        envd_session_stats(h.s, &st);
        if (forced)
            CHECK(st.last_chunk == 700, "a forced chunk of 700 became %lld",
                  (long long)st.last_chunk);
        else  /* (uncut: N / 8 envs a chunk, over 10 us at CartPole's cost) */
            CHECK(st.last_chunk < N / 8 && (double)st.last_chunk * cost <= 10000.0 + cost,
                  "a helped batch's chunk: %lld envs at %g ns each", (long long)st.last_chunk,
                  cost);
        CHECK(envd_session_recv(h.s, N, N, out, 1) == N, "recv all");
    }
    envd_session_set_chunk(h.s, 0);
    worker_hold_t hold;
    hold_worker(pool1, &hold); /* only this thread steps now */
    for (int b = 0; b < BATCHES; b++)
        CHECK(envd_session_send(h.s, ids + b * PER, PER, ENVD_JOB_HELPED) == ENVD_OK,
              "send batch %d", b);
    envd_session_help_t help;
    CHECK(envd_session_take_help(h.s, &help) == 4, "take_help took %d batches", help.count);
    envd_session_help(&help, NULL, NULL);
    expect_counts(h.s, PER, 4 * PER, "take_help");
    for (int64_t i = 0; i < BATCHES * PER; i++) {
        const int want = i / PER == 3 ? ENVD_ENV_IN_FLIGHT : ENVD_ENV_READY;
        CHECK(envd_session_env_state(h.s, i) == want, "take_help: env %lld (batch %lld) is in "
              "state %d, not %d", (long long)i, (long long)(i / PER),
              envd_session_env_state(h.s, i), want);
    }
    release_worker(pool1, &hold);
    CHECK(envd_session_recv(h.s, BATCHES * PER, BATCHES * PER, out, 1) == BATCHES * PER,
          "recv the five");
    free(ids);
    free(out);
    harness_free(&h);
}

/* ---- a batch overtaken before any thread started it (session.c run_overtaken) ------- */
/* A slow env: each step waits SLOW_STEP_S first (then CartPole's), so that a
 * NOTIFY batch of 8 costs over the 1 ms that a session capped at 0 threads
 * runs inline for an event loop (vec.c LOOP_INLINE_MAX_NS): it always goes
 * to the cap's one pool slot, measured or not, however fast the machine.
 * Its other batches run inline whatever their cost (the cap of 0). */
#define SLOW_STEP_S 150e-6
static envd_env_def_t g_slow;

static int slow_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                     double *reward, bool *terminated, bool *truncated)
{
    const double until = now_s() + SLOW_STEP_S;
    while (now_s() < until)
        ;
    return envd_builtin_cartpole.step(state, rng, action, obs, reward, terminated, truncated);
}

static void expect_ids(const int64_t *out, int64_t first, int64_t count, const char *what)
{
    for (int64_t k = 0; k < count; k++)
        CHECK(out[k] == first + k, "%s: env %lld at %lld, not %lld", what, (long long)out[k],
              (long long)k, (long long)(first + k));
}

/* With the pool's one worker held, batch B (envs [0, 8)) waits in the pool
 * while a later batch A ([8, 16)) runs inline and finishes.  The first
 * waiting recv passes B over (a worker may just be waking up for it) and
 * returns A; the next one, with B still unstarted, runs B itself before it
 * returns A again (ready first).  Each round reuses the entries of the one
 * before (the pass is forgotten); recvs that do not wait leave B to the
 * worker, and so does a waiting recv when B overtook nothing.  Every env's
 * rows equal those of as many sync steps. */
static void test_overtaken(envd_pool_t *pool1)
{
    enum { N = 16, B = 8 };
    g_slow = envd_builtin_cartpole;
    g_slow.step = slow_step;
    harness_t h, ref_a, ref_b;
    g_max_threads = 0;
    harness_init(&h, &g_slow, N, pool1, 0);
    g_max_threads = ENVD_VEC_NO_CAP;
    CHECK(envd_session_async_reset(h.s, NULL) == ENVD_OK, "async_reset");
    int64_t ids[N], out[N];
    for (int64_t i = 0; i < N; i++)
        ids[i] = i;
    CHECK(envd_session_recv(h.s, N, N, out, 1) == N, "recv the reset's envs");
    int steps_a = 0, steps_b = 0;
    worker_hold_t hold;
    for (int round = 0; round < 3; round++) {
        const int wait = round < 2; /* round 1 reuses round 0's entries */
        hold_worker(pool1, &hold);
        CHECK(envd_session_send(h.s, ids, B, ENVD_JOB_NOTIFY) == ENVD_OK, "send B");
        expect_counts(h.s, B, 0, "B waits for the held worker");
        for (int turn = 0; turn < 2; turn++) {
            CHECK(envd_session_send(h.s, ids + B, N - B, 0) == ENVD_OK, "send A");
            steps_a++;
            expect_counts(h.s, B, N - B, "A ran inline");
            CHECK(envd_session_recv(h.s, N - B, N - B, out, wait) == N - B,
                  "recv A (round %d, turn %d)", round, turn);
            expect_ids(out, B, N - B, "a recv of A");
            if (wait && turn == 1)
                expect_counts(h.s, 0, B, "a waiting recv ran B, passed over before");
            else
                expect_counts(h.s, B, 0, "B left to the worker");
        }
        release_worker(pool1, &hold);
        CHECK(envd_session_recv(h.s, B, B, out, 1) == B, "recv B");
        steps_b++;
        expect_ids(out, 0, B, "B's recv");
    }
    /* B overtook nothing: A (sent first) finished, B did not start. */
    hold_worker(pool1, &hold);
    CHECK(envd_session_send(h.s, ids + B, N - B, 0) == ENVD_OK, "send A first");
    steps_a++;
    CHECK(envd_session_send(h.s, ids, B, ENVD_JOB_NOTIFY) == ENVD_OK, "then B");
    for (int k = 0; k < 2; k++)
        CHECK(envd_session_recv(h.s, (N - B) / 2, (N - B) / 2, out, 1) == (N - B) / 2,
              "recv half of A");
    expect_counts(h.s, B, 0, "a batch nothing overtook is left to the worker");
    release_worker(pool1, &hold);
    CHECK(envd_session_recv(h.s, B, B, out, 1) == B, "recv B");
    steps_b++;
    harness_init(&ref_a, &envd_builtin_cartpole, N, NULL, 0);
    harness_init(&ref_b, &envd_builtin_cartpole, N, NULL, 0);
    for (harness_t *ref = &ref_a; ref; ref = ref == &ref_a ? &ref_b : NULL) {
        CHECK(envd_session_async_reset(ref->s, NULL) == ENVD_OK, "the reference's async_reset");
        CHECK(envd_session_recv(ref->s, N, N, out, 1) == N, "the reference's recv");
    }
    for (int k = 0; k < steps_a; k++)
        CHECK(envd_session_step(ref_a.s) >= 0, "the reference's step");
    for (int k = 0; k < steps_b; k++)
        CHECK(envd_session_step(ref_b.s) >= 0, "the reference's step");
    for (int64_t i = 0; i < N; i++)
        CHECK(same_row(i < B ? &ref_b : &ref_a, &h, i), "env %lld differs from %d sync steps",
              (long long)i, i < B ? steps_b : steps_a);
    harness_free(&h);
    harness_free(&ref_a);
    harness_free(&ref_b);
}

static void test_refusals(envd_pool_t *pool1)
{
    g_gated = envd_builtin_cartpole;
    g_gated.step = gated_step;
    gate(0);
    harness_t h;
    harness_init(&h, &g_gated, 8, pool1, 1);  /* chunk 1: every batch on the pool */
    envd_session_t *s = h.s;
    int64_t ids[8], got[8];
    uint8_t frame[1];

    /* Env 1 ready, env 2 in flight (held by the gate on the pool's thread). */
    ids[0] = 1;
    CHECK(envd_session_send(s, ids, 1, 0) == ENVD_OK, "send 1");
    const double deadline = now_s() + 60.0;
    int64_t in_flight = 1;
    while (in_flight) {
        counts(s, &in_flight, NULL);
        CHECK(now_s() < deadline, "env 1 never finished");
        sched_yield();
    }
    atomic_store(&g_gate_armed, 1);
    ids[0] = 2;
    CHECK(envd_session_send(s, ids, 1, 0) == ENVD_OK, "send 2");
    gate_wait_started();
    expect_counts(s, 1, 1, "held");

    ids[0] = 3, ids[1] = 1;
    CHECK(envd_session_send(s, ids, 2, 0) == ENVD_EBUSY && envd_session_error_index(s) == 1 &&
          envd_session_env_state(s, 1) == ENVD_ENV_READY, "send of a ready env");
    ids[0] = 2;
    CHECK(envd_session_send(s, ids, 1, 0) == ENVD_EBUSY && envd_session_error_index(s) == 2 &&
          envd_session_env_state(s, 2) == ENVD_ENV_IN_FLIGHT, "send of an env in flight");
    ids[0] = 0, ids[1] = 8;
    CHECK(envd_session_send(s, ids, 2, 0) == ENVD_EINVAL && envd_session_error_index(s) == 8,
          "send of id 8");
    ids[0] = -1;
    CHECK(envd_session_send(s, ids, 1, 0) == ENVD_EINVAL && envd_session_error_index(s) == -1,
          "send of id -1");
    CHECK(envd_session_send(s, ids, 0, 0) == ENVD_EINVAL && envd_session_error_index(s) == -1,
          "send of 0 ids");
    ids[0] = 4, ids[1] = 5, ids[2] = 4;
    CHECK(envd_session_send(s, ids, 3, 0) == ENVD_EBUSY && envd_session_error_index(s) == 4 &&
          envd_session_env_state(s, 4) == ENVD_ENV_IDLE, "send of env 4 twice");
    CHECK(envd_session_step(s) == ENVD_EBUSY && envd_session_error_index(s) == -1, "step");
    CHECK(envd_session_step_submit(s) == ENVD_EBUSY, "step_submit");
    CHECK(envd_session_reset(s, NULL, NULL) == ENVD_EBUSY, "reset with envs in flight");
    CHECK(envd_session_render(s, frame) == ENVD_EBUSY, "render with envs in flight");
    static const uint64_t seeds[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK(envd_session_seed(s, seeds) == ENVD_EBUSY && envd_session_error_index(s) == -1,
          "seed with envs in flight (their batches read the generators)");
    CHECK(envd_session_recv(s, 3, 3, got, 1) == ENVD_ESTATE && envd_session_error_index(s) == -1,
          "recv of 3 with 2 out");
    CHECK(envd_session_recv(s, 0, 0, got, 1) == ENVD_EINVAL, "recv of 0");
    CHECK(envd_session_recv(s, 2, 2, got, 0) == 0, "try_recv of 2 with 1 ready");
    expect_counts(s, 1, 1, "after the refusals");
    CHECK(envd_session_recv(s, 1, 1, got, 0) == 1 && got[0] == 1, "try_recv of 1");
    expect_counts(s, 1, 0, "after try_recv");

    atomic_store(&g_gate_release, 1);
    CHECK(envd_session_recv(s, 1, 1, got, 1) == 1 && got[0] == 2, "recv of the held env");
    gate(0);
    CHECK(envd_session_step(s) >= 0, "step with nothing out");
    ids[0] = 6;
    CHECK(envd_session_send(s, ids, 1, 0) == ENVD_OK, "send 6");
    CHECK(envd_session_recv(s, 1, 1, got, 1) == 1, "recv 6");
    ids[0] = 7;
    CHECK(envd_session_send(s, ids, 1, 0) == ENVD_OK, "send 7");
    do {  /* until 7 is ready */
        counts(s, &in_flight, NULL);
        sched_yield();
    } while (in_flight > 0);
    CHECK(envd_session_step(s) == ENVD_EBUSY, "step with an env ready");
    CHECK(envd_session_render(s, frame) == ENVD_EBUSY, "render with an env ready");
    CHECK(envd_session_seed(s, seeds) == ENVD_OK, "seed with an env ready (none in flight)");
    CHECK(envd_session_reset(s, NULL, NULL) == ENVD_OK, "reset with an env ready");
    expect_counts(s, 0, 0, "the reset forgot it");
    CHECK(envd_session_env_state(s, 7) == ENVD_ENV_IDLE, "env 7 idle after the reset");
    harness_free(&h);
}

/* ---- a failing env ------------------------------------------------------------------- */
static void test_failure(envd_pool_t *pool, int64_t chunk)
{
    g_failing = envd_builtin_cartpole;
    g_failing.step = failing_step;
    harness_t h;
    harness_init(&h, &g_failing, 8, pool, chunk);
    int64_t ids[8] = {5, 3, 1}, got[8];
    atomic_store(&g_fail_obs, (uintptr_t)(h.obs + 4 * 3));
    CHECK(envd_session_send(h.s, ids, 3, 0) == ENVD_OK, "send");
    CHECK(envd_session_recv(h.s, 2, 2, got, 1) == ENVD_EENV && envd_session_error_index(h.s) == 3,
          "the recv that finds the failure reports env 3");
    atomic_store(&g_fail_obs, 0);
    expect_counts(h.s, 0, 3, "the failed batch's envs stay ready");
    CHECK(envd_session_recv(h.s, 2, 2, got, 1) == 2 && got[0] == 5 && got[1] == 3, "then recv");
    CHECK(envd_session_recv(h.s, 1, 1, got, 1) == 1 && got[0] == 1, "then the last");
    ids[0] = 3;
    CHECK(envd_session_send(h.s, ids, 1, 0) == ENVD_OK, "the failed env can be sent again");
    CHECK(envd_session_recv(h.s, 1, 1, got, 1) == 1 && got[0] == 3, "and comes back");

    /* async_reset drops a kept failure. */
    atomic_store(&g_fail_obs, (uintptr_t)(h.obs + 4 * 2));
    ids[0] = 2;
    CHECK(envd_session_send(h.s, ids, 1, 0) == ENVD_OK, "send 2");
    int64_t in_flight = 1;
    while (in_flight)
        counts(h.s, &in_flight, NULL);
    atomic_store(&g_fail_obs, 0);
    CHECK(envd_session_async_reset(h.s, NULL) == ENVD_OK, "async_reset");
    CHECK(envd_session_recv(h.s, 8, 8, got, 1) == 8, "no failure after async_reset");
    for (int64_t i = 0; i < 8; i++)
        CHECK(got[i] == i, "async_reset: env order");
    harness_free(&h);
}

/* ---- async_reset with a batch in flight ---------------------------------------------- */
static void test_async_reset_in_flight(envd_pool_t *pool1)
{
    g_gated = envd_builtin_cartpole;
    g_gated.step = gated_step;
    gate(0);
    harness_t h;
    harness_init(&h, &g_gated, 16, pool1, 1);
    int64_t ids[16], got[16];
    for (int64_t i = 0; i < 16; i++)
        ids[i] = 15 - i;
    atomic_store(&g_gate_armed, 1);
    CHECK(envd_session_send(h.s, ids, 16, 0) == ENVD_OK, "send");
    gate_wait_started();
    pthread_t releaser;
    CHECK(pthread_create(&releaser, NULL, gate_release_later, NULL) == 0, "pthread_create");
    CHECK(envd_session_async_reset(h.s, NULL) == ENVD_OK, "async_reset");
    pthread_join(releaser, NULL);
    gate(0);
    expect_counts(h.s, 0, 16, "after async_reset");
    CHECK(envd_session_recv(h.s, 16, 16, got, 1) == 16, "recv");
    for (int64_t i = 0; i < 16; i++)
        CHECK(got[i] == i && h.lengths[i] == 0, "env %lld: order and a fresh episode",
              (long long)i);
    harness_free(&h);
}

/* ---- the doorbell served while the lock is taken --------------------------------------- */
typedef struct bell {
    envd_doorbell_header_t *h;
    int requests;
    _Atomic int answered_ok;
} bell_t;

static void *ringer_main(void *arg)
{
    bell_t *b = arg;
    for (int r = 0; r < b->requests; r++) {
        atomic_store(&b->h->req_kind, ENVD_DOORBELL_STEP);
        /* (seq_cst: the barrier between the store and the read of the flag,
         * as client/doorbell.py's ring: doorbell.h, Ordering) */
        const uint32_t seq = atomic_fetch_add(&b->h->req_seq, 1) + 1;
        if (atomic_load(&b->h->server_asleep))
            syscall(SYS_futex, (uint32_t *)&b->h->req_seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
        const double deadline = now_s() + 60.0;
        while (atomic_load(&b->h->done_seq) != seq) {
            CHECK(now_s() < deadline, "request %u never answered", seq);
            sched_yield();
        }
        if (atomic_load(&b->h->status) == ENVD_OK)
            atomic_fetch_add(&b->answered_ok, 1);
    }
    return NULL;
}

typedef struct {
    envd_session_t *s;
    atomic_int held, release;
} holder_t;

static void *hold_lock_main(void *arg)
{
    holder_t *hold = arg;
    envd_session_lock(hold->s);
    atomic_store(&hold->held, 1);
    while (!atomic_load(&hold->release))
        sched_yield();
    envd_session_unlock(hold->s);
    return NULL;
}

/* envd_session_step_if_short (a Python caller's bound step, bound_call.c)
 * never waits: while another thread holds the session's lock, and while a
 * chunk is forced (every step would wait for the pool), it runs nothing and
 * answers ENVD_SESSION_NOT_RUN; envd_session_step_is_short answers without
 * the lock (the holder here would wait for the caller's GIL). */
static void test_if_short_never_waits(envd_pool_t *pool)
{
    harness_t h;
    harness_init(&h, &envd_builtin_cartpole, 1, pool, 0);
    CHECK(envd_session_step_is_short(h.s) == 0, "short before any step was measured");
    CHECK(envd_session_step_if_short(h.s) == ENVD_SESSION_NOT_RUN, "an unmeasured step ran");
    for (int k = 0; k < 20; k++)
        CHECK(envd_session_step(h.s) >= 0, "if_short: a step to measure the cost");
    /* one CartPole, far under 20 us even under TSan (1.4 us measured) */
    CHECK(envd_session_step_is_short(h.s) == 1, "a measured CartPole is not short");
    int64_t steps = envd_session_steps(h.s);
    CHECK(envd_session_step_if_short(h.s) >= 0, "a short step");
    CHECK(envd_session_steps(h.s) == ++steps, "the short step did not run");

    holder_t hold = {.s = h.s};
    pthread_t holder;
    CHECK(pthread_create(&holder, NULL, hold_lock_main, &hold) == 0, "pthread_create");
    while (!atomic_load(&hold.held))
        sched_yield();
    CHECK(envd_session_step_is_short(h.s) == 1, "is_short changed while the lock is held");
    CHECK(envd_session_step_if_short(h.s) == ENVD_SESSION_NOT_RUN, "ran while locked");
    CHECK(envd_session_steps(h.s) == steps, "a step ran while another thread held the lock");
    atomic_store(&hold.release, 1);
    pthread_join(holder, NULL);

    envd_session_set_chunk(h.s, 1);
    CHECK(envd_session_step_is_short(h.s) == 0, "short with a forced chunk");
    CHECK(envd_session_step_if_short(h.s) == ENVD_SESSION_NOT_RUN, "ran with a forced chunk");
    CHECK(envd_session_step(h.s) >= 0, "a forced step");
    CHECK(envd_session_step_is_short(h.s) == 0, "short after a forced step");
    envd_session_set_chunk(h.s, 0);
    for (int k = 0; k < 5; k++)
        CHECK(envd_session_step(h.s) >= 0, "a step after the forced chunk");
    CHECK(envd_session_step_is_short(h.s) == 1, "not short again after the forced chunk");
    CHECK(envd_session_step_if_short(NULL) == ENVD_EINVAL, "a NULL session");
    harness_free(&h);
}

static void test_doorbell_and_lock(envd_pool_t *pool, int requests)
{
    harness_t h;
    harness_init(&h, &envd_builtin_cartpole, 33, pool, 0);
    envd_doorbell_header_t *header = xcalloc(1, sizeof *header);
    int64_t *ids = xcalloc(33, sizeof *ids);
    CHECK(envd_session_has_server(h.s) == 0, "a server before serve");
    CHECK(envd_doorbell_serve(h.s, header, ids, 20000) == ENVD_OK, "serve");
    CHECK(envd_session_has_server(h.s) == 1, "no server after serve");
    CHECK(envd_doorbell_serve(h.s, header, ids, 0) == ENVD_EBUSY, "a second serve");
    bell_t b = {.h = header, .requests = requests};
    pthread_t ringer;
    CHECK(pthread_create(&ringer, NULL, ringer_main, &b) == 0, "pthread_create");
    uint64_t s = 0x5e55;
    int64_t own_steps = 0;
    int locks = 0;
    while (atomic_load(&b.answered_ok) < requests) {
        envd_session_lock(h.s);
        locks++;
        /* (not done_seq: the server publishes an answer after it unlocks) */
        const int64_t served = envd_session_steps(h.s) - own_steps;
        if (rnd(&s) % 2) {  /* the holder calls the session (recursive lock) */
            CHECK(envd_session_step(h.s) >= 0, "a step holding the lock");
            own_steps++;
        }
        for (int k = 0; k < 200; k++)
            sched_yield();
        CHECK(envd_session_steps(h.s) - own_steps == served,
              "a request ran while the lock was held (%lld -> %lld steps served)",
              (long long)served, (long long)(envd_session_steps(h.s) - own_steps));
        envd_session_unlock(h.s);
        /* a Python caller's bound step (bound_call.c) while the doorbell
         * steps: the answer is read without the lock, and the step runs only
         * where its try-lock wins */
        const int rc = envd_session_step_if_short(h.s);
        if (rc != ENVD_SESSION_NOT_RUN) {
            CHECK(rc >= 0, "a short step failed: %d", rc);
            own_steps++;
        }
        for (int k = 0; k < (int)(rnd(&s) % 400); k++)
            sched_yield();
    }
    pthread_join(ringer, NULL);
    CHECK(atomic_load(&header->missed_rings) == 0, "the server slept through %u rings",
          atomic_load(&header->missed_rings));
    CHECK(envd_session_steps(h.s) == requests + own_steps, "steps %lld, want %lld",
          (long long)envd_session_steps(h.s), (long long)(requests + own_steps));
    envd_session_lock(h.s);
    envd_session_stop_server(h.s);  /* the caller may hold the lock */
    envd_session_unlock(h.s);
    CHECK(atomic_load(&header->closed) == 1, "closed after stop");
    CHECK(envd_session_has_server(h.s) == 0, "a server after stop");
    envd_session_stop_server(h.s);  /* no-op */
    /* Served again, then the session destroyed with the doorbell attached:
     * destroy stops it first (closed, its thread joined: ASan and TSan see
     * no use after free of the session). */
    CHECK(envd_doorbell_serve(h.s, header, ids, 0) == ENVD_OK, "serve again");
    CHECK(atomic_load(&header->closed) == 0, "closed while served");
    printf("session_stress: doorbell: %d requests, %d locks\n", requests, locks);
    harness_free(&h);
    CHECK(atomic_load(&header->closed) == 1, "not closed by the session's destroy");
    free(header);
    free(ids);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        g_div = atoi(argv[1]) > 0 ? atoi(argv[1]) : 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    static const int thread_counts[] = {0, 1, 2};
    envd_pool_t *pools[COUNT(thread_counts)];
    for (size_t i = 0; i < COUNT(thread_counts); i++)
        CHECK(envd_pool_create(&pools[i], thread_counts[i], NULL) == ENVD_OK, "pool create");
    double t = now_s();
    static const int64_t sizes[] = {1, 7, 64};
    for (size_t p = 0; p < COUNT(pools); p++)
        for (size_t k = 0; k < COUNT(sizes); k++)
            test_books(pools[p], thread_counts[p], sizes[k], scaled(3000, 300),
                       0x9e3779b97f4a7c15ull + p * 31 + k);
    for (g_max_threads = 0; g_max_threads <= 1; g_max_threads++) /* (NOTIFY sends may pool) */
        for (size_t k = 0; k < COUNT(sizes); k++)
            test_books(pools[2], thread_counts[2], sizes[k], scaled(1000, 100),
                       0x5eed5eedull + (uint64_t)g_max_threads * 31 + k);
    g_max_threads = ENVD_VEC_NO_CAP;
    printf("session_stress: books %.2f s\n", now_s() - t);
    t = now_s();
    test_refusals(pools[1]);
    for (size_t p = 0; p < COUNT(pools); p++)
        test_failure(pools[p], p == 0 ? 0 : 1);
    test_async_reset_in_flight(pools[1]);
    test_take_help(pools[1]);
    test_overtaken(pools[1]);
    for (size_t p = 0; p < COUNT(pools); p++)
        test_if_short_never_waits(pools[p]);
    printf("session_stress: refusals, failure, async_reset %.2f s\n", now_s() - t);
    t = now_s();
    for (size_t p = 0; p < COUNT(pools); p++)
        test_doorbell_and_lock(pools[p], scaled(2000, 200));
    printf("session_stress: doorbell %.2f s\n", now_s() - t);
    CHECK(envd_session_create(NULL, NULL) == ENVD_EINVAL, "create(NULL)");
    CHECK(envd_session_step_is_short(NULL) == 1, "a NULL session's refusal is short");
    envd_session_destroy(NULL);
    for (size_t i = 0; i < COUNT(pools); i++)
        envd_pool_destroy(pools[i]);
    printf("session_stress: ok\n");
    return 0;
}
