/*
 * plugin_variants.c -- broken plugins for test_plugins.py, one per -D flag:
 *   NO_ENTRY      exports no envd_plugin symbol
 *   NULL_TABLE    envd_plugin() returns NULL
 *   OTHER_ABI     the table says ABI version 999
 *   NO_ENVS       the table has num_envs 0
 *   ZERO_STATE    the env declares state_size 0
 *   DUPLICATE     the table holds the same id twice
 *   UNDEFINED     calls a function no library defines (dlopen must fail)
 *   ENV_ID=...    the env's id (default "TestPlugin-v0")
 *   INFO_FAILS    write_info fails once the env has stepped 3 times
 *   INFO_NAME=... the info field's name (default "steps")
 *   STATE_SIZE=.. the env's state_size in bytes (default: its counter's size)
 *   RENDERS       renders a 4x2 frame whose every pixel is (steps, 2, 3)
 *   BAD_RENDER    a render callback with render_width 0
 *   ABI_2         the table and the env say ABI 2 (before rendering), with
 *                 render fields set that a host must not read: an ABI 2
 *                 definition ends before them
 *   ABI3_AGENTS   the table and the env say ABI 3, with num_agents 2 (multi-agent
 *                 envs need ABI 4)
 *   ABI3_MULTI    the table and the env say ABI 3, with a MULTI_BINARY action
 *                 space (the new kinds need ABI 4)
 *   AGENTS_ZERO   an ABI 4 env with num_agents 0
 *   BAD_NVEC      an ABI 4 env with a MULTI_DISCRETE action whose nvec has a 0
 * Without flags it is a valid one-env plugin: obs = [steps so far], reward 1.
 */
#include <envd.h>

#ifndef ENV_ID
#define ENV_ID "TestPlugin-v0"
#endif
#ifndef INFO_NAME
#define INFO_NAME "steps"
#endif

typedef struct counter {
    int64_t steps;
} counter_t;

#ifdef UNDEFINED
int envd_test_no_such_function(void);
#endif

static int counter_init(void *state, const double *params)
{
    (void)state;
    (void)params;
    return ENVD_OK;
}

static int counter_reset(void *state, envd_rng_t *rng, void *obs)
{
    (void)rng;
    counter_t *s = state;
    s->steps = 0;
    *(float *)obs = 0.0f;
    return ENVD_OK;
}

static int counter_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                        double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    (void)action;
    (void)terminated;
    (void)truncated;
    counter_t *s = state;
    s->steps++;
#ifdef UNDEFINED
    s->steps += envd_test_no_such_function();
#endif
    *(float *)obs = (float)s->steps;
    *reward = 1.0;
    return ENVD_OK;
}

#if defined(RENDERS) || defined(BAD_RENDER) || defined(ABI_2)
static int counter_render(const void *state, uint8_t *rgb)
{
    const counter_t *s = state;
    for (int k = 0; k < 4 * 2; k++) {
        rgb[3 * k] = (uint8_t)s->steps;
        rgb[3 * k + 1] = 2;
        rgb[3 * k + 2] = 3;
    }
    return ENVD_OK;
}
#endif

static const envd_info_field_t info_fields[] = {
    {INFO_NAME, ENVD_DTYPE_INT32, 0, {0}, "steps since reset"},
};

static int counter_write_info(const void *state, void *const *fields)
{
    const counter_t *s = state;
#ifdef INFO_FAILS
    if (s->steps >= 3)
        return ENVD_EINVAL;
#endif
    *(int32_t *)fields[0] = (int32_t)s->steps;
    return ENVD_OK;
}

#ifdef BAD_NVEC
static const int64_t bad_nvec[] = {3, 0};
#endif

static const envd_env_def_t counter = {
#ifdef ABI_2
    .abi_version = 2,
#elif defined(ABI3_AGENTS) || defined(ABI3_MULTI)
    .abi_version = 3,
#else
    .abi_version = ENVD_ABI_VERSION,
#endif
    .id = ENV_ID,
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                          .shape = {1}},
#ifdef ABI3_MULTI
    .action_space = {.kind = ENVD_SPACE_MULTI_BINARY, .dtype = ENVD_DTYPE_INT8, .ndim = 1,
                     .shape = {2}},
#elif defined(BAD_NVEC)
    .action_space = {.kind = ENVD_SPACE_MULTI_DISCRETE, .dtype = ENVD_DTYPE_INT64, .ndim = 1,
                     .shape = {2}, .nvec = bad_nvec},
#else
    .action_space = {.kind = ENVD_SPACE_DISCRETE, .dtype = ENVD_DTYPE_INT64, .n = 2},
#endif
#ifdef ZERO_STATE
    .state_size = 0,
#elif defined(STATE_SIZE)
    .state_size = STATE_SIZE,
#else
    .state_size = sizeof(counter_t),
#endif
#ifdef ABI3_AGENTS
    .num_agents = 2,
#elif defined(AGENTS_ZERO)
    .num_agents = 0,
#else
    .num_agents = 1,
#endif
    .init = counter_init,
    .reset = counter_reset,
    .step = counter_step,
    .info_fields = info_fields,
    .num_info_fields = 1,
    .write_info = counter_write_info,
#if defined(RENDERS) || defined(ABI_2)
    .render_width = 4,
    .render_height = 2,
    .render_fps = 5,
    .render = counter_render,
#elif defined(BAD_RENDER)
    .render_height = 2,
    .render_fps = 5,
    .render = counter_render,
#endif
};

#ifdef DUPLICATE
static const envd_env_def_t *const envs[] = {&counter, &counter};
#else
static const envd_env_def_t *const envs[] = {&counter};
#endif

#ifdef OTHER_ABI
const envd_plugin_t test_plugin_table = {999, 1, envs};
#elif defined(ABI_2)
const envd_plugin_t test_plugin_table = {2, 1, envs};
#elif defined(ABI3_AGENTS) || defined(ABI3_MULTI)
const envd_plugin_t test_plugin_table = {3, 1, envs};
#elif defined(NO_ENVS)
const envd_plugin_t test_plugin_table = {ENVD_ABI_VERSION, 0, envs};
#else
const envd_plugin_t test_plugin_table = {ENVD_ABI_VERSION, (int32_t)(sizeof envs / sizeof envs[0]),
                                     envs};
#endif

#ifndef NO_ENTRY
const envd_plugin_t *envd_plugin(void)
{
#ifdef NULL_TABLE
    return NULL;
#else
    return &test_plugin_table;
#endif
}
#endif
