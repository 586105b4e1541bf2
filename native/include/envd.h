/*
 * envd.h -- the one C contract of envd.
 *
 * An environment is a table of plain C functions (envd_env_def_t) over a
 * block of state memory the host allocates (state_size bytes per instance).
 * Built-in envs are written against this header exactly as a plugin would be.
 *
 * Thread rules for env authors:
 *   - An env instance (its state block and its envd_rng_t) is only ever
 *     touched by one thread at a time, but consecutive calls may come from
 *     different threads.  Keep everything in the state block: no globals, no
 *     static mutable variables, no rand()/srand().
 *   - All randomness comes from the envd_rng_t the host passes in.  It
 *     reproduces numpy's SeedSequence -> PCG64 -> Generator bit for bit, so an
 *     env can match a numpy/gymnasium reference exactly.
 *   - Callbacks return ENVD_OK or a negative ENVD_E* code; they never abort,
 *     exit or print.
 *
 * Everything here is ABI: a plugin built against ENVD_ABI_VERSION N is only
 * loaded by a host whose envd_abi_version() is N.
 */
#ifndef ENVD_H
#define ENVD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ENVD_ABI_VERSION 1u

/* ---- error codes: 0 or a negative code from this one table ------------- */
#define ENVD_OK 0
#define ENVD_EINVAL (-1)    /* an argument is invalid */
#define ENVD_ENOMEM (-2)    /* out of memory */
#define ENVD_ERANGE (-3)    /* a value is out of its allowed range */
#define ENVD_ENOTFOUND (-4) /* no such env id */
#define ENVD_EABI (-5)      /* ABI version mismatch */
#define ENVD_ESTATE (-6)    /* call not valid in the current state */
#define ENVD_ESYS (-7)      /* a system call failed (see errno) */
#define ENVD_EBUSY (-8)     /* resource busy (e.g. a job still running) */
#define ENVD_EENV (-9)      /* an env callback reported a failure */
#define ENVD_ERROR_MIN (-9) /* the most negative code in the table */

/* A static, human-readable description of an ENVD_* code. */
const char *envd_strerror(int code);

/* The ABI version this library was built with (== ENVD_ABI_VERSION). */
uint32_t envd_abi_version(void);

/* ---- spaces --------------------------------------------------------------- */
typedef enum envd_dtype {
    ENVD_DTYPE_FLOAT32 = 0,
    ENVD_DTYPE_FLOAT64 = 1,
    ENVD_DTYPE_INT64 = 2,
    ENVD_DTYPE_INT32 = 3,
    ENVD_DTYPE_UINT8 = 4,
    ENVD_DTYPE_BOOL = 5
} envd_dtype_t;

/* Size in bytes of one element of dtype, or 0 for an unknown dtype. */
size_t envd_dtype_size(envd_dtype_t dtype);

typedef enum envd_space_kind {
    ENVD_SPACE_BOX = 0,     /* gymnasium.spaces.Box */
    ENVD_SPACE_DISCRETE = 1 /* gymnasium.spaces.Discrete, dtype INT64, shape () */
} envd_space_kind_t;

#define ENVD_MAX_DIMS 4

/* Largest per-instance state an env may declare (4 GiB). */
#define ENVD_MAX_STATE_SIZE ((size_t)1 << 32)

typedef struct envd_space {
    envd_space_kind_t kind;
    envd_dtype_t dtype;
    int32_t ndim;                 /* BOX: 0..ENVD_MAX_DIMS; DISCRETE: 0 */
    int64_t shape[ENVD_MAX_DIMS]; /* BOX: the first ndim entries are used */
    /* BOX: prod(shape) bounds each, +-INFINITY allowed; NULL = unbounded. */
    const double *low;
    const double *high;
    /* DISCRETE: actions are start, start+1, ..., start+n-1. */
    int64_t n;
    int64_t start;
} envd_space_t;

/* Number of elements of one sample of the space (1 for DISCRETE). */
int64_t envd_space_numel(const envd_space_t *space);

/* ---- construction parameters (the kwargs of make) ------------------------ */
typedef enum envd_param_type {
    ENVD_PARAM_FLOAT = 0,
    ENVD_PARAM_INT = 1, /* passed as an integral double */
    ENVD_PARAM_BOOL = 2 /* passed as 0.0 or 1.0 */
} envd_param_type_t;

typedef struct envd_param {
    const char *name; /* use gymnasium's kwarg name where gymnasium has one */
    envd_param_type_t type;
    double default_value;
    double min_value; /* inclusive; the host rejects values outside */
    double max_value;
    const char *doc;
} envd_param_t;

/* ---- per-env random number generator -------------------------------------- */
/* PCG64 (XSL-RR 128/64) state.  Treat as opaque; it lives in host memory. */
typedef struct envd_rng {
    uint64_t state_hi, state_lo;
    uint64_t inc_hi, inc_lo;
} envd_rng_t;

/* Seed like numpy.random.Generator(PCG64(SeedSequence(seed))). */
void envd_rng_seed(envd_rng_t *rng, uint64_t seed);
/* Next raw 64-bit output, as PCG64.random_raw(). */
uint64_t envd_rng_next_u64(envd_rng_t *rng);
/* A double in [0, 1), as Generator.random(). */
double envd_rng_random(envd_rng_t *rng);
/* A double in [low, high), as Generator.uniform(low, high). */
double envd_rng_uniform(envd_rng_t *rng, double low, double high);

/* ---- the env definition --------------------------------------------------- */
/*
 * init:  called once per instance on zeroed state memory, with the validated
 *        parameter values in declaration order (num_params doubles).
 * reset: start a new episode, drawing from rng; write one observation (the
 *        observation space's dtype and shape) to obs.
 * step:  apply one action (one sample of the action space; for DISCRETE an
 *        int64_t) and write the next observation, the reward and the env's own
 *        terminated/truncated flags.  Time limits are applied by the host; an
 *        env only sets *truncated for reasons of its own.
 * close: release anything init acquired (may be NULL).
 */
typedef struct envd_env_def {
    uint32_t abi_version; /* must be ENVD_ABI_VERSION */
    const char *id;       /* e.g. "CartPole-v1" */
    envd_space_t observation_space;
    envd_space_t action_space;
    size_t state_size;         /* bytes of per-instance state, 1..ENVD_MAX_STATE_SIZE */
    int32_t num_agents;        /* 1 for now; present for multi-agent envs */
    int32_t max_episode_steps; /* default time limit, 0 for none */
    const envd_param_t *params;
    int32_t num_params;
    int (*init)(void *state, const double *params);
    int (*reset)(void *state, envd_rng_t *rng, void *obs);
    int (*step)(void *state, envd_rng_t *rng, const void *action, void *obs,
                double *reward, bool *terminated, bool *truncated);
    void (*close)(void *state);
} envd_env_def_t;

/* Check a definition for consistency; ENVD_OK or the first problem found. */
int envd_env_def_validate(const envd_env_def_t *def);

#ifdef __cplusplus
}
#endif

#endif /* ENVD_H */
