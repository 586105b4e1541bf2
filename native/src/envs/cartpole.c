/*
 * CartPole-v1, bit-exact with gymnasium 1.x (classic_control/cartpole.py).
 *
 * State is float64 and every expression keeps gymnasium's evaluation order:
 * gymnasium computes on numpy float64 scalars, so each operation rounds once
 * in double precision, exactly as the C below does (built without FMA
 * contraction).  np.cos/np.sin on float64 scalars call libm, as we do.
 */
#include <math.h>

#include "envd.h"
#include "raster.h"

typedef struct cartpole {
    double x, x_dot, theta, theta_dot;
    bool sutton_barto_reward;
    bool terminated; /* the previous step terminated (gymnasium's steps_beyond_terminated) */
} cartpole_t;

#define GRAVITY 9.8
#define MASSCART 1.0
#define MASSPOLE 0.1
#define LENGTH 0.5 /* half the pole's length */
#define FORCE_MAG 10.0
#define TAU 0.02
#define X_THRESHOLD 2.4
/* Constants derived as gymnasium derives them, so they round identically. */
#define TOTAL_MASS (MASSPOLE + MASSCART)
#define POLEMASS_LENGTH (MASSPOLE * LENGTH)
#define THETA_THRESHOLD (12 * 2 * M_PI / 360)

static const double obs_high[4] = {(double)(float)(X_THRESHOLD * 2), INFINITY,
                                   (double)(float)(THETA_THRESHOLD * 2), INFINITY};
static const double obs_low[4] = {-(double)(float)(X_THRESHOLD * 2), -INFINITY,
                                  -(double)(float)(THETA_THRESHOLD * 2), -INFINITY};

static const envd_param_t params[] = {
    {"sutton_barto_reward", ENVD_PARAM_BOOL, 0.0, 0.0, 1.0,
     "reward 0 per step and -1 on failure instead of +1 per step"},
};

static int cartpole_init(void *state, const double *p)
{
    cartpole_t *s = state;
    s->sutton_barto_reward = p[0] != 0.0;
    return ENVD_OK;
}

static void write_obs(const cartpole_t *s, float *obs)
{
    obs[0] = (float)s->x;
    obs[1] = (float)s->x_dot;
    obs[2] = (float)s->theta;
    obs[3] = (float)s->theta_dot;
}

static int cartpole_reset(void *state, envd_rng_t *rng, void *obs)
{
    cartpole_t *s = state;
    s->x = envd_rng_uniform(rng, -0.05, 0.05);
    s->x_dot = envd_rng_uniform(rng, -0.05, 0.05);
    s->theta = envd_rng_uniform(rng, -0.05, 0.05);
    s->theta_dot = envd_rng_uniform(rng, -0.05, 0.05);
    s->terminated = false;
    write_obs(s, obs);
    return ENVD_OK;
}

static int cartpole_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                         double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    cartpole_t *s = state;
    double force = *(const int64_t *)action == 1 ? FORCE_MAG : -FORCE_MAG;
    double costheta = cos(s->theta);
    double sintheta = sin(s->theta);
    double temp = (force + POLEMASS_LENGTH * (s->theta_dot * s->theta_dot) * sintheta) / TOTAL_MASS;
    double thetaacc = (GRAVITY * sintheta - costheta * temp) /
                      (LENGTH * (4.0 / 3.0 - MASSPOLE * (costheta * costheta) / TOTAL_MASS));
    double xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS;

    s->x = s->x + TAU * s->x_dot;
    s->x_dot = s->x_dot + TAU * xacc;
    s->theta = s->theta + TAU * s->theta_dot;
    s->theta_dot = s->theta_dot + TAU * thetaacc;

    bool done = s->x < -X_THRESHOLD || s->x > X_THRESHOLD ||
                s->theta < -THETA_THRESHOLD || s->theta > THETA_THRESHOLD;
    if (!done)
        *reward = s->sutton_barto_reward ? 0.0 : 1.0;
    else if (!s->terminated)
        *reward = s->sutton_barto_reward ? -1.0 : 1.0; /* the pole just fell */
    else
        *reward = s->sutton_barto_reward ? -1.0 : 0.0; /* stepping past the end */
    s->terminated = s->terminated || done;
    *terminated = done;
    *truncated = false;
    write_obs(s, obs);
    return ENVD_OK;
}

/* gymnasium's CartPoleEnv.render geometry: a 600x400 frame, the cart's top at
 * y = 100 (y up), pole 10 px wide; colours as gymnasium's. */
#define SCREEN_WIDTH 600
#define SCREEN_HEIGHT 400

static int cartpole_render(const void *state, uint8_t *rgb)
{
    const cartpole_t *s = state;
    envd_raster_t r = {rgb, SCREEN_WIDTH, SCREEN_HEIGHT, true};
    const double scale = SCREEN_WIDTH / (X_THRESHOLD * 2);
    const double polewidth = 10.0, polelen = scale * (2 * LENGTH);
    const double cartwidth = 50.0, cartheight = 30.0, axleoffset = cartheight / 4.0;
    const double cartx = s->x * scale + SCREEN_WIDTH / 2.0, carty = 100;
    envd_raster_fill(&r, (envd_color_t){255, 255, 255});

    double l = -cartwidth / 2, rt = cartwidth / 2, t = cartheight / 2, b = -cartheight / 2;
    double cart[8] = {l + cartx, b + carty, l + cartx, t + carty,
                      rt + cartx, t + carty, rt + cartx, b + carty};
    envd_raster_polygon(&r, cart, 4, (envd_color_t){0, 0, 0});

    double pole[8];
    envd_raster_box(-polewidth / 2, polewidth / 2, -polewidth / 2, polelen - polewidth / 2,
                    -s->theta, cartx, carty + axleoffset, pole);
    envd_raster_polygon(&r, pole, 4, (envd_color_t){202, 152, 101});
    /* gymnasium truncates the axle's centre and radius to integers */
    envd_raster_circle(&r, envd_raster_trunc(cartx), envd_raster_trunc(carty + axleoffset),
                       (double)(int)(polewidth / 2), (envd_color_t){129, 132, 203});
    envd_raster_line(&r, 0, carty, SCREEN_WIDTH, carty, (envd_color_t){0, 0, 0});
    return ENVD_OK;
}

const envd_env_def_t envd_builtin_cartpole = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "CartPole-v1",
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                          .shape = {4}, .low = obs_low, .high = obs_high},
    .action_space = {.kind = ENVD_SPACE_DISCRETE, .dtype = ENVD_DTYPE_INT64, .n = 2},
    .state_size = sizeof(cartpole_t),
    .num_agents = 1,
    .max_episode_steps = 500,
    .params = params,
    .num_params = 1,
    .init = cartpole_init,
    .reset = cartpole_reset,
    .step = cartpole_step,
    .render_width = SCREEN_WIDTH,
    .render_height = SCREEN_HEIGHT,
    .render_fps = 50,
    .render = cartpole_render,
};
