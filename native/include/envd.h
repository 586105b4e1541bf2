/*
 * envd.h -- the one C contract of envd.
 *
 * An environment is a table of plain C functions (envd_env_def_t) over a
 * block of state memory the host allocates (state_size bytes per instance).
 * Built-in envs are written against this header exactly as a plugin would be.
 *
 * Thread rules for env authors:
 *   - An env instance (its state block and its envd_rng_t) is only ever
 *     touched by one thread at a time, but consecutive calls may come from
 *     different threads.  Keep everything in the state block: no globals, no
 *     static mutable variables, no rand()/srand().
 *   - All randomness comes from the envd_rng_t the host passes in.  It
 *     reproduces numpy's SeedSequence -> PCG64 -> Generator bit for bit, so an
 *     env can match a numpy/gymnasium reference exactly.
 *   - Callbacks return ENVD_OK or a negative ENVD_E* code; they never abort,
 *     exit or print.
 *
 * Everything here is ABI: a plugin built against ENVD_ABI_VERSION N is loaded
 * by a host whose envd_abi_version() is N, and by later hosts as long as N is
 * at least their ENVD_ABI_VERSION_MIN.  No version changed a layout: ABI 3
 * appended the render fields to envd_env_def_t (never read from an ABI 2
 * definition); ABI 4 added values only (num_agents > 1, the MULTI_DISCRETE
 * and MULTI_BINARY space kinds, the INT8 dtype, and the nvec/nvec_start
 * names that share the storage of a space's low/high), which the host accepts
 * only from a definition whose abi_version is 4 or more; ABI 5 appended flags,
 * describe, seed and the episode log (episode_fields, episode_end) after render
 * (never read from an ABI 2..4 definition).  A plugin links against
 * nothing of envd: what an env calls at run time (the RNG draws) is static
 * inline in this header, so a plugin builds with one line:
 *     cc -shared -fPIC -O2 -I "$(python -m envd.native --include)" myenv.c -o libmyenv.so
 *
 * The "cffi:begin" and "cffi:end" comment lines here and in native/src's
 * headers mark what envd's Python sees: its build declares the text between
 * them to cffi (native/cdef_from_headers.py).  They mean nothing to C.
 */
#ifndef ENVD_H
#define ENVD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cffi:begin */
#define ENVD_ABI_VERSION 5u
/* The oldest ABI this host still loads (see "the env definition" below). */
#define ENVD_ABI_VERSION_MIN 2u

/* ---- error codes: 0 or a negative code from this one table ------------- */
/*
 * X(name, value, message) for every code, in libuv's UV_ERRNO_MAP style: this
 * table generates the enum below, envd_strerror's messages (errors.c) and the
 * Python mirror of the codes (the module envd._native_facts, written by
 * native/build_ffi.py at build time), so a code is added in one place.  The
 * values are ABI: never renumber one; add new codes below ENVD_ERROR_MIN and
 * move ENVD_ERROR_MIN to the new most negative value.
 */
#define ENVD_ERRNO_MAP(X)                                                      \
    X(ENVD_OK, 0, "success")                                                   \
    X(ENVD_EINVAL, -1, "invalid argument")                                     \
    X(ENVD_ENOMEM, -2, "out of memory")                                        \
    X(ENVD_ERANGE, -3, "value out of range")                                   \
    X(ENVD_ENOTFOUND, -4, "no such environment")                               \
    X(ENVD_EABI, -5, "ABI version mismatch")                                   \
    X(ENVD_ESTATE, -6, "call not valid in the current state")                  \
    X(ENVD_ESYS, -7, "system call failed")                                     \
    X(ENVD_EBUSY, -8, "resource busy")                                         \
    X(ENVD_EENV, -9, "environment callback failed")

/* ENVD_EINVAL: an argument is invalid; ENVD_ENOMEM: out of memory;
 * ENVD_ERANGE: a value is out of its allowed range; ENVD_ENOTFOUND: no such
 * env id; ENVD_EABI: ABI version mismatch; ENVD_ESTATE: the call is not valid
 * in the current state; ENVD_ESYS: a system call failed (see errno);
 * ENVD_EBUSY: a resource is busy (e.g. a job still running); ENVD_EENV: an env
 * callback reported a failure.  Enum constants are ints in C, so functions
 * keep returning int. */
typedef enum envd_error {
#define ENVD_ERROR_ENUM_ENTRY(name, value, message) name = (value),
    ENVD_ERRNO_MAP(ENVD_ERROR_ENUM_ENTRY)
#undef ENVD_ERROR_ENUM_ENTRY
} envd_error_t;
#define ENVD_ERROR_MIN (-9) /* the most negative code in the table */

/* Functions declared without "static inline" in this header (envd_strerror,
 * envd_abi_version, envd_dtype_size, envd_space_numel, envd_rng_seed,
 * envd_env_def_validate, envd_env_def_problem) live in the host: a plugin
 * cannot call them (it links nothing of envd, so dlopen would fail). */

/* A static, human-readable description of an ENVD_* code. */
const char *envd_strerror(int code);

/* The ABI version this library was built with (== ENVD_ABI_VERSION). */
uint32_t envd_abi_version(void);

/* ---- spaces --------------------------------------------------------------- */
typedef enum envd_dtype {
    ENVD_DTYPE_FLOAT32 = 0,
    ENVD_DTYPE_FLOAT64 = 1,
    ENVD_DTYPE_INT64 = 2,
    ENVD_DTYPE_INT32 = 3,
    ENVD_DTYPE_UINT8 = 4,
    ENVD_DTYPE_BOOL = 5,
    ENVD_DTYPE_INT8 = 6 /* ABI 4: MultiBinary's dtype (gymnasium's np.int8) */
} envd_dtype_t;

/* cffi:end */
/* Size in bytes of one element of dtype, or 0 for an unknown dtype. */
size_t envd_dtype_size(envd_dtype_t dtype);

/* cffi:begin */
typedef enum envd_space_kind {
    ENVD_SPACE_BOX = 0,            /* gymnasium.spaces.Box */
    ENVD_SPACE_DISCRETE = 1,       /* gymnasium.spaces.Discrete, dtype INT64, shape () */
    ENVD_SPACE_MULTI_DISCRETE = 2, /* ABI 4: gymnasium.spaces.MultiDiscrete, dtype INT64 */
    ENVD_SPACE_MULTI_BINARY = 3    /* ABI 4: gymnasium.spaces.MultiBinary, dtype INT8 */
} envd_space_kind_t;

#define ENVD_MAX_DIMS 4

/* Largest per-instance state an env may declare (4 GiB). */
#define ENVD_MAX_STATE_SIZE ((size_t)1 << 32)

/* Largest num_agents of a definition (ABI 4). */
#define ENVD_MAX_AGENTS 4096

/*
 * A space, as gymnasium's of the same name:
 *   BOX             dtype any; ndim 0..ENVD_MAX_DIMS, shape; low/high: prod(shape)
 *                   inclusive bounds each (+-INFINITY allowed), NULL = unbounded.
 *   DISCRETE        dtype INT64, ndim 0; values start, start+1, ..., start+n-1;
 *                   one int64_t per sample.
 *   MULTI_DISCRETE  dtype INT64; ndim 1..ENVD_MAX_DIMS, shape (nvec's shape);
 *                   nvec: prod(shape) counts >= 1; nvec_start: prod(shape) starts,
 *                   or NULL for all 0.  Element k is one of nvec_start[k], ...,
 *                   nvec_start[k] + nvec[k] - 1 (gymnasium's MultiDiscrete(nvec,
 *                   start=nvec_start)); prod(shape) int64_t per sample.
 *   MULTI_BINARY    dtype INT8; ndim 1..ENVD_MAX_DIMS, shape (gymnasium's n); each
 *                   element 0 or 1; prod(shape) int8_t per sample.
 * nvec and nvec_start share the storage of low and high (anonymous unions: the
 * layout is the ABI 2 one): set them by name, .nvec = counts.
 */
typedef struct envd_space {
    envd_space_kind_t kind;
    envd_dtype_t dtype;
    int32_t ndim;                 /* BOX: 0..ENVD_MAX_DIMS; DISCRETE: 0 */
    int64_t shape[ENVD_MAX_DIMS]; /* BOX, MULTI_*: the first ndim entries are used */
    union {
        const double *low;   /* BOX */
        const int64_t *nvec; /* MULTI_DISCRETE */
    };
    union {
        const double *high;        /* BOX */
        const int64_t *nvec_start; /* MULTI_DISCRETE; NULL = all 0 */
    };
    /* DISCRETE: actions are start, start+1, ..., start+n-1. */
    int64_t n;
    int64_t start;
} envd_space_t;

/* cffi:end */
/* Number of elements of one sample of the space (1 for DISCRETE, prod(shape)
 * for the others). */
int64_t envd_space_numel(const envd_space_t *space);

/* cffi:begin */
/* ---- construction parameters (the kwargs of make) ------------------------ */
typedef enum envd_param_type {
    ENVD_PARAM_FLOAT = 0,
    ENVD_PARAM_INT = 1, /* passed as an integral double */
    ENVD_PARAM_BOOL = 2 /* passed as 0.0 or 1.0 */
} envd_param_type_t;

typedef struct envd_param {
    const char *name; /* use gymnasium's kwarg name where gymnasium has one */
    envd_param_type_t type;
    double default_value;
    double min_value; /* inclusive; the host rejects values outside */
    double max_value;
    const char *doc;
} envd_param_t;

/* ---- per-env random number generator -------------------------------------- */
/* PCG64 (XSL-RR 128/64) state.  Treat as opaque; it lives in host memory. */
typedef struct envd_rng {
    uint64_t state_hi, state_lo;
    uint64_t inc_hi, inc_lo;
} envd_rng_t;

/* cffi:end */
/* Seed like numpy.random.Generator(PCG64(SeedSequence(seed))).  The host
 * seeds; envs only draw. */
void envd_rng_seed(envd_rng_t *rng, uint64_t seed);

/* PCG's 128-bit LCG multiplier (the published constant), high and low halves. */
#define ENVD_PCG_MULT_HI 2549297995355413924ULL
#define ENVD_PCG_MULT_LO 4865540595714422341ULL

/* Next raw 64-bit output, as PCG64.random_raw(). */
static inline uint64_t envd_rng_next_u64(envd_rng_t *rng)
{
    /* one step of the 128-bit LCG, then the XSL-RR output function */
    const unsigned __int128 mult =
        ((unsigned __int128)ENVD_PCG_MULT_HI << 64) | ENVD_PCG_MULT_LO;
    unsigned __int128 s =
        (((unsigned __int128)rng->state_hi << 64) | rng->state_lo) * mult +
        (((unsigned __int128)rng->inc_hi << 64) | rng->inc_lo);
    rng->state_hi = (uint64_t)(s >> 64);
    rng->state_lo = (uint64_t)s;
    uint64_t x = rng->state_hi ^ rng->state_lo;
    unsigned rot = (unsigned)(rng->state_hi >> 58);
    return (x >> rot) | (x << ((64u - rot) & 63u));
}

/* A double in [0, 1), as Generator.random(). */
static inline double envd_rng_random(envd_rng_t *rng)
{
    return (double)(envd_rng_next_u64(rng) >> 11) * (1.0 / 9007199254740992.0);
}

/* A double in [low, high), as Generator.uniform(low, high). */
static inline double envd_rng_uniform(envd_rng_t *rng, double low, double high)
{
    return low + (high - low) * envd_rng_random(rng);
}

/* cffi:begin */
/* ---- extra per-env outputs: the env's own info entries -------------------- */
/* An env may publish fixed-shape arrays (e.g. an action mask) that the host
 * returns in the info dict under their names, after every reset and step. */
#define ENVD_MAX_INFO_FIELDS 8

typedef struct envd_info_field {
    const char *name;             /* the info key, e.g. "action_mask" */
    envd_dtype_t dtype;
    int32_t ndim;                 /* 0..ENVD_MAX_DIMS */
    int64_t shape[ENVD_MAX_DIMS]; /* the first ndim entries are used */
    const char *doc;
} envd_info_field_t;

/* ---- ABI 5: spaces from the params, flags, the env's own episodes -------- */
/* flags of envd_env_def_t (ABI 5); the host refuses a definition with any
 * other bit set. */
/* The env starts its next episode inside step on its own: the host adds no
 * autoreset and no time limit (make refuses autoreset_mode= and
 * max_episode_steps=; the definition's max_episode_steps must be 0),
 * truncated is always false, and the host's episode statistics come from
 * episode_end, not from terminated flags. */
#define ENVD_ENV_RESETS_ITSELF (1u << 0)
/* init of this definition never runs on two threads at once (the host inits
 * such envs one at a time under one lock per definition: for an init that
 * writes a global). */
#define ENVD_ENV_SERIAL_INIT (1u << 1)
/* The definition has the step_envs field and it is set (only with
 * ENVD_ENV_RESETS_ITSELF).  The host reads step_envs only under this flag: a
 * definition built with an ABI 5 header from before step_envs ends before
 * that field. */
#define ENVD_ENV_STEP_ENVS (1u << 2)
/* The definition has the bind_obs field and it is set: the env can write its
 * observations straight into its rows of the host's observation buffer
 * instead of a buffer of its own that step then copies (read only under this
 * flag, as step_envs under its own).  Only for an env that never reads its
 * observations back: a daemon's rows lie in memory its client can write, and
 * the env would act on what the client wrote. */
#define ENVD_ENV_OBS_ROWS (1u << 3)
/* With ENVD_ENV_OBS_ROWS: the env does read its observations back (they are
 * part of its state, e.g. a grid it looks up), so the host binds its rows
 * only where no one else can write them (a vec over the caller's private
 * memory, never a daemon's shared memory); elsewhere it copies. */
#define ENVD_ENV_OBS_ROWS_PRIVATE (1u << 4)
#define ENVD_ENV_FLAGS_KNOWN                                                      \
    (ENVD_ENV_RESETS_ITSELF | ENVD_ENV_SERIAL_INIT | ENVD_ENV_STEP_ENVS |         \
     ENVD_ENV_OBS_ROWS | ENVD_ENV_OBS_ROWS_PRIVATE)

/* Largest num_episode_fields. */
#define ENVD_MAX_EPISODE_FIELDS 16
/* The most bytes one describe call may take from alloc, all calls together
 * (64 MiB: Box bounds of 4M elements); alloc returns NULL past it. */
#define ENVD_MAX_DESCRIBE_BYTES ((size_t)1 << 26)

/* What describe fills: the spaces, agents and state size of one env made
 * with given params.  The host pre-fills it with the definition's static
 * observation_space, action_space, num_agents and state_size. */
typedef struct envd_description {
    envd_space_t observation_space;
    envd_space_t action_space;
    int32_t num_agents; /* 1..ENVD_MAX_AGENTS */
    size_t state_size;  /* 1..ENVD_MAX_STATE_SIZE */
    /* An upper bound of the bytes one env instance made with these params
     * allocates itself (malloc and friends, chunk overhead included) in
     * init, reset and step, outside its state block: 0..ENVD_MAX_STATE_SIZE,
     * 0 for none (the pre-filled value).  The host counts num_envs times it
     * against its memory bound (a daemon's --max-state-bytes) as it counts
     * the state blocks, so params a client chooses cannot make an env's
     * own heap grow past the operator's bound.  A static definition (no
     * describe) declares none: its own allocations are its author's to
     * bound (it runs only where an operator installed it). */
    uint64_t heap_bytes;
    /* The host's allocator for the arrays the spaces point to (Box low/high,
     * MultiDiscrete nvec/nvec_start): zeroed memory the host owns and frees
     * with the vec (describe never frees it).  NULL when out of memory or
     * past ENVD_MAX_DESCRIBE_BYTES: then return ENVD_ENOMEM.  Call it as
     * out->alloc(out->host, bytes). */
    void *(*alloc)(void *host, size_t bytes);
    void *host;
} envd_description_t;

/* ---- the env definition --------------------------------------------------- */
/*
 * init:  called once per instance on zeroed state memory, with the validated
 *        parameter values in declaration order (num_params doubles).  Each
 *        instance gets its own values: a make kwarg may give one value per
 *        env (a list of num_envs), a scalar means the same for all.
 * reset: start a new episode, drawing from rng; write one observation (the
 *        observation space's dtype and shape) to obs.
 * step:  apply one action (one sample of the action space; for DISCRETE an
 *        int64_t) and write the next observation, the reward and the env's own
 *        terminated/truncated flags.  Time limits are applied by the host; an
 *        env only sets *truncated for reasons of its own.
 * close: release anything init acquired (may be NULL).
 * write_info: (only with num_info_fields > 0) write the info fields of the
 *        current state: fields[k] points to this env's slot of info_fields[k]
 *        (its dtype and shape).  The host calls it after every reset and
 *        every step, including the reset of an autoreset, so the info always
 *        describes the state of the observation returned with it.
 * render: (ABI 3; may be NULL: the env does not render, and asking for
 *        render_mode="rgb_array" is refused) draw the current state as an
 *        RGB image into rgb: render_height rows of render_width pixels of 3
 *        bytes (R, G, B), row-major, top row first -- the layout of
 *        gymnasium's rgb_array frames.  Write every pixel.  Called on a state
 *        that has been reset, never while the instance steps.
 *
 * ABI 2 definitions end before render_width: a host reads the render fields
 * only from a definition whose abi_version is 3 or more, so ABI 2 plugins keep
 * loading (their envs do not render).  Likewise the ABI 5 fields (flags to
 * step_envs) are read only from a definition whose abi_version is 5 or more:
 * flags: ENVD_ENV_* bits (0 for none).
 * describe: (may be NULL: the static spaces, num_agents and state_size hold
 *        for every params) called at make with one env's validated params
 *        (declaration order, num_params doubles) and *out pre-filled with the
 *        static values; sets what differs (arrays from out->alloc).  The host
 *        validates the result as a static definition's; a make whose envs
 *        get different params must describe every env identically, else
 *        ENVD_EINVAL.  `envd list` shows the description at the defaults
 *        (a definition whose describe fails there does not load).  Called on
 *        the making thread, never concurrently with itself for one make, and
 *        must not keep pointers to params or out.
 * seed:  (may be NULL) called with env i's integer seed before init (make's
 *        seed s: s + i; no seed: the base the host drew, + i, the one its
 *        envd_rng_t is seeded from) and before every reset given a seed
 *        (reset(seed=t): t + i); not on a reset without seed, nor on an
 *        autoreset.  For envs with a random generator of their own.
 * episode_fields, num_episode_fields (0..ENVD_MAX_EPISODE_FIELDS), episode_end:
 *        the env's own episode log (e.g. PufferLib's Log: "episode_return",
 *        "episode_length", "score").  episode_end (required when
 *        num_episode_fields > 0; only with ENVD_ENV_RESETS_ITSELF) is called
 *        after every step (after step_envs: for the envs it flags); it
 *        returns how many episodes ended in that step
 *        (0: none; < 0: an error) and, when > 0, writes num_episode_fields
 *        values: the mean of each field over those episodes.  The host then
 *        reports them in info["envd_log"] (field -> float64 per row, mask
 *        info["_envd_log"]) for every row of the env, and its episode
 *        statistics take "r" from "episode_return" and "l" from
 *        "episode_length" when the env has those fields.  A RESETS_ITSELF
 *        env without episode_end never reports an episode end.
 * step_envs: (read only with ENVD_ENV_STEP_ENVS, which needs
 *        ENVD_ENV_RESETS_ITSELF and a non-NULL step_envs) what step does,
 *        for count envs in a row at once, so that a cheap env's steps run as
 *        one tight loop with no call per env (PufferLib's vec_step).  Env k
 *        (0 <= k < count): its state at (char *)state + k * stride, its
 *        actions (every agent's; the host's checked copy) at
 *        (const char *)actions + k * action_bytes; it writes its
 *        observations at (char *)obs + k * obs_bytes, its A agents' rewards
 *        and terminated flags at rewards[k * A] and terminated[k * A] (all
 *        start 0.0/false), and ended[k]: whether episode_end may report an
 *        episode end for it now (false: the host does not call episode_end
 *        for it in this step).  Returns count, or k < count when env k
 *        failed (as step returning an error; envs after it are not stepped:
 *        the host calls again from env k + 1).  The host then does what it
 *        does after each env's step.  Called for whole-vec steps and async
 *        batches of envs in a row (ids k, k + 1, ...); other batches use
 *        step.  Must step each env exactly as step would.  It gets no host
 *        generator (step's rng): for envs whose randomness lives in their
 *        own state (as the Ocean envs' streams do).
 * bind_obs: (read only with ENVD_ENV_OBS_ROWS, which needs a non-NULL
 *        bind_obs) called once per instance after its init and before its
 *        first reset, where the host binds (ENVD_ENV_OBS_ROWS_PRIVATE: only
 *        over private memory), with the env's observation rows (every
 *        agent's): the address every later reset, step and step_envs of
 *        this instance passes as its obs, for the instance's life.  The env
 *        may then write its observations there directly while the host runs
 *        one of its callbacks (never outside them); a callback whose obs is
 *        the bound address needs no copy.  Without ENVD_ENV_OBS_ROWS_PRIVATE
 *        the env must never read the rows (someone else may have written
 *        them); a row it leaves unwritten in a step keeps what it holds.
 *        ENVD_OK, or an error code (the make fails).  An instance the host
 *        does not bind gets obs to write as before.
 *
 * Multi-agent envs (ABI 4: num_agents = A in 1..ENVD_MAX_AGENTS; ABI 2 and 3
 * definitions must declare 1).  Agents are rows: a vec of N envs has N*A rows
 * in every array, agent-major within an env (row i*A + a is agent a of env i),
 * and the trainer sees a gymnasium VectorEnv of N*A rows.  The callbacks keep
 * their signatures; every per-agent pointer covers the env's A agents:
 *   reset writes A observations, one after the other (agent 0 first);
 *   step reads A actions and writes A observations, reward[A],
 *        terminated[A], truncated[A] (all start 0.0/false);
 *   write_info: fields[k] points to A slots of info field k (per agent);
 *   render draws the whole env, once.
 * An agent is done at the step where its terminated or truncated is set.  On
 * later steps of the same episode its row is dead: the env still gets an
 * action there (a checked one; ignore it) and may write anything in its
 * outputs, the host then overwrites the row with obs all zeros (SuperSuit's
 * "black death"), reward 0, and the agent's final terminated/truncated flags
 * again; info["agent_mask"] (bool per row, only when A > 1) is true on live
 * rows, including the step an agent ends, false on dead ones.  The env's
 * episode ends when every agent is done: the env ends it for everyone by
 * setting all flags (its own word), the host's time limit truncates every
 * live agent; autoreset (next_step, same_step) then resets the whole env.
 * Episode statistics are per row: the return and live length of each agent,
 * reported at the step that agent ends.  Seeding is per env, as for A = 1:
 * env i draws from one stream seeded s + i, shared by its agents in the order
 * the env's code draws.  An env that resets itself (ENVD_ENV_RESETS_ITSELF, ABI 5) has no dead
 * rows: every row takes the env's outputs every step (agent_mask always
 * true), and an episode end that episode_end reports ends it for every row.  Async batches are whole envs: batch_size and
 * env_ids count envs, a batch of B envs is B*A rows.
 */
typedef struct envd_env_def {
    uint32_t abi_version; /* must be ENVD_ABI_VERSION */
    const char *id;       /* e.g. "CartPole-v1" */
    envd_space_t observation_space;
    envd_space_t action_space;
    size_t state_size;         /* bytes of per-instance state, 1..ENVD_MAX_STATE_SIZE;
                                  zeroed and aligned for any type (max_align_t) */
    int32_t num_agents;        /* agents per env, 1..ENVD_MAX_AGENTS (ABI 4; before: 1) */
    int32_t max_episode_steps; /* default time limit, 0 for none */
    const envd_param_t *params;
    int32_t num_params;
    int (*init)(void *state, const double *params);
    int (*reset)(void *state, envd_rng_t *rng, void *obs);
    int (*step)(void *state, envd_rng_t *rng, const void *action, void *obs,
                double *reward, bool *terminated, bool *truncated);
    void (*close)(void *state);
    const envd_info_field_t *info_fields; /* num_info_fields entries, or NULL */
    int32_t num_info_fields;              /* 0..ENVD_MAX_INFO_FIELDS */
    int (*write_info)(const void *state, void *const *fields);
    /* ---- since ABI 3 ---- */
    int32_t render_width;  /* frame size in pixels, 1..ENVD_MAX_RENDER_SIDE */
    int32_t render_height; /*   (both 0 when render is NULL) */
    int32_t render_fps;    /* gymnasium's metadata["render_fps"], >= 1 */
    int (*render)(const void *state, uint8_t *rgb);
    /* ---- since ABI 5 ---- */
    uint32_t flags; /* ENVD_ENV_* bits */
    /* may be NULL: the static spaces/num_agents/state_size above hold for all params */
    int (*describe)(const double *params, envd_description_t *out);
    /* may be NULL */
    int (*seed)(void *state, uint64_t seed);
    /* episode log (may be 0 / NULL) */
    const char *const *episode_fields;
    int32_t num_episode_fields; /* 0..ENVD_MAX_EPISODE_FIELDS */
    int (*episode_end)(void *state, double *values);
    /* read only with ENVD_ENV_STEP_ENVS (see above) */
    int64_t (*step_envs)(void *state, size_t stride, int64_t count, const void *actions,
                         size_t action_bytes, void *obs, size_t obs_bytes, double *rewards,
                         bool *terminated, bool *ended);
    /* read only with ENVD_ENV_OBS_ROWS (see above) */
    int (*bind_obs)(void *state, void *obs);
} envd_env_def_t;

/* Largest render_width and render_height. */
#define ENVD_MAX_RENDER_SIDE 4096

/* Whether def renders (abi_version >= 3 and render != NULL); when it does and
 * the pointers are not NULL, its frame width, height and fps.  The one place
 * the host reads the ABI 3 fields, so an ABI 2 definition is never read past
 * its end.  A host function, like envd_env_def_validate. */
bool envd_env_def_render_info(const envd_env_def_t *def, int32_t *width, int32_t *height,
                              int32_t *fps);

/* The ABI 5 fields of def, or NULL where def predates ABI 5 (then read it as
 * flags 0 and every callback NULL): the one place the host reads them, so an
 * ABI 2..4 definition is never read past its end.  A host function. */
const envd_env_def_t *envd_env_def_v5(const envd_env_def_t *def);

/* Check a definition for consistency; ENVD_OK or the first problem found. */
int envd_env_def_validate(const envd_env_def_t *def);
/* The first problem of a definition in words ("observation_space: every
 * shape entry must be in 1..2^32"), or NULL when it is valid.  A static
 * string. */
const char *envd_env_def_problem(const envd_env_def_t *def);

/* ---- plugins ---------------------------------------------------------------
 * A plugin is a shared library exporting one function, ENVD_PLUGIN_SYMBOL:
 *
 *     const envd_plugin_t *envd_plugin(void);
 *
 * returning a static table of its env definitions.  The host checks
 * abi_version before reading anything else (this first field keeps its place
 * in every ABI version), then validates every definition; a plugin is loaded
 * whole or not at all.  A loaded plugin is never unloaded. */
#define ENVD_PLUGIN_SYMBOL "envd_plugin"

typedef struct envd_plugin {
    uint32_t abi_version;              /* ENVD_ABI_VERSION at the plugin's build */
    int32_t num_envs;                  /* >= 1 */
    const envd_env_def_t *const *envs; /* num_envs definitions */
} envd_plugin_t;

typedef const envd_plugin_t *(*envd_plugin_fn)(void);
/* cffi:end */

#ifdef __cplusplus
}
#endif

#endif /* ENVD_H */
