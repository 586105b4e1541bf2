/*
 * engine.h -- the request engine: the requests of many native sessions
 * (session.h) that wait on their envs, and their completion records.
 *
 * A front door that must never block (the daemon's event loop) submits a
 * request {kind, count/min, out, tag} for a session and gets its completion
 * record back: at once when the request could be answered at once (a step run
 * inline, a recv with enough envs ready, any refusal), else from a later
 * envd_engine_poll, which the front door calls when the pool's eventfd fires
 * (or a hosted worker's pidfd: a dead worker writes no eventfd).  The front
 * door keeps no books of what waits: the engine does, one request per session
 * at most (a session takes one request at a time; a send is served beside a
 * waiting recv, envd_engine_send), so the pending requests are bounded by the
 * sessions.
 *
 * Kinds (ENVD_REQ_*, defined in session.h: the session's book records them):
 *   ENVD_REQ_STEP    step every env (envd_session_step_submit ... _finish);
 *                    result: the envs whose episode ended, or the error;
 *   ENVD_REQ_RECV    receive at least min_count and at most max_count of the
 *                    oldest ready ids into out (the caller's memory of
 *                    max_count ids, untouched by the caller until the
 *                    completion); result: how many, or the error (a kept
 *                    failure of a finished batch, ENVD_ESTATE: fewer than
 *                    min_count sent);
 *   ENVD_REQ_SETTLE  complete once no env of the session is in flight (a
 *                    closed session is freed then; result ENVD_OK);
 *   ENVD_REQ_SEND    (envd_engine_call only: a send is answered at once, and
 *                    served beside a waiting recv) send max_count ids from
 *                    ids with flags (envd_session_send); result ENVD_OK or
 *                    its refusal.
 * Each is decided under its session's lock (a recv takes the ids and checks
 * the count in one holding, envd_session_recv_claimed): no batch can end between a look at
 * the ready envs and a count of those in flight.  A waiting request stays
 * until it completes: a batch ending after a poll looked at its session
 * writes the eventfd after its done flag, so the next poll finds it.
 *
 * Three front doors, one book: the daemon's loop (submit, send, poll), the
 * doorbell thread (envd_engine_call) and the in-process calls (the session's
 * own step, send and recv, with or without wait: envd_engine_call's STEP,
 * SEND and RECV are those calls, made with the lock held).  The session's
 * request (one at most) is kept in the session itself, under its lock: a
 * request that waits across a gap in the lock (the loop's; a doorbell's
 * SENDRECV helping its batch) is claimed there (envd_session_claim), and a
 * request made in one holding of the lock is decided there by the same rule
 * (envd_session_admit, which the session's step, send and recv ask, and
 * its whole-vec seed, reset, async_reset and render) -- a second request is
 * refused ENVD_EBUSY (nothing started, no env named), a send is served
 * beside a waiting recv (its batch writing the pool's eventfd, also when it
 * runs inline), refused beside any other request.
 *
 * Threading: the engine's own calls are made by one thread (the front door's);
 * the sessions' batches end on any thread meanwhile.  envd_engine_call needs
 * no engine and may be called by any thread holding the session's lock.  The
 * session of a waiting request must stay alive until the request completes or is
 * forgotten (envd_engine_forget), and nobody else may wait on it meanwhile
 * (poll takes the session's lock; the daemon runs no other operation on a
 * session with a waiting request, and serves no fast path for it).
 */
#ifndef ENVD_ENGINE_H
#define ENVD_ENGINE_H

#include <stdint.h>

#include "session.h"

/* cffi:begin */
typedef struct envd_engine envd_engine_t;

typedef struct envd_request {
    int32_t kind;           /* ENVD_REQ_* */
    int64_t min_count;      /* RECV */
    int64_t max_count;      /* RECV; SEND: the count of ids */
    int64_t *out;           /* RECV: max_count ids */
    const int64_t *ids;     /* SEND: max_count ids (copied before they are read) */
    int32_t flags;          /* SEND: ENVD_JOB_* */
    uint64_t tag;           /* the front door's, handed back in the completion */
} envd_request_t;

typedef struct envd_completion {
    uint64_t tag;
    int32_t kind;
    int32_t refused;        /* 1: refused before anything started (nothing
                               was stepped) */
    int64_t result;         /* >= 0 as the kind says, or an ENVD_E* code */
    int64_t error_index;    /* envd_session_error_index right after the call */
} envd_completion_t;

/* ENVD_OK or ENVD_ENOMEM. */
int envd_engine_create(envd_engine_t **out);
/* NULL is allowed.  Waiting requests are forgotten (no completion). */
void envd_engine_destroy(envd_engine_t *engine);

/* Submit session's request.  1: answered now, *done holds its completion;
 * 0: it waits (a later poll completes it); ENVD_EINVAL (a bad request: kind,
 * counts or out), ENVD_EBUSY (the session's request is taken: one waiting in
 * this engine, or a doorbell's SENDRECV helping its batch) or ENVD_ENOMEM:
 * nothing was submitted (no completion comes). */
int envd_engine_submit(envd_engine_t *engine, envd_session_t *session,
                       const envd_request_t *request, envd_completion_t *done);

/* envd_session_send(session, ids, count, flags), then the session's waiting
 * recv (if any) is looked at: a batch run inline writes no eventfd.  Returns
 * the send's code (its refusal: done->error_index names the env; ENVD_EBUSY
 * with -1 beside a request other than a recv);
 * done->kind is 0, or, when the send was taken and the recv completed, the
 * recv's kind (*done: its completion). */
int envd_engine_send(envd_engine_t *engine, envd_session_t *session, const int64_t *ids,
                     int64_t count, int flags, envd_completion_t *done);

/* A front door that blocks (the doorbell thread; the in-process calls are
 * the same session calls, each holding the lock itself) runs session's request
 * (STEP, RECV: exactly as submit decides it, but waiting for its batches
 * and helping them, as envd_session_step and envd_session_recv with wait do;
 * SEND), with the session's lock held by the caller from before the call to
 * after it has read the completion, into *done: 1, or ENVD_EINVAL for another
 * kind (no completion).  Refused ENVD_EBUSY (refused, error_index -1) while
 * another front door's request waits on the session (a send beside a waiting
 * recv is served, its batch writing the eventfd too). */
int envd_engine_call(envd_session_t *session, const envd_request_t *request,
                     envd_completion_t *done);

/* Look at the waiting requests (each under its session's lock, never waiting
 * for a batch) and write the completions of up to max of them that are done
 * into out: how many.  Those not looked at (max reached) wait for the next
 * poll. */
int64_t envd_engine_poll(envd_engine_t *engine, envd_completion_t *out, int64_t max);

/* Drop the session's waiting request, if any, with no completion (a session
 * freed at shutdown): 1 if there was one, else 0. */
int envd_engine_forget(envd_engine_t *engine, envd_session_t *session);

/* Requests waiting now (of kind; 0: of any kind). */
int64_t envd_engine_waiting(const envd_engine_t *engine, int32_t kind);
/* cffi:end */

#endif /* ENVD_ENGINE_H */
