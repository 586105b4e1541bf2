/*
 * errors.c -- the error messages (from envd.h's ENVD_ERRNO_MAP), ABI query, and
 * checks on the types of envd.h.
 */
#include <math.h>
#include <string.h>

#include "envd.h"

/* The table of envd.h is the only list of codes: it must cover 0 down to
 * ENVD_ERROR_MIN, each value once (the switch below refuses to compile with a
 * value twice; these checks catch a gap or a value outside the range). */
#define ENVD_ERROR_IN_RANGE(name, value, message)                                     \
    _Static_assert((value) <= 0 && (value) >= ENVD_ERROR_MIN,                     \
                   #name " lies outside ENVD_ERROR_MIN..0");
ENVD_ERRNO_MAP(ENVD_ERROR_IN_RANGE)
#undef ENVD_ERROR_IN_RANGE
#define ENVD_ERROR_COUNT_ONE(name, value, message) +1
_Static_assert(0 ENVD_ERRNO_MAP(ENVD_ERROR_COUNT_ONE) == 1 - ENVD_ERROR_MIN,
               "the error codes do not cover every value of ENVD_ERROR_MIN..0");
#undef ENVD_ERROR_COUNT_ONE

const char *envd_strerror(int code)
{
    switch (code) {
#define ENVD_ERROR_MESSAGE(name, value, message) case name: return message;
        ENVD_ERRNO_MAP(ENVD_ERROR_MESSAGE)
#undef ENVD_ERROR_MESSAGE
    default: return "unknown error code";
    }
}

uint32_t envd_abi_version(void) { return ENVD_ABI_VERSION; }

size_t envd_dtype_size(envd_dtype_t dtype)
{
    switch (dtype) {
    case ENVD_DTYPE_FLOAT32: return 4;
    case ENVD_DTYPE_FLOAT64: return 8;
    case ENVD_DTYPE_INT64: return 8;
    case ENVD_DTYPE_INT32: return 4;
    case ENVD_DTYPE_UINT8: return 1;
    case ENVD_DTYPE_BOOL: return 1;
    case ENVD_DTYPE_INT8: return 1;
    default: return 0;
    }
}

int64_t envd_space_numel(const envd_space_t *space)
{
    if (space->kind == ENVD_SPACE_DISCRETE)
        return 1;
    int64_t n = 1;
    for (int i = 0; i < space->ndim; i++)
        n *= space->shape[i];
    return n;
}

/* Refuse element counts whose byte size could overflow buffer arithmetic. */
#define MAX_SPACE_NUMEL (INT64_C(1) << 32)

/* Each check returns NULL or a static description of the first problem; the
 * text names the field so that a plugin author knows what to fix. */

typedef enum { SHAPE_OK, SHAPE_NDIM, SHAPE_ENTRY, SHAPE_NUMEL } shape_check_t;

/* ndim in 0..ENVD_MAX_DIMS, every entry >= 1, at most MAX_SPACE_NUMEL
 * elements in all (then *numel is their count). */
static shape_check_t check_shape(int32_t ndim, const int64_t *shape, int64_t *numel)
{
    if (ndim < 0 || ndim > ENVD_MAX_DIMS)
        return SHAPE_NDIM;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0 || shape[i] > MAX_SPACE_NUMEL)
            return SHAPE_ENTRY;
        n *= shape[i];
        if (n > MAX_SPACE_NUMEL)
            return SHAPE_NUMEL;
    }
    *numel = n;
    return SHAPE_OK;
}

/* Whether v is a value of an integer (or bool) dtype: finite and in range,
 * so that the Python side can build the gymnasium Box without wrapping. */
static bool fits_integer_dtype(envd_dtype_t dtype, double v)
{
    switch (dtype) {
    case ENVD_DTYPE_INT64: return v >= -9223372036854775808.0 && v < 9223372036854775808.0;
    case ENVD_DTYPE_INT32: return v >= -2147483648.0 && v <= 2147483647.0;
    case ENVD_DTYPE_UINT8: return v >= 0.0 && v <= 255.0;
    case ENVD_DTYPE_BOOL: return v >= 0.0 && v <= 1.0;
    case ENVD_DTYPE_INT8: return v >= -128.0 && v <= 127.0;
    default: return true; /* floating dtypes take any bound, infinities included */
    }
}

/* The same message, prefixed with the space it is about (literals concatenate). */
#define SPACE_PROBLEM(msg) (is_obs ? "observation_space: " msg : "action_space: " msg)

/* MULTI_DISCRETE: nvec >= 1 everywhere and start + nvec - 1 within int64. */
static const char *nvec_problem(const envd_space_t *space, int64_t n, int is_obs)
{
    if (space->nvec == NULL)
        return SPACE_PROBLEM("a multi-discrete space needs nvec");
    for (int64_t k = 0; k < n; k++) {
        int64_t start = space->nvec_start ? space->nvec_start[k] : 0;
        if (space->nvec[k] <= 0 || (start > 0 && space->nvec[k] - 1 > INT64_MAX - start))
            return SPACE_PROBLEM("a multi-discrete space needs every nvec >= 1 and "
                                 "nvec_start + nvec - 1 within int64");
    }
    return NULL;
}

/* MULTI_DISCRETE and MULTI_BINARY (ABI 4): an integer array space. */
static const char *multi_space_problem(const envd_space_t *space, int is_obs)
{
    if (space->kind == ENVD_SPACE_MULTI_DISCRETE && space->dtype != ENVD_DTYPE_INT64)
        return SPACE_PROBLEM("a multi-discrete space must have dtype INT64");
    if (space->kind == ENVD_SPACE_MULTI_BINARY && space->dtype != ENVD_DTYPE_INT8)
        return SPACE_PROBLEM("a multi-binary space must have dtype INT8");
    if (space->ndim < 1)
        return SPACE_PROBLEM("a multi-discrete or multi-binary space needs ndim >= 1");
    int64_t n = 0;
    switch (check_shape(space->ndim, space->shape, &n)) {
    case SHAPE_NDIM: return SPACE_PROBLEM("ndim must be in 0..4");
    case SHAPE_ENTRY: return SPACE_PROBLEM("every shape entry must be in 1..2^32");
    case SHAPE_NUMEL: return SPACE_PROBLEM("more than 2^32 elements");
    case SHAPE_OK: break;
    }
    return space->kind == ENVD_SPACE_MULTI_DISCRETE ? nvec_problem(space, n, is_obs) : NULL;
}

static const char *space_problem(const envd_space_t *space, int is_obs, uint32_t abi)
{
    if (abi < 4 && (space->kind > ENVD_SPACE_DISCRETE || space->dtype == ENVD_DTYPE_INT8))
        return SPACE_PROBLEM("MULTI_DISCRETE, MULTI_BINARY and INT8 need ABI 4; rebuild "
                             "it against this envd's envd.h (python -m envd.native --include)");
    if (envd_dtype_size(space->dtype) == 0)
        return SPACE_PROBLEM("unknown dtype");
    if (space->kind == ENVD_SPACE_MULTI_DISCRETE || space->kind == ENVD_SPACE_MULTI_BINARY)
        return multi_space_problem(space, is_obs);
    if (space->kind == ENVD_SPACE_DISCRETE) {
        if (space->dtype != ENVD_DTYPE_INT64)
            return SPACE_PROBLEM("a discrete space must have dtype INT64");
        /* actions are start .. start + n - 1: the last must fit in int64 */
        if (space->n <= 0 || (space->start > 0 && space->n - 1 > INT64_MAX - space->start))
            return SPACE_PROBLEM("a discrete space needs n >= 1 and start + n - 1 within int64");
        return NULL;
    }
    if (space->kind != ENVD_SPACE_BOX)
        return SPACE_PROBLEM("kind must be BOX, DISCRETE, MULTI_DISCRETE or MULTI_BINARY");
    int64_t n = 0;
    switch (check_shape(space->ndim, space->shape, &n)) {
    case SHAPE_NDIM: return SPACE_PROBLEM("ndim must be in 0..4");
    case SHAPE_ENTRY: return SPACE_PROBLEM("every shape entry must be in 1..2^32");
    case SHAPE_NUMEL: return SPACE_PROBLEM("more than 2^32 elements");
    case SHAPE_OK: break;
    }
    for (int64_t i = 0; space->low && space->high && i < n; i++) {
        if (isnan(space->low[i]) || isnan(space->high[i]) || space->low[i] > space->high[i])
            return SPACE_PROBLEM("a bound is NaN or low > high");
        if (!fits_integer_dtype(space->dtype, space->low[i]) ||
            !fits_integer_dtype(space->dtype, space->high[i]))
            return SPACE_PROBLEM("a bound is outside the range of its integer dtype");
    }
    return NULL;
}

static const char *params_problem(const envd_env_def_t *def)
{
    if (def->num_params < 0 || (def->num_params > 0 && def->params == NULL))
        return "params: num_params < 0, or params is NULL with num_params > 0";
    for (int i = 0; i < def->num_params; i++) {
        const envd_param_t *p = &def->params[i];
        if (p->name == NULL || p->name[0] == '\0')
            return "params: a parameter has no name";
        if (p->type < ENVD_PARAM_FLOAT || p->type > ENVD_PARAM_BOOL)
            return "params: a parameter's type is not FLOAT, INT or BOOL";
        if (!(p->min_value <= p->default_value && p->default_value <= p->max_value))
            return "params: a parameter's default is NaN or outside [min_value, max_value]";
    }
    return NULL;
}

/* Keys envd itself puts in info (envd.vec_info), and gymnasium's "_" masks. */
static bool is_reserved_info_name(const char *name)
{
    static const char *const reserved[] = {"env_id", "episode", "final_obs", "final_info",
                                           "agent_mask", "envd_log"};
    if (name[0] == '_')
        return true;
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
        if (strcmp(name, reserved[i]) == 0)
            return true;
    return false;
}

static const char *info_fields_problem(const envd_env_def_t *def)
{
    if (def->num_info_fields == 0)
        return NULL;
    if (def->num_info_fields < 0 || def->num_info_fields > ENVD_MAX_INFO_FIELDS)
        return "info_fields: num_info_fields must be in 0..8";
    if (def->info_fields == NULL || def->write_info == NULL)
        return "info_fields: num_info_fields > 0 needs info_fields and write_info";
    for (int k = 0; k < def->num_info_fields; k++) {
        const envd_info_field_t *f = &def->info_fields[k];
        if (f->name == NULL || f->name[0] == '\0')
            return "info_fields: a field has no name";
        if (is_reserved_info_name(f->name))
            return "info_fields: a field name is reserved (env_id, episode, final_obs, "
                   "final_info, agent_mask, envd_log, and names starting with '_' are envd's own "
                   "info keys)";
        if (envd_dtype_size(f->dtype) == 0)
            return "info_fields: a field has an unknown dtype";
        int64_t n = 0;
        switch (check_shape(f->ndim, f->shape, &n)) {
        case SHAPE_NDIM: return "info_fields: a field's ndim must be in 0..4";
        case SHAPE_ENTRY: return "info_fields: every shape entry must be in 1..2^32";
        case SHAPE_NUMEL: return "info_fields: a field has more than 2^32 elements";
        case SHAPE_OK: break;
        }
        for (int j = 0; j < k; j++)
            if (strcmp(def->info_fields[j].name, f->name) == 0)
                return "info_fields: two fields share a name";
    }
    return NULL;
}

/* Whether the host can read a definition of this ABI at all. */
static bool abi_loadable(uint32_t abi)
{
    return abi >= ENVD_ABI_VERSION_MIN && abi <= ENVD_ABI_VERSION;
}

bool envd_env_def_render_info(const envd_env_def_t *def, int32_t *width, int32_t *height,
                              int32_t *fps)
{
    /* ABI 2 definitions end before render_width: never read past them. */
    if (def == NULL || def->abi_version < 3 || !abi_loadable(def->abi_version) ||
        def->render == NULL)
        return false;
    if (width)
        *width = def->render_width;
    if (height)
        *height = def->render_height;
    if (fps)
        *fps = def->render_fps;
    return true;
}

static const char *render_problem(const envd_env_def_t *def)
{
    if (def->abi_version < 3)
        return NULL;
    if (def->render == NULL)
        return def->render_width == 0 && def->render_height == 0
                   ? NULL
                   : "render: render_width/height are set but render is NULL";
    if (def->render_width < 1 || def->render_width > ENVD_MAX_RENDER_SIDE ||
        def->render_height < 1 || def->render_height > ENVD_MAX_RENDER_SIDE)
        return "render: render_width and render_height must be in 1..ENVD_MAX_RENDER_SIDE";
    if (def->render_fps < 1)
        return "render: render_fps must be >= 1";
    return NULL;
}

const envd_env_def_t *envd_env_def_v5(const envd_env_def_t *def)
{
    /* ABI 2..4 definitions end at render (or before): never read past them. */
    return def != NULL && def->abi_version >= 5 && abi_loadable(def->abi_version) ? def : NULL;
}

static const char *episode_fields_problem(const envd_env_def_t *v5)
{
    if (v5->num_episode_fields < 0 || v5->num_episode_fields > ENVD_MAX_EPISODE_FIELDS)
        return "episode_fields: num_episode_fields must be in 0..ENVD_MAX_EPISODE_FIELDS (16)";
    if (v5->num_episode_fields > 0 && (v5->episode_fields == NULL || v5->episode_end == NULL))
        return "episode_fields: num_episode_fields > 0 needs episode_fields and episode_end";
    if (v5->episode_end != NULL && !(v5->flags & ENVD_ENV_RESETS_ITSELF))
        return "episode_end: only an env with ENVD_ENV_RESETS_ITSELF reports its own episodes";
    for (int k = 0; k < v5->num_episode_fields; k++) {
        const char *name = v5->episode_fields[k];
        if (name == NULL || name[0] == '\0')
            return "episode_fields: a field has no name";
        for (int j = 0; j < k; j++)
            if (strcmp(v5->episode_fields[j], name) == 0)
                return "episode_fields: two fields share a name";
    }
    return NULL;
}

/* The ABI 5 fields (none before ABI 5). */
static const char *v5_problem(const envd_env_def_t *def)
{
    const envd_env_def_t *v5 = envd_env_def_v5(def);
    if (v5 == NULL)
        return NULL;
    if (v5->flags & ~(uint32_t)ENVD_ENV_FLAGS_KNOWN)
        return "flags: a bit this host does not know is set (ENVD_ENV_RESETS_ITSELF, "
               "ENVD_ENV_SERIAL_INIT, ENVD_ENV_STEP_ENVS, ENVD_ENV_OBS_ROWS and "
               "ENVD_ENV_OBS_ROWS_PRIVATE are the flags)";
    if ((v5->flags & ENVD_ENV_RESETS_ITSELF) && v5->max_episode_steps != 0)
        return "max_episode_steps must be 0 for an env with ENVD_ENV_RESETS_ITSELF (the host "
               "adds no time limit to it)";
    /* step_envs is read only under its flag (an older ABI 5 definition ends
     * before the field) */
    if ((v5->flags & ENVD_ENV_STEP_ENVS) && !(v5->flags & ENVD_ENV_RESETS_ITSELF))
        return "step_envs: only an env with ENVD_ENV_RESETS_ITSELF steps envs in a row";
    if ((v5->flags & ENVD_ENV_STEP_ENVS) && v5->step_envs == NULL)
        return "flags: ENVD_ENV_STEP_ENVS is set but step_envs is NULL";
    /* bind_obs likewise; only a self-resetting env's rows are written by no
     * one but the env (the host's autoreset and dead rows write them too) */
    if ((v5->flags & ENVD_ENV_OBS_ROWS) && !(v5->flags & ENVD_ENV_RESETS_ITSELF))
        return "bind_obs: only an env with ENVD_ENV_RESETS_ITSELF writes its rows directly";
    if ((v5->flags & ENVD_ENV_OBS_ROWS) && v5->bind_obs == NULL)
        return "flags: ENVD_ENV_OBS_ROWS is set but bind_obs is NULL";
    if ((v5->flags & ENVD_ENV_OBS_ROWS_PRIVATE) && !(v5->flags & ENVD_ENV_OBS_ROWS))
        return "flags: ENVD_ENV_OBS_ROWS_PRIVATE needs ENVD_ENV_OBS_ROWS";
    return episode_fields_problem(v5);
}

const char *envd_env_def_problem(const envd_env_def_t *def)
{
    if (def == NULL)
        return "the definition is NULL";
    if (!abi_loadable(def->abi_version))
        return "abi_version differs from every ABI this host loads "
               "(ENVD_ABI_VERSION_MIN..ENVD_ABI_VERSION)";
    if (def->id == NULL || def->id[0] == '\0')
        return "id is NULL or empty";
    if (def->state_size == 0 || def->state_size > ENVD_MAX_STATE_SIZE)
        return "state_size must be in 1..ENVD_MAX_STATE_SIZE";
    if (def->abi_version < 4 && def->num_agents != 1)
        return "num_agents must be 1 in an ABI 2 or 3 definition; rebuild it against this "
               "envd's envd.h (python -m envd.native --include)";
    if (def->num_agents < 1 || def->num_agents > ENVD_MAX_AGENTS)
        return "num_agents must be in 1..ENVD_MAX_AGENTS";
    if (def->max_episode_steps < 0)
        return "max_episode_steps must be >= 0";
    if (def->init == NULL || def->reset == NULL || def->step == NULL)
        return "init, reset and step must not be NULL";
    const char *problem = space_problem(&def->observation_space, 1, def->abi_version);
    if (problem == NULL)
        problem = space_problem(&def->action_space, 0, def->abi_version);
    if (problem == NULL)
        problem = params_problem(def);
    if (problem == NULL)
        problem = info_fields_problem(def);
    if (problem == NULL)
        problem = render_problem(def);
    if (problem == NULL)
        problem = v5_problem(def);
    return problem;
}

int envd_env_def_validate(const envd_env_def_t *def)
{
    if (def != NULL && !abi_loadable(def->abi_version))
        return ENVD_EABI;
    return envd_env_def_problem(def) == NULL ? ENVD_OK : ENVD_EINVAL;
}
