/*
 * simple_spread_v3 (mpe2 1.x, PettingZoo's multi-particle "spread" task),
 * bit-exact with mpe2's parallel API for its defaults: N = 3 agents and 3
 * landmarks, silent agents, no motor noise, curriculum and
 * terminate_on_success off, full observability.  Two definitions share this
 * file, one per action mode of the reference (continuous_actions=False/True),
 * because an action space is fixed per definition; both take mpe2's kwargs
 * local_ratio and max_cycles.
 *
 * A multi-agent env (ABI 4): every per-agent pointer covers the N agents of
 * the instance, agent 0 first (obs: N x 6N floats, actions: N, reward,
 * terminated, truncated: N each).
 *
 * Arithmetic order follows mpe2's numpy code (scenarios/simple_spread.py,
 * _mpe_utils/core.py and simple_env.py), one float64 rounding per numpy
 * operation, built without FMA contraction (-ffp-contract=off):
 *   - a 2-vector norm is np.sqrt(np.sum(np.square(d))): d0*d0 + d1*d1, then a
 *     correctly rounded sqrt;
 *   - np.logaddexp(0, v) is numpy's npy_logaddexp, which calls libm's exp and
 *     log1p (the same glibc here);
 *   - forces accumulate in mpe2's order: the agent's own action force first,
 *     then each collision pair (a, b), a < b, as f + p_force.
 */
#include <math.h>

#include "envd.h"
#include "raster.h"

#define N_AGENTS 3
#define N_LANDMARKS 3
#define DIM_P 2
#define DIM_C 2
/* [self_vel, self_pos, landmark rel pos, other agents' rel pos, comm] */
#define OBS_DIM (DIM_P + DIM_P + DIM_P * N_LANDMARKS + DIM_P * (N_AGENTS - 1) + \
                 DIM_C * (N_AGENTS - 1))
#define MOVE_DIM (DIM_P * 2 + 1) /* no_action, left, right, down, up */

/* mpe2's World and Agent constants. */
#define DT 0.1
#define DAMPING 0.25
#define CONTACT_FORCE 1e2
#define CONTACT_MARGIN 1e-3
#define AGENT_SIZE 0.15
#define AGENT_MASS 1.0
#define SENSITIVITY 5.0 /* agent.accel is None */
/* numpy's NPY_LOGE2 */
#define LOGE2 0.693147180559945309417232121458176568

typedef struct simple_spread {
    double pos[N_AGENTS][DIM_P];
    double vel[N_AGENTS][DIM_P];
    double landmark[N_LANDMARKS][DIM_P];
    double local_ratio;
    int64_t max_cycles;
    int64_t steps; /* world steps since reset (mpe2's self.steps) */
    double original_cam_range; /* render: the camera range at reset */
} simple_spread_t;

static const envd_param_t params[] = {
    {"local_ratio", ENVD_PARAM_FLOAT, 0.5, 0.0, 1.0,
     "weight of an agent's own (collision) reward; the shared landmark reward gets "
     "1 - local_ratio"},
    {"max_cycles", ENVD_PARAM_INT, 25, 1, 2147483647,
     "env steps until every agent is truncated (mpe2's max_cycles)"},
};

static const double cont_act_low[MOVE_DIM] = {0, 0, 0, 0, 0};
static const double cont_act_high[MOVE_DIM] = {1, 1, 1, 1, 1};

static int spread_init(void *state, const double *p)
{
    simple_spread_t *s = state;
    s->local_ratio = p[0];
    s->max_cycles = (int64_t)p[1];
    return ENVD_OK;
}

/* The render camera's range: the largest |coordinate| of any entity. */
static double cam_range(const simple_spread_t *s)
{
    double range = 0.0;
    for (int i = 0; i < N_AGENTS; i++)
        for (int d = 0; d < DIM_P; d++)
            range = fmax(range, fabs(s->pos[i][d]));
    for (int l = 0; l < N_LANDMARKS; l++)
        for (int d = 0; d < DIM_P; d++)
            range = fmax(range, fabs(s->landmark[l][d]));
    return range;
}

/* np.sqrt(np.sum(np.square(a - b))) for 2-vectors. */
static double distance(const double *a, const double *b)
{
    double d0 = a[0] - b[0], d1 = a[1] - b[1];
    return sqrt(d0 * d0 + d1 * d1);
}

/* numpy's npy_logaddexp(x, y), branch for branch. */
static double npy_logaddexp(double x, double y)
{
    if (x == y)
        return x + LOGE2;
    double tmp = x - y;
    if (tmp > 0)
        return x + log1p(exp(-tmp));
    if (tmp <= 0)
        return y + log1p(exp(tmp));
    return tmp; /* NaN */
}

static void write_obs(const simple_spread_t *s, float *obs)
{
    for (int i = 0; i < N_AGENTS; i++) {
        float *o = obs + (size_t)i * OBS_DIM;
        const double *p = s->pos[i];
        int k = 0;
        o[k++] = (float)s->vel[i][0];
        o[k++] = (float)s->vel[i][1];
        o[k++] = (float)p[0];
        o[k++] = (float)p[1];
        for (int l = 0; l < N_LANDMARKS; l++) {
            o[k++] = (float)(s->landmark[l][0] - p[0]);
            o[k++] = (float)(s->landmark[l][1] - p[1]);
        }
        for (int j = 0; j < N_AGENTS; j++) {
            if (j == i)
                continue;
            o[k++] = (float)(s->pos[j][0] - p[0]);
            o[k++] = (float)(s->pos[j][1] - p[1]);
        }
        for (int j = 0; j < DIM_C * (N_AGENTS - 1); j++)
            o[k++] = 0.0f; /* silent agents: state.c is zeros */
    }
}

static int spread_reset(void *state, envd_rng_t *rng, void *obs)
{
    simple_spread_t *s = state;
    /* reset_world: uniform(-1, +1, 2) for every agent, then every landmark. */
    for (int i = 0; i < N_AGENTS; i++) {
        for (int d = 0; d < DIM_P; d++) {
            s->pos[i][d] = envd_rng_uniform(rng, -1.0, 1.0);
            s->vel[i][d] = 0.0;
        }
    }
    for (int l = 0; l < N_LANDMARKS; l++)
        for (int d = 0; d < DIM_P; d++)
            s->landmark[l][d] = envd_rng_uniform(rng, -1.0, 1.0);
    s->steps = 0;
    s->original_cam_range = cam_range(s);
    write_obs(s, obs);
    return ENVD_OK;
}

/* World.step after _set_action: u[i] is each agent's action force
 * (agent.action.u, already scaled by the sensitivity). */
static void world_step(simple_spread_t *s, double u[N_AGENTS][DIM_P])
{
    double force[N_AGENTS][DIM_P];
    /* apply_action_force: p_force[i] = agent.action.u + noise, noise 0.0 */
    for (int i = 0; i < N_AGENTS; i++)
        for (int d = 0; d < DIM_P; d++)
            force[i][d] = u[i][d] + 0.0;
    /* apply_environment_force: landmarks do not collide, so only agent pairs */
    const double dist_min = AGENT_SIZE + AGENT_SIZE;
    for (int a = 0; a < N_AGENTS; a++) {
        for (int b = a + 1; b < N_AGENTS; b++) {
            double delta[DIM_P] = {s->pos[a][0] - s->pos[b][0], s->pos[a][1] - s->pos[b][1]};
            double dist = sqrt(delta[0] * delta[0] + delta[1] * delta[1]);
            double penetration =
                npy_logaddexp(0.0, -(dist - dist_min) / CONTACT_MARGIN) * CONTACT_MARGIN;
            for (int d = 0; d < DIM_P; d++) {
                double f = CONTACT_FORCE * delta[d] / dist * penetration;
                force[a][d] = f + force[a][d];
                force[b][d] = -f + force[b][d];
            }
        }
    }
    /* integrate_state (max_speed is None) */
    for (int i = 0; i < N_AGENTS; i++) {
        for (int d = 0; d < DIM_P; d++) {
            s->pos[i][d] += s->vel[i][d] * DT;
            s->vel[i][d] = s->vel[i][d] * (1 - DAMPING);
            s->vel[i][d] += (force[i][d] / AGENT_MASS) * DT;
        }
    }
}

/* Scenario.global_reward: minus the sum over landmarks of the nearest
 * agent's distance (Python's min keeps the first of equal values). */
static double global_reward(const simple_spread_t *s)
{
    double rew = 0.0;
    for (int l = 0; l < N_LANDMARKS; l++) {
        double nearest = distance(s->pos[0], s->landmark[l]);
        for (int i = 1; i < N_AGENTS; i++) {
            double d = distance(s->pos[i], s->landmark[l]);
            if (d < nearest)
                nearest = d;
        }
        rew -= nearest;
    }
    return rew;
}

/* Scenario.reward: -1 for every other agent it collides with. */
static double agent_reward(const simple_spread_t *s, int i)
{
    double rew = 0.0;
    for (int j = 0; j < N_AGENTS; j++)
        rew -= 1.0 * (j != i && distance(s->pos[j], s->pos[i]) < AGENT_SIZE + AGENT_SIZE);
    return rew;
}

/* The rest of SimpleEnv._execute_world_step and step, after the actions. */
static int finish_step(simple_spread_t *s, double u[N_AGENTS][DIM_P], void *obs, double *reward,
                       bool *terminated, bool *truncated)
{
    world_step(s, u);
    double global = global_reward(s);
    for (int i = 0; i < N_AGENTS; i++)
        reward[i] = global * (1 - s->local_ratio) + agent_reward(s, i) * s->local_ratio;
    s->steps += 1;
    for (int i = 0; i < N_AGENTS; i++) {
        terminated[i] = false; /* terminate_on_success is off */
        truncated[i] = s->steps >= s->max_cycles;
    }
    write_obs(s, obs);
    return ENVD_OK;
}

static int spread_step_discrete(void *state, envd_rng_t *rng, const void *action, void *obs,
                                double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    simple_spread_t *s = state;
    const int64_t *a = action; /* checked by the host: 0..MOVE_DIM-1 */
    double u[N_AGENTS][DIM_P];
    for (int i = 0; i < N_AGENTS; i++) {
        u[i][0] = 0.0;
        u[i][1] = 0.0;
        if (a[i] == 1)
            u[i][0] = -1.0;
        if (a[i] == 2)
            u[i][0] = +1.0;
        if (a[i] == 3)
            u[i][1] = -1.0;
        if (a[i] == 4)
            u[i][1] = +1.0;
        u[i][0] *= SENSITIVITY;
        u[i][1] *= SENSITIVITY;
    }
    return finish_step(s, u, obs, reward, terminated, truncated);
}

/* np.clip, as PettingZoo's ClipOutOfBoundsWrapper (around every mpe2 env)
 * applies it to an action outside [0, 1]; clipping an in-range action changes
 * nothing, so clipping always is the same.  Comparisons let a NaN through, as
 * numpy's clip does. */
static float clipf(float x, float lo, float hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

static int spread_step_continuous(void *state, envd_rng_t *rng, const void *action, void *obs,
                                  double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    simple_spread_t *s = state;
    const float *act = action;
    double u[N_AGENTS][DIM_P];
    for (int i = 0; i < N_AGENTS; i++) {
        float a[MOVE_DIM];
        for (int k = 0; k < MOVE_DIM; k++)
            a[k] = clipf(act[i * MOVE_DIM + k], 0.0f, 1.0f);
        /* u[0] += action[2] - action[1]: a float32 difference added to 0.0 */
        u[i][0] = 0.0 + (double)(a[2] - a[1]);
        u[i][1] = 0.0 + (double)(a[4] - a[3]);
        u[i][0] *= SENSITIVITY;
        u[i][1] *= SENSITIVITY;
    }
    return finish_step(s, u, obs, reward, terminated, truncated);
}

/* SimpleEnv.draw (700x700, dynamic_rescaling on): entities are discs with a
 * one-pixel black border, agents first, then landmarks, on white; the camera
 * follows the entity farthest from the origin.  Not bit-exact (pygame
 * rounds its circles its own way); the agents of silent envs write no text. */
#define SCREEN_SIDE 700
#define LANDMARK_SIZE 0.05 /* mpe2's Entity default */

static void draw_entity(envd_raster_t *r, const double *p, double range, double radius,
                        envd_color_t color)
{
    /* x = (x / cam_range) * width // 2 * 0.9 + width // 2 (Python floor
     * division, then the scale), y flipped */
    double x = floor(p[0] / range * SCREEN_SIDE / 2) * 0.9 + SCREEN_SIDE / 2;
    double y = floor(-p[1] / range * SCREEN_SIDE / 2) * 0.9 + SCREEN_SIDE / 2;
    envd_raster_circle(r, envd_raster_trunc(x), envd_raster_trunc(y), radius,
                       (envd_color_t){0, 0, 0});
    if (radius > 1)
        envd_raster_circle(r, envd_raster_trunc(x), envd_raster_trunc(y), radius - 1, color);
}

static int spread_render(const void *state, uint8_t *rgb)
{
    const simple_spread_t *s = state;
    envd_raster_t r = {rgb, SCREEN_SIDE, SCREEN_SIDE, false};
    envd_raster_fill(&r, (envd_color_t){255, 255, 255});
    double range = cam_range(s);
    if (!(range > 0)) /* every entity at the origin, or NaN: nothing to place */
        return ENVD_OK;
    double scaling = 0.9 * s->original_cam_range / range;
    /* entity.color * 200: agents (0.35, 0.35, 0.85), landmarks 0.25 */
    for (int i = 0; i < N_AGENTS; i++)
        draw_entity(&r, s->pos[i], range, AGENT_SIZE * 350 * scaling,
                    (envd_color_t){70, 70, 170});
    for (int l = 0; l < N_LANDMARKS; l++)
        draw_entity(&r, s->landmark[l], range, LANDMARK_SIZE * 350 * scaling,
                    (envd_color_t){50, 50, 50});
    return ENVD_OK;
}

#define SPREAD_COMMON                                                                   \
    .abi_version = ENVD_ABI_VERSION,                                                    \
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1, \
                          .shape = {OBS_DIM}},                                          \
    .state_size = sizeof(simple_spread_t), .num_agents = N_AGENTS,                      \
    .max_episode_steps = 0, /* max_cycles is the env's own truncation */                \
    .params = params, .num_params = 2, .init = spread_init, .reset = spread_reset,             \
    .render_width = SCREEN_SIDE, .render_height = SCREEN_SIDE, .render_fps = 10,              \
    .render = spread_render

const envd_env_def_t envd_builtin_simple_spread = {
    SPREAD_COMMON,
    .id = "simple_spread_v3",
    .action_space = {.kind = ENVD_SPACE_DISCRETE, .dtype = ENVD_DTYPE_INT64, .n = MOVE_DIM},
    .step = spread_step_discrete,
};

const envd_env_def_t envd_builtin_simple_spread_continuous = {
    SPREAD_COMMON,
    .id = "simple_spread_continuous_v3",
    .action_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                     .shape = {MOVE_DIM}, .low = cont_act_low, .high = cont_act_high},
    .step = spread_step_continuous,
};
