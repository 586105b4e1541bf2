/*
 * rng.c -- per-env random numbers that reproduce numpy bit for bit.
 *
 * numpy.random.default_rng(seed) is Generator(PCG64(SeedSequence(seed))):
 *   1. SeedSequence turns the seed into 32-bit words of entropy, mixes them
 *      into a 4-word pool (hashmix/mix), then generate_state(4, uint64) draws
 *      four 64-bit words from the pool.
 *   2. PCG64 takes words 0,1 as the 128-bit initial state and 2,3 as the
 *      128-bit stream selector (pcg64_set_seed -> pcg_setseq_128_srandom_r).
 *   3. random() is (next64 >> 11) * 2^-53; uniform(lo, hi) is
 *      lo + (hi - lo) * random().  The draws are static inline in envd.h
 *      (plugins call them without linking envd); only seeding lives here.
 * The constants below are the published ones of SeedSequence (numpy's
 * bit_generator) and of PCG's 128-bit LCG multiplier.
 */
#include "envd.h"

typedef unsigned __int128 u128;

/* ---- SeedSequence ---------------------------------------------------------- */
enum { POOL_SIZE = 4 };
#define INIT_A 0x43b0d7e5u
#define MULT_A 0x931e8875u
#define INIT_B 0x8b51f9ddu
#define MULT_B 0x58f38dedu
#define MIX_MULT_L 0xca01f9ddu
#define MIX_MULT_R 0x4973f715u
#define XSHIFT 16

static uint32_t hashmix(uint32_t value, uint32_t *hash_const)
{
    value ^= *hash_const;
    *hash_const *= MULT_A;
    value *= *hash_const;
    value ^= value >> XSHIFT;
    return value;
}

static uint32_t mix(uint32_t x, uint32_t y)
{
    uint32_t result = MIX_MULT_L * x - MIX_MULT_R * y;
    result ^= result >> XSHIFT;
    return result;
}

/* SeedSequence(seed).generate_state(4, np.uint64) for a non-negative seed. */
static void seed_sequence_state(uint64_t seed, uint64_t out[4])
{
    /* The seed as little-endian 32-bit words; numpy drops high zero words
     * but keeps one word for seed 0. */
    uint32_t entropy[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    int n_entropy = (seed >> 32) ? 2 : 1;
    uint32_t pool[POOL_SIZE];
    uint32_t hash_const = INIT_A;

    for (int i = 0; i < POOL_SIZE; i++)
        pool[i] = hashmix(i < n_entropy ? entropy[i] : 0u, &hash_const);
    for (int src = 0; src < POOL_SIZE; src++)
        for (int dst = 0; dst < POOL_SIZE; dst++)
            if (src != dst)
                pool[dst] = mix(pool[dst], hashmix(pool[src], &hash_const));
    /* n_entropy <= POOL_SIZE, so there is no leftover entropy to fold in. */

    uint32_t words[8];
    uint32_t hash_b = INIT_B;
    for (int i = 0; i < 8; i++) {
        uint32_t v = pool[i % POOL_SIZE];
        v ^= hash_b;
        hash_b *= MULT_B;
        v *= hash_b;
        v ^= v >> XSHIFT;
        words[i] = v;
    }
    for (int i = 0; i < 4; i++)
        out[i] = (uint64_t)words[2 * i] | ((uint64_t)words[2 * i + 1] << 32);
}

/* ---- PCG64 (XSL-RR 128/64) -------------------------------------------------- */
static const u128 PCG_MULT = ((u128)ENVD_PCG_MULT_HI << 64) | ENVD_PCG_MULT_LO;

static u128 load(uint64_t hi, uint64_t lo) { return ((u128)hi << 64) | lo; }

static void pcg_step(envd_rng_t *rng)
{
    u128 s = load(rng->state_hi, rng->state_lo) * PCG_MULT +
             load(rng->inc_hi, rng->inc_lo);
    rng->state_hi = (uint64_t)(s >> 64);
    rng->state_lo = (uint64_t)s;
}

void envd_rng_seed(envd_rng_t *rng, uint64_t seed)
{
    uint64_t w[4];
    seed_sequence_state(seed, w);
    u128 initstate = load(w[0], w[1]);
    u128 inc = (load(w[2], w[3]) << 1) | 1u;

    rng->state_hi = rng->state_lo = 0;
    rng->inc_hi = (uint64_t)(inc >> 64);
    rng->inc_lo = (uint64_t)inc;
    pcg_step(rng);
    u128 s = load(rng->state_hi, rng->state_lo) + initstate;
    rng->state_hi = (uint64_t)(s >> 64);
    rng->state_lo = (uint64_t)s;
    pcg_step(rng);
}
