/*
 * multi_agent.c -- a multi-agent test plugin (ABI 4) for test_multi_agent.py.
 *
 *   Seek-v0  3 agents on cells 0..9 of a line, seeking one target cell.
 *     reset: target = int(10 * rng.random()), then agent a's cell =
 *            int(10 * rng.random()) for a = 0, 1, 2 (in that order; a draw
 *            equal to the target is kept).
 *     obs (per agent): Box float32 (2,) [own cell, target cell].
 *     action (per agent): MultiDiscrete([3, 2]): a[0] in {0, 1, 2} moves by
 *            a[0] - 1, times `speed` (kwarg, int in 1..3, default 1), times 2
 *            when a[1] is 1; the cell is clamped to 0..9.
 *     Agents move in order 0, 1, 2; an agent done earlier (a dead row) does
 *     not move.  A live agent that lands on the target: reward 1,
 *     terminated.  One that lands on cell 0 (and the target is not 0) ends
 *     the episode for everyone (the env's own word): its reward is -1, and
 *     every live agent is terminated in that step (the others' rewards as
 *     computed for them, -0.1 unless on the target).  Otherwise a live
 *     agent's reward is -0.1.
 *     Time limit: 8 steps (the host's).
 * The reference is the plain Python of tests/native/test_multi_agent.py.
 *
 * Built with -DSEEK_FAILS it is SeekFail-v0 instead: the same env, whose
 * step fails (ENVD_EENV) in every env made with speed 3, for the tests of
 * how errors name a multi-agent env's rows.  (Seek-v0's step and definition
 * stay as docs/writing-envs.md quotes them.)
 */
#include <envd.h>

#define AGENTS 3
#define CELLS 10

typedef struct seek {
    int64_t target;
    int64_t cell[AGENTS];
    bool done[AGENTS]; /* the env's own view: agents that ended */
    int64_t speed;
} seek_t;

static int seek_init(void *state, const double *params)
{
    ((seek_t *)state)->speed = (int64_t)params[0];
    return ENVD_OK;
}

static void write_obs(const seek_t *s, float *obs)
{
    for (int a = 0; a < AGENTS; a++) {
        obs[2 * a] = (float)s->cell[a];
        obs[2 * a + 1] = (float)s->target;
    }
}

static int seek_reset(void *state, envd_rng_t *rng, void *obs)
{
    seek_t *s = state;
    s->target = (int64_t)(CELLS * envd_rng_random(rng));
    for (int a = 0; a < AGENTS; a++) {
        s->cell[a] = (int64_t)(CELLS * envd_rng_random(rng));
        s->done[a] = false;
    }
    write_obs(s, obs);
    return ENVD_OK;
}

static int seek_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                     double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    (void)truncated;
    seek_t *s = state;
    const int64_t *act = action; /* AGENTS rows of 2, checked by the host */
    bool everyone_ends = false;
    for (int a = 0; a < AGENTS; a++) {
        if (s->done[a])
            continue;
        int64_t move = (act[2 * a] - 1) * s->speed * (act[2 * a + 1] ? 2 : 1);
        int64_t cell = s->cell[a] + move;
        s->cell[a] = cell < 0 ? 0 : cell >= CELLS ? CELLS - 1 : cell;
        if (s->cell[a] == s->target) {
            reward[a] = 1.0;
            terminated[a] = true;
        } else if (s->cell[a] == 0) {
            reward[a] = -1.0;
            everyone_ends = true;
        } else {
            reward[a] = -0.1;
        }
    }
    for (int a = 0; a < AGENTS; a++) {
        if (!s->done[a] && everyone_ends)
            terminated[a] = true;
        s->done[a] = s->done[a] || terminated[a];
    }
    write_obs(s, obs);
    return ENVD_OK;
}

static const envd_param_t params[] = {
    {"speed", ENVD_PARAM_INT, 1.0, 1.0, 3.0, "cells per move"},
};
static const double obs_low[] = {0, 0};
static const double obs_high[] = {CELLS - 1, CELLS - 1};
static const int64_t move_nvec[] = {3, 2};

static const envd_env_def_t seek = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "Seek-v0",
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                          .shape = {2}, .low = obs_low, .high = obs_high},
    .action_space = {.kind = ENVD_SPACE_MULTI_DISCRETE, .dtype = ENVD_DTYPE_INT64, .ndim = 1,
                     .shape = {2}, .nvec = move_nvec},
    .state_size = sizeof(seek_t),
    .num_agents = AGENTS,
    .max_episode_steps = 8,
    .params = params,
    .num_params = 1,
    .init = seek_init,
    .reset = seek_reset,
    .step = seek_step,
};

#ifdef SEEK_FAILS
static int seek_fail_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                          double *reward, bool *terminated, bool *truncated)
{
    if (((seek_t *)state)->speed == 3)
        return ENVD_EENV;
    return seek_step(state, rng, action, obs, reward, terminated, truncated);
}

static envd_env_def_t seek_fail; /* seek with its id and step replaced, at load */
static const envd_env_def_t *const envs[] = {&seek_fail};
static const envd_plugin_t plugin = {ENVD_ABI_VERSION, 1, envs};

const envd_plugin_t *envd_plugin(void)
{
    seek_fail = seek;
    seek_fail.id = "SeekFail-v0";
    seek_fail.step = seek_fail_step;
    return &plugin;
}
#else
static const envd_env_def_t *const envs[] = {&seek};
static const envd_plugin_t plugin = {ENVD_ABI_VERSION, 1, envs};

const envd_plugin_t *envd_plugin(void) { return &plugin; }
#endif
