/*
 * engine.c -- the request engine (see engine.h for the rules and threading).
 *
 * Invariants: waiting[0 .. count) holds one entry per session with a request
 * waiting (never two for a session: submit refuses it), each not done at its
 * last look; count <= capacity, and capacity grows by doubling from 16, so
 * it stays within max(16, twice the most requests that ever waited at once).
 */
#include "engine.h"

#include <stdlib.h>

#include "envd.h"

typedef struct waiting {
    envd_session_t *session;
    envd_request_t request;
} waiting_t;

struct envd_engine {
    waiting_t *waiting;
    int64_t count, capacity;
};

int envd_engine_create(envd_engine_t **out)
{
    envd_engine_t *e = calloc(1, sizeof *e);
    if (e == NULL)
        return ENVD_ENOMEM;
    *out = e;
    return ENVD_OK;
}

void envd_engine_destroy(envd_engine_t *e)
{
    if (e == NULL)
        return;
    free(e->waiting);
    free(e);
}

static void completion(envd_completion_t *done, envd_session_t *s, const envd_request_t *req,
                       int64_t result, int refused)
{
    done->tag = req->tag;
    done->kind = req->kind;
    done->refused = refused;
    done->result = result;
    done->error_index = result < 0 ? envd_session_error_index(s) : -1;
}

/* Whether the request is done now; if so *done is its completion.  Never
 * waits for a batch (the step was submitted already: STEP here only ends it). */
static int look(envd_session_t *s, const envd_request_t *req, envd_completion_t *done)
{
    switch (req->kind) {
    case ENVD_REQ_STEP:
        if (!envd_session_step_done(s))
            return 0;
        completion(done, s, req, envd_session_step_finish(s), 0);
        return 1;
    case ENVD_REQ_RECV: {
        const int64_t got = envd_session_recv_claimed(s, req->min_count, req->max_count, req->out);
        if (got == 0)
            return 0;
        completion(done, s, req, got, 0);
        return 1;
    }
    default: { /* ENVD_REQ_SETTLE */
        int64_t in_flight = 0;
        envd_session_counts(s, &in_flight, NULL);
        if (in_flight > 0)
            return 0;
        completion(done, s, req, ENVD_OK, 0);
        return 1;
    }
    }
}

static int64_t find(const envd_engine_t *e, const envd_session_t *s)
{
    for (int64_t k = 0; k < e->count; k++)
        if (e->waiting[k].session == s)
            return k;
    return -1;
}

static void remove_at(envd_engine_t *e, int64_t k)
{
    e->waiting[k] = e->waiting[--e->count];
}

static int add(envd_engine_t *e, envd_session_t *s, const envd_request_t *req)
{
    if (e->count == e->capacity) {
        const int64_t capacity = e->capacity ? 2 * e->capacity : 16;
        waiting_t *grown = realloc(e->waiting, (size_t)capacity * sizeof *grown);
        if (grown == NULL)
            return ENVD_ENOMEM;
        e->waiting = grown;
        e->capacity = capacity;
    }
    e->waiting[e->count++] = (waiting_t){.session = s, .request = *req};
    return ENVD_OK;
}

int envd_engine_submit(envd_engine_t *e, envd_session_t *s, const envd_request_t *req,
                       envd_completion_t *done)
{
    if (e == NULL || s == NULL || req == NULL || done == NULL)
        return ENVD_EINVAL;
    if (req->kind == ENVD_REQ_RECV &&
        (req->out == NULL || req->min_count < 1 || req->max_count < req->min_count ||
         req->max_count > envd_session_num_envs(s)))
        return ENVD_EINVAL;
    if (req->kind != ENVD_REQ_STEP && req->kind != ENVD_REQ_RECV && req->kind != ENVD_REQ_SETTLE)
        return ENVD_EINVAL;
    /* Room first: a request taken (a step submitted) must be able to wait. */
    int rc = add(e, s, req);
    if (rc != ENVD_OK)
        return rc;
    e->count--; /* (kept only if it waits, below) */
    /* The claim, the start and the first look in one holding of the lock:
     * a completion reads the error index another door's request may set. */
    envd_session_lock(s);
    if (envd_session_claim(s, req->kind) != ENVD_OK) {
        rc = ENVD_EBUSY; /* (the session's one request: this front door's or another's) */
    } else if (req->kind == ENVD_REQ_STEP && (rc = envd_session_step_submit(s)) < 0) {
        completion(done, s, req, rc, 1);
        envd_session_release(s);
        rc = 1;
    } else if (look(s, req, done)) {
        envd_session_release(s);
        rc = 1;
    } else {
        e->count++;
        rc = 0;
    }
    envd_session_unlock(s);
    return rc;
}

int envd_engine_send(envd_engine_t *e, envd_session_t *s, const int64_t *ids, int64_t count,
                     int flags, envd_completion_t *done)
{
    if (e == NULL || s == NULL || done == NULL)
        return ENVD_EINVAL;
    done->kind = 0;
    envd_session_lock(s); /* (the send and the look at the recv, in one holding) */
    /* (beside the session's waiting recv: async over several daemons, the
     * client sends while its recv waits) */
    const int rc = envd_session_send(s, ids, count, flags);
    done->error_index = envd_session_error_index(s);
    const int64_t k = find(e, s);
    /* (a refused send changed nothing: the recv is not looked at, and the
     * session's error_index still names the refused env) */
    if (k >= 0 && e->waiting[k].request.kind == ENVD_REQ_RECV && rc == ENVD_OK &&
        look(s, &e->waiting[k].request, done)) {
        remove_at(e, k);
        envd_session_release(s);
    }
    envd_session_unlock(s);
    return rc;
}

int envd_engine_call(envd_session_t *s, const envd_request_t *req, envd_completion_t *done)
{
    /* The session's lock is held from the decision to the completion (the
     * caller's; the waits below keep holding it, helping the batches), so no
     * other front door finds the session between them: only a request that
     * another one keeps (the loop's, waiting) is looked at.  The session's
     * calls below ask its rule themselves; asked here too, for the
     * completion's word that nothing started (no env named). */
    const int busy = envd_session_admit(s, req->kind) != ENVD_OK;
    int64_t rc;
    switch (req->kind) {
    case ENVD_REQ_STEP:
        rc = envd_session_step(s);
        break;
    case ENVD_REQ_RECV:
        rc = envd_session_recv(s, req->min_count, req->max_count, req->out, 1);
        break;
    case ENVD_REQ_SEND:
        rc = envd_session_send(s, req->ids, req->max_count, req->flags);
        break;
    default:
        return ENVD_EINVAL;
    }
    done->tag = req->tag;
    done->kind = req->kind;
    done->result = rc;
    done->refused = busy || (rc < 0 && req->kind == ENVD_REQ_SEND);
    done->error_index = rc >= 0 || busy ? -1 : envd_session_error_index(s);
    return 1;
}

int64_t envd_engine_poll(envd_engine_t *e, envd_completion_t *out, int64_t max)
{
    int64_t n = 0;
    for (int64_t k = 0; k < e->count && n < max;) {
        waiting_t *w = &e->waiting[k];
        envd_session_t *s = w->session;
        envd_session_lock(s); /* (the look and its completion in one holding) */
        const int found = look(s, &w->request, &out[n]);
        if (found)
            envd_session_release(s);
        envd_session_unlock(s);
        if (found) {
            n++;
            remove_at(e, k); /* (the last entry moved here: look at k again) */
        } else {
            k++;
        }
    }
    return n;
}

int envd_engine_forget(envd_engine_t *e, envd_session_t *s)
{
    const int64_t k = find(e, s);
    if (k < 0)
        return 0;
    remove_at(e, k);
    envd_session_release(s);
    return 1;
}

int64_t envd_engine_waiting(const envd_engine_t *e, int32_t kind)
{
    int64_t n = 0;
    for (int64_t k = 0; k < e->count; k++)
        n += kind == 0 || e->waiting[k].request.kind == kind;
    return n;
}
