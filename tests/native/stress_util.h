/*
 * stress_util.h -- helpers the vec and fast-path stress programs share:
 * loop counts scaled down for slow (sanitizer) builds, a xorshift generator,
 * a monotonic clock and a checked calloc.  (pool_stress.c scales without a
 * floor and keeps its own.)
 */
#ifndef ENVD_STRESS_UTIL_H
#define ENVD_STRESS_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "stress_check.h"

/* Loop counts are divided by this (the program's first argument). */
static int g_div = 1;

static inline int scaled(int count, int floor)
{
    return count / g_div > floor ? count / g_div : floor;
}

static inline uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n, size);
    CHECK(p, "out of memory");
    return p;
}

#endif /* ENVD_STRESS_UTIL_H */
