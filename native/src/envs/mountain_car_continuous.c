/*
 * MountainCarContinuous-v0, bit-exact with gymnasium 1.x
 * (classic_control/continuous_mountain_car.py).
 *
 * gymnasium's step mixes np.float64, np.float32 and Python floats, and the
 * type of each intermediate decides how it rounds:
 *   - reset stores a float64 array, so on the first step after a reset the
 *     position and velocity are np.float64; every step stores a float32
 *     array, so on later steps they are np.float32;
 *   - force = min(max(action[0], -1.0), 1.0) is the np.float32 action or,
 *     when clamped, the Python float bound (builtins return an argument);
 *   - math.cos returns a Python float; the clamps assign Python floats.
 * NumPy 2 promotion (NEP 50) then says: a Python float is "weak" and takes
 * the numpy operand's type (cast to float32 first when it meets np.float32,
 * for arithmetic and comparisons alike); np.float32 with np.float64 is
 * float64.  So each value below carries its kind and every operation applies
 * that rule.  Built without FMA contraction, each operation rounds once.
 */
#include <math.h>

#include "envd.h"
#include "mountain_car_render.h"

typedef struct mountain_car_continuous {
    double position, velocity; /* first, in this order: tests write them directly */
    bool state_f32;            /* the state array is float32 (after a step), not float64 */
    double goal_velocity;
} mountain_car_continuous_t;

#define MIN_ACTION (-1.0)
#define MAX_ACTION 1.0
#define MIN_POSITION (-1.2)
#define MAX_POSITION 0.6
#define MAX_SPEED 0.07
#define GOAL_POSITION 0.45
#define POWER 0.0015

static const double obs_high[2] = {(double)(float)MAX_POSITION, (double)(float)MAX_SPEED};
static const double obs_low[2] = {(double)(float)MIN_POSITION, (double)(float)-MAX_SPEED};
static const double act_high[1] = {MAX_ACTION};
static const double act_low[1] = {MIN_ACTION};

static const envd_param_t params[] = {
    {"goal_velocity", ENVD_PARAM_FLOAT, 0.0, -1.0, 1.0,
     "the episode terminates at the goal only once velocity >= goal_velocity"},
};

/* ---- numbers that remember their Python/numpy type ----------------------- */
typedef enum num_kind {
    PY_FLOAT, /* a Python float (or small int): weak under NEP 50 */
    NP_F64,   /* np.float64 */
    NP_F32    /* np.float32; its value is held exactly in the double */
} num_kind_t;

typedef struct num {
    double v;
    num_kind_t kind;
} num_t;

static num_t py(double v) { return (num_t){v, PY_FLOAT}; }

/* NEP 50: a weak Python float takes the other type; float32 with float64
 * promotes to float64. */
static num_kind_t promote(num_kind_t a, num_kind_t b)
{
    if (a == PY_FLOAT)
        return b;
    if (b == PY_FLOAT || a == b)
        return a;
    return NP_F64;
}

/* In float32 both operands are cast to float first (exact for np.float32,
 * rounding for a Python float), then one float32 operation. */
static num_t add(num_t a, num_t b)
{
    num_kind_t k = promote(a.kind, b.kind);
    return (num_t){k == NP_F32 ? (float)a.v + (float)b.v : a.v + b.v, k};
}

static num_t sub(num_t a, num_t b)
{
    num_kind_t k = promote(a.kind, b.kind);
    return (num_t){k == NP_F32 ? (float)a.v - (float)b.v : a.v - b.v, k};
}

static num_t mul(num_t a, num_t b)
{
    num_kind_t k = promote(a.kind, b.kind);
    return (num_t){k == NP_F32 ? (float)a.v * (float)b.v : a.v * b.v, k};
}

/* Comparisons promote the same way: np.float32(0.45) >= 0.45 is true. */
static bool gt(num_t a, num_t b)
{
    return promote(a.kind, b.kind) == NP_F32 ? (float)a.v > (float)b.v : a.v > b.v;
}

static bool lt(num_t a, num_t b) { return gt(b, a); }

static bool ge(num_t a, num_t b)
{
    return promote(a.kind, b.kind) == NP_F32 ? (float)a.v >= (float)b.v : a.v >= b.v;
}

static bool eq(num_t a, num_t b)
{
    return promote(a.kind, b.kind) == NP_F32 ? (float)a.v == (float)b.v : a.v == b.v;
}

/* ---- the env ---------------------------------------------------------------- */
static int mcc_init(void *state, const double *p)
{
    mountain_car_continuous_t *s = state;
    s->goal_velocity = p[0];
    return ENVD_OK;
}

static void write_obs(const mountain_car_continuous_t *s, float *obs)
{
    obs[0] = (float)s->position;
    obs[1] = (float)s->velocity;
}

static int mcc_reset(void *state, envd_rng_t *rng, void *obs)
{
    mountain_car_continuous_t *s = state;
    /* np.array([uniform(-0.6, -0.4), 0]) is a float64 array. */
    s->position = envd_rng_uniform(rng, -0.6, -0.4);
    s->velocity = 0.0;
    s->state_f32 = false;
    write_obs(s, obs);
    return ENVD_OK;
}

/* force = min(max(action[0], min_action), max_action): max(a, b) returns b
 * only if b > a, min(a, b) only if b < a, each as the object itself. */
static num_t clamp_force(num_t action)
{
    num_t force = gt(py(MIN_ACTION), action) ? py(MIN_ACTION) : action;
    return lt(py(MAX_ACTION), force) ? py(MAX_ACTION) : force;
}

/* velocity += force * power - 0.0025 * math.cos(3 * position), then the
 * clamps, which assign Python floats. */
static num_t next_velocity(num_t position, num_t velocity, num_t force)
{
    num_t three_pos = mul(py(3), position);         /* int 3 is weak too */
    num_t slope = py(0.0025 * cos(three_pos.v));     /* math.cos: Python float */
    velocity = add(velocity, sub(mul(force, py(POWER)), slope));
    if (gt(velocity, py(MAX_SPEED)))
        velocity = py(MAX_SPEED);
    if (lt(velocity, py(-MAX_SPEED)))
        velocity = py(-MAX_SPEED);
    return velocity;
}

static int mcc_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                    double *reward, bool *terminated, bool *truncated)
{
    (void)rng;
    mountain_car_continuous_t *s = state;
    volatile double two = 2.0; /* keeps a libm pow() call: gcc folds pow(x, 2.0) */
    float a0 = *(const float *)action;
    num_kind_t state_kind = s->state_f32 ? NP_F32 : NP_F64; /* self.state[i] */
    num_t position = {s->position, state_kind};
    num_t velocity = next_velocity(position, (num_t){s->velocity, state_kind},
                                   clamp_force((num_t){a0, NP_F32}));
    position = add(position, velocity);
    if (gt(position, py(MAX_POSITION)))
        position = py(MAX_POSITION);
    if (lt(position, py(MIN_POSITION)))
        position = py(MIN_POSITION);
    if (eq(position, py(MIN_POSITION)) && lt(velocity, py(0)))
        velocity = py(0); /* the Python int 0 */

    bool done = ge(position, py(GOAL_POSITION)) && ge(velocity, py(s->goal_velocity));
    /* reward = 0 or 100.0, minus math.pow(action[0], 2) * 0.1: all double. */
    *reward = (done ? 100.0 : 0.0) - pow((double)a0, two) * 0.1;
    *terminated = done;
    *truncated = false;
    /* self.state = np.array([position, velocity], dtype=np.float32) */
    s->position = (float)position.v;
    s->velocity = (float)velocity.v;
    s->state_f32 = true;
    write_obs(s, obs);
    return ENVD_OK;
}

static int mcc_render(const void *state, uint8_t *rgb)
{
    mountain_car_draw(rgb, ((const mountain_car_continuous_t *)state)->position, GOAL_POSITION);
    return ENVD_OK;
}

const envd_env_def_t envd_builtin_mountain_car_continuous = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "MountainCarContinuous-v0",
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                          .shape = {2}, .low = obs_low, .high = obs_high},
    .action_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                     .shape = {1}, .low = act_low, .high = act_high},
    .state_size = sizeof(mountain_car_continuous_t),
    .num_agents = 1,
    .max_episode_steps = 999,
    .params = params,
    .num_params = 1,
    .init = mcc_init,
    .reset = mcc_reset,
    .step = mcc_step,
    .render_width = MC_SCREEN_WIDTH,
    .render_height = MC_SCREEN_HEIGHT,
    .render_fps = 30,
    .render = mcc_render,
};
