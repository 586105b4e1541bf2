/*
 * session.c -- a native session: the async books over one backend, and the
 * server attached to it (see session.h for the rules and threading).
 *
 * Invariants (under the mutex): in_flight is the sum of the counts of the
 * batches from head to tail (submit order); state[i] is IN_FLIGHT for exactly
 * their ids, READY for exactly the num_ready ids of the ready ring (from
 * ready_head, in the order found finished), IDLE otherwise; entries have
 * increasing seqs (their sends' numbers, from 1), and newest_finished is the
 * largest seq collected so far (an older entry still in flight was
 * overtaken: run_overtaken).  A batch entry owns a backend batch and a
 * private copy of its ids; finished entries go to the spares and are reused
 * by later sends that fit (capacity in [count, 2 * count]), so the entries
 * in flight hold at most 2 * num_envs ids, and the spares hold at most
 * 2 * num_envs ids in all (sends of ever larger batches would otherwise keep
 * every size ever sent).  Hence envd_session_books_max_bytes: at most
 * num_envs entries in flight (each holds an env) and 2 * num_envs spares,
 * 4 * num_envs ids of capacity in all.
 */
#define _GNU_SOURCE
#include "session.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "envd.h"
#include "ids_run.h"

typedef struct entry {
    envd_backend_batch_t *batch;
    int64_t capacity;
    int64_t count;     /* ids of the send in flight */
    int64_t *ids;      /* capacity entries, private */
    int64_t seq;       /* its send's number: later sends have larger ones */
    int passed;        /* a recv returned without it while it was overtaken
                          and unstarted (run_overtaken) */
    struct entry *next;
} entry_t;

struct envd_session {
    envd_backend_t *backend;
    int64_t num_envs;
    pthread_mutex_t mutex;   /* recursive; guards everything below but the atomics */
    int8_t *state;           /* num_envs: ENVD_ENV_* */
    entry_t *head, *tail;    /* in flight, oldest first */
    entry_t *spares;
    int64_t spare_capacity;  /* ids the spares hold, <= 2 * num_envs */
    int64_t in_flight;
    int64_t sends;           /* sends taken so far: the next entry's seq - 1 */
    int64_t newest_finished; /* the largest seq collected (0: none) */
    int64_t *ready;          /* ring of num_envs ids */
    int64_t ready_head, num_ready;
    int error;               /* the first failure found, not reported yet */
    int64_t error_index_kept;
    int64_t error_index;     /* of the last refusal or failure */
    const envd_session_server_ops_t *server_ops;
    void *server;            /* attached (NULL: none); see envd_session_stop_server */
    int claimed;             /* the engine's request taken for it (ENVD_REQ_*, 0: none) */
    _Atomic int64_t steps;
    _Atomic int64_t async_env_steps;
    /* envd_session_step_is_short's answer: stored under the mutex after
     * whatever changes the backend's measured cost or its dispatch (publish_short),
     * loaded without it (the caller may hold its GIL, and a thread holding
     * the mutex may wait for that GIL) */
    _Atomic int short_step;
};

/* ---- creation ------------------------------------------------------------------------ */
int envd_session_create(envd_session_t **out, envd_backend_t *backend)
{
    if (out == NULL || backend == NULL || backend->num_envs < 1 ||
        backend->num_envs > ENVD_VEC_MAX_ENVS) {
        envd_backend_destroy(backend);
        return ENVD_EINVAL;
    }
    const int64_t n = backend->num_envs;
    envd_session_t *s = calloc(1, sizeof *s);
    int8_t *state = calloc((size_t)n, sizeof *state);
    int64_t *ready = malloc((size_t)n * sizeof *ready);
    pthread_mutexattr_t attr;
    if (s == NULL || state == NULL || ready == NULL || pthread_mutexattr_init(&attr) != 0) {
        free(s);
        free(state);
        free(ready);
        envd_backend_destroy(backend);
        return ENVD_ENOMEM;
    }
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&s->mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    s->backend = backend;
    s->num_envs = n;
    s->state = state;
    s->ready = ready;
    s->error_index = -1;
    *out = s;
    return ENVD_OK;
}

static void free_entries(envd_session_t *s, entry_t *e)
{
    while (e != NULL) {
        entry_t *next = e->next;
        s->backend->ops->batch_destroy(s->backend->impl, e->batch);
        free(e->ids);
        free(e);
        e = next;
    }
}

void envd_session_destroy(envd_session_t *s)
{
    if (s == NULL)
        return;
    envd_session_stop_server(s);
    envd_session_drop_async(s);
    free_entries(s, s->spares);
    envd_backend_destroy(s->backend);
    pthread_mutex_destroy(&s->mutex);
    free(s->state);
    free(s->ready);
    free(s);
}

int64_t envd_session_num_envs(const envd_session_t *s) { return s->num_envs; }

void envd_session_lock(envd_session_t *s) { pthread_mutex_lock(&s->mutex); }
int envd_session_trylock(envd_session_t *s) { return pthread_mutex_trylock(&s->mutex) == 0; }
void envd_session_unlock(envd_session_t *s) { pthread_mutex_unlock(&s->mutex); }

/* ---- the books ----------------------------------------------------------------------- */
/* A spare that holds count ids, or a new entry. */
static entry_t *entry_for(envd_session_t *s, int64_t count)
{
    for (entry_t **link = &s->spares; *link != NULL; link = &(*link)->next) {
        if ((*link)->capacity >= count && (*link)->capacity <= 2 * count) {
            entry_t *e = *link;
            *link = e->next;
            e->next = NULL;
            s->spare_capacity -= e->capacity;
            return e;
        }
    }
    entry_t *e = calloc(1, sizeof *e);
    if (e == NULL)
        return NULL;
    e->ids = malloc((size_t)count * sizeof *e->ids);
    if (e->ids == NULL ||
        s->backend->ops->batch_create(s->backend->impl, &e->batch, count) != ENVD_OK) {
        free(e->ids);
        free(e);
        return NULL;
    }
    e->capacity = count;
    return e;
}

static void to_spares(envd_session_t *s, entry_t *e)
{
    e->next = NULL;
    if (s->spare_capacity + e->capacity > 2 * s->num_envs) {
        free_entries(s, e);
        return;
    }
    s->spare_capacity += e->capacity;
    e->next = s->spares;
    s->spares = e;
}

/* The ring's positions wrap by a compare, not a modulo: a division per id
 * was a measurable share of a cheap env's async batch (docs/benchmarks.md). */
static void push_ready(envd_session_t *s, const int64_t *ids, int64_t count)
{
    int64_t pos = s->ready_head + s->num_ready; /* both < num_envs */
    if (pos >= s->num_envs)
        pos -= s->num_envs;
    for (int64_t k = 0; k < count; k++) {
        s->ready[pos] = ids[k];
        if (++pos == s->num_envs)
            pos = 0;
        s->state[ids[k]] = ENVD_ENV_READY;
    }
    s->num_ready += count;
}

/* End the batches that finished, in submit order: their envs become ready,
 * the first failure is kept. */
/* Publish whether the next envd_session_step is short (under the mutex):
 * its envs' measured cost above 0 and under ENVD_SESSION_SHORT_STEP_NS in
 * all, half the vec's inline threshold, so that the vec runs it inline
 * (step_choice.h: under the threshold a blocking step is never pooled),
 * and no chunk forced (a forced chunk sends every step to the pool). */
static void publish_short(envd_session_t *s)
{
    const envd_backend_ops_t *ops = s->backend->ops;
    const double ns = ops->step_estimate_ns ? ops->step_estimate_ns(s->backend->impl) : 0.0;
    const int is_short = ns > 0.0 && ns < (double)ENVD_SESSION_SHORT_STEP_NS;
    atomic_store_explicit(&s->short_step, is_short, memory_order_relaxed);
}

static void collect(envd_session_t *s)
{
    const envd_backend_ops_t *ops = s->backend->ops;
    entry_t **link = &s->head, *last = NULL;
    bool finished = false;
    while (*link != NULL) {
        entry_t *e = *link;
        if (!ops->batch_done(e->batch)) {
            last = e;
            link = &e->next;
            continue;
        }
        *link = e->next;
        finished = true;
        int rc = ops->batch_finish(s->backend->impl, e->batch);
        if (rc < 0 && s->error == 0) {
            s->error = rc;
            s->error_index_kept = ops->error_index(s->backend->impl);
        }
        push_ready(s, e->ids, e->count);
        if (e->seq > s->newest_finished)
            s->newest_finished = e->seq;
        s->in_flight -= e->count;
        atomic_fetch_add_explicit(&s->async_env_steps, e->count, memory_order_relaxed);
        to_spares(s, e);
    }
    s->tail = last;
    if (finished) /* (a batch's envs update the measured cost) */
        publish_short(s);
}

static int any_done(const envd_session_t *s)
{
    for (const entry_t *e = s->head; e != NULL; e = e->next)
        if (s->backend->ops->batch_done(e->batch))
            return 1;
    return 0;
}

void envd_session_drop_async(envd_session_t *s)
{
    pthread_mutex_lock(&s->mutex);
    const envd_backend_ops_t *ops = s->backend->ops;
    while (s->head != NULL) {
        entry_t *e = s->head;
        ops->batch_wait(s->backend->impl, e->batch);
        (void)ops->batch_finish(s->backend->impl, e->batch); /* nobody waits for it */
        s->head = e->next;
        to_spares(s, e);
    }
    s->tail = NULL;
    s->in_flight = 0;
    s->ready_head = s->num_ready = 0;
    s->error = 0;
    memset(s->state, ENVD_ENV_IDLE, (size_t)s->num_envs);
    pthread_mutex_unlock(&s->mutex);
}

/* A front door's request of kind beside the one claimed (session.h,
 * envd_session_admit): every request starts here, naming no env yet. */
static inline int admit(envd_session_t *s, int kind)
{
    s->error_index = -1;
    const int claimed = s->claimed;
    return claimed == 0 || (kind == ENVD_REQ_SEND && claimed == ENVD_REQ_RECV) ? ENVD_OK
                                                                               : ENVD_EBUSY;
}

/* ENVD_OK when no env is in flight (and, unless ready_ok, none ready), else
 * ENVD_EBUSY (as the vec answers a whole-vec call beside a batch). */
static int check_idle(envd_session_t *s, int ready_ok)
{
    s->error_index = -1;
    if (s->head != NULL)
        collect(s);
    if (s->in_flight > 0)
        return ENVD_EBUSY;
    if (s->num_ready > 0 && !ready_ok)
        return ENVD_EBUSY;
    return ENVD_OK;
}

static void forget_ready(envd_session_t *s)
{
    for (int64_t k = 0; k < s->num_ready; k++)
        s->state[s->ready[(s->ready_head + k) % s->num_envs]] = ENVD_ENV_IDLE;
    s->ready_head = s->num_ready = 0;
    s->error = 0;
}

/* ---- whole-vec calls ----------------------------------------------------------------- */
/* A whole-vec call (seed, reset, async_reset, render) is decided as a step:
 * refused beside any request another front door claimed (admit), whatever
 * the envs' states -- it reads or rewrites every env, the claimed request's
 * among them. */
int envd_session_seed(envd_session_t *s, const uint64_t *seeds)
{
    pthread_mutex_lock(&s->mutex);
    int rc = admit(s, ENVD_REQ_STEP);
    if (rc == ENVD_OK)
        rc = check_idle(s, 1); /* (a batch in flight reads its envs' generators) */
    if (rc == ENVD_OK)
        s->backend->ops->seed(s->backend->impl, seeds);
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

int envd_session_reset(envd_session_t *s, const uint64_t *seeds, const bool *mask)
{
    pthread_mutex_lock(&s->mutex);
    int rc = admit(s, ENVD_REQ_STEP);
    if (rc == ENVD_OK)
        rc = check_idle(s, 1);
    if (rc == ENVD_OK) {
        forget_ready(s);
        rc = s->backend->ops->reset(s->backend->impl, seeds, mask);
        publish_short(s);
    }
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

int64_t envd_session_reset_count(envd_session_t *s)
{
    pthread_mutex_lock(&s->mutex);
    int64_t count = s->backend->ops->reset_count(s->backend->impl);
    pthread_mutex_unlock(&s->mutex);
    return count;
}

static int finish_step(envd_session_t *s, int rc)
{
    publish_short(s); /* (a failed step measured its envs too) */
    /* (a load and a store, not a locked add: every writer holds the mutex,
       and readers only load) */
    if (rc >= 0)
        atomic_store_explicit(&s->steps, atomic_load_explicit(&s->steps, memory_order_relaxed) + 1,
                              memory_order_relaxed);
    else
        s->error_index = s->backend->ops->error_index(s->backend->impl);
    return rc;
}

/* envd_session_step's work, the mutex held (and released here). */
static int step_and_unlock(envd_session_t *s)
{
    int rc = admit(s, ENVD_REQ_STEP);
    if (rc == ENVD_OK)
        rc = check_idle(s, 0);
    if (rc == ENVD_OK)
        rc = finish_step(s, s->backend->ops->step(s->backend->impl));
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

int envd_session_step(envd_session_t *s)
{
    if (s == NULL)  /* (a closed Python wrapper's handle: refused, not a crash) */
        return ENVD_EINVAL;
    pthread_mutex_lock(&s->mutex);
    return step_and_unlock(s);
}

int envd_session_step_if_short(envd_session_t *s)
{
    if (s == NULL)
        return ENVD_EINVAL;
    if (!atomic_load_explicit(&s->short_step, memory_order_relaxed) ||
        pthread_mutex_trylock(&s->mutex) != 0)
        return ENVD_SESSION_NOT_RUN;
    return step_and_unlock(s);
}

int envd_session_step_submit(envd_session_t *s)
{
    pthread_mutex_lock(&s->mutex);
    int rc = check_idle(s, 0);
    if (rc == ENVD_OK) {
        rc = s->backend->ops->step_submit(s->backend->impl);
        if (rc < 0)
            s->error_index = s->backend->ops->error_index(s->backend->impl);
    }
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

int envd_session_step_done(envd_session_t *s)
{
    pthread_mutex_lock(&s->mutex);
    int done = s->backend->ops->step_done(s->backend->impl);
    pthread_mutex_unlock(&s->mutex);
    return done;
}

int envd_session_step_finish(envd_session_t *s)
{
    pthread_mutex_lock(&s->mutex);
    int rc = finish_step(s, s->backend->ops->step_finish(s->backend->impl));
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

/* ---- async --------------------------------------------------------------------------- */
int envd_session_async_reset(envd_session_t *s, const uint64_t *seeds)
{
    pthread_mutex_lock(&s->mutex);
    /* (before anything is dropped: beside another door's request, its envs
     * and a kept failure stay its own) */
    int rc = admit(s, ENVD_REQ_STEP);
    if (rc != ENVD_OK)
        goto out;
    envd_session_drop_async(s);
    rc = s->backend->ops->reset(s->backend->impl, seeds, NULL);
    publish_short(s);
    if (rc == ENVD_OK) {
        for (int64_t i = 0; i < s->num_envs; i++)
            s->ready[i] = i;
        s->num_ready = s->num_envs;
        memset(s->state, ENVD_ENV_READY, (size_t)s->num_envs);
    }
out:
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

/* Range and state of the private copy of a send's ids, in their order (the
 * first bad id is named); repeats are the backend's to refuse. */
static int check_send(envd_session_t *s, const int64_t *ids, int64_t count)
{
    for (int64_t k = 0; k < count; k++) {
        const int64_t i = ids[k];
        s->error_index = i;
        if (i < 0 || i >= s->num_envs)
            return ENVD_EINVAL;
        if (s->state[i] != ENVD_ENV_IDLE)
            return ENVD_EBUSY;
    }
    s->error_index = -1;
    return ENVD_OK;
}

/* check_send for ids that are a run in range (EnvPool's every batch): one
 * pass over their states; 0 when one is not idle (check_send then names it). */
static int run_idle(const envd_session_t *s, const int64_t *ids, int64_t count)
{
    if (!envd_ids_are_run_within(ids, count, s->num_envs))
        return 0;
    const int8_t *state = s->state + ids[0];
    int8_t busy = 0;
    for (int64_t k = 0; k < count; k++)
        busy |= (int8_t)(state[k] != ENVD_ENV_IDLE);
    return !busy;
}

int envd_session_send(envd_session_t *s, const int64_t *ids, int64_t count, int flags)
{
    pthread_mutex_lock(&s->mutex);
    int rc = admit(s, ENVD_REQ_SEND);
    if (rc != ENVD_OK)
        goto out;
    /* Beside a claimed recv (admitted: the claim is a recv), whose door may
     * wait on the pool's eventfd: the batch writes it, also when it runs
     * inline (below).  A caller that asked NOTIFY itself looks at an inline
     * batch itself (envd_engine_send). */
    const int announce = s->claimed != 0 && !(flags & ENVD_JOB_NOTIFY);
    if (announce)
        flags |= ENVD_JOB_NOTIFY;
    rc = ENVD_EINVAL;
    if (ids == NULL || count < 1 || count > s->num_envs)
        goto out;
    entry_t *e = entry_for(s, count);
    rc = ENVD_ENOMEM;
    if (e == NULL)
        goto out;
    memcpy(e->ids, ids, (size_t)count * sizeof *e->ids);
    const int run = run_idle(s, e->ids, count);
    rc = run ? ENVD_OK : check_send(s, e->ids, count);
    if (s->backend->ops->batch_help == NULL)
        flags &= ~ENVD_JOB_HELPED; /* nobody can help: the backend's threads run it */
    if (rc == ENVD_OK)
        rc = s->backend->ops->batch_submit(s->backend->impl, e->batch, e->ids, count, flags);
    /* (done already: run inline, no eventfd written; or, rarely, a pool
     * thread ended it and wrote one too -- a spare event, which the loop's
     * poll finds nothing new for) */
    if (rc == ENVD_OK && announce && s->backend->ops->notify != NULL &&
        s->backend->ops->batch_done(e->batch))
        s->backend->ops->notify(s->backend->impl);
    if (rc != ENVD_OK) {
        if (s->error_index == -1)
            s->error_index = s->backend->ops->error_index(s->backend->impl);
        to_spares(s, e);
        goto out;
    }
    e->count = count;
    e->seq = ++s->sends;
    e->passed = 0;
    if (s->tail == NULL)
        s->head = e;
    else
        s->tail->next = e;
    s->tail = e;
    s->in_flight += count;
    if (run)
        memset(s->state + e->ids[0], ENVD_ENV_IN_FLIGHT, (size_t)count);
    else
        for (int64_t k = 0; k < count; k++)
            s->state[e->ids[k]] = ENVD_ENV_IN_FLIGHT;
    collect(s); /* early finishers (inline batches) keep the ready order */
out:
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

int envd_session_take_help(envd_session_t *s, envd_session_help_t *help)
{
    pthread_mutex_lock(&s->mutex);
    const envd_backend_ops_t *ops = s->backend->ops;
    help->backend = s->backend;
    help->count = 0;
    if (ops->batch_help_ref != NULL) {
        /* The oldest first: a recv takes the envs that finished first, so
         * the oldest batch is the one its client waits for next. */
        entry_t *e = s->head;
        for (; e != NULL && help->count < ENVD_SESSION_MAX_HELP - 1; e = e->next)
            if (ops->batch_help_ref(e->batch))
                help->batches[help->count++] = e->batch;
        /* Then the newest, if the walk stopped before it: a send's batch
         * woke one worker fewer for its helper, or none (vec.h). */
        if (e != NULL && ops->batch_help_ref(s->tail->batch))
            help->batches[help->count++] = s->tail->batch;
    }
    pthread_mutex_unlock(&s->mutex);
    return help->count;
}

void envd_session_help(envd_session_help_t *help, int (*leave)(void *), void *arg)
{
    /* Each one, even once leave(arg) said stop: batch_help then only drops
     * its reference. */
    for (int k = 0; k < help->count; k++)
        help->backend->ops->batch_help(help->backend->impl, help->batches[k], leave, arg);
    help->count = 0;
}

static inline int64_t take_ready(envd_session_t *s, int64_t max_count, int64_t *out)
{
    const int64_t n = s->num_ready < max_count ? s->num_ready : max_count;
    int64_t pos = s->ready_head;
    for (int64_t k = 0; k < n; k++) {
        const int64_t i = s->ready[pos];
        if (++pos == s->num_envs)
            pos = 0;
        out[k] = i;
        s->state[i] = ENVD_ENV_IDLE;
    }
    s->ready_head = pos;
    s->num_ready -= n;
    return n;
}

/* Fairness of "ready first".  A batch can be overtaken by a later send (a
 * cheap batch runs inline and finishes at once) while it waits in the pool
 * with no chunk claimed: its worker is waking up (20-40 us), busy, or not
 * scheduled -- on one CPU the pool's SCHED_BATCH worker waited behind a
 * trainer that never blocks, and recv returned the inline batch's envs
 * again and again (an env of EnvPool's loop missed up to 171 recvs in a
 * row).  A waiting recv lets such a batch be passed over once, so that a
 * worker merely waking up is not raced and a recv with enough envs ready
 * does not block on a large batch; a batch still overtaken and unstarted at
 * a later recv has had a whole turn of the trainer to start, and that recv
 * runs it on its own thread (batch_wait) before it returns.  Batches a
 * worker started, or that no later batch overtook (EnvPool's loop of equal
 * batches: each finishes in turn), are left to the workers.  Returns
 * whether it ran one (the books then need collecting again). */
static int run_overtaken(envd_session_t *s)
{
    const envd_backend_ops_t *ops = s->backend->ops;
    if (ops->batch_unstarted == NULL)
        return 0;
    for (entry_t *e = s->head; e != NULL && e->seq < s->newest_finished; e = e->next) {
        if (!ops->batch_unstarted(e->batch))
            continue;
        if (e->passed) {
            ops->batch_wait(s->backend->impl, e->batch);
            return 1;
        }
        e->passed = 1; /* (the recv returns next: run_overtaken found none to run) */
    }
    return 0;
}

/* The kept failure, reported once (its envs stay ready). */
static int take_error(envd_session_t *s)
{
    const int rc = s->error;
    s->error_index = s->error_index_kept;
    s->error = 0;
    return rc;
}

/* envd_session_recv's work, admitted (the lock held). */
static inline int64_t recv_ids(envd_session_t *s, int64_t min_count, int64_t max_count,
                               int64_t *out, int wait)
{
    int64_t rc;
    if (out == NULL || min_count < 1 || min_count > s->num_envs || max_count < min_count) {
        rc = ENVD_EINVAL;
        goto out;
    }
    for (;;) {
        collect(s);
        if (s->error != 0) {
            rc = take_error(s);
            goto out;
        }
        if (s->num_ready + s->in_flight < min_count) {
            rc = ENVD_ESTATE;
            goto out;
        }
        if (s->num_ready >= min_count) {
            if (wait && run_overtaken(s))
                continue;
            rc = take_ready(s, max_count, out);
            goto out;
        }
        if (!wait) {
            rc = 0;
            goto out;
        }
        if (!any_done(s))
            s->backend->ops->batch_wait(s->backend->impl, s->head->batch);
    }
out:
    return rc;
}

int64_t envd_session_recv(envd_session_t *s, int64_t min_count, int64_t max_count,
                          int64_t *out, int wait)
{
    pthread_mutex_lock(&s->mutex);
    int64_t rc = admit(s, ENVD_REQ_RECV);
    if (rc == ENVD_OK)
        rc = recv_ids(s, min_count, max_count, out, wait);
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

int64_t envd_session_recv_claimed(envd_session_t *s, int64_t min_count, int64_t max_count,
                                  int64_t *out)
{
    pthread_mutex_lock(&s->mutex);
    s->error_index = -1;
    const int64_t rc = recv_ids(s, min_count, max_count, out, 0);
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

void envd_session_counts(envd_session_t *s, int64_t *in_flight, int64_t *ready)
{
    pthread_mutex_lock(&s->mutex);
    if (s->head != NULL)
        collect(s);
    if (in_flight != NULL)
        *in_flight = s->in_flight;
    if (ready != NULL)
        *ready = s->num_ready;
    pthread_mutex_unlock(&s->mutex);
}

int envd_session_env_state(envd_session_t *s, int64_t index)
{
    if (index < 0 || index >= s->num_envs)
        return ENVD_EINVAL;
    pthread_mutex_lock(&s->mutex);
    int state = s->state[index];
    pthread_mutex_unlock(&s->mutex);
    return state;
}

int envd_session_env_started(envd_session_t *s, int64_t index)
{
    if (index < 0 || index >= s->num_envs)
        return ENVD_EINVAL;
    pthread_mutex_lock(&s->mutex);
    int started = s->backend->ops->env_started(s->backend->impl, index);
    pthread_mutex_unlock(&s->mutex);
    return started;
}

/* ---- other --------------------------------------------------------------------------- */
int envd_session_render(envd_session_t *s, uint8_t *out)
{
    pthread_mutex_lock(&s->mutex);
    const envd_backend_ops_t *ops = s->backend->ops;
    /* Not while envs are ready either: whether a batch sent has finished by
     * now depends on the threads, so "in flight" alone would refuse the same
     * calls at random; ready envs' states are results not received yet. */
    int rc = admit(s, ENVD_REQ_STEP);
    if (rc == ENVD_OK)
        rc = check_idle(s, 0);
    const uint64_t frame = ops->frame_bytes(s->backend->impl);
    if (rc == ENVD_OK && (frame == 0 || out == NULL))
        rc = ENVD_EINVAL;
    for (int64_t i = 0; rc == ENVD_OK && i < s->num_envs; i++) {
        rc = ops->render(s->backend->impl, i, out + (uint64_t)i * frame);
        if (rc != ENVD_OK)
            s->error_index = i;
    }
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

uint64_t envd_session_frame_bytes(envd_session_t *s)
{
    return s->backend->ops->frame_bytes(s->backend->impl);
}

void envd_session_set_chunk(envd_session_t *s, int64_t chunk)
{
    pthread_mutex_lock(&s->mutex);
    s->backend->ops->set_chunk(s->backend->impl, chunk);
    publish_short(s);
    pthread_mutex_unlock(&s->mutex);
}

int envd_session_set_max_threads(envd_session_t *s, int max_threads)
{
    if (s->backend->ops->set_max_threads == NULL) /* (an optional op: the workers
                                                   * backend has no pool to cap) */
        return ENVD_EINVAL;
    pthread_mutex_lock(&s->mutex);
    int rc = s->backend->ops->set_max_threads(s->backend->impl, max_threads);
    publish_short(s);
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

void envd_session_stats(envd_session_t *s, envd_vec_stats_t *stats)
{
    pthread_mutex_lock(&s->mutex);
    s->backend->ops->stats(s->backend->impl, stats);
    pthread_mutex_unlock(&s->mutex);
}

int64_t envd_session_error_index(const envd_session_t *s) { return s->error_index; }

void envd_session_error_message(envd_session_t *s, int64_t index, char *out, size_t size)
{
    if (size == 0)
        return;
    out[0] = '\0';
    pthread_mutex_lock(&s->mutex);
    if (s->backend->ops->error_message != NULL)
        s->backend->ops->error_message(s->backend->impl, index, out, size);
    pthread_mutex_unlock(&s->mutex);
}

const void *envd_session_checked_actions(const envd_session_t *s)
{
    return s->backend->ops->checked_actions(s->backend->impl);
}

int64_t envd_session_steps(const envd_session_t *s)
{
    return atomic_load_explicit(&((envd_session_t *)s)->steps, memory_order_relaxed);
}

int64_t envd_session_async_env_steps(const envd_session_t *s)
{
    return atomic_load_explicit(&((envd_session_t *)s)->async_env_steps, memory_order_relaxed);
}

int64_t envd_session_spare_capacity(envd_session_t *s)
{
    pthread_mutex_lock(&s->mutex);
    const int64_t capacity = s->spare_capacity;
    pthread_mutex_unlock(&s->mutex);
    return capacity;
}

uint64_t envd_session_books_max_bytes(int64_t num_envs)
{
    const uint64_t n = num_envs > 0 ? (uint64_t)num_envs : 0;
    const uint64_t per_entry = sizeof(entry_t) + envd_backend_batch_bytes(0);
    /* state and ready ring; 3n entries; 4n ids of capacity, each in the
     * entry and its batch */
    return sizeof(envd_session_t) + n * (sizeof(int8_t) + sizeof(int64_t)) + 3 * n * per_entry +
           4 * n * 2 * sizeof(int64_t);
}

/* ---- the engine's book ---------------------------------------------------------------- */
int envd_session_claim(envd_session_t *s, int kind)
{
    pthread_mutex_lock(&s->mutex);
    const int rc = s->claimed != 0 ? ENVD_EBUSY : ENVD_OK;
    if (rc == ENVD_OK)
        s->claimed = kind;
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

void envd_session_release(envd_session_t *s)
{
    pthread_mutex_lock(&s->mutex);
    s->claimed = 0;
    pthread_mutex_unlock(&s->mutex);
}

int envd_session_claimed(const envd_session_t *s) { return s->claimed; }

int envd_session_admit(envd_session_t *s, int kind) { return admit(s, kind); }

/* ---- the attached server ------------------------------------------------------------- */
int envd_session_attach_server(envd_session_t *s, const envd_session_server_ops_t *ops,
                               void *server)
{
    if (ops == NULL || server == NULL)
        return ENVD_EINVAL;
    pthread_mutex_lock(&s->mutex);
    int rc = ENVD_EBUSY;
    if (s->server == NULL) {
        s->server_ops = ops;
        s->server = server;
        rc = ENVD_OK;
    }
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

int envd_session_has_server(envd_session_t *s)
{
    pthread_mutex_lock(&s->mutex);
    const int has = s->server != NULL;
    pthread_mutex_unlock(&s->mutex);
    return has;
}

void envd_session_stop_server(envd_session_t *s)
{
    /* Not under the mutex: the server's thread may be waiting for it (stop
     * waits for that thread).  The server pointer belongs to the callers of
     * attach and stop, which do not race (session.h). */
    void *server = s->server;
    if (server == NULL)
        return;
    s->server = NULL;
    s->server_ops->stop(server);
}

void envd_session_drain(envd_session_t *s)
{
    if (s->server != NULL)
        s->server_ops->drain(s->server);
}

int envd_session_step_is_short(envd_session_t *s)
{
    if (s == NULL)
        return 1;
    return atomic_load_explicit(&s->short_step, memory_order_relaxed);
}
