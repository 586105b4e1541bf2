/*
 * abi5_plugin.c -- a test plugin of the ABI 5 fields (test_abi5.py,
 * tests/integration/test_abi5_daemon.py).  One env, "Abi5Test-v0":
 *
 * params: size (int 1..8, default 3), agents (int 1..4, default 1),
 *   episode_len (int 1..50, default 4).
 * describe: observation Box float64 of shape (size + 6,) with bounds from the
 *   host's allocator ([0, 1e15]); action MultiDiscrete nvec [size + 1, 2]
 *   (from the allocator); num_agents = agents; state_size grows with size.
 *   size 7: describe fails (ENVD_EINVAL); size 8: asks the allocator for
 *   more than ENVD_MAX_DESCRIBE_BYTES (must get NULL: returns ENVD_ENOMEM).
 *   heap_bytes = 1000 * episode_len, ENVD_MAX_STATE_SIZE + 1 at 50 (refused).
 * flags: ENVD_ENV_RESETS_ITSELF | ENVD_ENV_SERIAL_INIT.
 * seed: records the seed and counts its calls.
 * init: fails when another init of this definition is running (it sleeps a
 *   little inside, so unserialised inits overlap) or when seed was not called
 *   before it.
 * Agent a's observation row: [last seed mod 2^32, seed calls, episodes ended, step of
 *   the episode, a, seed seen by init mod 2^32, size, 0...].
 * step: reward (per agent) = action[0] of that agent; after episode_len
 *   steps the env ends the episode itself: terminated set for every agent,
 *   step back to 0, episodes + 1 (no reset call).
 * episode_end: fields episode_return (the mean over agents of the episode's
 *   summed rewards), episode_length, score (episodes so far).
 * step_envs: step in a loop (NO_STEP_ENVS: none).  An env last seeded
 *   FAILING_SEED fails every step, changing nothing.
 *
 * -D variants (refused at load): BAD_FLAGS (an unknown flag bit),
 * TIME_LIMIT (max_episode_steps 10 with RESETS_ITSELF), MANY_FIELDS
 * (17 episode fields), DESCRIBE_DEFAULT_FAILS (describe fails at the
 * defaults), DESCRIBE_BAD (describe returns num_agents 0), STEP_ENVS_NO_FLAG
 * (step_envs without ENVD_ENV_RESETS_ITSELF), STEP_ENVS_NULL
 * (ENVD_ENV_STEP_ENVS with no step_envs).  NO_SERIAL (loads): without
 * ENVD_ENV_SERIAL_INIT, to show that the serial-init check can fail.
 * STEP_ENVS_UNFLAGGED (loads): step_envs set without ENVD_ENV_STEP_ENVS, as
 * the field's bytes look to a host reading an older ABI 5 definition: the
 * host must never call it (it aborts).
 * OBS_ROWS, OBS_ROWS_PRIVATE (load): bind_obs with ENVD_ENV_OBS_ROWS (and
 * ENVD_ENV_OBS_ROWS_PRIVATE).  bind_obs aborts unless it comes once, after
 * init and before the first reset; reset and step abort when given an obs
 * other than the bound row; column 7 (where size > 1) says whether the env
 * was bound.  Refused: OBS_ROWS_NO_RESET (ENVD_ENV_OBS_ROWS without
 * ENVD_ENV_RESETS_ITSELF), OBS_ROWS_NULL (the flag, no bind_obs),
 * OBS_PRIVATE_ALONE (ENVD_ENV_OBS_ROWS_PRIVATE without ENVD_ENV_OBS_ROWS).
 */
#include <envd.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

typedef struct abi5_state {
    uint64_t seed;        /* the last seed given */
    int64_t seed_calls;
    uint64_t seed_at_init;
    int64_t size, agents, episode_len;
    int64_t step, episodes;
    int64_t pending;      /* episodes ended since episode_end last asked */
    double returns[4];    /* per agent, this episode */
    double last_return;
    void *bound;         /* bind_obs's row, NULL while unbound */
    int64_t resets;
    unsigned char pad[]; /* state_size grows with size */
} abi5_state_t;

static atomic_int inits_running;

/* An env last seeded this fails every step (step and step_envs alike). */
#define FAILING_SEED 999999u

static int abi5_seed(void *state, uint64_t seed)
{
    abi5_state_t *s = state;
    s->seed = seed;
    s->seed_calls++;
    return ENVD_OK;
}

static int abi5_init(void *state, const double *params)
{
    abi5_state_t *s = state;
    if (atomic_fetch_add(&inits_running, 1) != 0) {
        atomic_fetch_sub(&inits_running, 1);
        return ENVD_EINVAL; /* two inits at once: SERIAL_INIT broken */
    }
    struct timespec pause = {0, 200000}; /* 0.2 ms: makes overlapping inits likely */
    nanosleep(&pause, NULL);
    int rc = s->seed_calls == 1 ? ENVD_OK : ENVD_ESTATE; /* seed comes first, once */
    s->seed_at_init = s->seed;
    s->size = (int64_t)params[0];
    s->agents = (int64_t)params[1];
    s->episode_len = (int64_t)params[2];
    atomic_fetch_sub(&inits_running, 1);
    return rc;
}

static void write_obs(const abi5_state_t *s, double *obs)
{
    const int64_t width = s->size + 6;
    for (int64_t a = 0; a < s->agents; a++) {
        double *row = obs + a * width;
        for (int64_t k = 0; k < width; k++)
            row[k] = 0.0;
        row[0] = (double)(s->seed & 0xFFFFFFFFu); /* (exact in a double) */
        row[1] = (double)s->seed_calls;
        row[2] = (double)s->episodes;
        row[3] = (double)s->step;
        row[4] = (double)a;
        row[5] = (double)(s->seed_at_init & 0xFFFFFFFFu);
        row[6] = (double)s->size;
        if (width > 7)
            row[7] = s->bound != NULL;
    }
}

/* A bound env is only ever given its row. */
static void check_row(const abi5_state_t *s, const void *obs)
{
    if (s->bound != NULL && obs != s->bound)
        abort();
}

__attribute__((unused)) static int abi5_bind_obs(void *state, void *obs)
{
    abi5_state_t *s = state;
    if (s->size < 1 || s->resets != 0 || s->bound != NULL || obs == NULL)
        abort(); /* after init, before the first reset, once */
    s->bound = obs;
    return ENVD_OK;
}

static int abi5_reset(void *state, envd_rng_t *rng, void *obs)
{
    (void)rng;
    abi5_state_t *s = state;
    check_row(s, obs);
    s->resets++;
    s->step = 0;
    for (int a = 0; a < 4; a++)
        s->returns[a] = 0.0;
    write_obs(s, obs);
    return ENVD_OK;
}

static int abi5_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                     double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    (void)truncated;
    abi5_state_t *s = state;
    const int64_t *act = action; /* per agent: [choice, flag] */
    check_row(s, obs);
    if (s->seed == FAILING_SEED)
        return ENVD_EENV; /* (nothing changed) */
    s->step++;
    for (int64_t a = 0; a < s->agents; a++) {
        reward[a] = (double)act[2 * a];
        s->returns[a] += reward[a];
    }
    if (s->step >= s->episode_len) { /* the env starts its next episode itself */
        double sum = 0.0;
        for (int64_t a = 0; a < s->agents; a++) {
            terminated[a] = true;
            sum += s->returns[a];
            s->returns[a] = 0.0;
        }
        s->last_return = sum / (double)s->agents;
        s->step = 0;
        s->episodes++;
        s->pending++;
    }
    write_obs(s, obs);
    return ENVD_OK;
}

/* abi5_step for count envs in a row (envd.h's step_envs). */
__attribute__((unused)) static int64_t abi5_step_envs(void *state, size_t stride, int64_t count, const void *actions,
                              size_t action_bytes, void *obs, size_t obs_bytes, double *rewards,
                              bool *terminated, bool *ended)
{
#ifdef STEP_ENVS_UNFLAGGED
    abort(); /* read without its flag */
#endif
    for (int64_t k = 0; k < count; k++) {
        abi5_state_t *s = (abi5_state_t *)((char *)state + (size_t)k * stride);
        int rc = abi5_step(s, NULL, (const char *)actions + (size_t)k * action_bytes,
                           (char *)obs + (size_t)k * obs_bytes, rewards + k * s->agents,
                           terminated + k * s->agents, NULL);
        if (rc != ENVD_OK)
            return k;
        ended[k] = s->pending > 0;
    }
    return count;
}

static int abi5_episode_end(void *state, double *values)
{
    abi5_state_t *s = state;
    if (s->pending == 0)
        return 0;
    int n = (int)s->pending;
    s->pending = 0;
    values[0] = s->last_return;
    values[1] = (double)s->episode_len;
    values[2] = (double)s->episodes;
    return n;
}

static int abi5_describe(const double *params, envd_description_t *out)
{
    const int64_t size = (int64_t)params[0];
#ifdef DESCRIBE_DEFAULT_FAILS
    return ENVD_EINVAL;
#endif
    if (size == 7)
        return ENVD_EINVAL;
    if (size == 8) /* past the bound: the host must refuse */
        return out->alloc(out->host, ENVD_MAX_DESCRIBE_BYTES + 1) ? ENVD_OK : ENVD_ENOMEM;
    const int64_t width = size + 6;
    double *low = out->alloc(out->host, (size_t)width * sizeof *low);
    double *high = out->alloc(out->host, (size_t)width * sizeof *high);
    int64_t *nvec = out->alloc(out->host, 2 * sizeof *nvec);
    if (!low || !high || !nvec)
        return ENVD_ENOMEM;
    for (int64_t k = 0; k < width; k++)
        high[k] = 1e15; /* (low: zeroed by the host) */
    nvec[0] = size + 1;
    nvec[1] = 2;
    out->observation_space.shape[0] = width;
    out->observation_space.low = low;
    out->observation_space.high = high;
    out->action_space.nvec = nvec;
#ifdef DESCRIBE_BAD
    out->num_agents = 0;
#else
    out->num_agents = (int32_t)params[1];
#endif
    out->state_size = sizeof(abi5_state_t) + (size_t)size * 64;
    /* a declaration only (the env allocates nothing): 1000 per episode step,
       past ENVD_MAX_STATE_SIZE at episode_len 50 */
    const int64_t len = (int64_t)params[2];
    out->heap_bytes = len == 50 ? (uint64_t)ENVD_MAX_STATE_SIZE + 1 : (uint64_t)len * 1000;
    return ENVD_OK;
}

static const envd_param_t params[] = {
    {"size", ENVD_PARAM_INT, 3, 1, 8, "observation width - 6"},
    {"agents", ENVD_PARAM_INT, 1, 1, 4, "agents per env"},
    {"episode_len", ENVD_PARAM_INT, 4, 1, 50, "steps per episode"},
};

#ifdef MANY_FIELDS
static const char *const fields[] = {"episode_return", "episode_length", "score", "f3", "f4",
                                     "f5", "f6", "f7", "f8", "f9", "f10", "f11", "f12", "f13",
                                     "f14", "f15", "f16"};
#define NUM_FIELDS 17
#else
static const char *const fields[] = {"episode_return", "episode_length", "score"};
#define NUM_FIELDS 3
#endif

/* The static spaces (what describe's output starts from): the defaults'. */
static const int64_t static_nvec[] = {4, 2};

static const envd_env_def_t abi5_env = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "Abi5Test-v0",
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT64, .ndim = 1,
                          .shape = {9}},
    .action_space = {.kind = ENVD_SPACE_MULTI_DISCRETE, .dtype = ENVD_DTYPE_INT64, .ndim = 1,
                     .shape = {2}, .nvec = static_nvec},
    .state_size = sizeof(abi5_state_t),
    .num_agents = 1,
#ifdef TIME_LIMIT
    .max_episode_steps = 10,
#endif
    .params = params,
    .num_params = 3,
    .init = abi5_init,
    .reset = abi5_reset,
    .step = abi5_step,
#ifdef BAD_FLAGS
    .flags = ENVD_ENV_RESETS_ITSELF | ENVD_ENV_SERIAL_INIT | (1u << 7),
#elif defined(NO_SERIAL)
    .flags = ENVD_ENV_RESETS_ITSELF,
#elif defined(STEP_ENVS_NO_FLAG)
    .flags = ENVD_ENV_SERIAL_INIT | ENVD_ENV_STEP_ENVS,
#elif defined(STEP_ENVS_NULL)
    .flags = ENVD_ENV_RESETS_ITSELF | ENVD_ENV_SERIAL_INIT | ENVD_ENV_STEP_ENVS,
#elif defined(OBS_ROWS) || defined(OBS_ROWS_NULL)
    .flags = ENVD_ENV_RESETS_ITSELF | ENVD_ENV_SERIAL_INIT | ENVD_ENV_STEP_ENVS |
             ENVD_ENV_OBS_ROWS,
#elif defined(OBS_ROWS_PRIVATE)
    .flags = ENVD_ENV_RESETS_ITSELF | ENVD_ENV_SERIAL_INIT | ENVD_ENV_STEP_ENVS |
             ENVD_ENV_OBS_ROWS | ENVD_ENV_OBS_ROWS_PRIVATE,
#elif defined(OBS_ROWS_NO_RESET)
    .flags = ENVD_ENV_SERIAL_INIT | ENVD_ENV_OBS_ROWS,
#elif defined(OBS_PRIVATE_ALONE)
    .flags = ENVD_ENV_RESETS_ITSELF | ENVD_ENV_SERIAL_INIT | ENVD_ENV_OBS_ROWS_PRIVATE,
#elif defined(NO_STEP_ENVS) || defined(STEP_ENVS_UNFLAGGED)
    .flags = ENVD_ENV_RESETS_ITSELF | ENVD_ENV_SERIAL_INIT,
#else
    .flags = ENVD_ENV_RESETS_ITSELF | ENVD_ENV_SERIAL_INIT | ENVD_ENV_STEP_ENVS,
#endif
    .describe = abi5_describe,
    .seed = abi5_seed,
    .episode_fields = fields,
    .num_episode_fields = NUM_FIELDS,
    .episode_end = abi5_episode_end,
#if !defined(NO_STEP_ENVS) && !defined(STEP_ENVS_NULL)
    .step_envs = abi5_step_envs,
#endif
#if !defined(OBS_ROWS_NULL)
    .bind_obs = abi5_bind_obs, /* (read only under ENVD_ENV_OBS_ROWS) */
#endif
};

static const envd_env_def_t *const envs[] = {&abi5_env};
static const envd_plugin_t table = {ENVD_ABI_VERSION, 1, envs};

const envd_plugin_t *envd_plugin(void) { return &table; }
