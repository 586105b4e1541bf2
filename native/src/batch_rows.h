/*
 * batch_rows.h -- the caller's side of an async batch, in one native call
 * each (the in-process VecEnv's send and recv, envd.native.vector_env):
 *
 *   envd_batch_ids   check a send's env ids (any integer dtype) and copy them
 *                    as int64: range, then repeats;
 *   envd_batch_gather copy the rows of a received batch out of every result
 *                    buffer into its batch buffer.
 *
 * Done with numpy, each is a handful of calls of a few microseconds: most of
 * a cheap env's async batch (docs/benchmarks.md, "Async batches").  Neither
 * keeps state; the caller owns every buffer.
 */
#ifndef ENVD_BATCH_ROWS_H
#define ENVD_BATCH_ROWS_H

#include <stdint.h>

/* cffi:begin */
/* Copy `count` ids of `itemsize` bytes (1, 2, 4 or 8; signed or not) from
 * ids into out as int64, refusing an id outside [0, num_envs) or repeated.
 * stamp (num_envs entries, zeroed before first use) and stamp_gen (a value
 * never passed before for this stamp, > 0) detect repeats in O(count).
 * Returns ENVD_OK; ENVD_EINVAL for an unsupported itemsize or count < 1;
 * ENVD_ERANGE with *bad the first id (in order) out of range; ENVD_EBUSY
 * with *bad the first repeated id (checked only once every id is in range).
 * ids may be at any alignment (read as bytes); out and stamp are aligned. */
int envd_batch_ids(const void *ids, int itemsize, int is_signed, int64_t count,
                   int64_t num_envs, int64_t *out, int64_t *stamp, int64_t stamp_gen,
                   int64_t *bad);

/* For each of the num_buffers buffers b: row k of dst[b] = row rows[k] of
 * src[b], for k < count, a row being row_bytes[b] bytes (rows in range: the
 * caller's books say so).  src and dst may be at any alignment (rows are
 * copied as bytes); rows is an aligned int64_t array. */
void envd_batch_gather(const int64_t *rows, int64_t count, int num_buffers,
                       const void *const *src, void *const *dst, const uint64_t *row_bytes);
/* cffi:end */

#endif
