/*
 * ocean_random.h -- per-env randomness and clocks for PufferLib's Ocean units.
 *
 * `envd ocean build` compiles every Ocean unit with `-include ocean_random.h`,
 * so this header comes before anything binding.c or <env>.h includes.  It
 * declares the system functions first (their headers are include-guarded, so
 * the unit's own includes add nothing later), then renames the calls:
 *
 *   rand, srand, random, srandom   -> the calling env's own stream, glibc's
 *       generator itself (random_r on a per-env struct random_data with a
 *       128-byte state: TYPE_3, the state srand() seeds by default), so an env
 *       seeded s draws what PufferLib's binding draws after srand(s), and no
 *       env shares a stream (PufferLib's envs share one global stream, whose
 *       lock-free use from many threads is a data race);
 *   time, clock, clock_gettime, getpid -> a virtual clock and process id of
 *       the env, derived from its seed, so that the envs that seed themselves
 *       from the clock (terraform) are reproducible.
 *
 * The macros are function-like: a struct field or local named `time` or
 * `rand` keeps its name; only calls are routed.
 *
 * The stream is the one the glue selected for the calling thread
 * (envd_ocean_current, set around every init, c_reset and c_step).  A call
 * outside the glue (none in the units built) draws from a thread-local
 * fallback stream seeded 1, glibc's default.
 */
#ifndef ENVD_OCEAN_RANDOM_H
#define ENVD_OCEAN_RANDOM_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* glibc's state size for TYPE_3 (degree 31): initstate_r picks TYPE_3 for
 * 128..255 bytes, as srand's static table. */
#define ENVD_OCEAN_RANDOM_STATE_BYTES 128

/* One env's randomness and clock: lives in the env's state block. */
typedef struct envd_ocean_streams {
    struct random_data data;
    /* random_r keeps pointers into this buffer; int32_t-aligned as glibc wants */
    int32_t state[ENVD_OCEAN_RANDOM_STATE_BYTES / sizeof(int32_t)];
    uint64_t clock_ns;    /* the virtual clock: starts at a seed-derived instant */
    uint64_t clock_start; /* clock_ns at the seed: clock() counts from there */
    int32_t pid;       /* the virtual process id */
} envd_ocean_streams_t;

static __thread envd_ocean_streams_t *envd_ocean_current;
static __thread envd_ocean_streams_t envd_ocean_fallback;
static __thread int envd_ocean_fallback_ready;

/* splitmix64's finalizer: spreads a seed into the clock and pid values. */
static inline uint64_t envd_ocean_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Seed a stream as srand(seed) seeds glibc's, and derive the clock and pid
 * from the env's seed (never from the real clock). */
static inline void envd_ocean_streams_init(envd_ocean_streams_t *s, uint64_t seed)
{
    memset(s, 0, sizeof(*s));
    initstate_r((unsigned int)seed, (char *)s->state, sizeof(s->state), &s->data);
    uint64_t m = envd_ocean_mix(seed);
    /* 2023-11-14 plus up to ~12 days: a plausible wall clock, never 0 */
    s->clock_ns = (1700000000ULL + (m % 1000000ULL)) * 1000000000ULL + (m >> 34) % 1000000000ULL;
    s->clock_start = s->clock_ns;
    s->pid = (int32_t)(2 + (m >> 8) % 4194300ULL);
}

static inline envd_ocean_streams_t *envd_ocean_streams(void)
{
    if (envd_ocean_current)
        return envd_ocean_current;
    if (!envd_ocean_fallback_ready) {
        envd_ocean_streams_init(&envd_ocean_fallback, 1);
        envd_ocean_fallback_ready = 1;
    }
    return &envd_ocean_fallback;
}

static inline long envd_ocean_random(void)
{
    int32_t out = 0;
    random_r(&envd_ocean_streams()->data, &out);
    return out;
}

/* glibc: rand() is (int) random(). */
static inline int envd_ocean_rand(void) { return (int)envd_ocean_random(); }

/* glibc: srand is srandom. */
static inline void envd_ocean_srandom(unsigned int seed)
{
    srandom_r(seed, &envd_ocean_streams()->data);
}

/* Every read of the virtual clock advances it by 1 ms plus 1 ns, so two reads
 * differ (as real ones would) and stay reproducible. */
static inline uint64_t envd_ocean_clock_read(void)
{
    envd_ocean_streams_t *s = envd_ocean_streams();
    s->clock_ns += 1000001ULL;
    return s->clock_ns;
}

static inline time_t envd_ocean_time(time_t *out)
{
    time_t t = (time_t)(envd_ocean_clock_read() / 1000000000ULL);
    if (out)
        *out = t;
    return t;
}

static inline int envd_ocean_clock_gettime(clockid_t clock, struct timespec *ts)
{
    (void)clock;
    uint64_t ns = envd_ocean_clock_read();
    ts->tv_sec = (time_t)(ns / 1000000000ULL);
    ts->tv_nsec = (long)(ns % 1000000000ULL);
    return 0;
}

/* CPU time: the virtual time since the seed, in CLOCKS_PER_SEC units. */
static inline clock_t envd_ocean_clock(void)
{
    uint64_t ns = envd_ocean_clock_read() - envd_ocean_streams()->clock_start;
    return (clock_t)(ns / (1000000000ULL / CLOCKS_PER_SEC));
}

static inline pid_t envd_ocean_getpid(void) { return (pid_t)envd_ocean_streams()->pid; }

#define rand() envd_ocean_rand()
#define random() envd_ocean_random()
#define srand(seed) envd_ocean_srandom((unsigned int)(seed))
#define srandom(seed) envd_ocean_srandom((unsigned int)(seed))
#define time(out) envd_ocean_time(out)
#define clock() envd_ocean_clock()
#define clock_gettime(clk, ts) envd_ocean_clock_gettime((clk), (ts))
#define getpid() envd_ocean_getpid()

#endif /* ENVD_OCEAN_RANDOM_H */
