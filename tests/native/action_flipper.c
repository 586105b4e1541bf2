/*
 * action_flipper.c -- a test plugin (env "ActionFlip-v0") that plays the
 * hostile second process of the copy-then-check rule (docs/architecture.md,
 * "Trust boundary: copy, then check"), deterministically.
 *
 * Its step callback first writes FLIP_TO (99, out of Discrete(3)'s range)
 * into every env's row of the actions array of each session segment this
 * process maps (/dev/shm/envd-*, found in /proc/self/maps; the array lies at
 * the param actions_offset, rows rows) -- exactly what another process of
 * the trainer may do between the daemon's range check and the step -- and
 * only then reads its own action argument.  It reports that action as its
 * observation, so the test sees what the env received:
 *   - a host that steps from its private, checked copy hands every env the
 *     action the trainer sent (0, 1 or 2);
 *   - a host that checks in the segment and steps from it hands it 99.
 * The test runs it in a daemon serving this one session.
 *
 * Built with -DMULTI it is "ActionFlipMulti-v0": MultiDiscrete([3, 3])
 * actions (every element is checked and flipped), both reported as its
 * two-element observation.
 */
#include <envd.h>
#include <stdio.h>
#include <string.h>

#define FLIP_TO 99
#ifdef MULTI
#define ELEMS 2 /* int64 elements of one action */
#define ENV_ID "ActionFlipMulti-v0"
static const int64_t nvec[ELEMS] = {3, 3};
#else
#define ELEMS 1
#define ENV_ID "ActionFlip-v0"
#endif

typedef struct flipper {
    double actions_offset; /* params: where the actions array lies in the segment */
    double rows;
} flipper_t;

static const envd_param_t params[] = {
    {"actions_offset", ENVD_PARAM_INT, 0.0, 0.0, 1e12, "offset of the actions array"},
    {"rows", ENVD_PARAM_INT, 1.0, 1.0, 1e7, "rows of the actions array (num_envs)"},
};

static int flipper_init(void *state, const double *values)
{
    flipper_t *s = state;
    s->actions_offset = values[0];
    s->rows = values[1];
    return ENVD_OK;
}

static int flipper_reset(void *state, envd_rng_t *rng, void *obs)
{
    (void)state;
    (void)rng;
    for (int k = 0; k < ELEMS; k++)
        ((float *)obs)[k] = -1.0f;
    return ENVD_OK;
}

/* Write FLIP_TO into every row of the actions array of every session segment
 * this process maps (large enough to hold it). */
static void flip_segments(const flipper_t *s)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    if (maps == NULL)
        return;
    const size_t offset = (size_t)s->actions_offset, rows = (size_t)s->rows;
    char line[512];
    while (fgets(line, sizeof line, maps) != NULL) {
        unsigned long begin, end, file_offset;
        char perms[8];
        int path_at = 0;
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %n", &begin, &end, perms, &file_offset,
                   &path_at) < 4 || path_at == 0)
            continue;
        if (strncmp(line + path_at, "/dev/shm/envd-", 14) != 0 || perms[1] != 'w' ||
            file_offset != 0 || end - begin < offset + rows * ELEMS * sizeof(int64_t))
            continue;
        volatile int64_t *actions = (volatile int64_t *)(begin + offset);
        for (size_t i = 0; i < rows * ELEMS; i++)
            actions[i] = FLIP_TO;
    }
    fclose(maps);
}

static int flipper_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                        double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    (void)terminated;
    (void)truncated;
    flip_segments(state);
    /* volatile: read after the flip, from wherever the host points */
    for (int k = 0; k < ELEMS; k++)
        ((float *)obs)[k] = (float)((const volatile int64_t *)action)[k];
    *reward = 0.0;
    return ENVD_OK;
}

static const envd_env_def_t flipper = {
    .abi_version = ENVD_ABI_VERSION,
    .id = ENV_ID,
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                          .shape = {ELEMS}},
#ifdef MULTI
    .action_space = {.kind = ENVD_SPACE_MULTI_DISCRETE, .dtype = ENVD_DTYPE_INT64, .ndim = 1,
                     .shape = {ELEMS}, .nvec = nvec},
#else
    .action_space = {.kind = ENVD_SPACE_DISCRETE, .dtype = ENVD_DTYPE_INT64, .n = 3},
#endif
    .state_size = sizeof(flipper_t),
    .num_agents = 1,
    .params = params,
    .num_params = 2,
    .init = flipper_init,
    .reset = flipper_reset,
    .step = flipper_step,
};

static const envd_env_def_t *const envs[] = {&flipper};
static const envd_plugin_t table = {ENVD_ABI_VERSION, 1, envs};

const envd_plugin_t *envd_plugin(void) { return &table; }
