/*
 * batch_queue.c -- async batches of one vec, for a C caller (see batch_queue.h).
 *
 * Invariants: in_flight is the sum of the counts of the entries from head to
 * tail (submit order); every id appears at most once in those entries and in
 * ready[0 .. num_ready); in_flight + num_ready <= num_envs.  An entry owns its
 * batch and a private copy of its ids; finished entries go to the spares and
 * are reused by later submits that fit: capacity in [count, 2 * count], so
 * the entries in flight hold at most 2 * num_envs ids.  The spares hold at
 * most 2 * num_envs ids in all (sends of ever larger batches would otherwise
 * keep every size ever sent).  Hence envd_batch_queue_max_bytes: at most
 * num_envs entries in flight (each holds an env) and 2 * num_envs spares
 * (each holds room for one), 4 * num_envs ids of capacity in all.
 */
#include "batch_queue.h"

#include <stdlib.h>
#include <string.h>

#include "envd.h"

typedef struct entry {
    envd_vec_batch_t *batch;
    int64_t capacity;
    int64_t count;     /* ids of the submit in flight */
    int64_t *ids;      /* capacity entries, private */
    struct entry *next;
} entry_t;

struct envd_batch_queue {
    envd_vec_t *vec;
    int64_t num_envs;
    entry_t *head, *tail;  /* in flight, oldest first */
    entry_t *spares;
    int64_t spare_capacity;  /* ids the spares hold, <= 2 * num_envs */
    int64_t in_flight;
    int64_t *ready;        /* num_envs entries */
    int64_t num_ready;
    int error;             /* the first failure found, not reported yet */
    int64_t error_index;
    int64_t finished;
};

int envd_batch_queue_create(envd_batch_queue_t **out, envd_vec_t *vec, int64_t num_envs)
{
    if (out == NULL || vec == NULL || num_envs < 1 || num_envs > ENVD_VEC_MAX_ENVS)
        return ENVD_EINVAL;
    envd_batch_queue_t *q = calloc(1, sizeof *q);
    int64_t *ready = malloc((size_t)num_envs * sizeof *ready);
    if (q == NULL || ready == NULL) {
        free(q);
        free(ready);
        return ENVD_ENOMEM;
    }
    q->vec = vec;
    q->num_envs = num_envs;
    q->ready = ready;
    *out = q;
    return ENVD_OK;
}

static void free_entries(entry_t *e)
{
    while (e != NULL) {
        entry_t *next = e->next;
        envd_vec_batch_destroy(e->batch);
        free(e->ids);
        free(e);
        e = next;
    }
}

void envd_batch_queue_destroy(envd_batch_queue_t *q)
{
    if (q == NULL)
        return;
    for (entry_t *e = q->head; e != NULL; e = e->next) {
        envd_vec_batch_wait(q->vec, e->batch);
        (void)envd_vec_batch_finish(q->vec, e->batch);  /* nobody waits for it */
    }
    free_entries(q->head);
    free_entries(q->spares);
    free(q->ready);
    free(q);
}

/* A spare that holds count ids, or a new entry. */
static entry_t *entry_for(envd_batch_queue_t *q, int64_t count)
{
    for (entry_t **link = &q->spares; *link != NULL; link = &(*link)->next) {
        if ((*link)->capacity >= count && (*link)->capacity <= 2 * count) {
            entry_t *e = *link;
            *link = e->next;
            e->next = NULL;
            q->spare_capacity -= e->capacity;
            return e;
        }
    }
    entry_t *e = calloc(1, sizeof *e);
    if (e == NULL)
        return NULL;
    e->ids = malloc((size_t)count * sizeof *e->ids);
    if (e->ids == NULL || envd_vec_batch_create(&e->batch, count) != ENVD_OK) {
        free(e->ids);
        free(e);
        return NULL;
    }
    e->capacity = count;
    return e;
}

static void to_spares(envd_batch_queue_t *q, entry_t *e)
{
    e->next = NULL;
    if (q->spare_capacity + e->capacity > 2 * q->num_envs) {
        free_entries(e);
        return;
    }
    q->spare_capacity += e->capacity;
    e->next = q->spares;
    q->spares = e;
}

int envd_batch_queue_submit(envd_batch_queue_t *q, const int64_t *env_ids, int64_t count)
{
    if (env_ids == NULL || count < 1 || count > q->num_envs)
        return ENVD_EINVAL;
    entry_t *e = entry_for(q, count);
    if (e == NULL)
        return ENVD_ENOMEM;
    memcpy(e->ids, env_ids, (size_t)count * sizeof *e->ids);
    int rc = envd_vec_batch_submit(q->vec, e->batch, e->ids, count, 0);
    if (rc != ENVD_OK) {
        to_spares(q, e);
        return rc;
    }
    e->count = count;
    if (q->tail == NULL)
        q->head = e;
    else
        q->tail->next = e;
    q->tail = e;
    q->in_flight += count;
    return ENVD_OK;
}

/* In submit order. */
void envd_batch_queue_collect(envd_batch_queue_t *q)
{
    entry_t **link = &q->head, *last = NULL;
    while (*link != NULL) {
        entry_t *e = *link;
        if (!envd_vec_batch_done(e->batch)) {
            last = e;
            link = &e->next;
            continue;
        }
        *link = e->next;
        int rc = envd_vec_batch_finish(q->vec, e->batch);
        if (rc < 0 && q->error == 0) {
            q->error = rc;
            q->error_index = envd_vec_error_index(q->vec);
        }
        memcpy(q->ready + q->num_ready, e->ids, (size_t)e->count * sizeof *e->ids);
        q->num_ready += e->count;
        q->in_flight -= e->count;
        q->finished += e->count;
        to_spares(q, e);
    }
    q->tail = last;
}

static int any_done(const envd_batch_queue_t *q)
{
    for (const entry_t *e = q->head; e != NULL; e = e->next)
        if (envd_vec_batch_done(e->batch))
            return 1;
    return 0;
}

int64_t envd_batch_queue_take(envd_batch_queue_t *q, int64_t count, int64_t *out,
                              int64_t *error_index)
{
    *error_index = -1;
    if (out == NULL || count < 1 || count > q->num_envs)
        return ENVD_EINVAL;
    for (;;) {
        envd_batch_queue_collect(q);
        if (q->error != 0) {
            int rc = q->error;
            *error_index = q->error_index;
            q->error = 0;
            return rc;
        }
        if (q->num_ready + q->in_flight < count)
            return ENVD_ESTATE;
        if (q->num_ready >= count) {
            int64_t n = q->num_ready;
            memcpy(out, q->ready, (size_t)n * sizeof *out);
            q->num_ready = 0;
            return n;
        }
        if (!any_done(q))
            envd_vec_batch_wait(q->vec, q->head->batch);
    }
}

uint64_t envd_batch_queue_max_bytes(int64_t num_envs)
{
    const uint64_t n = num_envs > 0 ? (uint64_t)num_envs : 0;
    const uint64_t per_entry = sizeof(entry_t) + envd_vec_batch_memory_bytes(0);
    /* ready ids; 3n entries; 4n ids of capacity, each in the entry and its batch */
    return sizeof(envd_batch_queue_t) + n * sizeof(int64_t) + 3 * n * per_entry +
           4 * n * 2 * sizeof(int64_t);
}

int64_t envd_batch_queue_pending(const envd_batch_queue_t *q)
{
    return q->in_flight + q->num_ready;
}

int64_t envd_batch_queue_finished(const envd_batch_queue_t *q)
{
    return q->finished;
}
