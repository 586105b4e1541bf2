/*
 * ocean_sanitized_run.c -- drive one Ocean plugin built with sanitizers.
 *
 * Usage: ocean_sanitized_run PLUGIN.so {defaults|min|max} STEPS
 * Loads the plugin, describes, seeds, inits, resets and steps two envs with
 * every make kwarg at its default, its minimum or its maximum, with random
 * valid actions (every Box element also 50% beyond its bounds; every other
 * step through step_envs), reads the episode log after each step and closes
 * them.  An env with ENVD_ENV_OBS_ROWS is bound (bind_obs) to a row of its
 * own of exactly its observations' size, which it then writes directly (an
 * overflow is ASan's).  Prints "ocean: ok" when
 * done; an ASan/UBSan report ends the run (halt_on_error).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <envd.h>

/* The host's allocations for describe, freed at the end (as the vec frees
 * them). */
static void *blocks[64];
static int num_blocks;

static void *host_alloc(void *host, size_t bytes)
{
    (void)host;
    if (num_blocks == 64)
        return NULL;
    return blocks[num_blocks++] = calloc(1, bytes ? bytes : 1);
}

static int64_t numel(const envd_space_t *s)
{
    int64_t n = 1;
    for (int32_t d = 0; d < s->ndim; d++)
        n *= s->shape[d];
    return n;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s PLUGIN {defaults|min|max} STEPS\n", argv[0]);
        return 2;
    }
    void *handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    envd_plugin_fn entry = (envd_plugin_fn)dlsym(handle, ENVD_PLUGIN_SYMBOL);
    const envd_plugin_t *plugin = entry ? entry() : NULL;
    if (!plugin || plugin->abi_version != ENVD_ABI_VERSION || plugin->num_envs != 1) {
        fprintf(stderr, "no ABI %u plugin table\n", ENVD_ABI_VERSION);
        return 1;
    }
    const envd_env_def_t *def = plugin->envs[0];
    double params[64];
    for (int32_t p = 0; p < def->num_params; p++) {
        const envd_param_t *param = &def->params[p];
        params[p] = strcmp(argv[2], "min") == 0   ? param->min_value
                    : strcmp(argv[2], "max") == 0 ? param->max_value
                                                  : param->default_value;
    }
    envd_description_t desc;
    memset(&desc, 0, sizeof(desc));
    desc.observation_space = def->observation_space;
    desc.action_space = def->action_space;
    desc.num_agents = def->num_agents;
    desc.state_size = def->state_size;
    desc.alloc = host_alloc;
    int rc = def->describe(params, &desc);
    if (rc != ENVD_OK) {
        fprintf(stderr, "describe refused the %s kwargs: %d\n", argv[2], rc);
        return 1;
    }
    long steps = atol(argv[3]);
    int32_t agents = desc.num_agents;
    const envd_space_t *act = &desc.action_space;
    int64_t act_n = numel(act) * agents;
    size_t obs_bytes = (size_t)(numel(&desc.observation_space) * agents) * 8;
    unsigned seed = 12345;
    enum { ENVS = 2 };
    void *states[ENVS];
    void *obs = calloc(1, obs_bytes);
    /* a bound env's row: its observations' exact bytes */
    const bool bind = def->flags & ENVD_ENV_OBS_ROWS;
    const size_t row_bytes = (size_t)(numel(&desc.observation_space) * agents) *
                             (desc.observation_space.dtype == ENVD_DTYPE_FLOAT32 ? 4 : 1);
    if (bind && desc.observation_space.dtype != ENVD_DTYPE_FLOAT32 &&
        desc.observation_space.dtype != ENVD_DTYPE_UINT8 &&
        desc.observation_space.dtype != ENVD_DTYPE_INT8) {
        fprintf(stderr, "no row size for this observation dtype\n");
        return 1;
    }
    void *rows[ENVS];
    void *actions = calloc((size_t)act_n, 8);
    const size_t action_bytes = (size_t)act_n * (act->kind == ENVD_SPACE_BOX ? 4 : 8);
    double *reward = calloc((size_t)agents, sizeof(double));
    bool *term = calloc((size_t)agents, 1), *trunc = calloc((size_t)agents, 1);
    double fields[ENVD_MAX_EPISODE_FIELDS];
    envd_rng_t rng;
    memset(&rng, 0, sizeof(rng));
    long episodes = 0;
    for (int e = 0; e < ENVS; e++) {
        states[e] = aligned_alloc(64, (desc.state_size + 63) & ~(size_t)63);
        memset(states[e], 0, desc.state_size);
        rows[e] = bind ? calloc(1, row_bytes) : obs;
        if (def->seed(states[e], (uint64_t)e + 3) != ENVD_OK || def->init(states[e], params) != ENVD_OK ||
            (bind && def->bind_obs(states[e], rows[e]) != ENVD_OK) ||
            def->reset(states[e], &rng, rows[e]) != ENVD_OK) {
            fprintf(stderr, "init/reset failed\n");
            return 1;
        }
    }
    for (long t = 0; t < steps; t++) {
        for (int e = 0; e < ENVS; e++) {
            for (int64_t k = 0; k < act_n; k++) {
                if (act->kind == ENVD_SPACE_DISCRETE)
                    ((int64_t *)actions)[k] = rand_r(&seed) % act->n;
                else if (act->kind == ENVD_SPACE_MULTI_DISCRETE)
                    ((int64_t *)actions)[k] = rand_r(&seed) % act->nvec[k % numel(act)];
                else
                    ((float *)actions)[k] = (float)(rand_r(&seed) % 301 - 150) / 100.0f;
            }
            /* every other step through step_envs (one env a call, with
               the host's action_bytes: the one-agent Discrete loop runs
               under the sanitizers too), which must flag each step after
               which episode_end reports an end */
            bool flagged = true;
            if (t % 2 && def->step_envs) {
                if (def->step_envs(states[e], 0, 1, actions, action_bytes, rows[e], 0,
                                   reward, term, &flagged) != 1) {
                    fprintf(stderr, "step_envs failed\n");
                    return 1;
                }
            } else if (def->step(states[e], &rng, actions, rows[e], reward, term, trunc) !=
                       ENVD_OK) {
                fprintf(stderr, "step failed\n");
                return 1;
            }
            int ended = def->episode_end(states[e], fields);
            if (ended < 0 || (ended > 0 && !flagged)) {
                fprintf(stderr, "episode_end failed or was not flagged by step_envs\n");
                return 1;
            }
            episodes += ended;
        }
    }
    for (int e = 0; e < ENVS; e++) {
        def->close(states[e]);
        free(states[e]);
        if (bind)
            free(rows[e]);
    }
    free(obs);
    free(actions);
    free(reward);
    free(term);
    free(trunc);
    for (int b = 0; b < num_blocks; b++)
        free(blocks[b]);
    printf("ocean: ok (%ld episodes)\n", episodes);
    return 0;
}
