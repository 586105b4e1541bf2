/*
 * builtin_envs.c -- the table of built-in envs, in the order of
 * ENVD_BUILTIN_ENVS (builtin_envs.h).  Lookup by id and plugin registration
 * live in Python (envd.native.registry), which owns the namespace of env ids.
 */
#include "builtin_envs.h"

static const envd_env_def_t *const builtins[] = {
#define ENVD_BUILTIN_ENTRY(name) &envd_builtin_##name,
    ENVD_BUILTIN_ENVS(ENVD_BUILTIN_ENTRY)
#undef ENVD_BUILTIN_ENTRY
};

int envd_builtin_count(void) { return (int)(sizeof builtins / sizeof builtins[0]); }

const envd_env_def_t *envd_builtin_get(int i)
{
    return i >= 0 && i < envd_builtin_count() ? builtins[i] : NULL;
}
