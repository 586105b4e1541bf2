/*
 * ocean_threads_run.c -- one Ocean plugin's envs stepped from two threads.
 *
 * Usage: ocean_threads_run PLUGIN.so ROUNDS
 * As envd's pool does: four envs are inited one at a time (under a lock, as
 * the host inits a SERIAL_INIT def), then two threads step them in rounds
 * separated by a barrier, each env on the other thread than in the round
 * before, so consecutive calls of one env come from different threads and
 * envs of one kind step at the same time.  Built with -fsanitize=thread: a
 * race between envs (a global the env's code writes, a shared random
 * stream) is reported.  An env with ENVD_ENV_OBS_ROWS is bound to its row
 * of one array of the four envs' rows side by side, as the host binds it, and
 * writes it directly from whichever thread steps it.  Prints "ocean threads:
 * ok".
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <envd.h>

enum { ENVS = 4, THREADS = 2 };

static const envd_env_def_t *def;
static envd_description_t desc;
static void *states[ENVS];
static long rounds;
static pthread_barrier_t barrier;
static int failed;
/* bound envs' rows: env e's at rows + e * row_bytes */
static unsigned char *rows;
static size_t row_bytes;

/* Env e's obs: its bound row, else the caller's buffer. */
static void *obs_of(int e, void *own) { return rows ? rows + (size_t)e * row_bytes : own; }

static void *host_alloc(void *host, size_t bytes)
{
    (void)host;
    return calloc(1, bytes ? bytes : 1); /* kept until exit: bounds of the description */
}

static int64_t numel(const envd_space_t *s)
{
    int64_t n = 1;
    for (int32_t d = 0; d < s->ndim; d++)
        n *= s->shape[d];
    return n;
}

static void *stepper(void *arg)
{
    int t = (int)(long)arg;
    int32_t agents = desc.num_agents;
    const envd_space_t *act = &desc.action_space;
    int64_t act_n = numel(act) * agents;
    void *obs = calloc((size_t)(numel(&desc.observation_space) * agents), 8);
    void *actions = calloc((size_t)act_n, 8);
    double *reward = calloc((size_t)agents, sizeof(double));
    bool *term = calloc((size_t)agents, 1), *trunc = calloc((size_t)agents, 1);
    double fields[ENVD_MAX_EPISODE_FIELDS];
    envd_rng_t rng;
    memset(&rng, 0, sizeof(rng));
    unsigned seed = 99u + (unsigned)t;
    for (long r = 0; r < rounds; r++) {
        for (int e = 0; e < ENVS; e++) {
            if ((e + r) % THREADS != t)
                continue;
            for (int64_t k = 0; k < act_n; k++) {
                if (act->kind == ENVD_SPACE_DISCRETE)
                    ((int64_t *)actions)[k] = rand_r(&seed) % act->n;
                else if (act->kind == ENVD_SPACE_MULTI_DISCRETE)
                    ((int64_t *)actions)[k] = rand_r(&seed) % act->nvec[k % numel(act)];
                else
                    ((float *)actions)[k] = (float)(rand_r(&seed) % 201 - 100) / 100.0f;
            }
            if (def->step(states[e], &rng, actions, obs_of(e, obs), reward, term, trunc) !=
                    ENVD_OK ||
                def->episode_end(states[e], fields) < 0)
                __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        }
        pthread_barrier_wait(&barrier);
    }
    free(obs);
    free(actions);
    free(reward);
    free(term);
    free(trunc);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PLUGIN ROUNDS\n", argv[0]);
        return 2;
    }
    void *handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    envd_plugin_fn entry = handle ? (envd_plugin_fn)dlsym(handle, ENVD_PLUGIN_SYMBOL) : NULL;
    const envd_plugin_t *plugin = entry ? entry() : NULL;
    if (!plugin) {
        fprintf(stderr, "no plugin: %s\n", handle ? "no table" : dlerror());
        return 1;
    }
    def = plugin->envs[0];
    rounds = atol(argv[2]);
    double params[64];
    for (int32_t p = 0; p < def->num_params; p++)
        params[p] = def->params[p].default_value;
    desc.observation_space = def->observation_space;
    desc.action_space = def->action_space;
    desc.num_agents = def->num_agents;
    desc.state_size = def->state_size;
    desc.alloc = host_alloc;
    if (def->describe(params, &desc) != ENVD_OK)
        return 1;
    void *obs = calloc((size_t)(numel(&desc.observation_space) * desc.num_agents), 8);
    if (def->flags & ENVD_ENV_OBS_ROWS) {
        row_bytes = (size_t)(numel(&desc.observation_space) * desc.num_agents) *
                    (desc.observation_space.dtype == ENVD_DTYPE_FLOAT32 ? 4 : 1);
        rows = calloc(ENVS, row_bytes);
    }
    envd_rng_t rng;
    memset(&rng, 0, sizeof(rng));
    for (int e = 0; e < ENVS; e++) {
        states[e] = aligned_alloc(64, (desc.state_size + 63) & ~(size_t)63);
        memset(states[e], 0, desc.state_size);
        if (def->seed(states[e], (uint64_t)e) != ENVD_OK || def->init(states[e], params) != ENVD_OK ||
            (rows && def->bind_obs(states[e], obs_of(e, obs)) != ENVD_OK) ||
            def->reset(states[e], &rng, obs_of(e, obs)) != ENVD_OK)
            return 1;
    }
    pthread_barrier_init(&barrier, NULL, THREADS);
    pthread_t threads[THREADS];
    for (long t = 0; t < THREADS; t++)
        pthread_create(&threads[t], NULL, stepper, (void *)t);
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    pthread_barrier_destroy(&barrier);
    for (int e = 0; e < ENVS; e++) {
        def->close(states[e]);
        free(states[e]);
    }
    free(obs);
    free(rows);
    if (failed)
        return 1;
    printf("ocean threads: ok\n");
    return 0;
}
