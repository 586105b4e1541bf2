/*
 * ocean_layout.h -- what an Ocean env's manifest says of one env's shape.
 *
 * A manifest (manifests/<env>.h) computes it from the make kwargs, as the env's
 * Python class computes its spaces; ocean_glue.h turns it into envd's spaces.
 * Every Ocean space is a Box with scalar bounds, a Discrete, or a
 * MultiDiscrete, which this covers.
 */
#ifndef ENVD_OCEAN_LAYOUT_H
#define ENVD_OCEAN_LAYOUT_H

#include <envd.h>

#include "ocean_python.h"

#define ENVD_OCEAN_MAX_NVEC 8

typedef struct envd_ocean_layout {
    int32_t agents; /* rows per env */
    /* the observation: a Box of obs_dtype, bounds obs_low..obs_high */
    envd_dtype_t obs_dtype;
    int32_t obs_ndim;
    int64_t obs_shape[ENVD_MAX_DIMS];
    double obs_low, obs_high;
    /* the action: DISCRETE (act_n), MULTI_DISCRETE (act_ndim 1, act_nvec) or a
       float32 BOX (act_shape, act_low..act_high; the glue clips to them, as
       PufferLib's classes np.clip their continuous actions) */
    envd_space_kind_t act_kind;
    int64_t act_n;
    int32_t act_ndim;
    int64_t act_shape[ENVD_MAX_DIMS];
    int64_t act_nvec[ENVD_OCEAN_MAX_NVEC];
    double act_low, act_high;
} envd_ocean_layout_t;

/* C kwargs named as the make kwargs, with the same values: the manifests whose
 * env's Python class passes its kwargs through unchanged. */
static inline void envd_ocean_same_kwargs(envd_ocean_dict_t *kw, const envd_param_t *params,
                                          int32_t count, const double *values)
{
    for (int32_t i = 0; i < count; i++)
        envd_ocean_dict_set(kw, params[i].name, values[i]);
}

/* A flat float32 Box observation in [low, high] of n elements, one agent. */
static inline void envd_ocean_flat_obs(envd_ocean_layout_t *l, int64_t n, double low, double high)
{
    l->agents = 1;
    l->obs_dtype = ENVD_DTYPE_FLOAT32;
    l->obs_ndim = 1;
    l->obs_shape[0] = n;
    l->obs_low = low;
    l->obs_high = high;
}

static inline void envd_ocean_discrete(envd_ocean_layout_t *l, int64_t n)
{
    l->act_kind = ENVD_SPACE_DISCRETE;
    l->act_n = n;
}

/* What one calloc(count, size) of the env's takes from glibc's heap at most,
 * for a manifest's ocean_heap_bytes (every manifest defines it: the bytes
 * one env allocates itself in init, reset and step, from the env's own
 * code; render-only allocations excluded, envd never renders through
 * raylib): the bytes plus the chunk's header and rounding (at most 23
 * bytes, at least a 32-byte chunk), or the page rounding of an mmapped one
 * (requests of 128 KiB and more may be mmapped). */
static inline uint64_t envd_ocean_chunk(double count, double size)
{
    uint64_t bytes = (uint64_t)count * (uint64_t)size;
    return bytes < ((uint64_t)1 << 17) ? bytes + 32 : bytes + 16 + 4095;
}

#endif /* ENVD_OCEAN_LAYOUT_H */
