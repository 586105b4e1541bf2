/*
 * ocean_log_copies.c -- ocean_episode_end's two ways to a Log's fields, on a
 * made-up env (glue_edges/manifest.h) compiled as envd ocean build compiles
 * a real one, once per my_log below (-DLOG_KIND=k).
 *
 * LOG_KIND 0: my_log copies fields of the Log unchanged, out of the Log's
 * order and with "n" among them: the glue reads the floats itself
 * (ocean_log_copies).  LOG_KIND 1..7: my_log scales, offsets, takes the
 * absolute value, clamps, adds two floats, records a constant, or records a
 * field only for some values; 8..11: it combines fields with small integer
 * coefficients (3a, (a + e) / 2, a + d - b, a + b + e: each equal to another
 * field in every probe of arithmetic progressions, issue 36's B2); 12: it
 * computes a rate into the Log, then records it (B1): the glue must keep
 * calling my_log.  Either way every episode end's values equal PufferLib's
 * vec_log written out here (every float of the Log divided by n, then
 * my_log's formula), for n = 1 and n = 2 and Logs of both signs, and the
 * Log is cleared; for n in (0, 1) and n at or beyond 2^31 (inf too) the
 * episode end returns 1 and INT_MAX (B3), and n <= 0 or NaN is no episode
 * end and leaves the Log.  Prints "log copies: ok".
 */
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* score and perf at 0 and 4, b and d at 1 and 3, n last: the places at
 * which each combination of LOG_KIND 8..11 matched another field in the
 * probes of arithmetic progressions */
typedef struct Log {
    float score;
    float b;
    float c;
    float d;
    float perf;
    float f;
    float g;
    float episode_return;
    float n;
} Log;

typedef struct Env {
    float *observations;
    float *actions;
    float *rewards;
    unsigned char *terminals;
    Log log;
    char *heap;
} Env;

static void c_reset(Env *env) { (void)env; }
static void c_step(Env *env) { (void)env; }
static void c_close(Env *env) { free(env->heap); }

#include "env_binding.h"

static int my_init(Env *env, PyObject *args, PyObject *kwargs)
{
    (void)args;
    env->heap = calloc(1, 1);
    (void)unpack(kwargs, "extra");
    return 0;
}

/* my_log's second field, as a function of the mean Log (vec_log's). */
static float second(const Log *m)
{
    switch (LOG_KIND) {
    case 0: return m->score;
    case 1: return m->score * 2.0f;
    case 2: return m->score + 1.0f;
    case 3: return fabsf(m->score);
    case 4: return fminf(m->score, 1.0e6f);
    case 5: return m->score + m->perf;
    case 6: return 3.0f;
    case 7: return m->perf;
    case 8: return m->score * 3.0f;
    case 9: return 0.5f * (m->score + m->perf);
    case 10: return m->score + m->d - m->b;
    case 11: return m->score + m->b + m->perf;
    default: return m->b > 0.0f ? m->score / m->b : 0.0f; /* (12: written to c) */
    }
}

static int my_log(PyObject *dict, Log *log)
{
    if (LOG_KIND == 12)
        log->c = second(log);
    assign_to_dict(dict, "episode_return", log->episode_return);
    if (LOG_KIND != 7 || log->perf > 0.0f)
        assign_to_dict(dict, "score", LOG_KIND == 12 ? log->c : second(log));
    assign_to_dict(dict, "n", log->n);
    assign_to_dict(dict, "perf", log->perf);
    return 0;
}

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "LOG_KIND %d line %d: %s\n", LOG_KIND, __LINE__, #cond); \
            return 1;                                                            \
        }                                                                        \
    } while (0)

int main(void)
{
    const envd_plugin_t *plugin = envd_plugin();
    CHECK(plugin != NULL);
    const envd_env_def_t *def = plugin->envs[0];
    /* the fields at load: my_log on an empty Log, "n" left out */
    CHECK(def->num_episode_fields == (LOG_KIND == 7 ? 2 : 3));
    CHECK(ocean_log_copies == (LOG_KIND == 0));
    static unsigned char state[4096] __attribute__((aligned(64)));
    CHECK(def->init(state, (const double[]){2, 2, 2, 0, 0}) == ENVD_OK);
    Env *env = &((ocean_state_t *)state)->env;
    double values[ENVD_MAX_EPISODE_FIELDS];
    CHECK(def->episode_end(state, values) == 0); /* n == 0: no end */
    /* {score, b, c, d, perf, f, g, episode_return, n} */
    const Log logs[] = {
        {2.5f, 4.0f, 0.0f, 1.5f, 0.75f, 6.0f, -7.0f, -4.0f, 1.0f},
        {-6.5f, -1.0f, 3.0f, 0.25f, 0.5f, 2.0f, 8.0f, 9.0f, 2.0f},
        {3.0e7f, 2.0f, -5.0f, 12.0f, -1.25f, 0.0f, 1.0f, 0.0f, 2.0f},
        {-0.375f, 0.125f, 9.0f, -3.0f, -2.0f, 5.0f, 4.0f, 1.0e-3f, 1.0f},
        {3.0f, 2.0f, 1.0f, 7.0f, 6.0f, 5.0f, 4.0f, 8.0f, 0.5f},
        {3.0f, 2.0f, 1.0f, 7.0f, 6.0f, 5.0f, 4.0f, 8.0f, 3.0e9f},
        {3.0f, 2.0f, 1.0f, 7.0f, 6.0f, 5.0f, 4.0f, 8.0f, INFINITY},
        {3.0f, 2.0f, 1.0f, 7.0f, 6.0f, 5.0f, 4.0f, 8.0f, -1.0f},
        {3.0f, 2.0f, 1.0f, 7.0f, 6.0f, 5.0f, 4.0f, 8.0f, NAN},
    };
    for (size_t i = 0; i < sizeof(logs) / sizeof(logs[0]); i++) {
        env->log = logs[i];
        const float n = logs[i].n;
        for (int f = 0; f < ENVD_MAX_EPISODE_FIELDS; f++)
            values[f] = -12345.0;
        if (!(n > 0.0f)) { /* no episode end: nothing written, the Log kept */
            CHECK(def->episode_end(state, values) == 0);
            CHECK(values[0] == -12345.0);
            CHECK(memcmp(&env->log, &logs[i], sizeof(Log)) == 0);
            continue;
        }
        /* vec_log: every float divided by n ("n" too: n / n, never a field) */
        Log m = logs[i];
        for (size_t j = 0; j < sizeof(Log) / sizeof(float); j++)
            ((float *)&m)[j] /= n;
        const int count = n < 1.0f ? 1 : n >= 2147483648.0f ? INT_MAX : (int)n;
        CHECK(def->episode_end(state, values) == count);
        const char *const *names = def->episode_fields;
        for (int32_t f = 0; f < def->num_episode_fields; f++) {
            double want = strcmp(names[f], "episode_return") == 0 ? m.episode_return
                          : strcmp(names[f], "perf") == 0         ? m.perf
                          : strcmp(names[f], "score") == 0 && (LOG_KIND != 7 || m.perf > 0.0f)
                              ? second(&m)
                              : NAN;
            CHECK(values[f] == want || (isnan(want) && isnan(values[f])));
        }
        static const Log cleared;
        CHECK(memcmp(&env->log, &cleared, sizeof(Log)) == 0);
    }
    def->close(state);
    printf("log copies: ok\n");
    return 0;
}
