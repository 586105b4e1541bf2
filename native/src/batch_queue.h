/*
 * batch_queue.h -- the async batches of one vec and the envs they finished,
 * for a caller in C: the fast path's server thread (fast.c) serves a
 * session's send and recv with it.  envd.native.native_vec.AsyncBatches and
 * the daemon's Session keep the same books in Python for the socket path;
 * both follow EnvPool's rules (vector_base.BatchedVecEnv, "async mode").
 *
 * An env is in at most one place: idle, in a batch in flight, or ready
 * (finished, its id not taken yet).  Ready ids keep the order in which their
 * batches were found finished (batches are checked in submit order).
 *
 * Threading: one caller thread at a time (the fast path's mutex); the vec's
 * pool steps the batches meanwhile.
 */
#ifndef ENVD_BATCH_QUEUE_H
#define ENVD_BATCH_QUEUE_H

#include <stdint.h>

#include "vec.h"

typedef struct envd_batch_queue envd_batch_queue_t;

/* A queue for vec's num_envs envs.  ENVD_OK, ENVD_EINVAL or ENVD_ENOMEM. */
int envd_batch_queue_create(envd_batch_queue_t **out, envd_vec_t *vec, int64_t num_envs);

/* Wait for the batches in flight (their chunks use the vec's buffers), drop
 * every result and free.  NULL is allowed.  Before the vec is destroyed. */
void envd_batch_queue_destroy(envd_batch_queue_t *queue);

/* Start stepping env_ids[0 .. count) with their actions from the vec's
 * actions buffer.  The ids are copied before anything reads them (they may
 * lie in memory another process writes).  ENVD_OK, ENVD_ENOMEM, or what
 * envd_vec_batch_submit refuses with (nothing started; envd_vec_error_index
 * names the env). */
int envd_batch_queue_submit(envd_batch_queue_t *queue, const int64_t *env_ids, int64_t count);

/* Wait until at least count envs are ready, then write every ready id to
 * out (room for num_envs) and return how many (>= count); the caller's thread
 * runs the oldest batch's chunks while it waits.  Errors, with nothing
 * taken: the first env failure in a batch found finished (ENVD_EENV, its env
 * in *error_index; the batch's envs are ready all the same: the next call
 * returns them), ENVD_EINVAL (count outside [1, num_envs]) or ENVD_ESTATE
 * (fewer than count envs in flight or ready; *error_index = -1). */
int64_t envd_batch_queue_take(envd_batch_queue_t *queue, int64_t count, int64_t *out,
                              int64_t *error_index);

/* End the batches that finished (without waiting): their envs become ready
 * (and count as finished), a failure waits for the next take. */
void envd_batch_queue_collect(envd_batch_queue_t *queue);

/* The most bytes a queue of num_envs envs allocates at once, whatever is
 * sent (allocator overhead aside): what a daemon counts against
 * --max-state-bytes for a session's fast-path async books. */
uint64_t envd_batch_queue_max_bytes(int64_t num_envs);

/* Envs in flight or ready (0: the vec may be reset or stepped whole). */
int64_t envd_batch_queue_pending(const envd_batch_queue_t *queue);

/* Envs whose batch was found finished, since the queue was created. */
int64_t envd_batch_queue_finished(const envd_batch_queue_t *queue);

#endif /* ENVD_BATCH_QUEUE_H */
