/*
 * Pendulum-v1, bit-exact with gymnasium 1.x (classic_control/pendulum.py).
 *
 * The state (th, thdot) is a float64 array, so th and thdot are np.float64
 * scalars and each operation on them rounds once in double, as below (built
 * without FMA contraction).  The action is a float32 array and
 * u = np.clip(u, ...)[0] is an np.float32 scalar, so the terms with u are
 * float32 arithmetic that is then promoted to float64 (NEP 50: a Python float
 * meeting an np.float32 is cast to float32 first).
 *
 * x**2 on an np.float64 scalar calls libm pow(x, 2.0) and on an np.float32
 * scalar powf(x, 2.0f); neither is always x*x, and gcc folds a constant
 * exponent of 2 into x*x, so the exponent is read through a volatile.
 */
#include <math.h>

#include "envd.h"
#include "raster.h"

typedef struct pendulum {
    double th, thdot; /* first, in this order: tests write them directly */
    double g;
} pendulum_t;

#define MAX_SPEED 8 /* a Python int in gymnasium; np.clip keeps float64 */
#define MAX_TORQUE 2.0
#define DT 0.05
#define MASS 1.0
#define LENGTH 1.0

static const double obs_high[3] = {1.0, 1.0, MAX_SPEED};
static const double obs_low[3] = {-1.0, -1.0, -MAX_SPEED};
static const double act_high[1] = {MAX_TORQUE};
static const double act_low[1] = {-MAX_TORQUE};

static const envd_param_t params[] = {
    {"g", ENVD_PARAM_FLOAT, 10.0, 0.0, 1000.0,
     "acceleration of gravity (m s^-2) used in the pendulum dynamics"},
};

static int pendulum_init(void *state, const double *p)
{
    pendulum_t *s = state;
    s->g = p[0];
    return ENVD_OK;
}

/* Python float % and numpy float64 remainder: fmod, then move the result to
 * the divisor's sign (npy_divmod); a zero result takes the divisor's sign. */
static double py_mod(double a, double b)
{
    double mod = fmod(a, b);
    if (mod == 0.0)
        return copysign(0.0, b);
    if ((b < 0) != (mod < 0))
        mod += b;
    return mod;
}

static double angle_normalize(double x)
{
    return py_mod(x + M_PI, 2 * M_PI) - M_PI;
}

/* np.clip: comparisons that let a NaN through, as numpy's clip does. */
static double clip(double x, double lo, double hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

static float clipf(float x, float lo, float hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

static void write_obs(const pendulum_t *s, float *obs)
{
    obs[0] = (float)cos(s->th);
    obs[1] = (float)sin(s->th);
    obs[2] = (float)s->thdot;
}

static int pendulum_reset(void *state, envd_rng_t *rng, void *obs)
{
    pendulum_t *s = state;
    /* uniform(low=[-pi, -1], high=[pi, 1]) draws element 0, then element 1. */
    s->th = envd_rng_uniform(rng, -M_PI, M_PI);
    s->thdot = envd_rng_uniform(rng, -1.0, 1.0);
    write_obs(s, obs);
    return ENVD_OK;
}

static int pendulum_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                         double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    pendulum_t *s = state;
    volatile double two = 2.0; /* keeps pow()/powf() calls: see the top */
    /* np.clip of a float32 array with Python float bounds stays float32. */
    float u = clipf(*(const float *)action, (float)-MAX_TORQUE, (float)MAX_TORQUE);
    /* u**2 is powf; 0.001 * it is float32 (the Python float is cast first). */
    float torque_cost = (float)0.001 * powf(u, (float)two);
    /* float64 ** 2 is pow; float64 + float32 promotes to float64. */
    double costs = pow(angle_normalize(s->th), two) + 0.1 * pow(s->thdot, two) +
                   (double)torque_cost;
    /* 3 * g / (2 * l) and 3.0 / (m * l**2) are Python floats (l**2 exact for
     * l = 1); the first meets np.sin (float64), the second u (float32). */
    double gravity_term = 3 * s->g / (2 * LENGTH) * sin(s->th);
    float torque_term = (float)(3.0 / (MASS * (LENGTH * LENGTH))) * u;
    double newthdot = s->thdot + (gravity_term + (double)torque_term) * DT;
    newthdot = clip(newthdot, -MAX_SPEED, MAX_SPEED);
    s->th = s->th + newthdot * DT;
    s->thdot = newthdot;

    *reward = -costs;
    *terminated = false;
    *truncated = false;
    write_obs(s, obs);
    return ENVD_OK;
}

/* gymnasium's PendulumEnv.render geometry (500x500, y up).  gymnasium also
 * draws an arrow image scaled by the last torque; envd leaves it out (the
 * rod and joints show the state). */
#define SCREEN_DIM 500

static int pendulum_render(const void *state, uint8_t *rgb)
{
    const pendulum_t *s = state;
    envd_raster_t r = {rgb, SCREEN_DIM, SCREEN_DIM, true};
    const double scale = SCREEN_DIM / (2.2 * 2);
    const int offset = SCREEN_DIM / 2;
    const double rod_length = 1 * scale, rod_width = 0.2 * scale;
    const envd_color_t red = {204, 77, 77};
    envd_raster_fill(&r, (envd_color_t){255, 255, 255});
    double rod[8];
    envd_raster_box(0, rod_length, -rod_width / 2, rod_width / 2, s->th + M_PI / 2, offset,
                    offset, rod);
    envd_raster_polygon(&r, rod, 4, red);
    envd_raster_circle(&r, offset, offset, (int)(rod_width / 2), red);
    double ex, ey;
    envd_raster_rotate(rod_length, 0, s->th + M_PI / 2, &ex, &ey);
    envd_raster_circle(&r, envd_raster_trunc(ex + offset), envd_raster_trunc(ey + offset),
                       (int)(rod_width / 2), red);
    envd_raster_circle(&r, offset, offset, (int)(0.05 * scale), (envd_color_t){0, 0, 0});
    return ENVD_OK;
}

const envd_env_def_t envd_builtin_pendulum = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "Pendulum-v1",
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                          .shape = {3}, .low = obs_low, .high = obs_high},
    .action_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                     .shape = {1}, .low = act_low, .high = act_high},
    .state_size = sizeof(pendulum_t),
    .num_agents = 1,
    .max_episode_steps = 200,
    .params = params,
    .num_params = 1,
    .init = pendulum_init,
    .reset = pendulum_reset,
    .step = pendulum_step,
    .render_width = SCREEN_DIM,
    .render_height = SCREEN_DIM,
    .render_fps = 30,
    .render = pendulum_render,
};
