/*
 * builtin_envs.h -- the env definitions compiled into envd.
 *
 * ENVD_BUILTIN_ENVS is the one list of built-in envs: X(name) for the
 * definition `const envd_env_def_t envd_builtin_<name>` that a file of
 * native/src/envs/ exports.  It declares the definitions below and fills the
 * table of builtin_envs.c, whose order is envd_builtin_get's; the build
 * compiles every C file of native/src/envs/ and writes the ids into the Python
 * facts (envd._native_facts.BUILTIN_ENV_IDS), so a new built-in env is
 * its C file plus its line here.
 */
#ifndef ENVD_BUILTIN_ENVS_H
#define ENVD_BUILTIN_ENVS_H

#include "envd.h"

#define ENVD_BUILTIN_ENVS(X)         \
    X(cartpole)                      \
    X(pendulum)                      \
    X(mountain_car)                  \
    X(mountain_car_continuous)       \
    X(acrobot)                       \
    X(snake)                         \
    X(connect_four)                  \
    X(simple_spread)                 \
    X(simple_spread_continuous)

#define ENVD_BUILTIN_DECLARE(name) extern const envd_env_def_t envd_builtin_##name;
ENVD_BUILTIN_ENVS(ENVD_BUILTIN_DECLARE)
#undef ENVD_BUILTIN_DECLARE

/* cffi:begin */
/* Number of built-in envs, and the i-th one (NULL when out of range). */
int envd_builtin_count(void);
const envd_env_def_t *envd_builtin_get(int i);
/* cffi:end */

#endif /* ENVD_BUILTIN_ENVS_H */
