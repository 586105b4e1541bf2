/*
 * engine_stress.c -- tests of native/src/engine.c (the request engine: the
 * requests of many sessions that wait, and their completions); exits non-zero
 * on any failure.  Usage: engine_stress [divisor] (loop counts are divided by
 * divisor: sanitizer builds run slower).
 *
 * Checks:
 *   - many sessions at once on pools of 0, 1 and 2 threads: the main thread
 *     (the daemon's loop) submits steps and recvs of random min/max counts,
 *     sends beside waiting recvs (ENVD_JOB_NOTIFY), and drains completions
 *     (after the pool's eventfd, or by polling) while the pool's threads end
 *     batches: every request is completed exactly once (its tag), a recv
 *     returns between min and max ids, each of them out and received exactly
 *     once; a step's completion is never refused while nothing is out; at
 *     the end nothing waits and every env is idle;
 *   - a waiting recv completed by a failing batch: ENVD_EENV naming the env,
 *     the batch's envs ready for the next recv;
 *   - a session closed while its recv waits on a batch in flight (forget,
 *     then destroy while another thread releases the batch); a settle
 *     request that waits for a batch and completes once it ends;
 *   - two front doors on one session (the loop's submit, and envd_engine_call
 *     under the session's lock, as the doorbell thread makes it): beside the
 *     loop's waiting recv the other door's step and recv are refused
 *     (ENVD_EBUSY, nothing stepped, no env named) and its send is served;
 *     beside a waiting settle every request of either door is refused, sends
 *     too; beside the other door's claimed recv the loop's step and recv are
 *     refused (nothing submitted) and its send is served; then the loop's
 *     steps, sends and recvs race the other door's steps on pools of 0, 1
 *     and 2 threads: each answered once, a refusal steps nothing, the loop's
 *     are served in turn, never refused;
 *   - the third front door, the in-process calls (envd_session_step, _send,
 *     _recv with and without wait): beside the loop's waiting recv a step
 *     and a recv are refused (ENVD_EBUSY, nothing stepped or taken, no env
 *     named), a send is served and its batch writes the pool's eventfd;
 *     beside a settle a send is refused too; beside a doorbell's claimed
 *     recv the same; then an in-process thread's sends, recvs and steps race
 *     the loop's steps and the doorbell door's steps on pools of 0, 1 and 2
 *     threads: each answered once, a recv returns its own send's envs, a
 *     refusal steps nothing, every env comes back; a close (the server
 *     stopped, what is out dropped) while an in-process recv waits: the recv
 *     answered once, the close after it, nothing left out;
 *   - the whole-vec calls (reset, async_reset, render, seed) made on another
 *     thread beside the loop's waiting recv (its batch in flight, then
 *     ended but not looked at) and beside a doorbell's claimed recv: each
 *     refused ENVD_EBUSY naming no env, every env's state unchanged; the
 *     recv then completes with its envs; each runs once nothing is claimed;
 *   - a send of another door beside the loop's waiting recv whose batch runs
 *     inline writes the pool's eventfd before it returns (none with nothing
 *     claimed), and the loop's recv takes its env;
 *   - refusals: a second request of a session (ENVD_EBUSY), bad recvs
 *     (ENVD_EINVAL), a step while envs are out (completed at once, refused,
 *     ENVD_EBUSY), a recv of more than is out (ENVD_ESTATE), a refused send
 *     (no completion).
 */
#define _GNU_SOURCE
#include "engine.h"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "builtin_envs.h"
#include "envd.h"
#include "pool.h"
#include "stress_harness.h"
#include "stress_util.h"

/* ---- an env that can be held in its step (the harness's gate), or fail ------------- */
static _Atomic uintptr_t g_fail_obs;
static envd_env_def_t g_def;

static int test_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                     double *reward, bool *terminated, bool *truncated)
{
    gate_hold();
    if ((uintptr_t)obs == atomic_load(&g_fail_obs))
        return ENVD_EENV;
    return envd_builtin_cartpole.step(state, rng, action, obs, reward, terminated, truncated);
}

/* Poll until tag completes (other completions are not expected); *out: it. */
static void poll_for(envd_engine_t *e, uint64_t tag, envd_completion_t *out)
{
    const double deadline = now_s() + 60.0;
    for (;;) {
        int64_t n = envd_engine_poll(e, out, 1);
        if (n == 1) {
            CHECK(out->tag == tag, "completion of tag %llu, expected %llu",
                  (unsigned long long)out->tag, (unsigned long long)tag);
            return;
        }
        CHECK(now_s() < deadline, "tag %llu never completed", (unsigned long long)tag);
        sched_yield();
    }
}

/* ---- many sessions, concurrent completions ------------------------------------------ */
enum { SESSIONS = 4, ENVS = 16 };

typedef struct client {
    harness_t h;
    int8_t out[ENVS];       /* 1 while sent and not received */
    int64_t num_out;
    uint64_t waiting_tag;   /* 0: none */
    int32_t waiting_kind;
    int64_t min, max;
    int64_t ids[ENVS];      /* the waiting recv's out */
} client_t;

static uint64_t g_completed; /* completions seen */

static void on_completion(client_t *clients, const envd_completion_t *c)
{
    client_t *cl = &clients[c->tag >> 32];
    CHECK(cl->waiting_tag == c->tag && cl->waiting_kind == c->kind,
          "completion of tag %llu kind %d: not the one waiting (exactly once)",
          (unsigned long long)c->tag, c->kind);
    cl->waiting_tag = 0;
    g_completed++;
    if (c->kind == ENVD_REQ_STEP) {
        CHECK(c->result >= 0 && !c->refused, "a step with nothing out: %lld",
              (long long)c->result);
        return;
    }
    CHECK(c->kind == ENVD_REQ_RECV && !c->refused, "kind %d", c->kind);
    CHECK(c->result >= cl->min && c->result <= cl->max, "recv of [%lld, %lld] took %lld",
          (long long)cl->min, (long long)cl->max, (long long)c->result);
    for (int64_t k = 0; k < c->result; k++) {
        const int64_t i = cl->ids[k];
        CHECK(i >= 0 && i < ENVS && cl->out[i], "recv returned env %lld, not out",
              (long long)i);
        cl->out[i] = 0;
        cl->num_out--;
    }
}

static void test_concurrent(envd_pool_t *pool, int rounds, uint64_t seed)
{
    g_def = envd_builtin_cartpole;
    g_def.step = test_step;
    gate(0);
    client_t *clients = xcalloc(SESSIONS, sizeof *clients);
    for (int c = 0; c < SESSIONS; c++)
        harness_init(&clients[c].h, &g_def, ENVS, pool, 1 + c % 3);
    envd_engine_t *e = NULL;
    CHECK(envd_engine_create(&e) == ENVD_OK, "engine");
    const int efd = envd_pool_eventfd(pool);
    uint64_t serial = 0, submitted = 0;
    envd_completion_t done[SESSIONS];
    g_completed = 0;
    for (int r = 0; r < rounds; r++) {
        client_t *cl = &clients[rnd(&seed) % SESSIONS];
        const uint64_t tag = ((uint64_t)(cl - clients) << 32) | (++serial & 0xffffffffu);
        const uint64_t choice = rnd(&seed) % 4;
        if (choice <= 1 && cl->num_out < ENVS &&
            (cl->waiting_tag == 0 || cl->waiting_kind == ENVD_REQ_RECV)) {
            /* a send of some idle envs (beside a waiting recv, or not) */
            int64_t ids[ENVS], count = 0;
            for (int64_t i = 0; i < ENVS; i++)
                if (!cl->out[i] && rnd(&seed) % 2)
                    ids[count++] = i;
            if (count == 0)
                continue;
            for (int64_t k = 0; k < count; k++)
                cl->h.actions[ids[k]] = (int64_t)(rnd(&seed) % 2);
            envd_completion_t c;
            CHECK(envd_engine_send(e, cl->h.s, ids, count, ENVD_JOB_NOTIFY, &c) == ENVD_OK,
                  "send");
            for (int64_t k = 0; k < count; k++)
                cl->out[ids[k]] = 1;
            cl->num_out += count;
            if (c.kind != 0)
                on_completion(clients, &c);
        } else if (cl->waiting_tag == 0) {
            envd_request_t req = {.tag = tag};
            if (cl->num_out == 0) {
                req.kind = ENVD_REQ_STEP;
                for (int64_t i = 0; i < ENVS; i++)
                    cl->h.actions[i] = (int64_t)(rnd(&seed) % 2);
            } else {
                req.kind = ENVD_REQ_RECV;
                req.min_count = 1 + (int64_t)(rnd(&seed) % (uint64_t)cl->num_out);
                req.max_count = req.min_count +
                                (int64_t)(rnd(&seed) % (uint64_t)(ENVS - req.min_count + 1));
                req.out = cl->ids;
                cl->min = req.min_count;
                cl->max = req.max_count;
            }
            envd_completion_t c;
            const int rc = envd_engine_submit(e, cl->h.s, &req, &c);
            CHECK(rc == 0 || rc == 1, "submit: %d", rc);
            submitted++;
            cl->waiting_tag = tag;
            cl->waiting_kind = req.kind;
            if (rc == 1)
                on_completion(clients, &c);
            else
                CHECK(envd_engine_submit(e, cl->h.s, &req, &c) == ENVD_EBUSY,
                      "a second request of a session");
        }
        /* the loop's turn: after the eventfd (briefly waited for), or a plain poll */
        if (rnd(&seed) % 2) {
            struct pollfd p = {.fd = efd, .events = POLLIN};
            if (poll(&p, 1, 0) == 1) {
                uint64_t v;
                CHECK(read(efd, &v, sizeof v) == sizeof v, "eventfd read");
            }
        }
        const int64_t n = envd_engine_poll(e, done, 1 + (int64_t)(rnd(&seed) % SESSIONS));
        for (int64_t k = 0; k < n; k++)
            on_completion(clients, &done[k]);
    }
    /* drain: recv whatever is out, until nothing waits */
    const double deadline = now_s() + 120.0;
    for (;;) {
        int busy = 0;
        for (int c = 0; c < SESSIONS; c++) {
            client_t *cl = &clients[c];
            busy |= cl->waiting_tag != 0 || cl->num_out > 0;
            if (cl->waiting_tag == 0 && cl->num_out > 0) {
                envd_request_t req = {.kind = ENVD_REQ_RECV, .min_count = cl->num_out,
                                      .max_count = cl->num_out, .out = cl->ids,
                                      .tag = ((uint64_t)c << 32) | (++serial & 0xffffffffu)};
                cl->min = cl->max = cl->num_out;
                envd_completion_t d;
                const int rc = envd_engine_submit(e, cl->h.s, &req, &d);
                CHECK(rc == 0 || rc == 1, "drain submit: %d", rc);
                submitted++;
                cl->waiting_tag = req.tag;
                cl->waiting_kind = ENVD_REQ_RECV;
                if (rc == 1)
                    on_completion(clients, &d);
            }
        }
        if (!busy)
            break;
        CHECK(now_s() < deadline, "the drain never ended");
        const int64_t n = envd_engine_poll(e, done, SESSIONS);
        for (int64_t k = 0; k < n; k++)
            on_completion(clients, &done[k]);
        sched_yield();
    }
    CHECK(g_completed == submitted, "%llu requests, %llu completions",
          (unsigned long long)submitted, (unsigned long long)g_completed);
    CHECK(envd_engine_waiting(e, 0) == 0, "nothing waits");
    for (int c = 0; c < SESSIONS; c++) {
        for (int64_t i = 0; i < ENVS; i++)
            CHECK(envd_session_env_state(clients[c].h.s, i) == ENVD_ENV_IDLE, "env idle");
        harness_free(&clients[c].h);
    }
    envd_engine_destroy(e);
    free(clients);
}

/* ---- a waiting recv completed by a failing batch ------------------------------------ */
static void test_failing_batch(envd_pool_t *pool1)
{
    g_def = envd_builtin_cartpole;
    g_def.step = test_step;
    harness_t h;
    harness_init(&h, &g_def, 8, pool1, 1);
    envd_engine_t *e = NULL;
    CHECK(envd_engine_create(&e) == ENVD_OK, "engine");
    int64_t ids[3] = {6, 2, 4}, got[8];
    envd_completion_t c;
    gate(1);
    atomic_store(&g_fail_obs, (uintptr_t)(h.obs + 4 * 2));
    CHECK(envd_engine_send(e, h.s, ids, 3, ENVD_JOB_NOTIFY, &c) == ENVD_OK && c.kind == 0,
          "send");
    gate_wait_started();
    envd_request_t req = {.kind = ENVD_REQ_RECV, .min_count = 3, .max_count = 8, .out = got,
                          .tag = 7};
    CHECK(envd_engine_submit(e, h.s, &req, &c) == 0, "the recv waits");
    CHECK(envd_engine_poll(e, &c, 1) == 0, "still waits");
    atomic_store(&g_gate_release, 1);
    poll_for(e, 7, &c);
    CHECK(c.kind == ENVD_REQ_RECV && c.result == ENVD_EENV && c.error_index == 2,
          "the failure names env 2: %lld %lld", (long long)c.result, (long long)c.error_index);
    gate(0);
    atomic_store(&g_fail_obs, 0);
    req.tag = 8;
    CHECK(envd_engine_submit(e, h.s, &req, &c) == 1 && c.result == 3 && got[0] == 6 &&
              got[1] == 2 && got[2] == 4,
          "the failed batch's envs are ready, in order");
    harness_free(&h);
    envd_engine_destroy(e);
}

/* ---- a close while a recv waits; settle ---------------------------------------------- */
static void test_close_and_settle(envd_pool_t *pool1)
{
    g_def = envd_builtin_cartpole;
    g_def.step = test_step;
    envd_engine_t *e = NULL;
    CHECK(envd_engine_create(&e) == ENVD_OK, "engine");
    int64_t ids[4] = {0, 1, 2, 3}, got[4];
    envd_completion_t c;

    harness_t h;
    harness_init(&h, &g_def, 4, pool1, 1);
    gate(1);
    CHECK(envd_engine_send(e, h.s, ids, 4, ENVD_JOB_NOTIFY, &c) == ENVD_OK, "send");
    gate_wait_started();
    envd_request_t req = {.kind = ENVD_REQ_RECV, .min_count = 4, .max_count = 4, .out = got,
                          .tag = 1};
    CHECK(envd_engine_submit(e, h.s, &req, &c) == 0, "the recv waits");
    CHECK(envd_engine_forget(e, h.s) == 1 && envd_engine_forget(e, h.s) == 0, "forget once");
    CHECK(envd_engine_waiting(e, 0) == 0, "nothing waits");
    pthread_t releaser;
    CHECK(pthread_create(&releaser, NULL, gate_release_later, NULL) == 0, "pthread_create");
    harness_free(&h); /* waits for the held batch */
    pthread_join(releaser, NULL);
    CHECK(envd_engine_poll(e, &c, 1) == 0, "no completion of a forgotten request");

    harness_init(&h, &g_def, 4, pool1, 1);
    envd_request_t settle = {.kind = ENVD_REQ_SETTLE, .tag = 2};
    CHECK(envd_engine_submit(e, h.s, &settle, &c) == 1 && c.result == ENVD_OK,
          "nothing in flight: settled at once");
    gate(1);
    CHECK(envd_engine_send(e, h.s, ids, 2, ENVD_JOB_NOTIFY, &c) == ENVD_OK, "send");
    gate_wait_started();
    CHECK(envd_engine_submit(e, h.s, &settle, &c) == 0, "settle waits");
    CHECK(envd_engine_waiting(e, ENVD_REQ_SETTLE) == 1 && envd_engine_waiting(e, 0) == 1,
          "one settle waits");
    CHECK(envd_engine_submit(e, h.s, &req, &c) == ENVD_EBUSY, "one request per session");
    atomic_store(&g_gate_release, 1);
    poll_for(e, 2, &c);
    CHECK(c.kind == ENVD_REQ_SETTLE && c.result == ENVD_OK, "settled");
    gate(0);
    harness_free(&h);
    envd_engine_destroy(e);
}

/* ---- refusals ------------------------------------------------------------------------ */
static void test_refusals(envd_pool_t *pool1)
{
    harness_t h;
    harness_init(&h, &envd_builtin_cartpole, 4, pool1, 1);
    envd_engine_t *e = NULL;
    CHECK(envd_engine_create(&e) == ENVD_OK, "engine");
    int64_t ids[4] = {0, 1, 2, 3}, got[4];
    envd_completion_t c;
    envd_request_t bad = {.kind = ENVD_REQ_RECV, .min_count = 2, .max_count = 1, .out = got};
    CHECK(envd_engine_submit(e, h.s, &bad, &c) == ENVD_EINVAL, "max < min");
    bad.max_count = 5;
    CHECK(envd_engine_submit(e, h.s, &bad, &c) == ENVD_EINVAL, "max > num_envs");
    bad.max_count = 2;
    bad.out = NULL;
    CHECK(envd_engine_submit(e, h.s, &bad, &c) == ENVD_EINVAL, "no out");
    bad.kind = 99;
    CHECK(envd_engine_submit(e, h.s, &bad, &c) == ENVD_EINVAL, "unknown kind");
    envd_request_t recv = {.kind = ENVD_REQ_RECV, .min_count = 1, .max_count = 1, .out = got,
                           .tag = 5};
    CHECK(envd_engine_submit(e, h.s, &recv, &c) == 1 && c.result == ENVD_ESTATE &&
              c.error_index == -1 && c.tag == 5,
          "a recv with nothing out: ESTATE at once");
    CHECK(envd_engine_send(e, h.s, ids, 2, 0, &c) == ENVD_OK, "send");
    envd_request_t step = {.kind = ENVD_REQ_STEP, .tag = 6};
    CHECK(envd_engine_submit(e, h.s, &step, &c) == 1 && c.refused && c.result == ENVD_EBUSY,
          "a step while envs are out: refused at once");
    recv.min_count = recv.max_count = 3;
    CHECK(envd_engine_submit(e, h.s, &recv, &c) == 1 && c.result == ENVD_ESTATE,
          "a recv of more than is out");
    recv.min_count = recv.max_count = 2;
    recv.tag = 9;
    const int rc = envd_engine_submit(e, h.s, &recv, &c);
    CHECK(rc == 0 || rc == 1, "recv: %d", rc);
    if (rc == 0) /* (it waits for the pool's thread) */
        poll_for(e, 9, &c);
    CHECK(c.result == 2 && got[0] == 0 && got[1] == 1, "recv of the two sent");
    CHECK(envd_engine_send(e, h.s, ids, 1, 0, &c) == ENVD_OK, "send env 0");
    CHECK(envd_engine_send(e, h.s, ids, 1, 0, &c) == ENVD_EBUSY && c.kind == 0 &&
              envd_session_error_index(h.s) == 0,
          "a refused send names its env and completes nothing");
    CHECK(envd_engine_waiting(e, 0) == 0, "nothing waits");
    harness_free(&h);
    envd_engine_destroy(e);
    envd_engine_destroy(NULL);
}

/* ---- two front doors on one session: the loop's submit and a blocking call ---------- */
/* A blocking front door's request (the doorbell thread's): envd_engine_call
 * with the session's lock held around it, as doorbell.c does. */
static envd_completion_t call(envd_session_t *s, envd_request_t req)
{
    envd_completion_t c;
    memset(&c, 0xab, sizeof c);
    envd_session_lock(s);
    CHECK(envd_engine_call(s, &req, &c) == 1, "call kind %d", req.kind);
    envd_session_unlock(s);
    return c;
}

static void test_front_door_rules(envd_pool_t *pool1)
{
    g_def = envd_builtin_cartpole;
    g_def.step = test_step;
    harness_t h;
    harness_init(&h, &g_def, 4, pool1, 1);
    envd_engine_t *e = NULL;
    CHECK(envd_engine_create(&e) == ENVD_OK, "engine");
    int64_t ids[4] = {0, 1, 2, 3}, got[4];
    envd_completion_t c;
    const envd_request_t step = {.kind = ENVD_REQ_STEP, .tag = 11};

    /* The loop's recv waits: the other door's step and recv are refused, its
     * send is served beside it (and its batch writes the eventfd). */
    gate(1);
    CHECK(envd_engine_send(e, h.s, ids, 2, ENVD_JOB_NOTIFY, &c) == ENVD_OK, "send");
    gate_wait_started();
    envd_request_t recv = {.kind = ENVD_REQ_RECV, .min_count = 2, .max_count = 2, .out = got,
                           .tag = 1};
    CHECK(envd_engine_submit(e, h.s, &recv, &c) == 0, "the loop's recv waits");
    const int64_t steps = envd_session_steps(h.s);
    c = call(h.s, step);
    CHECK(c.result == ENVD_EBUSY && c.refused && c.error_index == -1 && c.tag == 11 &&
              c.kind == ENVD_REQ_STEP,
          "a step beside the loop's recv: %lld refused %d index %lld", (long long)c.result,
          c.refused, (long long)c.error_index);
    CHECK(envd_session_steps(h.s) == steps, "the refused step stepped");
    c = call(h.s, (envd_request_t){.kind = ENVD_REQ_RECV, .min_count = 1, .max_count = 1,
                                   .out = got + 2, .tag = 12});
    CHECK(c.result == ENVD_EBUSY && c.refused && c.error_index == -1, "a second recv");
    pthread_t releaser;
    CHECK(pthread_create(&releaser, NULL, gate_release_later, NULL) == 0, "pthread_create");
    c = call(h.s, (envd_request_t){.kind = ENVD_REQ_SEND, .ids = ids + 2, .max_count = 1,
                                   .flags = ENVD_JOB_HELPED, .tag = 13});
    CHECK(c.result == ENVD_OK && !c.refused && c.error_index == -1 && c.tag == 13,
          "a send beside the loop's recv: %lld", (long long)c.result);
    pthread_join(releaser, NULL);
    poll_for(e, 1, &c);
    CHECK(c.result == 2, "the loop's recv: %lld", (long long)c.result);
    gate(0);
    c = call(h.s, (envd_request_t){.kind = ENVD_REQ_RECV, .min_count = 1, .max_count = 1,
                                   .out = got + 2, .tag = 14});
    /* (the send's batch may have run inline, ahead of the held one: any order) */
    CHECK(c.result == 1 && (1 << got[0] | 1 << got[1] | 1 << got[2]) == 7,
          "each env sent by either door came back once: %lld %lld %lld", (long long)got[0],
          (long long)got[1], (long long)got[2]);

    /* A settle waits: every request of the other door is refused, a send too
     * (beside a request that is not a recv), and the loop's own send. */
    gate(1);
    CHECK(envd_engine_send(e, h.s, ids, 1, ENVD_JOB_NOTIFY, &c) == ENVD_OK, "send");
    gate_wait_started();
    const envd_request_t settle = {.kind = ENVD_REQ_SETTLE, .tag = 2};
    CHECK(envd_engine_submit(e, h.s, &settle, &c) == 0, "settle waits");
    c = call(h.s, (envd_request_t){.kind = ENVD_REQ_SEND, .ids = ids + 1, .max_count = 1,
                                   .tag = 15});
    CHECK(c.result == ENVD_EBUSY && c.refused && c.error_index == -1, "a send beside a settle");
    CHECK(envd_session_env_state(h.s, 1) == ENVD_ENV_IDLE, "the refused send took env 1");
    CHECK(envd_engine_send(e, h.s, ids + 1, 1, ENVD_JOB_NOTIFY, &c) == ENVD_EBUSY &&
              c.kind == 0 && c.error_index == -1,
          "the loop's send beside its settle");
    c = call(h.s, step);
    CHECK(c.result == ENVD_EBUSY && c.refused, "a step beside a settle");
    atomic_store(&g_gate_release, 1);
    poll_for(e, 2, &c);
    gate(0);
    c = call(h.s, (envd_request_t){.kind = ENVD_REQ_RECV, .min_count = 1, .max_count = 1,
                                   .out = got, .tag = 16});
    CHECK(c.result == 1 && got[0] == 0, "env 0 back");
    c = call(h.s, step);
    CHECK(c.result >= 0 && !c.refused && envd_session_steps(h.s) == steps + 1,
          "nothing waits: the other door's step runs");
    envd_session_lock(h.s);
    CHECK(envd_engine_call(h.s, &settle, &c) == ENVD_EINVAL, "a settle is the loop's only");
    envd_session_unlock(h.s);

    /* The other way: the other door's recv claimed across a gap in its lock
     * (a doorbell's SENDRECV helping its batch): the loop's requests are
     * refused (nothing submitted), its send is served beside it. */
    CHECK(envd_session_claim(h.s, ENVD_REQ_RECV) == ENVD_OK, "claim");
    CHECK(envd_session_claim(h.s, ENVD_REQ_STEP) == ENVD_EBUSY, "one claim at a time");
    CHECK(envd_engine_submit(e, h.s, &step, &c) == ENVD_EBUSY && envd_engine_waiting(e, 0) == 0,
          "the loop's step beside the other door's recv");
    CHECK(envd_session_steps(h.s) == steps + 1, "the refused step stepped");
    recv.tag = 3;
    CHECK(envd_engine_submit(e, h.s, &recv, &c) == ENVD_EBUSY, "the loop's recv beside it");
    CHECK(envd_engine_send(e, h.s, ids + 3, 1, ENVD_JOB_NOTIFY, &c) == ENVD_OK && c.kind == 0,
          "the loop's send beside the other door's recv");
    envd_session_release(h.s);
    c = call(h.s, (envd_request_t){.kind = ENVD_REQ_RECV, .min_count = 1, .max_count = 1,
                                   .out = got, .tag = 17});
    CHECK(c.result == 1 && got[0] == 3, "the other door's recv takes the loop's send");
    CHECK(envd_session_claimed(h.s) == 0, "released");
    harness_free(&h);
    envd_engine_destroy(e);
}

/* The other door (the doorbell thread's part): whole steps through
 * envd_engine_call until told to stop, counting those run and refused. */
typedef struct door {
    envd_session_t *s;
    _Atomic int stop;
    int64_t ran, refused;
} door_t;

static void *door_main(void *arg)
{
    door_t *d = arg;
    while (!atomic_load(&d->stop)) {
        const envd_completion_t c = call(d->s, (envd_request_t){.kind = ENVD_REQ_STEP});
        CHECK(c.kind == ENVD_REQ_STEP && (c.result >= 0 || c.result == ENVD_EBUSY),
              "the door's step: %lld", (long long)c.result);
        if (c.result >= 0)
            d->ran++;
        else
            d->refused++;
        if ((d->ran + d->refused) % 8 == 0)
            sched_yield();
    }
    return NULL;
}

/* The loop's steps, sends and recvs race the other door's steps on one
 * session: each request of either door is answered once, a refused one
 * steps nothing (the session's steps count exactly the steps run), the
 * loop's own requests are never refused for the other door's (which holds
 * the session's lock for all of its request: they are served in turn), and
 * every env comes back. */
static void test_front_door_race(envd_pool_t *pool, int rounds)
{
    harness_t h;
    harness_init(&h, &envd_builtin_cartpole, 16, pool, 4);
    envd_engine_t *e = NULL;
    CHECK(envd_engine_create(&e) == ENVD_OK, "engine");
    door_t d = {.s = h.s};
    pthread_t door;
    CHECK(pthread_create(&door, NULL, door_main, &d) == 0, "pthread_create");
    int64_t ids[16], got[16], loop_steps = 0, received = 0, sent = 0;
    for (int64_t i = 0; i < 16; i++)
        ids[i] = i;
    envd_completion_t c;
    for (int r = 0; r < rounds; r++) {
        if (r % 4 == 0)  /* (a gap with no request of the loop: the door's turn) */
            nanosleep(&(struct timespec){0, 50000}, NULL);
        if (r % 3 != 2) {
            const envd_request_t step = {.kind = ENVD_REQ_STEP, .tag = (uint64_t)r};
            const int rc = envd_engine_submit(e, h.s, &step, &c);
            CHECK(rc == 0 || rc == 1, "the loop's step: %d", rc);
            if (rc == 0)
                poll_for(e, (uint64_t)r, &c);
            CHECK(c.tag == (uint64_t)r && c.result >= 0 && !c.refused,
                  "the loop's step refused: %lld", (long long)c.result);
            loop_steps++;
            continue;
        }
        const int64_t k = 1 + r % 16;
        CHECK(envd_engine_send(e, h.s, ids, k, ENVD_JOB_NOTIFY, &c) == ENVD_OK, "send");
        sent += k;
        const envd_request_t recv = {.kind = ENVD_REQ_RECV, .min_count = k, .max_count = k,
                                     .out = got, .tag = (uint64_t)r};
        const int rc = envd_engine_submit(e, h.s, &recv, &c);
        CHECK(rc == 0 || rc == 1, "the loop's recv: %d", rc);
        if (rc == 0)
            poll_for(e, (uint64_t)r, &c);
        CHECK(c.result == k, "the loop's recv: %lld of %lld", (long long)c.result, (long long)k);
        received += k;
    }
    atomic_store(&d.stop, 1);
    pthread_join(door, NULL);
    CHECK(received == sent, "every env back");
    CHECK(d.ran > 0, "the door never ran a step in the loop's gaps (refused %lld)",
          (long long)d.refused);
    CHECK(envd_session_steps(h.s) == loop_steps + d.ran,
          "steps %lld, want the loop's %lld and the door's %lld",
          (long long)envd_session_steps(h.s), (long long)loop_steps, (long long)d.ran);
    CHECK(envd_engine_waiting(e, 0) == 0 && envd_session_claimed(h.s) == 0, "nothing waits");
    printf("engine_stress: front doors: the door ran %lld, refused %lld; the loop %lld steps\n",
           (long long)d.ran, (long long)d.refused, (long long)loop_steps);
    harness_free(&h);
    envd_engine_destroy(e);
}

/* ---- the third front door: the in-process calls -------------------------------------- */
/* Whether the pool's eventfd is readable within a deadline (a batch sent with
 * ENVD_JOB_NOTIFY ended); then drained. */
static int eventfd_fired(envd_pool_t *pool)
{
    struct pollfd p = {.fd = envd_pool_eventfd(pool), .events = POLLIN};
    if (poll(&p, 1, 60000) != 1)
        return 0;
    uint64_t count;
    return read(p.fd, &count, sizeof count) == (ssize_t)sizeof count;
}

static void drain_eventfd(envd_pool_t *pool)
{
    struct pollfd p = {.fd = envd_pool_eventfd(pool), .events = POLLIN};
    uint64_t count;
    while (poll(&p, 1, 0) == 1)
        CHECK(read(p.fd, &count, sizeof count) == (ssize_t)sizeof count, "drain the eventfd");
}

/* The loop's recv (tag 1) of the count envs ids it sent (with flags),
 * waiting in the engine while their batch is held at the gate on the
 * pool's thread. */
static void park_loop_recv(envd_engine_t *e, harness_t *h, int64_t *ids, int64_t count,
                           int flags, int64_t *got, envd_completion_t *c)
{
    gate(1);
    CHECK(envd_engine_send(e, h->s, ids, count, flags, c) == ENVD_OK, "the loop's send");
    gate_wait_started();
    const envd_request_t recv = {.kind = ENVD_REQ_RECV, .min_count = count, .max_count = count,
                                 .out = got, .tag = 1};
    CHECK(envd_engine_submit(e, h->s, &recv, c) == 0, "the loop's recv waits");
}

/* The in-process calls (envd_session_step, _send, _recv with and without
 * wait: the in-process VecEnv's) decided by the rule of the other doors:
 * beside the loop's waiting recv, or a doorbell's claimed recv, a step and a
 * recv are refused (ENVD_EBUSY, nothing stepped or taken, no env named) and a
 * send is served, its batch writing the pool's eventfd for the loop; beside a
 * settle a send is refused too. */
static void test_in_process_rules(envd_pool_t *pool1)
{
    g_def = envd_builtin_cartpole;
    g_def.step = test_step;
    harness_t h;
    harness_init(&h, &g_def, 4, pool1, 1);
    envd_engine_t *e = NULL;
    CHECK(envd_engine_create(&e) == ENVD_OK, "engine");
    int64_t ids[4] = {0, 1, 2, 3}, got[4];
    envd_completion_t c;
    const int64_t steps = envd_session_steps(h.s);

    /* (the loop's send without ENVD_JOB_NOTIFY, polled: the eventfd written
     * below is the in-process send's) */
    park_loop_recv(e, &h, ids, 2, 0, got, &c);
    CHECK(envd_session_send(h.s, ids, 1, 0) == ENVD_EBUSY && envd_session_error_index(h.s) == 0,
          "an in-process send of an env in flight: admitted beside the recv, refused naming it");
    CHECK(envd_session_step(h.s) == ENVD_EBUSY && envd_session_error_index(h.s) == -1,
          "an in-process step beside the loop's recv (naming no env)");
    CHECK(envd_session_steps(h.s) == steps, "the refused step stepped");
    CHECK(envd_session_recv(h.s, 1, 1, got + 2, 1) == ENVD_EBUSY &&
              envd_session_error_index(h.s) == -1,
          "an in-process recv beside the loop's recv (it would wait for the loop's envs)");
    CHECK(envd_session_recv(h.s, 1, 1, got + 2, 0) == ENVD_EBUSY, "an in-process try_recv");
    drain_eventfd(pool1);
    /* (the gate held: the batch of env 2 waits behind the held one on the
     * pool's one thread -- the harness forces chunks, no batch runs inline
     * -- and the recv's two ids are the loop's to find) */
    pthread_t releaser;
    CHECK(pthread_create(&releaser, NULL, gate_release_later, NULL) == 0, "pthread_create");
    CHECK(envd_session_send(h.s, ids + 2, 1, 0) == ENVD_OK,
          "an in-process send beside the loop's recv is served");
    CHECK(envd_session_env_state(h.s, 2) != ENVD_ENV_IDLE, "env 2 went");
    pthread_join(releaser, NULL);
    CHECK(eventfd_fired(pool1), "the in-process send's batch wrote the eventfd for the loop");
    poll_for(e, 1, &c);
    CHECK(c.result == 2, "the loop's recv: %lld", (long long)c.result);
    gate(0);
    CHECK(envd_session_recv(h.s, 1, 1, got + 2, 1) == 1, "the in-process recv once free");
    CHECK((1 << got[0] | 1 << got[1] | 1 << got[2]) == 7,
          "each env sent by either door came back once: %lld %lld %lld", (long long)got[0],
          (long long)got[1], (long long)got[2]);

    /* Beside a settle every in-process request is refused, sends too. */
    gate(1);
    CHECK(envd_engine_send(e, h.s, ids, 1, ENVD_JOB_NOTIFY, &c) == ENVD_OK, "send");
    gate_wait_started();
    const envd_request_t settle = {.kind = ENVD_REQ_SETTLE, .tag = 2};
    CHECK(envd_engine_submit(e, h.s, &settle, &c) == 0, "settle waits");
    CHECK(envd_session_send(h.s, ids + 1, 1, 0) == ENVD_EBUSY &&
              envd_session_error_index(h.s) == -1 &&
              envd_session_env_state(h.s, 1) == ENVD_ENV_IDLE,
          "an in-process send beside a settle: refused, env 1 not taken");
    CHECK(envd_session_step(h.s) == ENVD_EBUSY, "an in-process step beside a settle");
    atomic_store(&g_gate_release, 1);
    poll_for(e, 2, &c);
    gate(0);
    CHECK(envd_session_recv(h.s, 1, 1, got, 0) == 1 && got[0] == 0, "env 0 back");
    CHECK(envd_session_step(h.s) >= 0 && envd_session_steps(h.s) == steps + 1,
          "nothing waits: the in-process step runs");

    /* Beside a doorbell's claimed recv (a SENDRECV helping its batch). */
    CHECK(envd_session_claim(h.s, ENVD_REQ_RECV) == ENVD_OK, "claim");
    CHECK(envd_session_step(h.s) == ENVD_EBUSY && envd_session_steps(h.s) == steps + 1,
          "an in-process step beside the doorbell's recv");
    CHECK(envd_session_send(h.s, ids + 3, 1, 0) == ENVD_OK, "an in-process send beside it");
    CHECK(envd_session_recv(h.s, 1, 1, got, 1) == ENVD_EBUSY &&
              envd_session_env_state(h.s, 3) != ENVD_ENV_IDLE,
          "an in-process recv beside it: refused, env 3 not taken");
    envd_session_release(h.s);
    CHECK(envd_session_recv(h.s, 1, 1, got, 1) == 1 && got[0] == 3, "env 3 back");
    CHECK(envd_engine_waiting(e, 0) == 0 && envd_session_claimed(h.s) == 0, "nothing waits");
    harness_free(&h);
    envd_engine_destroy(e);
}

/* An in-process thread (the VecEnv's: sends, blocking recvs of its own sends,
 * whole steps) racing the loop's steps and the doorbell thread's steps on one
 * session: every call of each door is answered once (a recv with exactly the
 * ids its own send took, as the only sender), a refusal steps nothing (the
 * session's steps count exactly those run), and every env comes back. */
typedef struct in_process {
    envd_session_t *s;
    int rounds;
    int64_t ran, refused, sent, received;
} in_process_t;

static void *in_process_main(void *arg)
{
    in_process_t *p = arg;
    int64_t ids[16], got[16];
    for (int64_t i = 0; i < 16; i++)
        ids[i] = 15 - i;
    for (int r = 0; r < p->rounds; r++) {
        /* (the lock held around a call and its error index: other doors'
         * requests set the session's index too, session.h) */
        if (r % 2 == 0) {
            envd_session_lock(p->s);
            const int rc = envd_session_step(p->s);
            const int64_t index = envd_session_error_index(p->s);
            envd_session_unlock(p->s);
            CHECK(rc >= 0 || (rc == ENVD_EBUSY && index == -1), "the in-process step: %d", rc);
            if (rc >= 0)
                p->ran++;
            else
                p->refused++;
            continue;
        }
        const int64_t k = 1 + r % 16;
        int rc;
        for (;;) {
            envd_session_lock(p->s);
            rc = envd_session_send(p->s, ids, k, 0);
            const int64_t index = envd_session_error_index(p->s);
            envd_session_unlock(p->s);
            if (rc != ENVD_EBUSY)
                break;
            /* (beside the loop's step, which holds the session's request) */
            CHECK(index == -1, "a refused send named env %lld", (long long)index);
            p->refused++;
            sched_yield();
        }
        CHECK(rc == ENVD_OK, "the in-process send: %d", rc);
        p->sent += k;
        int64_t n;
        while ((n = envd_session_recv(p->s, k, k, got, r % 4 == 1)) == 0 || n == ENVD_EBUSY)
            sched_yield();
        CHECK(n == k, "the in-process recv: %lld of %lld", (long long)n, (long long)k);
        int64_t seen = 0;
        for (int64_t j = 0; j < k; j++) {
            CHECK(got[j] >= 16 - k && got[j] < 16 && !(seen & 1ll << got[j]),
                  "the in-process recv returned env %lld, not one of its send",
                  (long long)got[j]);
            seen |= 1ll << got[j];
        }
        p->received += k;
    }
    return NULL;
}

static void test_in_process_race(envd_pool_t *pool, int rounds)
{
    harness_t h;
    harness_init(&h, &envd_builtin_cartpole, 16, pool, 4);
    envd_engine_t *e = NULL;
    CHECK(envd_engine_create(&e) == ENVD_OK, "engine");
    door_t d = {.s = h.s};
    in_process_t p = {.s = h.s, .rounds = rounds};
    pthread_t door, in_process;
    CHECK(pthread_create(&door, NULL, door_main, &d) == 0, "pthread_create");
    CHECK(pthread_create(&in_process, NULL, in_process_main, &p) == 0, "pthread_create");
    int64_t loop_ran = 0, loop_refused = 0;
    envd_completion_t c;
    for (int r = 0; r < rounds; r++) {
        if (r % 4 == 0)
            nanosleep(&(struct timespec){0, 50000}, NULL);
        const envd_request_t step = {.kind = ENVD_REQ_STEP, .tag = (uint64_t)r};
        const int rc = envd_engine_submit(e, h.s, &step, &c);
        CHECK(rc == 0 || rc == 1, "the loop's step: %d", rc);
        if (rc == 0)
            poll_for(e, (uint64_t)r, &c);
        CHECK(c.tag == (uint64_t)r, "the loop's step answered once");
        if (c.result >= 0) {
            loop_ran++;
        } else {
            /* (the in-process envs out: refused before it started) */
            CHECK(c.result == ENVD_EBUSY && c.refused, "the loop's step: %lld",
                  (long long)c.result);
            loop_refused++;
        }
    }
    pthread_join(in_process, NULL);
    atomic_store(&d.stop, 1);
    pthread_join(door, NULL);
    CHECK(p.received == p.sent, "every env back");
    CHECK(envd_session_steps(h.s) == loop_ran + d.ran + p.ran,
          "steps %lld, want the loop's %lld, the door's %lld and the in-process %lld",
          (long long)envd_session_steps(h.s), (long long)loop_ran, (long long)d.ran,
          (long long)p.ran);
    int64_t in_flight = -1, ready = -1;
    envd_session_counts(h.s, &in_flight, &ready);
    CHECK(in_flight == 0 && ready == 0, "envs left out: %lld %lld", (long long)in_flight,
          (long long)ready);
    CHECK(envd_engine_waiting(e, 0) == 0 && envd_session_claimed(h.s) == 0, "nothing waits");
    printf("engine_stress: in-process door: ran %lld, refused %lld, %lld envs; the loop ran "
           "%lld, refused %lld; the doorbell's ran %lld, refused %lld\n",
           (long long)p.ran, (long long)p.refused, (long long)p.received, (long long)loop_ran,
           (long long)loop_refused, (long long)d.ran, (long long)d.refused);
    harness_free(&h);
    envd_engine_destroy(e);
}

/* A close while an in-process recv waits (the daemon's closing of a session:
 * its server stopped, what is out dropped, envd_session_stop_server): the
 * close waits for the recv (the session's lock), which is answered once with
 * its envs; then nothing is out. */
typedef struct waiter {
    envd_session_t *s;
    int64_t got[4];
    _Atomic int64_t result;
    _Atomic int started;
} waiter_t;

static void *waiter_main(void *arg)
{
    waiter_t *w = arg;
    atomic_store(&w->started, 1);
    atomic_store(&w->result, envd_session_recv(w->s, 2, 2, w->got, 1));
    return NULL;
}

static _Atomic int g_stops;

static void stop_dropping(void *server)
{
    atomic_fetch_add(&g_stops, 1);
    envd_session_drop_async(server);
}

static void drain_nothing(void *server) { (void)server; }

typedef struct closer {
    envd_session_t *s;
    _Atomic int done;
} closer_t;

static void *closer_main(void *arg)
{
    closer_t *cl = arg;
    envd_session_stop_server(cl->s);
    atomic_store(&cl->done, 1);
    return NULL;
}

static void test_close_while_in_process_waits(envd_pool_t *pool1)
{
    g_def = envd_builtin_cartpole;
    g_def.step = test_step;
    harness_t h;
    harness_init(&h, &g_def, 4, pool1, 1);
    static const envd_session_server_ops_t ops = {.stop = stop_dropping, .drain = drain_nothing};
    CHECK(envd_session_attach_server(h.s, &ops, h.s) == ENVD_OK, "attach");
    int64_t ids[4] = {0, 1, 2, 3};
    gate(1);
    CHECK(envd_session_send(h.s, ids, 2, 0) == ENVD_OK && envd_session_send(h.s, ids + 2, 2, 0) ==
                                                               ENVD_OK,
          "two sends");
    gate_wait_started();
    waiter_t w = {.s = h.s, .result = 1};
    pthread_t waiter, closer;
    CHECK(pthread_create(&waiter, NULL, waiter_main, &w) == 0, "pthread_create");
    while (!atomic_load(&w.started))
        sched_yield();
    /* (the recv holds the session's lock while it waits: the close starts
     * while it waits, or before it if this thread runs first -- both are a
     * close racing the in-process recv) */
    nanosleep(&(struct timespec){0, 2000000}, NULL);
    closer_t cl = {.s = h.s};
    atomic_store(&g_stops, 0);
    CHECK(pthread_create(&closer, NULL, closer_main, &cl) == 0, "pthread_create");
    nanosleep(&(struct timespec){0, 2000000}, NULL);
    CHECK(atomic_load(&w.result) == 1, "the recv returned while its batch is held");
    atomic_store(&g_gate_release, 1);
    pthread_join(waiter, NULL);
    pthread_join(closer, NULL);
    gate(0);
    const int64_t got = atomic_load(&w.result);
    CHECK(got == 2 || got == ENVD_ESTATE,
          "the in-process recv: %lld (its envs, or none left once closed)", (long long)got);
    if (got == 2)
        CHECK((w.got[0] == 0 && w.got[1] == 1) || (w.got[0] == 2 && w.got[1] == 3),
              "the recv returned one send's envs: %lld %lld", (long long)w.got[0],
              (long long)w.got[1]);
    CHECK(atomic_load(&cl.done) && atomic_load(&g_stops) == 1 && !envd_session_has_server(h.s),
          "the close stopped the server once");
    int64_t in_flight = -1, ready = -1;
    envd_session_counts(h.s, &in_flight, &ready);
    CHECK(in_flight == 0 && ready == 0, "left out after the close: %lld %lld",
          (long long)in_flight, (long long)ready);
    harness_free(&h);
}

/* ---- the whole-vec calls decided by the same rule ------------------------------------ */
/* A whole-vec call made on a thread of its own (the in-process VecEnv's, or
 * the daemon's executor: another front door than the claimed request's). */
typedef struct whole_call {
    envd_session_t *s;
    int which;           /* WHOLE_* */
    uint8_t *frames;     /* render's */
    int rc;
    int64_t index;       /* envd_session_error_index right after the call */
} whole_call_t;

enum { WHOLE_RESET, WHOLE_ASYNC_RESET, WHOLE_RENDER, WHOLE_SEED, WHOLE_CALLS };
static const char *const WHOLE_NAMES[] = {"reset", "async_reset", "render", "seed"};

static void *whole_call_main(void *arg)
{
    whole_call_t *w = arg;
    static const uint64_t seeds[4] = {7, 8, 9, 10};
    envd_session_lock(w->s); /* (around the call and its error index) */
    switch (w->which) {
    case WHOLE_RESET:
        w->rc = envd_session_reset(w->s, NULL, NULL);
        break;
    case WHOLE_ASYNC_RESET:
        w->rc = envd_session_async_reset(w->s, NULL);
        break;
    case WHOLE_RENDER:
        w->rc = envd_session_render(w->s, w->frames);
        break;
    default:
        w->rc = envd_session_seed(w->s, seeds);
        break;
    }
    w->index = envd_session_error_index(w->s);
    envd_session_unlock(w->s);
    return NULL;
}

static int whole_call(envd_session_t *s, int which, uint8_t *frames, int64_t *index)
{
    whole_call_t w = {.s = s, .which = which, .frames = frames};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, whole_call_main, &w) == 0, "pthread_create");
    /* (a deadline: a call the rule fails to refuse may wait for the batch
     * held at the gate, which this thread releases only later: a failure,
     * not a hang) */
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 120;
    CHECK(pthread_timedjoin_np(t, NULL, &deadline) == 0, "%s never returned (waits beside a "
          "claimed request instead of being refused)", WHOLE_NAMES[which]);
    *index = w.index;
    return w.rc;
}

/* Every whole-vec call is refused ENVD_EBUSY (no env named) and changes
 * nothing: each env's state is still want[i]. */
static void check_whole_refused(harness_t *h, uint8_t *frames, const int8_t *want,
                                const char *beside)
{
    for (int which = 0; which < WHOLE_CALLS; which++) {
        int64_t index = 0;
        const int rc = whole_call(h->s, which, frames, &index);
        CHECK(rc == ENVD_EBUSY && index == -1, "%s beside %s: %d (index %lld)",
              WHOLE_NAMES[which], beside, rc, (long long)index);
        for (int64_t i = 0; i < h->n; i++)
            CHECK(envd_session_env_state(h->s, i) == want[i],
                  "%s beside %s changed env %lld's state: %d, want %d", WHOLE_NAMES[which],
                  beside, (long long)i, envd_session_env_state(h->s, i), want[i]);
    }
}

/* The whole-vec calls (reset, async_reset, render, seed) ask the rule of the
 * requests: beside the loop's waiting recv (its batch in flight, then done
 * but not yet looked at) and beside a doorbell's claimed recv (nothing out),
 * each made on another thread is refused ENVD_EBUSY naming no env, the
 * books intact; the waiting recv then completes with its envs, and once
 * nothing is claimed every call runs. */
static void test_whole_vec_rules(envd_pool_t *pool1)
{
    g_def = envd_builtin_cartpole;
    g_def.step = test_step;
    harness_t h;
    harness_init(&h, &g_def, 4, pool1, 1);
    const uint64_t frame = envd_session_frame_bytes(h.s);
    CHECK(frame > 0, "cartpole renders");
    uint8_t *frames = xcalloc(4, frame);
    envd_engine_t *e = NULL;
    CHECK(envd_engine_create(&e) == ENVD_OK, "engine");
    int64_t ids[4] = {0, 1, 2, 3}, got[4], index;
    envd_completion_t c;

    /* The loop's recv waits for its batch, held in flight. */
    park_loop_recv(e, &h, ids, 2, ENVD_JOB_NOTIFY, got, &c);
    const int8_t in_flight[4] = {ENVD_ENV_IN_FLIGHT, ENVD_ENV_IN_FLIGHT, ENVD_ENV_IDLE,
                                 ENVD_ENV_IDLE};
    check_whole_refused(&h, frames, in_flight, "the loop's recv, its batch in flight");
    /* Its batch ends; the loop has not looked yet (no poll): its envs are
     * ready, and still the recv's. */
    atomic_store(&g_gate_release, 1);
    const double deadline = now_s() + 60.0;
    for (int64_t flying = 1, done = 0; flying > 0 || done < 2;) {
        envd_session_counts(h.s, &flying, &done);
        CHECK(now_s() < deadline, "the held batch never ended");
        sched_yield();
    }
    gate(0);
    const int8_t ready[4] = {ENVD_ENV_READY, ENVD_ENV_READY, ENVD_ENV_IDLE, ENVD_ENV_IDLE};
    check_whole_refused(&h, frames, ready, "the loop's recv, its envs ready");
    poll_for(e, 1, &c);
    CHECK(c.kind == ENVD_REQ_RECV && c.result == 2 && got[0] == 0 && got[1] == 1,
          "the loop's recv completes with its envs: %lld (%lld %lld)", (long long)c.result,
          (long long)got[0], (long long)got[1]);
    /* (its batch's own event, which the pool thread writes after the done
     * flag the recv saw: taken here, so that no later check reads it) */
    CHECK(eventfd_fired(pool1), "the loop's batch wrote the eventfd");

    /* A doorbell's claimed recv (its SENDRECV helping a batch), nothing out. */
    CHECK(envd_session_claim(h.s, ENVD_REQ_RECV) == ENVD_OK, "claim");
    const int8_t idle[4] = {ENVD_ENV_IDLE, ENVD_ENV_IDLE, ENVD_ENV_IDLE, ENVD_ENV_IDLE};
    check_whole_refused(&h, frames, idle, "a doorbell's claimed recv");
    CHECK(envd_session_claimed(h.s) == ENVD_REQ_RECV, "the claim kept");
    envd_session_release(h.s);

    /* Nothing claimed: every call runs (async_reset last: its envs are ready
     * then, which render refuses). */
    static const int order[WHOLE_CALLS] = {WHOLE_RESET, WHOLE_RENDER, WHOLE_SEED,
                                           WHOLE_ASYNC_RESET};
    for (int k = 0; k < WHOLE_CALLS; k++)
        CHECK(whole_call(h.s, order[k], frames, &index) == ENVD_OK, "%s with nothing claimed",
              WHOLE_NAMES[order[k]]);
    CHECK(envd_session_recv(h.s, 4, 4, got, 1) == 4, "the async reset's envs");
    CHECK(envd_session_reset(h.s, NULL, NULL) == ENVD_OK, "reset");
    CHECK(envd_engine_waiting(e, 0) == 0 && envd_session_claimed(h.s) == 0, "nothing waits");
    free(frames);
    harness_free(&h);
    envd_engine_destroy(e);
}

/* A send of another door beside the loop's waiting recv whose batch runs
 * inline (cheap, measured, no chunk forced) wrote no eventfd (a NOTIFY batch
 * on the pool writes it when it ends): the loop, waiting on the eventfd,
 * never looked at its recv, which those envs may complete.  The session
 * counts the event itself before the send returns. */
static void test_inline_notify(envd_pool_t *pool1)
{
    g_def = envd_builtin_cartpole;
    g_def.step = test_step;
    gate(0);
    harness_t h;
    harness_init(&h, &g_def, 4, pool1, 0);  /* (adaptive: cheap runs go inline) */
    for (int k = 0; k < 20; k++)
        CHECK(envd_session_step(h.s) >= 0, "a measuring step");
    envd_engine_t *e = NULL;
    CHECK(envd_engine_create(&e) == ENVD_OK, "engine");
    int64_t ids[4] = {0, 1, 2, 3}, got[4];
    envd_completion_t c;
    /* The loop's recv waits for env 0, held on the pool's thread. */
    envd_session_set_chunk(h.s, 1);
    park_loop_recv(e, &h, ids, 1, ENVD_JOB_NOTIFY, got, &c);
    atomic_store(&g_gate_armed, 0);  /* (env 0 stays held: its release is not given) */
    envd_session_set_chunk(h.s, 0);
    drain_eventfd(pool1);
    CHECK(envd_session_send(h.s, ids + 1, 1, 0) == ENVD_OK, "an in-process send beside it");
    CHECK(envd_session_env_state(h.s, 1) == ENVD_ENV_READY,
          "the cheap send's batch ran inline (the case under test)");
    struct pollfd p = {.fd = envd_pool_eventfd(pool1), .events = POLLIN};
    CHECK(poll(&p, 1, 0) == 1, "the inline batch beside the loop's recv wrote the eventfd");
    drain_eventfd(pool1);
    poll_for(e, 1, &c);
    CHECK(c.result == 1 && got[0] == 1, "the loop's recv took the inline batch's env: %lld %lld",
          (long long)c.result, (long long)got[0]);
    atomic_store(&g_gate_release, 1);
    CHECK(envd_session_recv(h.s, 1, 1, got, 1) == 1 && got[0] == 0, "env 0 back");
    /* (its batch's own event: the pool thread writes it after the done flag
     * the recv saw, so it may come after the recv) */
    CHECK(eventfd_fired(pool1), "the loop's batch wrote the eventfd");
    gate(0);
    /* Nothing claimed: an inline batch sent without NOTIFY writes nothing. */
    CHECK(envd_session_send(h.s, ids + 2, 1, 0) == ENVD_OK &&
              envd_session_env_state(h.s, 2) == ENVD_ENV_READY,
          "an inline send with nothing claimed");
    CHECK(poll(&p, 1, 0) == 0, "an inline batch with nothing claimed wrote the eventfd");
    CHECK(envd_session_recv(h.s, 1, 1, got, 1) == 1 && got[0] == 2, "env 2 back");
    harness_free(&h);
    envd_engine_destroy(e);
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
    for (size_t p = 0; p < COUNT(pools); p++)
        test_concurrent(pools[p], scaled(20000, 2000), 0x9e3779b97f4a7c15ull + p);
    printf("engine_stress: concurrent %.2f s\n", now_s() - t);
    test_failing_batch(pools[1]);
    test_close_and_settle(pools[1]);
    test_refusals(pools[1]);
    test_front_door_rules(pools[1]);
    for (size_t p = 0; p < COUNT(pools); p++)
        test_front_door_race(pools[p], scaled(3000, 300));
    test_in_process_rules(pools[1]);
    for (size_t p = 0; p < COUNT(pools); p++)
        test_in_process_race(pools[p], scaled(3000, 300));
    test_close_while_in_process_waits(pools[1]);
    test_whole_vec_rules(pools[1]);
    test_inline_notify(pools[1]);
    for (size_t i = 0; i < COUNT(pools); i++)
        envd_pool_destroy(pools[i]);
    printf("engine_stress: ok\n");
    return 0;
}
