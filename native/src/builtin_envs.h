/*
 * builtin_envs.h -- the env definitions compiled into envd.
 */
#ifndef ENVD_BUILTIN_ENVS_H
#define ENVD_BUILTIN_ENVS_H

#include "envd.h"

extern const envd_env_def_t envd_builtin_cartpole;
extern const envd_env_def_t envd_builtin_pendulum;
extern const envd_env_def_t envd_builtin_mountain_car;
extern const envd_env_def_t envd_builtin_mountain_car_continuous;
extern const envd_env_def_t envd_builtin_acrobot;
extern const envd_env_def_t envd_builtin_snake;
extern const envd_env_def_t envd_builtin_connect_four;

/* Number of built-in envs, and the i-th one (NULL when out of range). */
int envd_builtin_count(void);
const envd_env_def_t *envd_builtin_get(int i);

#endif /* ENVD_BUILTIN_ENVS_H */
