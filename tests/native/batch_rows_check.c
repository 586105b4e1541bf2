/*
 * batch_rows_check.c -- batch_rows.c on its own, built plain and with
 * -fsanitize=address,undefined by test_batch_rows.py: ids of every integer
 * width and rows of every row size are read from and written to addresses
 * one byte past alignment (a C-contiguous numpy array may start anywhere:
 * np.frombuffer(..., offset=1)), which a typed load would make undefined
 * behaviour (UBSan's alignment check); results equal a byte-wise reference.
 *
 * Prints "batch_rows_check: ok" and exits 0, or names the failed check.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "batch_rows.h"
#include "envd.h"
#include "stress_check.h"

#define NUM_ENVS 40
#define COUNT_IDS 16
#define MAX_ROW 24

static unsigned char ids_mem[COUNT_IDS * 8 + 1];
static unsigned char src_mem[NUM_ENVS * MAX_ROW + 1];
static unsigned char dst_mem[COUNT_IDS * MAX_ROW + 1];

/* id k: distinct for k < NUM_ENVS (3 and NUM_ENVS share no factor) */
static int64_t id_of(int k) { return (int64_t)((k * 3 + 1) % NUM_ENVS); }

static void check_ids(int itemsize, int is_signed, int64_t *stamp, int64_t *gen)
{
    unsigned char *ids = ids_mem + 1; /* one byte past alignment */
    for (int k = 0; k < COUNT_IDS; k++) {
        int64_t v = id_of(k);
        /* little- or big-endian alike: the value's low bytes in the machine's order */
        switch (itemsize) {
        case 1: { uint8_t x = (uint8_t)v; memcpy(ids + k, &x, 1); break; }
        case 2: { uint16_t x = (uint16_t)v; memcpy(ids + 2 * k, &x, 2); break; }
        case 4: { uint32_t x = (uint32_t)v; memcpy(ids + 4 * k, &x, 4); break; }
        default: memcpy(ids + 8 * k, &v, 8);
        }
    }
    int64_t out[COUNT_IDS], bad = -1;
    int rc = envd_batch_ids(ids, itemsize, is_signed, COUNT_IDS, NUM_ENVS, out, stamp,
                            ++*gen, &bad);
    CHECK(rc == ENVD_OK, "itemsize %d: rc %d", itemsize, rc);
    for (int k = 0; k < COUNT_IDS; k++)
        CHECK(out[k] == id_of(k), "itemsize %d: id %d read as %lld", itemsize, k,
              (long long)out[k]);
}

/* The rows a gather is checked with (see check_gather). */
enum rows_kind {
    SCATTERED, RUN_TO_THE_END, RUN_BUT_LAST, RUN_BUT_FIRST, RUN_BUT_SWAPPED, ONE_ROW, ROWS_KINDS
};

static int fill_rows(int64_t *rows, enum rows_kind kind)
{
    const int64_t first = NUM_ENVS - COUNT_IDS; /* a run ending at the last row */
    for (int k = 0; k < COUNT_IDS; k++)
        rows[k] = kind == SCATTERED ? id_of(COUNT_IDS - 1 - k) : first + k;
    if (kind == RUN_BUT_LAST)
        rows[COUNT_IDS - 1] = 0;  /* (copied as one block, it would read first + 15) */
    if (kind == RUN_BUT_FIRST)
        rows[0] = first - 1;
    if (kind == RUN_BUT_SWAPPED) { /* the ends of a run, two rows swapped between them */
        rows[1] = first + 2;
        rows[2] = first + 1;
    }
    return kind == ONE_ROW ? 1 : COUNT_IDS;
}

/* Rows scattered, a run (copied as one block), runs broken at either end or
 * in the middle, and a single row: each row equals its source row; nothing
 * past count. */
static void check_gather(uint64_t row_bytes, enum rows_kind kind)
{
    unsigned char *src = src_mem + 1, *dst = dst_mem + 1;
    for (size_t i = 0; i < NUM_ENVS * row_bytes; i++)
        src[i] = (unsigned char)(i * 7 + row_bytes);
    memset(dst, 0, COUNT_IDS * row_bytes);
    /* the rows: an aligned int64 array (batch_rows.py passes no other) */
    int64_t rows[COUNT_IDS];
    const int count = fill_rows(rows, kind);
    const void *srcs[1] = {src};
    void *dsts[1] = {dst};
    envd_batch_gather(rows, count, 1, srcs, dsts, &row_bytes);
    for (int k = 0; k < count; k++)
        CHECK(memcmp(dst + (size_t)k * row_bytes, src + (size_t)rows[k] * row_bytes,
                     row_bytes) == 0,
              "row_bytes %llu, rows kind %d: row %d", (unsigned long long)row_bytes, kind, k);
    for (size_t i = (size_t)count * row_bytes; i < COUNT_IDS * row_bytes; i++)
        CHECK(dst[i] == 0, "row_bytes %llu, rows kind %d: byte %zu past the rows written",
              (unsigned long long)row_bytes, kind, i);
}

/* A negative id of a signed width is refused as that negative value (an
 * int32 -1 once read as 4294967295 through ?:'s conversion to unsigned). */
static void check_negative_ids(int64_t *stamp, int64_t *gen)
{
    int8_t i8 = -1;
    int16_t i16 = -2;
    int32_t i32 = -3;
    int64_t i64 = -4, out[1], bad = 0;
    const void *ids[] = {&i8, &i16, &i32, &i64};
    for (int s = 0; s < 4; s++) {
        int rc = envd_batch_ids(ids[s], 1 << s, 1, 1, NUM_ENVS, out, stamp, ++*gen, &bad);
        CHECK(rc == ENVD_ERANGE && bad == -1 - s, "itemsize %d: rc %d, bad %lld", 1 << s, rc,
              (long long)bad);
    }
}

int main(void)
{
    int64_t stamp[NUM_ENVS] = {0}, gen = 0;
    check_negative_ids(stamp, &gen);
    static const int sizes[] = {1, 2, 4, 8};
    for (size_t s = 0; s < COUNT(sizes); s++) {
        check_ids(sizes[s], 1, stamp, &gen);
        check_ids(sizes[s], 0, stamp, &gen);
    }
    static const uint64_t row_sizes[] = {1, 2, 4, 8, 3, 12, MAX_ROW};
    for (size_t s = 0; s < COUNT(row_sizes); s++)
        for (int kind = 0; kind < ROWS_KINDS; kind++)
            check_gather(row_sizes[s], (enum rows_kind)kind);
    printf("batch_rows_check: ok\n");
    return 0;
}
