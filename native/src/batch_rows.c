/*
 * batch_rows.c -- an async batch's id check and row gather for the caller
 * (see batch_rows.h).
 */
#include "batch_rows.h"

#include <string.h>

#include "envd.h"

/* id k of the array, as int64 (a uint64 above INT64_MAX reads negative: out
 * of range all the same). */
static int64_t id_at(const void *ids, int itemsize, int is_signed, int64_t k)
{
    switch (itemsize) {
    case 1: return is_signed ? ((const int8_t *)ids)[k] : ((const uint8_t *)ids)[k];
    case 2: return is_signed ? ((const int16_t *)ids)[k] : ((const uint16_t *)ids)[k];
    case 4: return is_signed ? ((const int32_t *)ids)[k] : ((const uint32_t *)ids)[k];
    default: return ((const int64_t *)ids)[k];
    }
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
    for (int64_t k = 0; k < count; k++) {
        const int64_t i = id_at(ids, itemsize, is_signed, k);
        if (i < 0 || i >= num_envs) {
            *bad = i;
            return ENVD_ERANGE;
        }
        out[k] = i;
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

/* One buffer's rows, by row size: typed copies for the common sizes (a
 * memcpy call per 4-byte row costs more than the row). */
#define GATHER_AS(type)                                                            \
    do {                                                                           \
        const type *s = src;                                                       \
        type *d = dst;                                                             \
        for (int64_t k = 0; k < count; k++)                                        \
            d[k] = s[rows[k]];                                                     \
    } while (0)

static void gather_one(const int64_t *rows, int64_t count, const void *src, void *dst,
                       uint64_t row_bytes)
{
    switch (row_bytes) {
    case 1: GATHER_AS(uint8_t); break;
    case 2: GATHER_AS(uint16_t); break;
    case 4: GATHER_AS(uint32_t); break;
    case 8: GATHER_AS(uint64_t); break;
    default:
        for (int64_t k = 0; k < count; k++)
            memcpy((unsigned char *)dst + (uint64_t)k * row_bytes,
                   (const unsigned char *)src + (uint64_t)rows[k] * row_bytes, row_bytes);
    }
}

void envd_batch_gather(const int64_t *rows, int64_t count, int num_buffers,
                       const void *const *src, void *const *dst, const uint64_t *row_bytes)
{
    for (int b = 0; b < num_buffers; b++)
        gather_one(rows, count, src[b], dst[b], row_bytes[b]);
}
