/*
 * multi_spaces.c -- a test plugin for the ABI 4 spaces (test_multi_spaces.py):
 *
 *   Lights-v0    4 lights.  obs MultiBinary(4) (which are on); action
 *                MultiDiscrete([4, 3], start=[0, -1]): light a[0] is switched
 *                off (a[1] = -1), toggled (0) or on (+1).  reward = lights on
 *                after the action, plus `bonus` when all are on, which
 *                terminates.  Reset: light k is on when rng.random() < 0.5.
 *   Switches-v0  the same 4 lights.  obs MultiDiscrete([5]) (how many are on);
 *                action MultiBinary(4): toggle every light whose bit is 1.
 *                reward and termination as Lights-v0, bonus included.
 *
 * Both take one kwarg, bonus (float in [0, 10], default 1), so per-env kwargs
 * can be tested against separately made envs.  The reference is the plain
 * Python of tests/native/test_multi_spaces.py, written from this description.
 */
#include <envd.h>

#define NUM_LIGHTS 4

typedef struct lights {
    int8_t on[NUM_LIGHTS];
    double bonus;
} lights_t;

static int lights_init(void *state, const double *params)
{
    ((lights_t *)state)->bonus = params[0];
    return ENVD_OK;
}

static int count_on(const lights_t *s)
{
    int n = 0;
    for (int k = 0; k < NUM_LIGHTS; k++)
        n += s->on[k];
    return n;
}

static void draw_lights(lights_t *s, envd_rng_t *rng)
{
    for (int k = 0; k < NUM_LIGHTS; k++)
        s->on[k] = envd_rng_random(rng) < 0.5;
}

/* reward and termination of the state after an action */
static void score(const lights_t *s, double *reward, bool *terminated)
{
    int n = count_on(s);
    *terminated = n == NUM_LIGHTS;
    *reward = n + (*terminated ? s->bonus : 0.0);
}

static int lights_reset(void *state, envd_rng_t *rng, void *obs)
{
    lights_t *s = state;
    draw_lights(s, rng);
    for (int k = 0; k < NUM_LIGHTS; k++)
        ((int8_t *)obs)[k] = s->on[k];
    return ENVD_OK;
}

static int lights_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                       double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    (void)truncated;
    lights_t *s = state;
    const int64_t *a = action; /* checked by the host: a[0] in 0..3, a[1] in -1..1 */
    s->on[a[0]] = a[1] == 0 ? (int8_t)!s->on[a[0]] : (int8_t)(a[1] > 0);
    for (int k = 0; k < NUM_LIGHTS; k++)
        ((int8_t *)obs)[k] = s->on[k];
    score(s, reward, terminated);
    return ENVD_OK;
}

static int switches_reset(void *state, envd_rng_t *rng, void *obs)
{
    lights_t *s = state;
    draw_lights(s, rng);
    *(int64_t *)obs = count_on(s);
    return ENVD_OK;
}

static int switches_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                         double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    (void)truncated;
    lights_t *s = state;
    const int8_t *a = action; /* checked by the host: every bit 0 or 1 */
    for (int k = 0; k < NUM_LIGHTS; k++)
        s->on[k] ^= a[k];
    *(int64_t *)obs = count_on(s);
    score(s, reward, terminated);
    return ENVD_OK;
}

static const envd_param_t params[] = {
    {"bonus", ENVD_PARAM_FLOAT, 1.0, 0.0, 10.0, "reward added when every light is on"},
};

static const int64_t light_choice_nvec[] = {NUM_LIGHTS, 3};
static const int64_t light_choice_start[] = {0, -1};
static const int64_t count_nvec[] = {NUM_LIGHTS + 1};

static const envd_env_def_t lights = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "Lights-v0",
    .observation_space = {.kind = ENVD_SPACE_MULTI_BINARY, .dtype = ENVD_DTYPE_INT8, .ndim = 1,
                          .shape = {NUM_LIGHTS}},
    .action_space = {.kind = ENVD_SPACE_MULTI_DISCRETE, .dtype = ENVD_DTYPE_INT64, .ndim = 1,
                     .shape = {2}, .nvec = light_choice_nvec,
                     .nvec_start = light_choice_start},
    .state_size = sizeof(lights_t),
    .num_agents = 1,
    .max_episode_steps = 12,
    .params = params,
    .num_params = 1,
    .init = lights_init,
    .reset = lights_reset,
    .step = lights_step,
};

static const envd_env_def_t switches = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "Switches-v0",
    .observation_space = {.kind = ENVD_SPACE_MULTI_DISCRETE, .dtype = ENVD_DTYPE_INT64,
                          .ndim = 1, .shape = {1}, .nvec = count_nvec},
    .action_space = {.kind = ENVD_SPACE_MULTI_BINARY, .dtype = ENVD_DTYPE_INT8, .ndim = 1,
                     .shape = {NUM_LIGHTS}},
    .state_size = sizeof(lights_t),
    .num_agents = 1,
    .max_episode_steps = 12,
    .params = params,
    .num_params = 1,
    .init = lights_init,
    .reset = switches_reset,
    .step = switches_step,
};

static const envd_env_def_t *const envs[] = {&lights, &switches};
static const envd_plugin_t plugin = {ENVD_ABI_VERSION, 2, envs};

const envd_plugin_t *envd_plugin(void) { return &plugin; }
