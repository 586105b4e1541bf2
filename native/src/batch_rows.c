/*
 * batch_rows.c -- an async batch's id check and row gather for the caller
 * (see batch_rows.h).
 */
#include "batch_rows.h"

#include <string.h>

#include "envd.h"
#include "ids_run.h"

/* Copy the ids as `type` into out as int64, returning ENVD_ERANGE with *bad
 * the first one outside [0, num_envs) (a uint64 above INT64_MAX reads
 * negative: out of range all the same).  Each id is read with a constant-size
 * memcpy, which compiles to a load but needs no alignment: a C-contiguous
 * numpy array may start at any byte (np.frombuffer(..., offset=1)).  One
 * loop per width, so the width is not decided per id. */
#define IDS_AS(type)                                                               \
    for (int64_t k = 0; k < count; k++) {                                          \
        type v;                                                                    \
        memcpy(&v, (const unsigned char *)ids + (uint64_t)k * sizeof v, sizeof v); \
        const int64_t i = (int64_t)v;                                              \
        if (i < 0 || i >= num_envs) {                                              \
            *bad = i;                                                              \
            return ENVD_ERANGE;                                                    \
        }                                                                          \
        out[k] = i;                                                                \
    }

int envd_batch_ids(const void *ids, int itemsize, int is_signed, int64_t count,
                   int64_t num_envs, int64_t *out, int64_t *stamp, int64_t stamp_gen,
                   int64_t *bad)
{
    if (ids == NULL || out == NULL || stamp == NULL || count < 1 || stamp_gen <= 0 ||
        (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8))
        return ENVD_EINVAL;
    /* Range first, over every id (the caller's message names the first bad
     * one), then repeats: a repeat report never names an id out of range. */
    switch (itemsize * (is_signed ? 1 : -1)) {
    case 1: IDS_AS(int8_t); break;
    case -1: IDS_AS(uint8_t); break;
    case 2: IDS_AS(int16_t); break;
    case -2: IDS_AS(uint16_t); break;
    case 4: IDS_AS(int32_t); break;
    case -4: IDS_AS(uint32_t); break;
    case 8: IDS_AS(int64_t); break;
    default: IDS_AS(uint64_t);
    }
    for (int64_t k = 0; k < count; k++) {
        if (stamp[out[k]] == stamp_gen) {
            *bad = out[k];
            return ENVD_EBUSY;
        }
        stamp[out[k]] = stamp_gen;
    }
    return ENVD_OK;
}

/* One buffer's rows, by row size.  memcpy of a constant size compiles to a
 * move (a memcpy call per 4-byte row costs more than the row) and, unlike a
 * typed load, needs no alignment and reads float rows as bytes (no
 * strict-aliasing breach); as vec.c's copy_action_rows. */
#define GATHER_OF(size)                                                            \
    for (int64_t k = 0; k < count; k++)                                           \
        memcpy((unsigned char *)dst + (uint64_t)k * (size),                        \
               (const unsigned char *)src + (uint64_t)rows[k] * (size), (size))

static void gather_one(const int64_t *rows, int64_t count, const void *src, void *dst,
                       uint64_t row_bytes)
{
    switch (row_bytes) {
    case 1: GATHER_OF(1); break;
    case 2: GATHER_OF(2); break;
    case 4: GATHER_OF(4); break;
    case 8: GATHER_OF(8); break;
    default: GATHER_OF(row_bytes);
    }
}

void envd_batch_gather(const int64_t *rows, int64_t count, int num_buffers,
                       const void *const *src, void *const *dst, const uint64_t *row_bytes)
{
    if (count > 0 && envd_ids_are_run(rows, count)) {
        /* One copy a buffer: a recv's whole gather of a 2048-CartPole
         * batch went from 22 to 14 us on a slow 2-CPU host (a non-constant
         * row size is a memcpy call a row). */
        for (int b = 0; b < num_buffers; b++)
            memcpy(dst[b], (const unsigned char *)src[b] + (uint64_t)rows[0] * row_bytes[b],
                   (size_t)((uint64_t)count * row_bytes[b]));
        return;
    }
    for (int b = 0; b < num_buffers; b++)
        gather_one(rows, count, src[b], dst[b], row_bytes[b]);
}
