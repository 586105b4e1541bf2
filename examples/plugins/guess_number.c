/*
 * guess_number.c -- an example envd plugin: GuessNumber-v0.
 *
 * The env hides a number in [0, 100); each step the agent guesses one, and
 * the observation says whether the hidden number is lower (-1) or higher
 * (+1) than the guess.  A right guess ends the episode with reward +1; a
 * wrong one costs `penalty`.  info["bounds"] is the interval [low, high]
 * the feedback so far leaves possible, an example of an env info field.
 *
 * Build and use it (nothing of envd is linked; see "plugins" in envd.h):
 *     cc -shared -fPIC -O2 -I "$(python -m envd.native --include)" \
 *        guess_number.c -o libguess_number.so
 *     envd --plugin ./libguess_number.so            # in the daemon, or
 *     envd.make("GuessNumber-v0", 8, plugin="./libguess_number.so")
 */
#include <envd.h>

#define RANGE 100

typedef struct guess_number {
    double penalty; /* the kwarg, fixed at init */
    int64_t target;
    int64_t low, high; /* the target is in [low, high] given the feedback so far */
} guess_number_t;

static const double obs_low[1] = {-1.0};
static const double obs_high[1] = {1.0};

static const envd_param_t params[] = {
    {"penalty", ENVD_PARAM_FLOAT, 0.0, 0.0, 1.0, "reward lost per wrong guess"},
};

static const envd_info_field_t info_fields[] = {
    {"bounds", ENVD_DTYPE_INT64, 1, {2}, "[low, high]: where the number can still be"},
};

static int guess_init(void *state, const double *p)
{
    guess_number_t *s = state;
    s->penalty = p[0];
    return ENVD_OK;
}

static int guess_reset(void *state, envd_rng_t *rng, void *obs)
{
    guess_number_t *s = state;
    /* numpy: int(np.random.default_rng(seed).random() * 100) */
    s->target = (int64_t)(envd_rng_random(rng) * RANGE);
    s->low = 0;
    s->high = RANGE - 1;
    *(float *)obs = 0.0f;
    return ENVD_OK;
}

static int guess_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                      double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    (void)truncated;
    guess_number_t *s = state;
    int64_t guess = *(const int64_t *)action;
    float feedback = 0.0f;
    if (guess == s->target) {
        *reward = 1.0;
        *terminated = true;
        s->low = s->high = guess;
    } else {
        *reward = 0.0 - s->penalty; /* not -penalty, which is -0.0 for 0 */
        feedback = s->target < guess ? -1.0f : 1.0f;
        if (s->target < guess && guess - 1 < s->high)
            s->high = guess - 1;
        if (s->target > guess && guess + 1 > s->low)
            s->low = guess + 1;
    }
    *(float *)obs = feedback;
    return ENVD_OK;
}

static int guess_write_info(const void *state, void *const *fields)
{
    const guess_number_t *s = state;
    int64_t *bounds = fields[0];
    bounds[0] = s->low;
    bounds[1] = s->high;
    return ENVD_OK;
}

static const envd_env_def_t guess_number = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "GuessNumber-v0",
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                          .shape = {1}, .low = obs_low, .high = obs_high},
    .action_space = {.kind = ENVD_SPACE_DISCRETE, .dtype = ENVD_DTYPE_INT64, .n = RANGE},
    .state_size = sizeof(guess_number_t),
    .num_agents = 1,
    .max_episode_steps = 20,
    .params = params,
    .num_params = 1,
    .init = guess_init,
    .reset = guess_reset,
    .step = guess_step,
    .info_fields = info_fields,
    .num_info_fields = 1,
    .write_info = guess_write_info,
};

static const envd_env_def_t *const envs[] = {&guess_number};
static const envd_plugin_t plugin = {ENVD_ABI_VERSION, 1, envs};

/* The entry point envd looks up (ENVD_PLUGIN_SYMBOL). */
const envd_plugin_t *envd_plugin(void) { return &plugin; }
