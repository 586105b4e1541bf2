/*
 * backend.h -- a stepping backend: what runs a session's envs (session.h).
 *
 * The session keeps the books (which env is idle, in flight or ready, in
 * what order) and serialises its callers; a backend only steps: every env at
 * once (reset, step), or a batch of env ids while the caller goes on
 * (batch_submit ... batch_finish).  One struct of function pointers per kind
 * of backend, in the style of EnvPool's envpool/core/envpool.h:
 *
 *   backend_pool.c  C envs in a vec (vec.h) stepped by a thread pool (pool.h)
 *   (issue 17)      Python envs hosted in worker processes
 *
 * Contract (every backend): the caller's buffers (envd_vec_buffers_t: inputs
 * the caller writes, outputs it reads) are the backend's to read and write
 * during a call and while a step or batch of it is in flight; a backend
 * copies the inputs it acts on (actions, ids, seeds, mask) into its own
 * memory before it checks them (the buffers may be shared memory another
 * process writes).  Errors are negative ENVD_E* codes; error_index names the
 * env a refusal or failure is about (-1: none).  Results are bit-identical
 * whatever the backend's threads or chunking.
 *
 * Threading: one call at a time (the session's lock); a backend's own threads
 * run the work in flight.
 */
#ifndef ENVD_BACKEND_H
#define ENVD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vec.h"

/* cffi:begin */
typedef struct envd_backend_batch envd_backend_batch_t; /* a backend's async batch */
typedef struct envd_backend envd_backend_t;
/* cffi:end */

typedef struct envd_backend_ops {
    /* Seed every env's generator (seeds: num_envs entries), no reset. */
    void (*seed)(void *impl, const uint64_t *seeds);
    /* Reset the envs in mask (NULL: all), reseeding them first if seeds. */
    int (*reset)(void *impl, const uint64_t *seeds, const bool *mask);
    /* Envs the last reset selected (its private copy of the mask). */
    int64_t (*reset_count)(const void *impl);
    /* Step every env: envs whose episode ended, or an error. */
    int (*step)(void *impl);
    /* step split for an event loop: submit, poll done, finish (as vec.h). */
    int (*step_submit)(void *impl);
    int (*step_done)(const void *impl);
    int (*step_finish)(void *impl);
    /* Async batches of up to capacity envs, reused by the session. */
    int (*batch_create)(void *impl, envd_backend_batch_t **out, int64_t capacity);
    void (*batch_destroy)(void *impl, envd_backend_batch_t *batch);
    /* Start stepping ids[0 .. count) (copied) with their actions; flags:
     * ENVD_JOB_NOTIFY (the pool's eventfd counts its completion),
     * ENVD_JOB_HELPED (only where batch_help is not NULL). */
    int (*batch_submit)(void *impl, envd_backend_batch_t *batch, const int64_t *ids,
                        int64_t count, int flags);
    int (*batch_done)(const envd_backend_batch_t *batch);
    /* Optional (NULL: every batch sent with ENVD_JOB_NOTIFY writes the
     * eventfd itself when it ends): count one event on the eventfd a NOTIFY
     * batch writes, for a NOTIFY batch that ended before batch_submit
     * returned (run inline: it wrote none), once it is done. */
    void (*notify)(void *impl);
    /* Block until done (the calling thread may run its work meanwhile). */
    void (*batch_wait)(void *impl, envd_backend_batch_t *batch);
    /* Optional (NULL: never): non-zero while the batch is in flight and no
     * thread has started it, so that batch_wait would run it on the caller's
     * thread (a snapshot, as envd_vec_batch_unstarted). */
    int (*batch_unstarted)(const envd_backend_batch_t *batch);
    /* Optional (NULL: the backend's own threads run every batch): help a
     * batch in flight, as envd_vec_batch_help_ref / _help (vec.h); a batch
     * submitted with ENVD_JOB_HELPED expects the help. */
    int (*batch_help_ref)(envd_backend_batch_t *batch);
    void (*batch_help)(void *impl, envd_backend_batch_t *batch, int (*leave)(void *),
                       void *arg);
    /* End a done batch: envs whose episode ended, or ENVD_EENV. */
    int (*batch_finish)(void *impl, envd_backend_batch_t *batch);
    /* Bytes of one env's frame (0: the env does not render); draw env index. */
    uint64_t (*frame_bytes)(const void *impl);
    int (*render)(void *impl, int64_t index, uint8_t *rgb);
    int64_t (*error_index)(const void *impl);
    /* 1 once env index (in range) was reset, else 0: the backend's own word,
     * never a client-writable buffer (names a refused step's ENVD_ESTATE). */
    int (*env_started)(const void *impl, int64_t index);
    /* What failed env index with ENVD_EENV, as text (NUL-terminated, at most
     * size > 0 bytes); NULL: the backend has no more to say than the code. */
    void (*error_message)(const void *impl, int64_t index, char *out, size_t size);
    /* The backend's copy of the actions the last step or send checked. */
    const void *(*checked_actions)(const void *impl);
    void (*set_chunk)(void *impl, int64_t chunk);
    /* Optional (NULL: never short): the wall time a blocking step is
     * measured to take, ns; 0 while unmeasured or while a forced chunk sends
     * every step to the pool (envd_vec_step_estimate_ns).  Read after every
     * step (session.c publish_short): one load or two, no copy. */
    double (*step_estimate_ns)(const void *impl);
    /* Cap the pool threads stepping these envs (vec.h, envd_vec_set_max_threads);
     * optional (NULL: no pool to cap, envd_session_set_max_threads refuses). */
    int (*set_max_threads)(void *impl, int max_threads);
    void (*stats)(const void *impl, envd_vec_stats_t *stats);
    /* Free the backend itself (after every batch was finished). */
    void (*destroy)(envd_backend_t *backend);
} envd_backend_ops_t;

struct envd_backend {
    const envd_backend_ops_t *ops;
    void *impl;
    int64_t num_envs;
};

/* Bytes a batch of capacity envs of any backend allocates at most (for the
 * session's bound on its books). */
uint64_t envd_backend_batch_bytes(int64_t capacity);

/* ---- backend_pool.c: a vec on a thread pool ---- */

/* cffi:begin */
/* A new vec (envd_vec_create's arguments) as a backend that owns it. */
int envd_backend_pool_create(envd_backend_t **out, const envd_env_def_t *def,
                             const envd_vec_config_t *config,
                             const envd_vec_buffers_t *buffers, envd_pool_t *pool);
/* cffi:end */

/* A backend over an existing vec of num_envs envs that it does not own
 * (destroy leaves the vec; tests drive one vec directly and through a
 * session). */
int envd_backend_pool_wrap(envd_backend_t **out, envd_vec_t *vec, int64_t num_envs);

/* Free a backend (NULL allowed): backend->ops->destroy.  The session does
 * this in its destroy. */
void envd_backend_destroy(envd_backend_t *backend);

#endif /* ENVD_BACKEND_H */
