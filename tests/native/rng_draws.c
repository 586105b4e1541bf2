/* rng_draws.c -- exports envd.h's static inline RNG draws under plain names so
 * that test_rng.py can call them through ctypes. */
#include "envd.h"

uint64_t test_rng_next_u64(envd_rng_t *rng) { return envd_rng_next_u64(rng); }
double test_rng_random(envd_rng_t *rng) { return envd_rng_random(rng); }
double test_rng_uniform(envd_rng_t *rng, double low, double high)
{
    return envd_rng_uniform(rng, low, high);
}
