/*
 * describe.c -- see describe.h.
 *
 * Bounds: one describe call takes at most ENVD_MAX_DESCRIBE_BYTES from its
 * allocator (all its allocations together; the arena's own headers are
 * not counted), so a plugin's describe cannot make the host allocate without
 * limit for params a client chose.  A second row's description is built in
 * its own arena, compared, and freed at once: a make holds one description.
 */
#include "describe.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One allocation of an arena: a header, then the zeroed bytes (aligned for
 * any type through max_align_t). */
typedef struct chunk {
    struct chunk *next;
    _Alignas(max_align_t) unsigned char bytes[];
} chunk_t;

typedef struct arena {
    chunk_t *chunks;
    size_t used; /* bytes handed out, at most ENVD_MAX_DESCRIBE_BYTES */
} arena_t;

struct envd_described {
    envd_env_def_t def;
    arena_t arena;
    uint64_t heap_bytes; /* the largest any env of the make declared */
};

static void *arena_alloc(void *host, size_t bytes)
{
    arena_t *arena = host;
    if (arena == NULL || bytes == 0 || bytes > ENVD_MAX_DESCRIBE_BYTES - arena->used)
        return NULL;
    chunk_t *chunk = calloc(1, sizeof *chunk + bytes);
    if (chunk == NULL)
        return NULL;
    chunk->next = arena->chunks;
    arena->chunks = chunk;
    arena->used += bytes;
    return chunk->bytes;
}

static void arena_free(arena_t *arena)
{
    for (chunk_t *c = arena->chunks, *next; c != NULL; c = next) {
        next = c->next;
        free(c);
    }
    arena->chunks = NULL;
    arena->used = 0;
}

int envd_env_def_describes(const envd_env_def_t *def)
{
    const envd_env_def_t *v5 = envd_env_def_v5(def);
    return v5 != NULL && v5->describe != NULL;
}

/* Describe one row into *into (a copy of def with describe's results and no
 * describe), its arrays from arena; then validate it as a static definition. */
static int describe_row(envd_env_def_t *into, uint64_t *heap_bytes, arena_t *arena,
                        const envd_env_def_t *def, const double *row, int64_t index, char *error,
                        size_t size)
{
    envd_description_t d = {
        .observation_space = def->observation_space,
        .action_space = def->action_space,
        .num_agents = def->num_agents,
        .state_size = def->state_size,
        .alloc = arena_alloc,
        .host = arena,
    };
    int rc = def->describe(row, &d);
    if (rc != ENVD_OK) {
        snprintf(error, size, "%s: describe failed for the params of env %lld: %s (%d)",
                 def->id, (long long)index, envd_strerror(rc), rc);
        return rc == ENVD_ENOMEM ? ENVD_ENOMEM : ENVD_EINVAL;
    }
    if (d.heap_bytes > ENVD_MAX_STATE_SIZE) {
        snprintf(error, size, "%s: describe gave heap_bytes %llu for the params of env %lld, "
                 "past ENVD_MAX_STATE_SIZE", def->id, (unsigned long long)d.heap_bytes,
                 (long long)index);
        return ENVD_EINVAL;
    }
    *heap_bytes = d.heap_bytes;
    /* Only the fields def has: one built with an older ABI 5 header ends
     * before step_envs or bind_obs, and then has not set their flags. */
    const size_t have = (def->flags & ENVD_ENV_OBS_ROWS)    ? sizeof *def
                        : (def->flags & ENVD_ENV_STEP_ENVS) ? offsetof(envd_env_def_t, bind_obs)
                                                            : offsetof(envd_env_def_t, step_envs);
    memset(into, 0, sizeof *into);
    memcpy(into, def, have);
    into->observation_space = d.observation_space;
    into->action_space = d.action_space;
    into->num_agents = d.num_agents;
    into->state_size = d.state_size;
    into->describe = NULL;
    const char *problem = envd_env_def_problem(into);
    if (problem != NULL) {
        snprintf(error, size, "%s: describe gave an invalid description for the params of "
                 "env %lld: %s", def->id, (long long)index, problem);
        return ENVD_EINVAL;
    }
    return ENVD_OK;
}

/* Whether two arrays of n values are equal (both NULL counts as equal). */
static bool same_array(const void *a, const void *b, int64_t n, size_t item)
{
    if (a == NULL || b == NULL)
        return a == b;
    return memcmp(a, b, (size_t)n * item) == 0;
}

static bool same_space(const envd_space_t *a, const envd_space_t *b)
{
    if (a->kind != b->kind || a->dtype != b->dtype)
        return false;
    if (a->kind == ENVD_SPACE_DISCRETE)
        return a->n == b->n && a->start == b->start;
    if (a->ndim != b->ndim ||
        memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]) != 0)
        return false;
    int64_t n = envd_space_numel(a);
    if (a->kind == ENVD_SPACE_MULTI_DISCRETE)
        return same_array(a->nvec, b->nvec, n, sizeof(int64_t)) &&
               same_array(a->nvec_start, b->nvec_start, n, sizeof(int64_t));
    if (a->kind == ENVD_SPACE_BOX) /* (validated: no NaN bounds) */
        return same_array(a->low, b->low, n, sizeof(double)) &&
               same_array(a->high, b->high, n, sizeof(double));
    return true;
}

static bool same_description(const envd_env_def_t *a, const envd_env_def_t *b)
{
    return a->num_agents == b->num_agents && a->state_size == b->state_size &&
           same_space(&a->observation_space, &b->observation_space) &&
           same_space(&a->action_space, &b->action_space);
}

int envd_describe(envd_described_t **out, const envd_env_def_t *def, const double *params,
                  int64_t num_rows, char *error, size_t size)
{
    *out = NULL;
    if (size > 0)
        error[0] = '\0';
    if (envd_env_def_validate(def) != ENVD_OK || !envd_env_def_describes(def) || num_rows < 1 ||
        (def->num_params > 0 && params == NULL)) {
        snprintf(error, size, "envd_describe: an invalid definition or arguments");
        return ENVD_EINVAL;
    }
    envd_described_t *described = calloc(1, sizeof *described);
    if (described == NULL)
        return ENVD_ENOMEM;
    const size_t width = (size_t)def->num_params;
    int rc = describe_row(&described->def, &described->heap_bytes, &described->arena, def,
                          params, 0, error, size);
    for (int64_t i = 1; rc == ENVD_OK && i < num_rows; i++) {
        const double *row = params + (size_t)i * width;
        if (memcmp(row, row - width, width * sizeof *row) == 0)
            continue; /* the same params as env i - 1: the same description */
        envd_env_def_t other;
        uint64_t heap_bytes = 0;
        arena_t scratch = {0};
        rc = describe_row(&other, &heap_bytes, &scratch, def, row, i, error, size);
        if (heap_bytes > described->heap_bytes) /* envs may differ here: bound by the largest */
            described->heap_bytes = heap_bytes;
        if (rc == ENVD_OK && !same_description(&described->def, &other)) {
            snprintf(error, size, "%s: envs of one vec must have the same spaces: the params "
                     "of env %lld describe other spaces, agents or state size than env 0's",
                     def->id, (long long)i);
            rc = ENVD_EINVAL;
        }
        arena_free(&scratch);
    }
    if (rc != ENVD_OK) {
        envd_described_free(described);
        return rc;
    }
    *out = described;
    return ENVD_OK;
}

const envd_env_def_t *envd_described_def(const envd_described_t *described)
{
    return &described->def;
}

uint64_t envd_described_bytes(const envd_described_t *described)
{
    return described->arena.used;
}

uint64_t envd_described_heap_bytes(const envd_described_t *described)
{
    return described->heap_bytes;
}

void envd_described_free(envd_described_t *described)
{
    if (described == NULL)
        return;
    arena_free(&described->arena);
    free(described);
}
