/*
 * ocean_glue.h -- one Ocean env as an envd ABI 5 plugin.
 *
 * Included last by env_binding.h, in binding.c's translation unit: Env, Log,
 * c_reset, c_step, c_close, my_init and my_log are the env's own; the
 * manifest (manifest.h) gave ocean_params, ocean_ckwargs and ocean_layout.
 * What PufferLib's env_binding.h does per env is done here per envd instance:
 *
 *   seed   keeps env i's seed (the host passes s + i) for init and the next
 *          reset;
 *   init   srand(seed) then my_init with the C kwargs and the injected `seed`
 *          kwarg (vec_init's order);
 *   reset  srand(seed) if a seed came since the last reset (vec_reset), then
 *          c_reset;
 *   step   the host's actions converted to the env's C action type, c_step;
 *          rewards float -> double, terminals -> bool, truncations false;
 *          step_envs does it for envs in a row, one loop (vec_step's);
 *   episode_end  when the Log counted episodes in this step (log.n > 0):
 *          every field divided by n, as vec_log averages, then my_log's
 *          records (read straight from the Log where my_log only copies its
 *          floats: ocean_find_copies), then the Log is cleared as vec_log
 *          clears it (a step without an episode leaves what the env
 *          accumulates, e.g. connect4's lengths, for the next);
 *   close  c_close.
 *
 * Every call that can run the env's code selects the env's own random stream
 * and clock for the calling thread (ocean_random.h) and clears it after.  The
 * env's action, reward and terminal buffers are private to the state block.
 * Its obs buffer is too, and obs is copied to the host's row after each
 * reset and step, unless the host bound the env to its row (bind_obs: for
 * the envs whose manifest sets ENVD_ENV_OBS_ROWS, audited in docs/ocean.md):
 * then env->observations is that row and the env writes it directly
 * (PufferLib's vec does the same with its own buffer).
 */
#ifndef ENVD_OCEAN_GLUE_H
#define ENVD_OCEAN_GLUE_H

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdalign.h>
#include <stddef.h>

#ifndef ENVD_OCEAN_FLAGS
#define ENVD_OCEAN_FLAGS 0u
#endif

/* A manifest without make kwargs defines ENVD_OCEAN_NO_PARAMS and no table. */
#ifdef ENVD_OCEAN_NO_PARAMS
#define ENVD_OCEAN_NUM_PARAMS 0
static const envd_param_t *const ocean_param_table = NULL;
#else
#define ENVD_OCEAN_NUM_PARAMS ((int32_t)(sizeof(ocean_params) / sizeof(ocean_params[0])))
static const envd_param_t *const ocean_param_table = ocean_params;
#endif

typedef __typeof__(*((Env *)0)->observations) ocean_obs_t;
typedef __typeof__(*((Env *)0)->actions) ocean_act_t;
typedef __typeof__(*((Env *)0)->rewards) ocean_rew_t;
typedef __typeof__(*((Env *)0)->terminals) ocean_term_t;

/* Bytes right after the env for its action, reward and terminal buffers
 * where they fit (ocean_place). */
#define ENVD_OCEAN_NEAR_BYTES 48

/* What every step reads comes first (the env, its small buffers, then the
 * fields the glue reads around c_step), the random streams (read only when
 * the env draws) after: at large N each env's block is a cache miss a step,
 * and the fewer lines a step touches the better (perf of squared at N=4096;
 * with its buffers after the streams, squared's step at N=64 stalled on
 * their line: perf). */
typedef struct ocean_state {
    Env env;
    alignas(max_align_t) unsigned char near[ENVD_OCEAN_NEAR_BYTES];
    int32_t agents;
    envd_space_kind_t act_kind;
    int64_t obs_numel, act_numel; /* per env: every agent's */
    float act_low, act_high;
    size_t off_obs, off_act, off_rew, off_term; /* from the state's start */
    uint64_t seed;    /* the last seed the host gave */
    bool reseed;      /* a seed came since the last reset */
    bool initialized; /* my_init ran: close runs c_close */
    envd_ocean_streams_t streams;
    alignas(max_align_t) unsigned char tail[];
} ocean_state_t;

/* envd_dtype_size is the host's: a plugin links nothing of envd. */
static size_t ocean_dtype_size(envd_dtype_t dtype)
{
    switch (dtype) {
    case ENVD_DTYPE_FLOAT32: case ENVD_DTYPE_INT32: return 4;
    case ENVD_DTYPE_FLOAT64: case ENVD_DTYPE_INT64: return 8;
    case ENVD_DTYPE_UINT8: case ENVD_DTYPE_BOOL: case ENVD_DTYPE_INT8: return 1;
    }
    return 0;
}

static size_t ocean_align_up(size_t n)
{
    return (n + alignof(max_align_t) - 1) & ~(alignof(max_align_t) - 1);
}

static int64_t ocean_numel(int32_t ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int32_t d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

/* The largest extent of an observation or Box action dimension, and the
 * largest observation element count, a manifest's layout may give. */
#define ENVD_OCEAN_MAX_EXTENT ((int64_t)1 << 24)
#define ENVD_OCEAN_MAX_NUMEL ((int64_t)1 << 32)

/* The manifest's layout for params, checked against the env's C types. */
static int ocean_get_layout(const double *params, envd_ocean_layout_t *l)
{
    memset(l, 0, sizeof(*l));
    int rc = ocean_layout(params, l);
    if (rc != ENVD_OK)
        return rc;
    if (l->agents < 1 || l->agents > ENVD_MAX_AGENTS || l->obs_ndim < 1 ||
        l->obs_ndim > ENVD_MAX_DIMS || ocean_dtype_size(l->obs_dtype) != sizeof(ocean_obs_t))
        return ENVD_EINVAL;
    /* every extent and the element product bounded before any arithmetic
       or allocation on them (ocean_bounds allocates 8 bytes an element) */
    int64_t obs_numel = 1;
    for (int32_t d = 0; d < l->obs_ndim; d++) {
        if (l->obs_shape[d] < 1 || l->obs_shape[d] > ENVD_OCEAN_MAX_EXTENT)
            return ENVD_ERANGE;
        obs_numel *= l->obs_shape[d]; /* < 2^32 * 2^24: no overflow */
        if (obs_numel > ENVD_OCEAN_MAX_NUMEL)
            return ENVD_ERANGE;
    }
    if (l->act_kind == ENVD_SPACE_MULTI_DISCRETE && (l->act_ndim != 1 || l->act_shape[0] < 1 ||
                                                    l->act_shape[0] > ENVD_OCEAN_MAX_NVEC))
        return ENVD_EINVAL;
    if (l->act_kind == ENVD_SPACE_BOX) {
        if (l->act_ndim < 0 || l->act_ndim > ENVD_MAX_DIMS)
            return ENVD_EINVAL;
        for (int32_t d = 0; d < l->act_ndim; d++)
            if (l->act_shape[d] < 1 || l->act_shape[d] > ENVD_OCEAN_MAX_EXTENT)
                return ENVD_ERANGE;
    }
    return ENVD_OK;
}

static int64_t ocean_act_numel(const envd_ocean_layout_t *l)
{
    return l->act_kind == ENVD_SPACE_DISCRETE ? 1 : ocean_numel(l->act_ndim, l->act_shape);
}

static size_t ocean_align_to(size_t n, size_t align) { return (n + align - 1) & ~(align - 1); }

/* The private buffers: actions, rewards and terminals of all agents packed
 * in `near` where they fit (one agent's usually do), else after the state
 * header with the obs of all agents (obs last: an env bound to its rows
 * never touches it).  Offsets from the state's start; returns the state
 * size. */
static size_t ocean_place(const envd_ocean_layout_t *l, size_t *off_obs, size_t *off_act,
                          size_t *off_rew, size_t *off_term)
{
    size_t agents = (size_t)l->agents;
    size_t act = agents * (size_t)ocean_act_numel(l) * sizeof(ocean_act_t);
    size_t rew_at = ocean_align_to(act, alignof(ocean_rew_t));
    size_t term_at = ocean_align_to(rew_at + agents * sizeof(ocean_rew_t), alignof(ocean_term_t));
    size_t tail = offsetof(ocean_state_t, tail);
    size_t at = 0;
    if (term_at + agents * sizeof(ocean_term_t) <= ENVD_OCEAN_NEAR_BYTES) {
        size_t near = offsetof(ocean_state_t, near);
        *off_act = near;
        *off_rew = near + rew_at;
        *off_term = near + term_at;
    } else {
        *off_act = tail + at;
        at = ocean_align_up(at + act);
        *off_rew = tail + at;
        at = ocean_align_up(at + agents * sizeof(ocean_rew_t));
        *off_term = tail + at;
        at = ocean_align_up(at + agents * sizeof(ocean_term_t));
    }
    *off_obs = tail + at;
    at = ocean_align_up(at + agents * (size_t)ocean_numel(l->obs_ndim, l->obs_shape) * sizeof(ocean_obs_t));
    return sizeof(ocean_state_t) + at;
}

/* A Box bound array of n copies of v, in host memory. */
static const double *ocean_bounds(envd_description_t *out, int64_t n, double v)
{
    double *b = out->alloc(out->host, (size_t)n * sizeof(double));
    if (b)
        for (int64_t k = 0; k < n; k++)
            b[k] = v;
    return b;
}

/* The spaces of l: bounds from alloc (host memory in describe, the heap for
 * the static definition). */
static int ocean_spaces(const envd_ocean_layout_t *l, envd_description_t *out)
{
    envd_space_t *o = &out->observation_space;
    memset(o, 0, sizeof(*o));
    o->kind = ENVD_SPACE_BOX;
    o->dtype = l->obs_dtype;
    o->ndim = l->obs_ndim;
    for (int32_t d = 0; d < l->obs_ndim; d++)
        o->shape[d] = l->obs_shape[d];
    int64_t n = ocean_numel(l->obs_ndim, l->obs_shape);
    o->low = ocean_bounds(out, n, l->obs_low);
    o->high = ocean_bounds(out, n, l->obs_high);
    if (!o->low || !o->high)
        return ENVD_ENOMEM;

    envd_space_t *a = &out->action_space;
    memset(a, 0, sizeof(*a));
    a->kind = l->act_kind;
    if (l->act_kind == ENVD_SPACE_DISCRETE) {
        a->dtype = ENVD_DTYPE_INT64;
        a->n = l->act_n;
    } else if (l->act_kind == ENVD_SPACE_MULTI_DISCRETE) {
        a->dtype = ENVD_DTYPE_INT64;
        a->ndim = 1;
        a->shape[0] = l->act_shape[0];
        int64_t *nvec = out->alloc(out->host, (size_t)l->act_shape[0] * sizeof(int64_t));
        if (!nvec)
            return ENVD_ENOMEM;
        memcpy(nvec, l->act_nvec, (size_t)l->act_shape[0] * sizeof(int64_t));
        a->nvec = nvec;
    } else {
        a->dtype = ENVD_DTYPE_FLOAT32;
        a->ndim = l->act_ndim;
        for (int32_t d = 0; d < l->act_ndim; d++)
            a->shape[d] = l->act_shape[d];
        int64_t an = ocean_numel(l->act_ndim, l->act_shape);
        a->low = ocean_bounds(out, an, l->act_low);
        a->high = ocean_bounds(out, an, l->act_high);
        if (!a->low || !a->high)
            return ENVD_ENOMEM;
    }
    out->num_agents = l->agents;
    size_t a0, a1, a2, a3;
    out->state_size = ocean_place(l, &a0, &a1, &a2, &a3);
    return ENVD_OK;
}

static int ocean_describe(const double *params, envd_description_t *out)
{
    envd_ocean_layout_t l;
    int rc = ocean_get_layout(params, &l);
    if (rc != ENVD_OK)
        return rc;
    out->heap_bytes = ocean_heap_bytes(params); /* every manifest defines it */
    return ocean_spaces(&l, out);
}

static int ocean_seed(void *state, uint64_t seed)
{
    ocean_state_t *st = state;
    st->seed = seed;
    st->reseed = true;
    return ENVD_OK;
}

/* PufferLib passes seeds as a C int: the low 32 bits, as srand sees them. */
static unsigned int ocean_srand_seed(const ocean_state_t *st) { return (unsigned int)st->seed; }

/* The C kwargs of params plus the `seed` kwarg vec_init injects.  Returns
 * ENVD_OK or ENVD_EINVAL with kw->error set. */
static int ocean_kwargs(const double *params, int64_t seed, envd_ocean_dict_t *kw)
{
    memset(kw, 0, sizeof(*kw));
    ocean_ckwargs(params, kw);
    envd_ocean_dict_set(kw, "seed", (double)seed);
    return kw->error[0] ? ENVD_EINVAL : ENVD_OK;
}

static int ocean_init(void *state, const double *params)
{
    ocean_state_t *st = state;
    envd_ocean_layout_t l;
    int rc = ocean_get_layout(params, &l);
    if (rc != ENVD_OK)
        return rc;
    ocean_place(&l, &st->off_obs, &st->off_act, &st->off_rew, &st->off_term);
    st->agents = l.agents;
    st->obs_numel = (int64_t)l.agents * ocean_numel(l.obs_ndim, l.obs_shape);
    st->act_numel = (int64_t)l.agents * ocean_act_numel(&l);
    st->act_kind = l.act_kind;
    st->act_low = (float)l.act_low;
    st->act_high = (float)l.act_high;
    unsigned char *base = state;
    st->env.observations = (ocean_obs_t *)(base + st->off_obs);
    st->env.actions = (ocean_act_t *)(base + st->off_act);
    st->env.rewards = (ocean_rew_t *)(base + st->off_rew);
    st->env.terminals = (ocean_term_t *)(base + st->off_term);

    envd_ocean_dict_t kw, args;
    rc = ocean_kwargs(params, (int32_t)ocean_srand_seed(st), &kw);
    if (rc != ENVD_OK)
        return rc;
    memset(&args, 0, sizeof(args));
    envd_ocean_streams_init(&st->streams, ocean_srand_seed(st)); /* vec_init's srand(seed) */
    envd_ocean_current = &st->streams;
    my_init(&st->env, &args, &kw);
    if (kw.error[0]) {
        /* a kwarg my_init read was missing: what it allocated goes now
           (initialized stays false: ocean_close will not close it again) */
        c_close(&st->env);
        envd_ocean_current = NULL;
        return ENVD_EINVAL;
    }
    envd_ocean_current = NULL;
    st->initialized = true;
    return ENVD_OK;
}

/* The env's observations to obs: nothing to do where obs is the row the env
 * writes directly (bound), a copy otherwise. */
static inline void ocean_give_obs(const ocean_state_t *st, void *obs)
{
    if (obs != (void *)st->env.observations)
        memcpy(obs, st->env.observations, (size_t)st->obs_numel * sizeof(ocean_obs_t));
}

/* The host's row for env->observations (after init, before the first reset):
 * what the private buffer holds goes with it (init may have written it). */
static int ocean_bind_obs(void *state, void *obs)
{
    ocean_state_t *st = state;
    memcpy(obs, st->env.observations, (size_t)st->obs_numel * sizeof(ocean_obs_t));
    st->env.observations = obs;
    return ENVD_OK;
}

static int ocean_reset(void *state, envd_rng_t *rng, void *obs)
{
    (void)rng; /* the env draws from its own glibc stream */
    ocean_state_t *st = state;
    if (st->reseed) {
        envd_ocean_streams_init(&st->streams, ocean_srand_seed(st)); /* vec_reset's srand */
        st->reseed = false;
    }
    envd_ocean_current = &st->streams;
    c_reset(&st->env);
    envd_ocean_current = NULL;
    ocean_give_obs(st, obs);
    return ENVD_OK;
}

/* The host's actions (the checked copy) into the env's action buffer, as the
 * env's C action type. */
static inline void ocean_take_actions(ocean_state_t *st, const void *action)
{
    ocean_act_t *act = st->env.actions;
    if (st->act_kind == ENVD_SPACE_BOX) {
        const float *a = action;
        for (int64_t k = 0; k < st->act_numel; k++) /* PufferLib's np.clip */
            act[k] = (ocean_act_t)fminf(fmaxf(a[k], st->act_low), st->act_high);
    } else {
        const int64_t *a = action;
        for (int64_t k = 0; k < st->act_numel; k++)
            act[k] = (ocean_act_t)a[k];
    }
}

/* The env's outputs after c_step: obs to the host's row, rewards float ->
 * double, terminals -> bool (truncations: the host's false, Ocean envs
 * never truncate). */
static inline void ocean_give_outputs(const ocean_state_t *st, void *obs, double *reward,
                                      bool *terminated)
{
    ocean_give_obs(st, obs);
    for (int32_t i = 0; i < st->agents; i++) {
        reward[i] = (double)st->env.rewards[i];
        terminated[i] = st->env.terminals[i] != 0;
    }
}

static int ocean_step(void *state, envd_rng_t *rng, const void *action, void *obs, double *reward,
                      bool *terminated, bool *truncated)
{
    (void)rng;
    (void)truncated;
    ocean_state_t *st = state;
    ocean_take_actions(st, action);
    envd_ocean_current = &st->streams;
    c_step(&st->env);
    envd_ocean_current = NULL;
    ocean_give_outputs(st, obs, reward, terminated);
    return ENVD_OK;
}

/* One agent's action, reward and terminal flag in `near`, where ocean_place
 * puts them (one agent's always fit): C lays a struct out as ocean_place
 * packs, each member at the next multiple of its alignment. */
typedef struct ocean_one {
    ocean_act_t act;
    ocean_rew_t rew;
    ocean_term_t term;
} ocean_one_t;

/* Whether st's buffers are one agent's in `near` (ocean_one_t's layout), with
 * one integer action a step: what ocean_step_envs_one assumes. */
static bool ocean_is_one(const ocean_state_t *st)
{
    const ocean_one_t *one = (const ocean_one_t *)st->near;
    return st->agents == 1 && st->act_kind != ENVD_SPACE_BOX && st->act_numel == 1 &&
           st->env.actions == &one->act && st->env.rewards == &one->rew &&
           st->env.terminals == &one->term;
}

_Static_assert(_Generic(((Env *)0)->log.n, float: 1, default: 0), "the Log's n is a float");

/* ocean_step_envs for envs that ocean_is_one (the usual Ocean env), their
 * actions 8 bytes apart (one int64 each): the same steps with every
 * per-env read of the state's layout gone (agents, action kind and count,
 * the buffers' addresses: fixed offsets in the state), which were most of
 * the glue's cost per env around a cheap c_step (callgrind of squared at
 * N=64: 57, then 33, now 25 instructions an env; PufferLib's loop 8).
 * ended[k] is the Log's n as bits, nonzero: every n > 0, and -0.0 or a NaN,
 * which ocean_episode_end refuses (the host asks it only where ended[k] is
 * set; two instructions fewer than a float compare). */
static inline int64_t ocean_step_envs_one(unsigned char *states, size_t stride, int64_t count,
                                          const int64_t *acts, unsigned char *out,
                                          size_t obs_bytes, double *rewards, bool *terminated,
                                          bool *ended, envd_ocean_streams_t **current)
{
    for (int64_t k = 0; k < count; k++) {
        ocean_state_t *st = (ocean_state_t *)(states + (size_t)k * stride);
        ocean_one_t *one = (ocean_one_t *)st->near;
        one->act = (ocean_act_t)acts[k];
        *current = &st->streams;
        c_step(&st->env);
        ocean_give_obs(st, out + (size_t)k * obs_bytes);
        rewards[k] = (double)one->rew;
        terminated[k] = one->term != 0;
        uint32_t n_bits;
        memcpy(&n_bits, &st->env.log.n, sizeof n_bits);
        ended[k] = n_bits != 0;
    }
    return count;
}

/* ocean_step for count envs in a row: PufferLib's vec_step loop, with each
 * env's own stream selected around its c_step.  ended[k]: the env's Log
 * counted an episode (ocean_episode_end's test). */
static int64_t ocean_step_envs(void *state, size_t stride, int64_t count, const void *actions,
                               size_t action_bytes, void *obs, size_t obs_bytes, double *rewards,
                               bool *terminated, bool *ended)
{
    unsigned char *states = state;
    const unsigned char *acts = actions;
    unsigned char *out = obs;
    /* The thread's slot, looked up once: in a shared object each access of a
     * thread-local variable is a call (__tls_get_addr), and gcc recomputes
     * the address after every c_step rather than keep it; the empty asm
     * makes it a value gcc cannot recompute. */
    envd_ocean_streams_t **current = &envd_ocean_current;
    __asm__("" : "+r"(current));
    /* Every env of a vec has the same layout (the host describes them alike):
     * the first env's says which loop steps them all. */
    if (count > 0 && ocean_is_one(state) && action_bytes == sizeof(int64_t)) {
        ocean_step_envs_one(states, stride, count, actions, out, obs_bytes, rewards, terminated,
                            ended, current);
        *current = NULL;
        return count;
    }
    for (int64_t k = 0; k < count; k++) {
        ocean_state_t *st = (ocean_state_t *)(states + (size_t)k * stride);
        ocean_take_actions(st, acts + (size_t)k * action_bytes);
        *current = &st->streams;
        c_step(&st->env);
        ocean_give_outputs(st, out + (size_t)k * obs_bytes, rewards + k * st->agents,
                           terminated + k * st->agents);
        ended[k] = st->env.log.n > 0.0f;
    }
    *current = NULL;
    return count;
}

/* The Log's field names (my_log's order, without "n"), set once by
 * envd_plugin; where my_log names each field once, also each field's place
 * among my_log's records (ocean_log_count of them); where my_log records
 * each field as one float of the Log, unchanged, also that float's index
 * (ocean_log_copies). */
static const char *ocean_episode_names[ENVD_MAX_EPISODE_FIELDS];
static int32_t ocean_num_episode_fields;
static int32_t ocean_episode_place[ENVD_MAX_EPISODE_FIELDS];
static int32_t ocean_log_count; /* 0: my_log repeats a name, look names up */
static int32_t ocean_episode_from[ENVD_MAX_EPISODE_FIELDS];
static bool ocean_log_copies;

#define ENVD_OCEAN_LOG_FLOATS (sizeof(Log) / sizeof(float))

/* The count ocean_episode_end returns for a Log's n > 0 (the host reads it
 * only as "an episode ended"): PufferLib's vec_log logs every n != 0 as a
 * float, so a fraction of one (0 < n < 1: an env that counts halves) is an
 * episode end, 1; n at or above INT_MAX, or inf, is INT_MAX (a float to int
 * conversion out of int's range is undefined). */
static inline int ocean_episode_count(float n)
{
    if (n < 1.0f)
        return 1;
    return n < 2147483648.0f ? (int)n : INT_MAX;
}

/* ocean_episode_end through my_log: vec_log's mean of the Log, my_log's
 * records of it, the fields read from them.  Out of line: its frame (the
 * records, 1 KiB) and saved registers cost every episode end when inlined
 * (ocean_log_copies's path). */
static __attribute__((noinline)) int ocean_episode_end_logged(ocean_state_t *st, float n,
                                                              double *values)
{
    /* vec_log: every float of the Log divided by n, then my_log (n is
     * nearly always 1, by which a division changes no float) */
    Log mean = st->env.log;
    if (n != 1.0f)
        for (size_t j = 0; j < ENVD_OCEAN_LOG_FLOATS; j++)
            ((float *)&mean)[j] /= n;
    memset(&st->env.log, 0, sizeof(Log));
    /* Only the header is cleared: the records are written before they are
     * read.  Appended without the by-name search, and read by place when
     * my_log wrote the same names as at load (the same literals): the search
     * and the 1 KiB clear were most of an episode end's cost (perf, squared).
     * my_log gets a copy of the mean each time: it may write into its Log. */
    envd_ocean_dict_t rec;
    rec.count = 0;
    rec.append = ocean_log_count > 0;
    rec.error[0] = '\0';
    Log arg = mean;
    my_log(&rec, &arg);
    bool by_place = rec.append && rec.count == ocean_log_count;
    for (int32_t f = 0; by_place && f < ocean_num_episode_fields; f++)
        by_place = rec.names[ocean_episode_place[f]] == ocean_episode_names[f];
    if (rec.append && !by_place) { /* not the names of load: as a dict */
        rec.count = 0;
        rec.append = false;
        arg = mean;
        my_log(&rec, &arg);
    }
    for (int32_t f = 0; f < ocean_num_episode_fields; f++) {
        const double *v = by_place ? &rec.values[ocean_episode_place[f]]
                                   : envd_ocean_dict_find(&rec, ocean_episode_names[f]);
        values[f] = v ? *v : NAN;
    }
    return ocean_episode_count(n);
}

/* An episode ended when the Log's n > 0 (ocean_episode_count); n <= 0 or a
 * NaN (no env counts so) is no episode end, and the Log is left as it is. */
static int ocean_episode_end(void *state, double *values)
{
    ocean_state_t *st = state;
    float n = st->env.log.n;
    if (!(n > 0.0f))
        return 0;
    if (!ocean_log_copies)
        return ocean_episode_end_logged(st, n, values);
    /* my_log's records without my_log: each field's float, divided by n as
     * vec_log divides it (n is nearly always 1, by which a division changes
     * no float).  my_log, its records and the Log's copy were two thirds of
     * an episode end's instructions (callgrind, squared). */
    const float *log = (const float *)&st->env.log;
    if (n == 1.0f)
        for (int32_t f = 0; f < ocean_num_episode_fields; f++)
            values[f] = (double)log[ocean_episode_from[f]];
    else
        for (int32_t f = 0; f < ocean_num_episode_fields; f++)
            values[f] = (double)(log[ocean_episode_from[f]] / n);
    memset(&st->env.log, 0, sizeof(Log));
    return ocean_episode_count(n);
}

/* splitmix64: the probes' bits (any fixed well-mixed sequence would do). */
static inline uint64_t ocean_probe_bits(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

#define ENVD_OCEAN_PROBES 6

/* Probe p's Log.  n is 1, as in every Log my_log gets from vec_log (the
 * mean: n / n).  Every other float has a full pseudo-random mantissa, so
 * that no combination of other floats (a * 3, (a + e) / 2, a + d - b, ...)
 * equals it in every probe but by a chance of about 2^-23 a probe; its
 * magnitude lies in [2^-4, 2^21), a range a real Log holds (rates below 1,
 * lengths and returns up to a few million; a my_log that converts a field
 * to int, e.g. for a loop bound, gets a defined, bounded int); and its sign
 * and binade vary by probe: all positive, all negative, all in the top
 * binade of each sign (so that a clamp under 2^20 shows), all in the
 * bottom binade, then mixed, so that an absolute value, a clamp or a record
 * only of some signs changes some probe's record. */
static void ocean_probe_log(int p, Log *probe)
{
    float *floats = (float *)probe;
    uint64_t state = 0x656e7664u + (uint64_t)p; /* "envd" */
    for (size_t j = 0; j < ENVD_OCEAN_LOG_FLOATS; j++) {
        const uint64_t bits = ocean_probe_bits(&state);
        int binade = (int)((bits >> 23) % 25u) - 4; /* [-4, 20] */
        bool negative = (bits >> 40) & 1u;
        switch (p) {
        case 0: negative = false; break;
        case 1: negative = true; break;
        case 2: binade = 20; negative = false; break;
        case 3: binade = 20; negative = true; break;
        case 4: binade = -4; break;
        default: break;
        }
        /* the float's bits: sign, biased exponent, the 23 mantissa bits */
        const uint32_t word = (negative ? 0x80000000u : 0u) | (uint32_t)(127 + binade) << 23 |
                              (uint32_t)(bits & 0x7fffffu);
        memcpy(&floats[j], &word, sizeof word);
    }
    probe->n = 1.0f;
}

/* Whether my_log records every field as one float of the Log, unchanged
 * (`assign_to_dict(dict, "score", log->score)`, as every binding envd builds
 * does), and which: my_log on probe Logs (ocean_probe_log) whose floats are
 * all distinct; a field must be the same float in every probe.  A record
 * that offsets, scales, clamps, takes the absolute value of or combines
 * floats, or a constant, is in some probe none of its floats, or a float
 * other than in the other probes; a my_log that writes into its Log (say a
 * rate computed into a field, then recorded) is no copy either, whatever it
 * records: my_log stays in use.  The records are compared with an untouched
 * copy of the probe.  Needs ocean_log_count (the names recorded once each,
 * at their places). */
static bool ocean_find_copies(void)
{
    if (ocean_log_count == 0)
        return false;
    for (int p = 0; p < ENVD_OCEAN_PROBES; p++) {
        Log probe, given;
        ocean_probe_log(p, &probe);
        const float *floats = (const float *)&probe;
        for (size_t j = 0; j < ENVD_OCEAN_LOG_FLOATS; j++)
            for (size_t k = 0; k < j; k++)
                if (floats[j] == floats[k])
                    return false; /* (two equal by chance: no copy found) */
        given = probe;
        envd_ocean_dict_t rec;
        memset(&rec, 0, sizeof(rec));
        rec.append = true;
        my_log(&rec, &given);
        if (rec.count != ocean_log_count || rec.error[0] ||
            memcmp(&given, &probe, sizeof(Log)) != 0)
            return false;
        for (int32_t f = 0; f < ocean_num_episode_fields; f++) {
            int32_t place = ocean_episode_place[f];
            if (rec.names[place] != ocean_episode_names[f])
                return false;
            int32_t from = -1;
            for (size_t j = 0; j < ENVD_OCEAN_LOG_FLOATS && from < 0; j++)
                if (rec.values[place] == (double)floats[j])
                    from = (int32_t)j;
            if (from < 0 || (p > 0 && from != ocean_episode_from[f]))
                return false;
            ocean_episode_from[f] = from;
        }
    }
    return true;
}

static void ocean_close(void *state)
{
    ocean_state_t *st = state;
    if (!st->initialized)
        return;
    envd_ocean_current = &st->streams;
    c_close(&st->env);
    envd_ocean_current = NULL;
}

/* ---- the definition --------------------------------------------------- */
static envd_env_def_t ocean_def;
static const envd_env_def_t *ocean_defs[1] = {&ocean_def};
static const envd_plugin_t ocean_plugin = {ENVD_ABI_VERSION, 1, ocean_defs};
static pthread_once_t ocean_once = PTHREAD_ONCE_INIT;
static bool ocean_ready;

static void *ocean_heap_alloc(void *host, size_t bytes)
{
    (void)host;
    return calloc(1, bytes ? bytes : 1);
}

static void ocean_fill_def(void)
{
    double defaults[ENVD_OCEAN_NUM_PARAMS > 0 ? ENVD_OCEAN_NUM_PARAMS : 1];
    for (int32_t p = 0; p < ENVD_OCEAN_NUM_PARAMS; p++)
        defaults[p] = ocean_param_table[p].default_value;
    envd_ocean_layout_t l;
    envd_description_t d;
    memset(&d, 0, sizeof(d));
    d.alloc = ocean_heap_alloc; /* the static def's bounds: kept while loaded (never unloaded) */
    if (ocean_get_layout(defaults, &l) != ENVD_OK || ocean_spaces(&l, &d) != ENVD_OK)
        return;

    /* The Log's fields, by name: my_log on an empty Log. */
    envd_ocean_dict_t rec;
    Log empty;
    memset(&rec, 0, sizeof(rec));
    memset(&empty, 0, sizeof(empty));
    my_log(&rec, &empty);
    for (int32_t i = 0; i < rec.count; i++) {
        if (strcmp(rec.names[i], "n") == 0)
            continue;
        if (ocean_num_episode_fields == ENVD_MAX_EPISODE_FIELDS)
            return;
        ocean_episode_place[ocean_num_episode_fields] = i;
        ocean_episode_names[ocean_num_episode_fields++] = rec.names[i];
    }
    /* The same records appended: as many only if my_log repeats no name. */
    envd_ocean_dict_t all;
    memset(&all, 0, sizeof(all));
    all.append = true;
    my_log(&all, &empty);
    ocean_log_count = all.count == rec.count && !rec.error[0] ? rec.count : 0;
    ocean_log_copies = ocean_find_copies();

    ocean_def.abi_version = ENVD_ABI_VERSION;
    ocean_def.id = "puffer:" ENVD_OCEAN_ENV;
    ocean_def.observation_space = d.observation_space;
    ocean_def.action_space = d.action_space;
    ocean_def.state_size = d.state_size;
    ocean_def.num_agents = d.num_agents;
    ocean_def.max_episode_steps = 0;
    ocean_def.params = ocean_param_table;
    ocean_def.num_params = ENVD_OCEAN_NUM_PARAMS;
    ocean_def.init = ocean_init;
    ocean_def.reset = ocean_reset;
    ocean_def.step = ocean_step;
    ocean_def.close = ocean_close;
    ocean_def.flags = ENVD_ENV_RESETS_ITSELF | ENVD_ENV_STEP_ENVS | (ENVD_OCEAN_FLAGS);
    ocean_def.describe = ocean_describe;
    ocean_def.seed = ocean_seed;
    ocean_def.episode_fields = ocean_episode_names;
    ocean_def.num_episode_fields = ocean_num_episode_fields;
    ocean_def.episode_end = ocean_episode_end;
    ocean_def.step_envs = ocean_step_envs;
    ocean_def.bind_obs = ocean_bind_obs; /* read only where the manifest set ENVD_ENV_OBS_ROWS */
    ocean_ready = true;
}

__attribute__((visibility("default"))) const envd_plugin_t *envd_plugin(void)
{
    pthread_once(&ocean_once, ocean_fill_def);
    return ocean_ready ? &ocean_plugin : NULL;
}

/* The C kwargs the manifest derives from params (without `seed`): for tests
 * and `envd list`, which compare them with the env's Python class.  Returns
 * the count written (at most cap), or a negative ENVD_E* code. */
__attribute__((visibility("default"))) int envd_ocean_ckwargs(const double *params,
                                                              const char **names,
                                                              double *values, int32_t cap)
{
    envd_ocean_dict_t kw;
    memset(&kw, 0, sizeof(kw));
    ocean_ckwargs(params, &kw);
    if (kw.error[0])
        return ENVD_EINVAL;
    int32_t n = kw.count < cap ? kw.count : cap;
    for (int32_t i = 0; i < n; i++) {
        names[i] = kw.names[i];
        values[i] = kw.values[i];
    }
    return n;
}

/* The envd dtype of the env's C action buffer (breakout's and pong's float
 * even in Discrete mode): for `envd bench --ocean`, which drives PufferLib's
 * own binding with the same actions. */
__attribute__((visibility("default"))) int envd_ocean_action_dtype(void)
{
    return (int)_Generic((ocean_act_t)0, float: ENVD_DTYPE_FLOAT32, double: ENVD_DTYPE_FLOAT64,
                         int: ENVD_DTYPE_INT32, unsigned char: ENVD_DTYPE_UINT8,
                         signed char: ENVD_DTYPE_INT8, char: ENVD_DTYPE_INT8,
                         default: -1);
}

#endif /* ENVD_OCEAN_GLUE_H */
