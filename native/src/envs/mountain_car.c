/*
 * MountainCar-v0, bit-exact with gymnasium 1.x (classic_control/mountain_car.py).
 *
 * Reset stores a float64 array and every step stores the np.float64 results
 * of np.clip (or the Python int 0 for a stopped car), so all state arithmetic
 * is double and rounds once per operation as below (built without FMA
 * contraction).  math.cos on a double is libm cos, as we call it.
 */
#include <math.h>

#include "envd.h"
#include "mountain_car_render.h"

typedef struct mountain_car {
    double position, velocity; /* first, in this order: tests write them directly */
    double goal_velocity;
} mountain_car_t;

#define MIN_POSITION (-1.2)
#define MAX_POSITION 0.6
#define MAX_SPEED 0.07
#define GOAL_POSITION 0.5
#define FORCE 0.001
#define GRAVITY 0.0025

static const double obs_high[2] = {(double)(float)MAX_POSITION, (double)(float)MAX_SPEED};
static const double obs_low[2] = {(double)(float)MIN_POSITION, (double)(float)-MAX_SPEED};

static const envd_param_t params[] = {
    {"goal_velocity", ENVD_PARAM_FLOAT, 0.0, -1.0, 1.0,
     "the episode terminates at the goal only once velocity >= goal_velocity"},
};

static int mountain_car_init(void *state, const double *p)
{
    mountain_car_t *s = state;
    s->goal_velocity = p[0];
    return ENVD_OK;
}

/* np.clip: comparisons that let a NaN through, as numpy's clip does. */
static double clip(double x, double lo, double hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

static void write_obs(const mountain_car_t *s, float *obs)
{
    obs[0] = (float)s->position;
    obs[1] = (float)s->velocity;
}

static int mountain_car_reset(void *state, envd_rng_t *rng, void *obs)
{
    mountain_car_t *s = state;
    s->position = envd_rng_uniform(rng, -0.6, -0.4);
    s->velocity = 0.0;
    write_obs(s, obs);
    return ENVD_OK;
}

static int mountain_car_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                             double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    mountain_car_t *s = state;
    int64_t a = *(const int64_t *)action;
    if (a < 0 || a > 2)
        return ENVD_EINVAL; /* gymnasium asserts action_space.contains(action) */
    /* (action - 1) * force: int64 times a Python float is float64;
     * math.cos(3 * position) is libm cos of a double product. */
    double velocity = s->velocity + ((double)(a - 1) * FORCE + cos(3 * s->position) * -GRAVITY);
    velocity = clip(velocity, -MAX_SPEED, MAX_SPEED);
    double position = clip(s->position + velocity, MIN_POSITION, MAX_POSITION);
    if (position == MIN_POSITION && velocity < 0)
        velocity = 0.0; /* the Python int 0: the same value in every later use */
    s->position = position;
    s->velocity = velocity;

    *reward = -1.0;
    *terminated = position >= GOAL_POSITION && velocity >= s->goal_velocity;
    *truncated = false;
    write_obs(s, obs);
    return ENVD_OK;
}

static int mountain_car_render(const void *state, uint8_t *rgb)
{
    mountain_car_draw(rgb, ((const mountain_car_t *)state)->position, GOAL_POSITION);
    return ENVD_OK;
}

const envd_env_def_t envd_builtin_mountain_car = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "MountainCar-v0",
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                          .shape = {2}, .low = obs_low, .high = obs_high},
    .action_space = {.kind = ENVD_SPACE_DISCRETE, .dtype = ENVD_DTYPE_INT64, .n = 3},
    .state_size = sizeof(mountain_car_t),
    .num_agents = 1,
    .max_episode_steps = 200,
    .params = params,
    .num_params = 1,
    .init = mountain_car_init,
    .reset = mountain_car_reset,
    .step = mountain_car_step,
    .render_width = MC_SCREEN_WIDTH,
    .render_height = MC_SCREEN_HEIGHT,
    .render_fps = 30,
    .render = mountain_car_render,
};
