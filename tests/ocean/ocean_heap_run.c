/*
 * ocean_heap_run.c -- what one Ocean env instance allocates itself.
 *
 * Usage: ocean_heap_run PLUGIN.so {defaults|min|max} STEPS
 * Describes one env with every make kwarg at its default, minimum or
 * maximum, then seeds, inits, resets and steps it with random valid
 * actions, reading glibc's heap use (mallinfo2: in-use chunk bytes plus
 * mmapped bytes) after each call, twice (the first round warms up); the
 * driver allocates nothing of its own meanwhile.  Prints
 * "heap: estimate=E measured=M": E the description's heap_bytes, M the most
 * the heap grew over its use before init.
 */
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <envd.h>

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

static size_t heap_in_use(void)
{
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s PLUGIN {defaults|min|max} STEPS\n", argv[0]);
        return 2;
    }
    void *handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    envd_plugin_fn entry = handle ? (envd_plugin_fn)dlsym(handle, ENVD_PLUGIN_SYMBOL) : NULL;
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
    if (def->describe(params, &desc) != ENVD_OK) {
        fprintf(stderr, "describe refused the %s kwargs\n", argv[2]);
        return 1;
    }
    long steps = atol(argv[3]);
    int32_t agents = desc.num_agents;
    const envd_space_t *act = &desc.action_space;
    int64_t act_n = numel(act) * agents;
    unsigned seed = 12345;
    void *obs = calloc((size_t)(numel(&desc.observation_space) * agents), 8);
    void *actions = calloc((size_t)act_n, 8);
    double *reward = calloc((size_t)agents, sizeof(double));
    bool *term = calloc((size_t)agents, 1), *trunc = calloc((size_t)agents, 1);
    double fields[ENVD_MAX_EPISODE_FIELDS];
    envd_rng_t rng;
    memset(&rng, 0, sizeof(rng));
    void *state = aligned_alloc(64, (desc.state_size + 63) & ~(size_t)63);
    size_t grew = 0;
    /* round 0 warms up: the first call into the plugin allocates its
       thread-local block (once per thread, not per env) */
    for (int round = 0; round < 2; round++) {
        memset(state, 0, desc.state_size);
        size_t base = heap_in_use(), peak = base, now;
        if (def->seed(state, 7) != ENVD_OK || def->init(state, params) != ENVD_OK) {
            fprintf(stderr, "init failed\n");
            return 1;
        }
        now = heap_in_use();
        peak = now > peak ? now : peak;
        if (def->reset(state, &rng, obs) != ENVD_OK) {
            fprintf(stderr, "reset failed\n");
            return 1;
        }
        for (long t = 0; t < steps; t++) {
            now = heap_in_use();
            peak = now > peak ? now : peak;
            for (int64_t k = 0; k < act_n; k++) {
                if (act->kind == ENVD_SPACE_DISCRETE)
                    ((int64_t *)actions)[k] = rand_r(&seed) % act->n;
                else if (act->kind == ENVD_SPACE_MULTI_DISCRETE)
                    ((int64_t *)actions)[k] = rand_r(&seed) % act->nvec[k % numel(act)];
                else
                    ((float *)actions)[k] = (float)(rand_r(&seed) % 301 - 150) / 100.0f;
            }
            if (def->step(state, &rng, actions, obs, reward, term, trunc) != ENVD_OK ||
                def->episode_end(state, fields) < 0) {
                fprintf(stderr, "step failed\n");
                return 1;
            }
        }
        now = heap_in_use();
        peak = now > peak ? now : peak;
        def->close(state);
        grew = peak - base;
    }
    printf("heap: estimate=%llu measured=%llu\n", (unsigned long long)desc.heap_bytes,
           (unsigned long long)grew);
    return 0;
}
