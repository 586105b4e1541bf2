/*
 * builtin_envs.c -- the table of built-in envs.  Lookup by id and plugin
 * registration live in Python (envd.native.registry), which owns the
 * namespace of env ids.
 */
#include "builtin_envs.h"

static const envd_env_def_t *const builtins[] = {
    &envd_builtin_cartpole,
    &envd_builtin_pendulum,
    &envd_builtin_mountain_car,
    &envd_builtin_mountain_car_continuous,
    &envd_builtin_acrobot,
    &envd_builtin_snake,
    &envd_builtin_connect_four,
};

int envd_builtin_count(void) { return (int)(sizeof builtins / sizeof builtins[0]); }

const envd_env_def_t *envd_builtin_get(int i)
{
    return i >= 0 && i < envd_builtin_count() ? builtins[i] : NULL;
}
