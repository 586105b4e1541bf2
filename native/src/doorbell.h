/*
 * doorbell.h -- the doorbell, the mechanism of the same-host fast path: a
 * session's steps requested through a futex word in its shared-memory header
 * and served by a native thread of the daemon, with no socket round trip and
 * no Python on the way.
 *
 * The doorbell (envd_doorbell_header_t) lies in the session's header page.  The
 * client (another process, pure Python) writes the request's inputs in shared
 * memory, writes req_count and req_kind, increments req_seq and, if the
 * server said it sleeps (server_asleep), wakes req_seq's futex; the server
 * thread (one per fast-path session) runs the request through the session's own
 * functions (session.h: envd_session_step, _send, _recv), so results and
 * books are those of every other path -- writes status and result, sets
 * done_seq = req_seq and wakes done_seq's futex when the client said it
 * sleeps there.
 * The futexes are shared (not FUTEX_PRIVATE): the words live in a MAP_SHARED
 * segment of two processes.
 *
 * Requests (req_kind):
 *   STEP  step every env with the actions buffer; result: envs whose episode
 *         ended.  Refused with ENVD_EBUSY while envs are out (error index
 *         -1): result is the number in flight, or when none is, minus the
 *         number ready.
 *   SEND  start stepping the req_count env ids in the ids array (with their
 *         rows of the actions buffer) and answer at once; result 0 (refused
 *         with ENVD_EBUSY for an env not idle: result is its ENVD_ENV_* state).
 * A request failed with ENVD_EENV (an env's own code: a hosted Python env
 * raised, or its worker died) carries the backend's words for it in message,
 * written before done_seq.
 *   RECV  wait until req_count envs sent are ready, write exactly req_count
 *         ready ids (oldest first) to the ids array; result: req_count (the
 *         rest stay ready).  Refused with ENVD_ESTATE when fewer are in flight
 *         or ready (error index -1; result: how many are).  An env that failed
 *         in a batch makes RECV answer its error; the batch's envs are
 *         returned by the next RECV.
 *   SENDRECV  a SEND of the req_count ids, then a RECV of req_count, answered
 *         once (when the RECV is): the trainer rings it and goes on, as after
 *         a send, and the daemon's thread wakes once per batch, not twice
 *         (a trainer driving several daemons, client/multi_async.py).  sent
 *         says which part the answer is: 0, the SEND's refusal (as SEND, no
 *         env stepped); 1, the RECV's answer, as RECV.  A request rung while
 *         it is out is not served before it is answered: a client rings one
 *         at a time.
 * The async books are the session's (session.h), shared with every other
 * caller of the session.
 *
 * Ordering (x86-64, where the client enables the fast path): the client's
 * stores (actions, then req_kind, then req_seq) become visible in order and
 * the server reads req_seq with acquire before anything else; the server
 * publishes done_seq with release after every result.  Waking each other
 * is a pair of flags, each written before a futex wait and read after the
 * other side's store, with a full barrier between the store and the read on
 * both sides, so at least one side sees the other's store:
 *   - the client sleeps on done_seq: it sets client_waiting, then FUTEX_WAIT
 *     (the kernel compares done_seq after a barrier); the server stores
 *     done_seq (seq_cst) and wakes done_seq if client_waiting is set;
 *   - the server sleeps on req_seq: it sets server_asleep (seq_cst), then
 *     FUTEX_WAIT; the client stores req_seq, then a full barrier (an atomic
 *     read-modify-write: client/doorbell.py), then wakes req_seq only if
 *     server_asleep is set.  A spinning server (the hot case: a trainer
 *     stepping back to back) is not sent a system call it does not need
 *     (2 us of the trainer's time per ring on a 2-CPU VM).  The server counts
 *     in missed_rings every sleep slice that ran out although a request had
 *     been rung: a client that did not wake it (0 but for rare races at the
 *     end of a slice: a client preempted between its store and its read
 *     across it, or a ring landing as it ran out, which costs nothing).
 *
 * Spinning: a server thread spins on req_seq for up to spin_ns after each
 * request (never after a SENDRECV, doorbell.c spin_deadline) before it
 * sleeps, yielding its CPU between checks after the first microseconds (a
 * client that shares its CPU rings without waiting for the spin's end:
 * doorbell.c SPIN_ALONE_NS), but only while it holds one of the process-wide spin slots
 * (envd_doorbell_set_max_spinners; the pool's workers keep the rest of the
 * CPUs), so spinners never outnumber the CPUs -- and only when, as it
 * answers, fewer other server threads run requests than all CPUs but one
 * (several trainers stepping at once on a small machine need the CPUs).
 *
 * Lock: the server holds the session's mutex while it serves a request;
 * every other caller of the session takes it too (envd_doorbell_lock is
 * envd_session_lock), so a request rung at any time never runs concurrently
 * with them -- except between a SENDRECV's halves: the server lets the lock
 * go while it steps the batches in flight (its SEND's envs are in flight
 * then, which every caller that acts on the session checks).  Draining:
 * requests after envd_doorbell_drain are answered with status
 * ENVD_DOORBELL_SHUTTING_DOWN without running; the RECV half of a SENDRECV whose
 * batch started is still answered.
 *
 * Policy: a server thread that started under SCHED_OTHER sleeps under
 * SCHED_BATCH after answering a SENDRECV (woken by the next one, it does not
 * preempt the trainer that rang and went on) and under SCHED_OTHER after any
 * other request (doorbell.c, sleep_policy).
 */
#ifndef ENVD_DOORBELL_H
#define ENVD_DOORBELL_H

#include <stdatomic.h>
#include <stdint.h>

#include "session.h"
#include "vec.h"

/* cffi:begin */
/* Where the doorbell lies in the segment's header page (envd/shm.py mirrors
 * these offsets); the client's and the server's words on separate lines. */
#define ENVD_DOORBELL_OFFSET 128
/* The doorbell's layout and requests, as a number: a daemon's hello says it
 * (capability doorbell_layout), and a client rings only a doorbell of its own
 * layout.  1: up to the contended word; 2: SENDRECV and the sent word (the
 * message moved from offset 96 to 100); 3: server_asleep, which the client
 * reads to skip the wake-up of a spinning server, and missed_rings (the
 * message moved to 108). */
#define ENVD_DOORBELL_LAYOUT 3

enum { ENVD_DOORBELL_STEP = 1, ENVD_DOORBELL_SEND = 2, ENVD_DOORBELL_RECV = 3,   /* req_kind */
       ENVD_DOORBELL_SENDRECV = 4 };
enum { ENVD_DOORBELL_SHUTTING_DOWN = -1000 };     /* status: the daemon drains */
/* The doorbell's message (a hosted env's exception); it ends well inside the
 * header page (ENVD_DOORBELL_OFFSET + the header < 4096, envd/shm.py). */
#define ENVD_DOORBELL_MESSAGE_BYTES 1536

typedef struct envd_doorbell_header {
    /* written by the client */
    _Atomic uint32_t req_seq;        /* futex: +1 per request */
    _Atomic uint32_t req_kind;       /* ENVD_DOORBELL_STEP, _SEND, _RECV or _SENDRECV */
    _Atomic uint32_t client_waiting; /* 1 while the client sleeps on done_seq */
    _Atomic uint32_t req_count;      /* SEND: ids sent; RECV: envs wanted;
                                        SENDRECV: both */
    uint32_t client_pad[12];
    /* written by the server */
    _Atomic uint32_t done_seq;       /* futex: req_seq of the last request answered */
    _Atomic int32_t status;          /* ENVD_OK, a negative ENVD_E* code, or
                                        ENVD_DOORBELL_SHUTTING_DOWN */
    _Atomic int64_t result;          /* see the requests above */
    _Atomic int64_t error_index;     /* the env an error names, else -1 */
    _Atomic uint32_t closed;         /* 1 once the server thread stopped for good
                                        (session closed, expired or freed): a
                                        request rung now is never answered here */
    _Atomic uint32_t contended;      /* 1 when other doorbell threads of the
                                        daemon were running requests as this
                                        answer was written (several trainers
                                        share the CPUs: the client then sleeps
                                        rather than yields while it waits) */
    _Atomic uint32_t sent;           /* SENDRECV: 1 when its batch started (the
                                        answer is the RECV's), 0 when the SEND
                                        was refused; 0 for the other kinds */
    _Atomic uint32_t server_asleep;  /* 1 while the server thread sleeps (or is about
                                        to) on req_seq: a request rung then needs
                                        FUTEX_WAKE req_seq */
    _Atomic uint32_t missed_rings;   /* sleep slices of the server that ran out with
                                        a request rung (a ring that did not wake a
                                        sleeping server) */
    char message[ENVD_DOORBELL_MESSAGE_BYTES]; /* status ENVD_EENV: what failed, as the
                                        backend words it (UTF-8, NUL-terminated;
                                        "" when it has nothing more to say) */
} envd_doorbell_header_t;

/* Serve session's requests rung at header from a doorbell thread attached
 * to the session (envd_session_attach_server: envd_session_stop_server stops
 * it, as envd_doorbell_stop does, envd_session_drain drains it, and
 * destroying the session stops it first).  ENVD_EBUSY if the session has a
 * server already, else as envd_doorbell_start. */
int envd_doorbell_serve(envd_session_t *session, envd_doorbell_header_t *header, int64_t *ids,
                        int64_t spin_ns);

/* cffi:end */
typedef struct envd_doorbell envd_doorbell_t;

/* Start serving session's requests from the doorbell at header (zeroed or
 * left by an earlier doorbell of the same segment: serving starts after
 * the request already counted).  ids: the array of the session's num_envs env
 * ids that SEND and RECV use (in the segment).  spin_ns: how long the thread
 * spins after a request.  ENVD_OK, ENVD_EINVAL, ENVD_ENOMEM or ENVD_ESYS (no
 * thread).  envd_doorbell_serve calls this; a caller of its own stops it
 * with envd_doorbell_stop. */
int envd_doorbell_start(envd_doorbell_t **out, envd_session_t *session,
                        envd_doorbell_header_t *header, int64_t *ids, int64_t spin_ns);

/* Stop the thread (after the request it serves, if any; a SENDRECV stopped
 * while it steps its batch is never answered), drop the envs in
 * flight (waiting for them) or ready in the session, mark the doorbell closed
 * (waking a client that waits) and free; returns the steps served in all (0
 * for NULL) and, if batch_envs is not NULL, stores there envd_doorbell_batch_envs's
 * last count.  The session and the header must stay valid until this
 * returns; the caller may hold the session's lock. */
int64_t envd_doorbell_stop(envd_doorbell_t *bell, int64_t *batch_envs);

/* Hold off the server thread: it finishes the request it serves (or the half
 * of a SENDRECV), then waits;
 * requests rung meanwhile are served after envd_doorbell_unlock. */
void envd_doorbell_lock(envd_doorbell_t *bell);
/* envd_doorbell_lock if the server is not serving a request now: 1, else 0
 * (for callers that must not block, e.g. an event loop reading statistics). */
int envd_doorbell_trylock(envd_doorbell_t *bell);
void envd_doorbell_unlock(envd_doorbell_t *bell);

/* From now on answer every request with ENVD_DOORBELL_SHUTTING_DOWN. */
void envd_doorbell_drain(envd_doorbell_t *bell);

/* STEP requests served (answered ENVD_OK) so far. */
int64_t envd_doorbell_served(const envd_doorbell_t *bell);

/* Envs of the session's batches found finished (by RECV, envd_doorbell_collect
 * or any other caller of the session) since this doorbell started. */
int64_t envd_doorbell_batch_envs(const envd_doorbell_t *bell);

/* Unless the server thread is serving a request now (then it does so
 * itself), end the batches that finished, so that envd_doorbell_batch_envs counts
 * them before a RECV asks (a daemon's statistics); never blocks. */
void envd_doorbell_collect(envd_doorbell_t *bell);

/* Envs of the session in flight or ready (not yet received). */
int64_t envd_doorbell_pending(const envd_doorbell_t *bell);

/* How long past its last answer the server spins for the next request, as
 * its client's gaps decide (ns; 0: it does not spin), whether or not a spin
 * slot and the CPUs then let it spin.  The server thread's own books: read
 * only while it cannot write them, asleep (server_asleep read as 1, which
 * orders its writes before the read) and rung by nobody.  For tests. */
int64_t envd_doorbell_spin_ns(const envd_doorbell_t *bell);

/* cffi:begin */
/* How many server threads of this process may spin at once (>= 0; default 1). */
void envd_doorbell_set_max_spinners(int max_spinners);
/* cffi:end */

#endif /* ENVD_DOORBELL_H */
