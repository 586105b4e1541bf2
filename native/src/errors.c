/*
 * errors.c -- the error table, ABI query, and checks on the types of envd.h.
 */
#include <math.h>

#include "envd.h"

const char *envd_strerror(int code)
{
    switch (code) {
    case ENVD_OK: return "success";
    case ENVD_EINVAL: return "invalid argument";
    case ENVD_ENOMEM: return "out of memory";
    case ENVD_ERANGE: return "value out of range";
    case ENVD_ENOTFOUND: return "no such environment";
    case ENVD_EABI: return "ABI version mismatch";
    case ENVD_ESTATE: return "call not valid in the current state";
    case ENVD_ESYS: return "system call failed";
    case ENVD_EBUSY: return "resource busy";
    case ENVD_EENV: return "environment callback failed";
    default: return "unknown error code";
    }
}

uint32_t envd_abi_version(void) { return ENVD_ABI_VERSION; }

size_t envd_dtype_size(envd_dtype_t dtype)
{
    switch (dtype) {
    case ENVD_DTYPE_FLOAT32: return 4;
    case ENVD_DTYPE_FLOAT64: return 8;
    case ENVD_DTYPE_INT64: return 8;
    case ENVD_DTYPE_INT32: return 4;
    case ENVD_DTYPE_UINT8: return 1;
    case ENVD_DTYPE_BOOL: return 1;
    default: return 0;
    }
}

int64_t envd_space_numel(const envd_space_t *space)
{
    if (space->kind == ENVD_SPACE_DISCRETE)
        return 1;
    int64_t n = 1;
    for (int i = 0; i < space->ndim; i++)
        n *= space->shape[i];
    return n;
}

/* Refuse element counts whose byte size could overflow buffer arithmetic. */
#define MAX_SPACE_NUMEL (INT64_C(1) << 32)

static int validate_space(const envd_space_t *space)
{
    if (envd_dtype_size(space->dtype) == 0)
        return ENVD_EINVAL;
    if (space->kind == ENVD_SPACE_DISCRETE)
        /* actions are start .. start + n - 1: the last must fit in int64 */
        return space->dtype == ENVD_DTYPE_INT64 && space->n > 0 &&
                       (space->start <= 0 || space->n - 1 <= INT64_MAX - space->start)
                   ? ENVD_OK
                   : ENVD_EINVAL;
    if (space->kind != ENVD_SPACE_BOX || space->ndim < 0 || space->ndim > ENVD_MAX_DIMS)
        return ENVD_EINVAL;
    int64_t n = 1;
    for (int i = 0; i < space->ndim; i++) {
        if (space->shape[i] <= 0 || space->shape[i] > MAX_SPACE_NUMEL)
            return ENVD_EINVAL;
        n *= space->shape[i];
        if (n > MAX_SPACE_NUMEL)
            return ENVD_EINVAL;
    }
    for (int64_t i = 0; space->low && space->high && i < n; i++)
        if (isnan(space->low[i]) || isnan(space->high[i]) || space->low[i] > space->high[i])
            return ENVD_EINVAL;
    return ENVD_OK;
}

static int validate_params(const envd_env_def_t *def)
{
    if (def->num_params < 0 || (def->num_params > 0 && def->params == NULL))
        return ENVD_EINVAL;
    for (int i = 0; i < def->num_params; i++) {
        const envd_param_t *p = &def->params[i];
        if (p->name == NULL || p->type < ENVD_PARAM_FLOAT || p->type > ENVD_PARAM_BOOL)
            return ENVD_EINVAL;
        if (!(p->min_value <= p->default_value && p->default_value <= p->max_value))
            return ENVD_EINVAL;
    }
    return ENVD_OK;
}

int envd_env_def_validate(const envd_env_def_t *def)
{
    if (def == NULL)
        return ENVD_EINVAL;
    if (def->abi_version != ENVD_ABI_VERSION)
        return ENVD_EABI;
    if (def->id == NULL || def->id[0] == '\0' || def->state_size == 0 ||
        def->state_size > ENVD_MAX_STATE_SIZE ||
        def->num_agents != 1 || def->max_episode_steps < 0 ||
        def->init == NULL || def->reset == NULL || def->step == NULL)
        return ENVD_EINVAL;
    int rc = validate_space(&def->observation_space);
    if (rc == ENVD_OK)
        rc = validate_space(&def->action_space);
    if (rc == ENVD_OK)
        rc = validate_params(def);
    return rc;
}
