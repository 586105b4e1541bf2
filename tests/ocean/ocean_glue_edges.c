/*
 * ocean_glue_edges.c -- ocean_glue.h's refusals, on a made-up env
 * (glue_edges/manifest.h) compiled as envd ocean build compiles a real one.
 *
 * Checks: an observation of more than 2^32 elements (each extent within
 * 2^24) and a Box action extent outside 1..2^24 are refused by describe and
 * init before anything is allocated; an init whose my_init allocated and
 * then read a C kwarg the manifest did not give fails with ENVD_EINVAL and
 * frees what it allocated (c_close ran; LeakSanitizer checks the rest).
 * Prints "glue edges: ok".
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct Log {
    float episode_return;
    float n;
} Log;

typedef struct Env {
    float *observations;
    float *actions;
    float *rewards;
    unsigned char *terminals;
    Log log;
    char *heap; /* my_init's own allocation */
} Env;

static int closes;

static void c_reset(Env *env) { (void)env; }
static void c_step(Env *env) { (void)env; }
static void c_close(Env *env)
{
    free(env->heap);
    env->heap = NULL;
    closes++;
}

#include "env_binding.h"

static int my_init(Env *env, PyObject *args, PyObject *kwargs)
{
    (void)args;
    env->heap = calloc(1000, 1);
    (void)unpack(kwargs, "extra");
    return 0;
}

static int my_log(PyObject *dict, Log *log)
{
    assign_to_dict(dict, "episode_return", log->episode_return);
    return 0;
}

static void *host_alloc(void *host, size_t bytes)
{
    (void)host;
    (void)bytes;
    fprintf(stderr, "describe allocated for refused params\n");
    exit(1);
}

#define CHECK(cond)                                                       \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "line %d: %s\n", __LINE__, #cond);           \
            return 1;                                                     \
        }                                                                 \
    } while (0)

int main(void)
{
    const envd_plugin_t *plugin = envd_plugin();
    CHECK(plugin != NULL);
    const envd_env_def_t *def = plugin->envs[0];
    static unsigned char state[4096] __attribute__((aligned(64)));
    const double k = 1 << 24;
    const double refused[][5] = {
        {k, k, 257, 0, 0},     /* 2^56 elements */
        {65536, 65537, 1, 0, 0}, /* one past 2^32 */
        {k + 1, 1, 1, 0, 0},   /* an extent past 2^24 */
        {2, 2, 2, -1, 0},      /* a Box action extent below 1 */
        {2, 2, 2, k + 1, 0},   /* and past 2^24 */
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        envd_description_t d;
        memset(&d, 0, sizeof(d));
        d.alloc = host_alloc;
        CHECK(def->describe(refused[i], &d) == ENVD_ERANGE);
        memset(state, 0, sizeof(state));
        CHECK(def->init(state, refused[i]) == ENVD_ERANGE);
    }
    /* 2^32 elements exactly is within the bound (describe would allocate) */
    envd_ocean_layout_t l;
    CHECK(ocean_get_layout((const double[]){65536, 65536, 1, 0, 0}, &l) == ENVD_OK);

    memset(state, 0, sizeof(state));
    CHECK(def->init(state, (const double[]){2, 2, 2, 0, 1}) == ENVD_EINVAL);
    CHECK(closes == 1);
    def->close(state); /* the host closes every env of a failed make: once only */
    CHECK(closes == 1);

    memset(state, 0, sizeof(state));
    CHECK(def->init(state, (const double[]){2, 2, 2, 0, 0}) == ENVD_OK);
    def->close(state);
    CHECK(closes == 2);
    printf("glue edges: ok\n");
    return 0;
}
