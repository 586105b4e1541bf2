/*
 * ids_run.h -- whether a batch's env ids are a run: first, first + 1, ...,
 * first + count - 1.  Every batch of EnvPool's loop is one (its envs are sent
 * together and finish together), and a run's per-env work -- marking envs,
 * copying their rows -- is one block operation instead of a loop.
 */
#ifndef ENVD_IDS_RUN_H
#define ENVD_IDS_RUN_H

#include <stdint.h>

/* Any ids, even hostile ones (unsigned arithmetic: no overflow); count >= 1.
 * A run says nothing about range: callers check first and count. */
static inline int envd_ids_are_run(const int64_t *ids, int64_t count)
{
    uint64_t off = 0;
    for (int64_t k = 1; k < count; k++)
        off |= (uint64_t)ids[k] - (uint64_t)ids[0] - (uint64_t)k;
    return off == 0;
}

/* ids are a run of envs all in [0, num_envs). */
static inline int envd_ids_are_run_within(const int64_t *ids, int64_t count, int64_t num_envs)
{
    return count >= 1 && ids[0] >= 0 && ids[0] <= num_envs - count &&
           envd_ids_are_run(ids, count);
}

#endif /* ENVD_IDS_RUN_H */
