/*
 * session.h -- a native session: one stepping backend (backend.h), the async
 * books of its envs, and the server of its own that a front door may attach
 * (the doorbell, doorbell.h), serving every caller: the in-process VecEnv,
 * the daemon's socket handlers and the doorbell's thread all step the envs
 * through these functions, so every path keeps the same books by
 * construction.
 *
 * Books (EnvPool's async rules): each env is IDLE (the caller holds it),
 * IN_FLIGHT (in a batch being stepped) or READY (its batch finished, its id
 * not received yet).  READY ids form a FIFO in the order their batches were
 * found finished (batches are checked in submit order).  The first failure of
 * an env in a finished batch is kept for the next recv, which returns it;
 * that batch's envs are ready all the same (the recv after returns them).
 * Invariant: in_flight + ready <= num_envs, each env in exactly one state.
 *
 * Refusals (nothing changes; envd_session_error_index names the env or -1):
 *   send   ENVD_EINVAL (count outside [1, num_envs], an id out of range:
 *          named), ENVD_EBUSY (an env not IDLE: named; envd_session_env_state
 *          tells in flight from ready; or twice in this send), and the
 *          backend's refusals of the actions (ENVD_ERANGE, ENVD_ESTATE);
 *   step, step_submit, reset, render
 *          ENVD_EBUSY while envs are in flight (-1); step, step_submit and
 *          render also while envs are ready (-1: envd_session_counts tells
 *          which; render: whether a batch sent has finished depends on the
 *          threads, every env received does not); reset forgets the ready
 *          ones (and a failure not reported yet);
 *   recv   ENVD_EINVAL (count outside [1, num_envs]), ENVD_ESTATE (fewer
 *          than count in flight or ready, -1), or the kept failure;
 *   seed   ENVD_EBUSY while envs are in flight (-1: their batches read
 *          their envs' generators).
 * async_reset waits for the envs in flight, drops their results (and a kept
 * failure), resets every env and makes them all READY in env order.
 * Every call above that reads or rewrites envs (step, send, recv; the
 * whole-vec seed, reset, async_reset and render) is also refused
 * ENVD_EBUSY (-1, nothing changed) beside another front door's request
 * (below).
 *
 * Front doors (engine.h): the in-process VecEnv's calls, the daemon's loop
 * (the request engine) and the doorbell's thread.  A request of any of them
 * (a step, a send, a recv) is decided by one rule, kept with the session's
 * book of the request a front door took and has not completed
 * (envd_session_claim): the calls below that make one (step, send, recv)
 * refuse it ENVD_EBUSY (naming no env, nothing started) beside another
 * door's request, but serve a send beside a recv (its batch then writes the
 * pool's eventfd, for the loop, also when it runs inline).  The whole-vec
 * calls that read or rewrite envs (seed, reset, async_reset, render) ask
 * the same rule, decided as a step: refused beside any claimed request
 * (async_reset drops nothing then: the claimed request's envs stay its own).
 * set_chunk and set_max_threads do not ask it: they tune how later runs are
 * dispatched, not what any env holds (and the cap is refused while a run is
 * in flight, whoever sent it).  The daemon's loop runs no whole-vec call
 * beside its own waiting request (a session takes one request at a time,
 * server/lifecycle.py), so only another door's claim refuses its reset or
 * render (a doorbell's SENDRECV helping its batch).
 *
 * Threading: one recursive mutex per session.  Every function below takes it
 * (except the counters marked lock-free), so any thread may call them; the
 * doorbell thread holds it while it serves a request.  envd_session_lock
 * holds it for a caller's own work (the doorbell waits), and the holder may
 * call the session meanwhile.  Blocking calls (step, reset, recv with wait,
 * async_reset) hold it while they wait: a caller that must never block (an
 * event loop) uses envd_session_trylock first, or the non-waiting calls.
 *
 * Ownership: the session owns its backend (destroyed with it) and the server
 * attached to it (stopped with it); the caller owns the buffers (and the
 * server's own memory: the doorbell's header and ids).
 *
 * Layering: the front doors (the doorbell, doorbell.c; the daemon's and the
 * in-process VecEnv's Python) depend on the session, never the reverse: the
 * session knows an attached server only by its ops (envd_session_server_ops_t).
 */
#ifndef ENVD_SESSION_H
#define ENVD_SESSION_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* cffi:begin */
typedef struct envd_session envd_session_t;

enum { ENVD_ENV_IDLE = 0, ENVD_ENV_IN_FLIGHT = 1, ENVD_ENV_READY = 2 };

/* The kinds of request a front door makes (engine.h), as the session's book
 * records the one taken (envd_session_claim). */
enum { ENVD_REQ_STEP = 1, ENVD_REQ_RECV = 2, ENVD_REQ_SETTLE = 3, ENVD_REQ_SEND = 4 };

/* A session over backend (taken over: destroyed with the session, also when
 * this fails).  ENVD_OK, ENVD_EINVAL or ENVD_ENOMEM. */
int envd_session_create(envd_session_t **out, envd_backend_t *backend);

/* Stop the attached server, wait for the batches in flight (their work uses
 * the buffers), drop their results, free the books and the backend.  NULL is
 * allowed.  No other thread may use the session meanwhile or after. */
void envd_session_destroy(envd_session_t *session);

int64_t envd_session_num_envs(const envd_session_t *session);

void envd_session_lock(envd_session_t *session);
int envd_session_trylock(envd_session_t *session); /* 1: taken, 0: held elsewhere */
void envd_session_unlock(envd_session_t *session);

/* ---- whole-vec calls ---- */
/* Seed every env's generator, no reset: ENVD_OK, or ENVD_EBUSY (above). */
int envd_session_seed(envd_session_t *session, const uint64_t *seeds);
int envd_session_reset(envd_session_t *session, const uint64_t *seeds, const bool *mask);
int64_t envd_session_reset_count(envd_session_t *session);
/* Step every env (NULL: ENVD_EINVAL): the in-process step, and the doorbell's
 * (envd_engine_call). */
int envd_session_step(envd_session_t *session);

/* ---- async ---- */
int envd_session_async_reset(envd_session_t *session, const uint64_t *seeds);

/* Start stepping ids[0 .. count) (copied before anything reads them: they may
 * lie in memory another process writes) with their rows of the actions
 * buffer; flags: ENVD_JOB_NOTIFY (the pool's eventfd fires when the batch
 * ends), ENVD_JOB_HELPED (the caller helps: envd_session_take_help; it may
 * be woken no worker, vec.h, so someone must help or wait for it).
 * Finished batches are collected before it returns.  Beside another door's
 * claimed recv it adds ENVD_JOB_NOTIFY (that door may wait on the pool's
 * eventfd), and when the batch ran inline (no eventfd written) it counts
 * the event itself (the backend's notify) before it returns. */
int envd_session_send(envd_session_t *session, const int64_t *ids, int64_t count, int flags);

/* cffi:end */
/* step split for a caller that must not block (the request engine,
 * engine.h, which Python calls instead): submit (ENVD_EBUSY while envs are
 * in flight or ready), poll done, finish once done (as step's result). */
int envd_session_step_submit(envd_session_t *session);
int envd_session_step_done(envd_session_t *session);
int envd_session_step_finish(envd_session_t *session);

/* Helping the session's batches in flight run, without waiting for them
 * (the doorbell's server thread, between an answer and its client's next
 * request): take the help with the session's lock held (how many batches,
 * of those in flight with chunks left that were sent with ENVD_JOB_HELPED:
 * the oldest ENVD_SESSION_MAX_HELP - 1 and the newest; 0: none, or the
 * backend's own threads run every batch, or its chunks are long, vec.h);
 * then run it with or without the lock: each batch in turn, in that order
 * (envd_pool_help: until no chunk is left or leave(arg) says stop -- asked
 * before the first chunk and after each; the batches after that are only let
 * go).  Every taken help must be run: it holds its batches in flight, and
 * nobody may wait for them meanwhile.  Only a few: a recv waits for the
 * oldest, and EnvPool's loop keeps two batches out. */
#define ENVD_SESSION_MAX_HELP 4
typedef struct envd_session_help {
    envd_backend_t *backend;
    int count;
    envd_backend_batch_t *batches[ENVD_SESSION_MAX_HELP];
} envd_session_help_t;
int envd_session_take_help(envd_session_t *session, envd_session_help_t *help);
void envd_session_help(envd_session_help_t *help, int (*leave)(void *), void *arg);

/* cffi:begin */
/* Receive at least min_count and at most max_count of the oldest ready ids
 * into out: how many (>= min_count), or 0 if wait is 0 and fewer than
 * min_count are ready, or a refusal (above).  With wait, the calling thread
 * runs the oldest batch's work until enough are ready; and, before it
 * returns, runs any batch that a later send overtook and that was already
 * passed over unstarted by an earlier recv (session.c, run_overtaken: a
 * batch no thread started does not wait behind ever-ready cheap ones).  A
 * failure of that batch is then raised by this recv, as any finished
 * batch's. */
int64_t envd_session_recv(envd_session_t *session, int64_t min_count, int64_t max_count,
                          int64_t *out, int wait);

/* End the batches that finished, without waiting (their envs become ready);
 * then *in_flight and *ready (either may be NULL). */
void envd_session_counts(envd_session_t *session, int64_t *in_flight, int64_t *ready);

/* An env's state (ENVD_ENV_*), or ENVD_EINVAL for an index out of range. */
int envd_session_env_state(envd_session_t *session, int64_t index);
/* 1 once env index was reset, 0 while it never was (which a refused step's
 * ENVD_ESTATE means: never reset, or done with autoreset disabled), ENVD_EINVAL
 * out of range.  The backend's own books: the daemon words its refusals from
 * this, never from the shared segment's flags a client can write. */
int envd_session_env_started(envd_session_t *session, int64_t index);

/* ---- other ---- */
/* Draw every env's frame into out (num_envs * frame_bytes bytes, env order). */
int envd_session_render(envd_session_t *session, uint8_t *out);
uint64_t envd_session_frame_bytes(envd_session_t *session);
void envd_session_set_chunk(envd_session_t *session, int64_t chunk);
/* Cap the pool threads that step this session's envs at once (all its
 * paths: step, reset, send; see envd_vec_set_max_threads): ENVD_VEC_NO_CAP,
 * 0 (inline on the thread serving the call) or K >= 1.  Set it before the
 * first step; ENVD_EBUSY while a step or a batch is in flight. */
int envd_session_set_max_threads(envd_session_t *session, int max_threads);
void envd_session_stats(envd_session_t *session, envd_vec_stats_t *stats);
/* The env the last refusal or failure names (-1: none).  Lock-free: read it
 * right after the failed call, on the same thread (with the session's lock
 * held around both where another front door may make a request meanwhile:
 * every request sets it). */
int64_t envd_session_error_index(const envd_session_t *session);
/* What failed env index with ENVD_EENV, as the backend words it
 * (NUL-terminated, at most size bytes; "" when it has no more to say than the
 * code: the native pool's envs). */
void envd_session_error_message(envd_session_t *session, int64_t index, char *out, size_t size);
/* The backend's copy of the actions the last step or send checked. */
const void *envd_session_checked_actions(const envd_session_t *session);

/* Whole steps (any path) and envs of batches found finished (any path) so
 * far.  Lock-free. */
int64_t envd_session_steps(const envd_session_t *session);
int64_t envd_session_async_env_steps(const envd_session_t *session);

/* Ids of capacity the reusable finished batches hold (<= 2 * num_envs,
 * however the sizes of sends vary). */
int64_t envd_session_spare_capacity(envd_session_t *session);

/* The most bytes the books of a session of num_envs envs allocate at once,
 * whatever is sent (allocator overhead aside): what a daemon counts against
 * --max-state-bytes beside the backend's own bytes. */
uint64_t envd_session_books_max_bytes(int64_t num_envs);

/* ---- the attached server (the doorbell: envd_doorbell_serve, doorbell.h) ---- */
/* Stop the attached server (ops->stop) and detach it.  No-op without one.
 * The caller may hold the session's lock. */
void envd_session_stop_server(envd_session_t *session);
/* From now on the attached server answers every request with "shutting down"
 * (ops->drain).  No-op without one. */
void envd_session_drain(envd_session_t *session);

/* ---- the caller's choice of lock (native/capi/bound_call.c) ---- */
/* A whole-vec step estimated to take less than this holds its Python
 * caller's GIL (see envd_session_step_is_short). */
#define ENVD_SESSION_SHORT_STEP_NS 20000
/* 1 when the next envd_session_step is measured short: its envs' estimated
 * cost (the backend's stats) is above 0 and under ENVD_SESSION_SHORT_STEP_NS
 * in all, half the vec's inline threshold (vec.c's INLINE_BELOW_NS, 40 us),
 * and no chunk is forced (envd_session_set_chunk), so the step runs inline
 * on the caller's thread and never waits for a pool thread; 1 also for a
 * NULL session (its step is refused at once).  0 before any step was
 * measured, for a longer step, with a forced chunk, and for a backend that
 * measures none (the workers backend).  Lock-free: the session publishes the
 * answer (a relaxed atomic) after every step, reset, finished async batch,
 * chunk or cap change, so that a caller holding its GIL never waits for the
 * session's lock (a thread holding that lock may wait for the GIL).  A
 * Python caller holds the GIL through a short step (cffi's call, which
 * releases and retakes it, cost about 420 instructions more than the bound
 * call, 3.5% of puffer:squared's in-place step at N=64: docs/benchmarks.md)
 * and releases it for any other, so that its other threads never stall
 * behind a long step or a pool wait. */
int envd_session_step_is_short(envd_session_t *session);
/* envd_session_step when it is short (envd_session_step_is_short) and the
 * session's lock is free at once (a try-lock); else ENVD_SESSION_NOT_RUN,
 * having done nothing.  ENVD_EINVAL for a NULL session.  For a caller that
 * holds a lock another thread may wait for while it holds the session's
 * lock (a Python caller's GIL: bound_call.c): it never waits for the
 * session's lock, and runs the step itself only where the step never waits
 * for the pool; on ENVD_SESSION_NOT_RUN it releases its own lock and calls
 * envd_session_step. */
int envd_session_step_if_short(envd_session_t *session);

/* cffi:end */
/* envd_session_step_if_short's "not run": no code envd_session_step returns
 * (episode counts >= 0, ENVD_E* codes small negatives); bound_call.c's
 * BOUND_NOT_RUN, the same value. */
#define ENVD_SESSION_NOT_RUN INT_MIN

/* What the session calls of a server attached to it. */
typedef struct envd_session_server_ops {
    /* Stop serving (after the request it serves, if any), drop the envs in
     * flight or ready (envd_session_drop_async) and free the server; called
     * without the session's lock taken by the session (its caller may hold
     * it). */
    void (*stop)(void *server);
    /* Answer every later request with "shutting down"; lock-free. */
    void (*drain)(void *server);
} envd_session_server_ops_t;
/* Attach server (ops outlive it): the session stops it before it is
 * destroyed.  ENVD_EBUSY if one is attached.  The start and stop of a server
 * do not race (the daemon serializes them). */
int envd_session_attach_server(envd_session_t *session, const envd_session_server_ops_t *ops,
                               void *server);
/* 1 while a server is attached, else 0. */
int envd_session_has_server(envd_session_t *session);

/* The request engine's book of this session (engine.h): the kind (ENVD_REQ_*)
 * of the request a front door took for it across a gap in the session's
 * lock (the loop's waiting request, a doorbell's SENDRECV helping its batch)
 * and has not completed, 0 for none.  Kept under the session's lock, so that
 * every front door (the in-process calls, the daemon's loop, the doorbell
 * thread) sees the same one: claim records kind, or refuses ENVD_EBUSY while
 * one is held (and keeps it); release clears it; claimed reads it (the
 * caller holds the session's lock, or reads a hint). */
int envd_session_claim(envd_session_t *session, int kind);
void envd_session_release(envd_session_t *session);
/* cffi:begin */
int envd_session_claimed(const envd_session_t *session);
/* cffi:end */
/* The one rule of a request made under one holding of the lock (step, send,
 * recv, and the whole-vec seed, reset, async_reset and render, decided as
 * a step: each of them asks it), beside the claimed one: ENVD_OK when none
 * is claimed, or for a send beside a recv; else ENVD_EBUSY, naming no env
 * (the error index is -1).  The caller holds the lock for the decision and
 * the request it admits. */
int envd_session_admit(envd_session_t *session, int kind);
/* The claimed recv's own look (the engine's waiting request, engine.c): as
 * envd_session_recv without waiting, not refused for its own claim. */
int64_t envd_session_recv_claimed(envd_session_t *session, int64_t min_count,
                                  int64_t max_count, int64_t *out);

/* Drop every env in flight (waiting for its batch) or ready, and a kept
 * failure: every env is IDLE after it. */
void envd_session_drop_async(envd_session_t *session);

#endif /* ENVD_SESSION_H */
