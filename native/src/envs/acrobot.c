/*
 * Acrobot-v1, bit-exact with gymnasium 1.x (classic_control/acrobot.py).
 *
 * gymnasium computes on numpy float64 scalars and arrays, so each operation
 * rounds once in double precision exactly as the C below does (built without
 * FMA contraction), provided every expression keeps Python's left-to-right
 * evaluation order.  Sub-expressions of Python-float constants are folded by
 * Python in double, in the same order as the constants below.  Three numpy
 * details matter beyond that:
 *   - x**2 on an np.float64 scalar calls libm pow(x, 2.0), which differs
 *     from x*x in rare cases (see libm_square);
 *   - reset stores the state as float32 and its observation applies numpy's
 *     float32 sin/cos (its own SIMD kernel, see npy_f32_trig.h);
 *   - after a step the state is float64 (np.append of float32 state and a
 *     Python torque), so later observations use libm cos/sin in double.
 */
#include <math.h>

#include "envd.h"
#include "npy_f32_trig.h"
#include "raster.h"

typedef struct acrobot {
    /* theta1, theta2, dtheta1, dtheta2; float32 values after reset. */
    double s[4];
} acrobot_t;

#define DT 0.2
#define LINK_LENGTH_1 1.0
#define LINK_LENGTH_2 1.0 /* only the frame uses it */
#define LINK_MASS_1 1.0
#define LINK_MASS_2 1.0
#define LINK_COM_POS_1 0.5
#define LINK_COM_POS_2 0.5
#define LINK_MOI 1.0
#define GRAVITY 9.8
#define MAX_VEL_1 (4 * M_PI)
#define MAX_VEL_2 (9 * M_PI)

/*
 * Python-float constant sub-expressions of _dsdt, grouped as Python groups
 * them (left to right); all are exact except the products with GRAVITY,
 * which round exactly once in both languages.  lc**2 on Python floats is
 * an exact square of 0.5, so writing it as a product changes nothing.
 */
#define M1_LC1_SQ (LINK_MASS_1 * (LINK_COM_POS_1 * LINK_COM_POS_1))
#define L1_SQ_PLUS_LC2_SQ (LINK_LENGTH_1 * LINK_LENGTH_1 + LINK_COM_POS_2 * LINK_COM_POS_2)
#define TWO_L1_LC2 (2 * LINK_LENGTH_1 * LINK_COM_POS_2)
#define LC2_SQ (LINK_COM_POS_2 * LINK_COM_POS_2)
#define L1_LC2 (LINK_LENGTH_1 * LINK_COM_POS_2)
#define M2_LC2_G (LINK_MASS_2 * LINK_COM_POS_2 * GRAVITY)
#define NEG_M2_L1_LC2 (-LINK_MASS_2 * LINK_LENGTH_1 * LINK_COM_POS_2)
#define TWO_M2_L1_LC2 (2 * LINK_MASS_2 * LINK_LENGTH_1 * LINK_COM_POS_2)
#define M_LC_G ((LINK_MASS_1 * LINK_COM_POS_1 + LINK_MASS_2 * LINK_LENGTH_1) * GRAVITY)
#define M2_L1_LC2 (LINK_MASS_2 * LINK_LENGTH_1 * LINK_COM_POS_2)
#define M2_LC2_SQ_PLUS_I2 (LINK_MASS_2 * LC2_SQ + LINK_MOI)

static const double obs_high[6] = {1.0, 1.0, 1.0, 1.0, (double)(float)MAX_VEL_1,
                                   (double)(float)MAX_VEL_2};
static const double obs_low[6] = {-1.0, -1.0, -1.0, -1.0, -(double)(float)MAX_VEL_1,
                                  -(double)(float)MAX_VEL_2};

/* gymnasium's AVAIL_TORQUE; its int +1 becomes 1.0 in np.append. */
static const double avail_torque[3] = {-1.0, 0.0, 1.0};

/*
 * gymnasium: x**2 on an np.float64 scalar is libm pow(x, 2.0), which is not
 * always x*x.  GCC folds pow(x, 2.0) into x*x even without fast-math, so the
 * exponent is hidden from it in a volatile.
 */
static double libm_square(double x)
{
    volatile double two = 2.0;
    return pow(x, two);
}

static int acrobot_init(void *state, const double *p)
{
    (void)state;
    (void)p;
    return ENVD_OK;
}

/* gymnasium's _dsdt (book dynamics) for y = (theta1, theta2, dtheta1, dtheta2). */
static void dsdt(const double y[4], double a, double dy[4])
{
    double theta1 = y[0], theta2 = y[1], dtheta1 = y[2], dtheta2 = y[3];
    double d1 = M1_LC1_SQ + LINK_MASS_2 * (L1_SQ_PLUS_LC2_SQ + TWO_L1_LC2 * cos(theta2)) +
                LINK_MOI + LINK_MOI;
    double d2 = LINK_MASS_2 * (LC2_SQ + L1_LC2 * cos(theta2)) + LINK_MOI;
    double phi2 = M2_LC2_G * cos(theta1 + theta2 - M_PI / 2.0);
    double phi1 = NEG_M2_L1_LC2 * libm_square(dtheta2) * sin(theta2) -
                  TWO_M2_L1_LC2 * dtheta2 * dtheta1 * sin(theta2) +
                  M_LC_G * cos(theta1 - M_PI / 2) + phi2;
    double ddtheta2 = (a + d2 / d1 * phi1 - M2_L1_LC2 * libm_square(dtheta1) * sin(theta2) - phi2) /
                      (M2_LC2_SQ_PLUS_I2 - libm_square(d2) / d1);
    double ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    dy[0] = dtheta1;
    dy[1] = dtheta2;
    dy[2] = ddtheta1;
    dy[3] = ddtheta2;
}

/* out = y + h * k, elementwise as numpy does. */
static void axpy(const double y[4], double h, const double k[4], double out[4])
{
    for (int i = 0; i < 4; i++)
        out[i] = y[i] + h * k[i];
}

/*
 * gymnasium's rk4 over t = [0, dt].  The torque rides along as a fifth state
 * component with derivative 0.0, so it stays exactly a and is left out here.
 */
static void rk4(double y[4], double a)
{
    const double dt = DT - 0; /* t[1] - t[0] */
    const double dt2 = dt / 2.0;
    double k1[4], k2[4], k3[4], k4[4], tmp[4];
    dsdt(y, a, k1);
    axpy(y, dt2, k1, tmp);
    dsdt(tmp, a, k2);
    axpy(y, dt2, k2, tmp);
    dsdt(tmp, a, k3);
    axpy(y, dt, k3, tmp);
    dsdt(tmp, a, k4);
    /* y0 + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4), numpy left to right. */
    for (int i = 0; i < 4; i++)
        y[i] = y[i] + dt / 6.0 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);
}

static double wrap(double x, double m, double big_m)
{
    double diff = big_m - m;
    while (x > big_m)
        x = x - diff;
    while (x < m)
        x = x + diff;
    return x;
}

/* Python's min(max(x, m), M): each keeps its first argument unless the
 * second compares strictly greater (smaller). */
static double bound(double x, double m, double big_m)
{
    double lo = m > x ? m : x;
    return big_m < lo ? big_m : lo;
}

static int acrobot_reset(void *state, envd_rng_t *rng, void *obs)
{
    acrobot_t *st = state;
    float *o = obs;
    float s[4];
    /* np_random.uniform(-0.1, 0.1, size=(4,)).astype(np.float32) */
    for (int i = 0; i < 4; i++) {
        s[i] = (float)envd_rng_uniform(rng, -0.1, 0.1);
        st->s[i] = s[i];
    }
    /* The state is float32 here, so np.cos/np.sin run numpy's float32 kernel. */
    o[0] = envd_npy_cosf(s[0]);
    o[1] = envd_npy_sinf(s[0]);
    o[2] = envd_npy_cosf(s[1]);
    o[3] = envd_npy_sinf(s[1]);
    o[4] = s[2];
    o[5] = s[3];
    return ENVD_OK;
}

static int acrobot_step(void *state, envd_rng_t *rng, const void *action, void *obs,
                        double *reward, bool *terminated, bool *truncated)
{
    (void)rng; /* torque_noise_max is 0: no draw */
    acrobot_t *st = state;
    float *o = obs;
    int64_t act = *(const int64_t *)action;
    if (act < 0 || act > 2)
        return ENVD_ERANGE;
    double *s = st->s;
    rk4(s, avail_torque[act]);
    s[0] = wrap(s[0], -M_PI, M_PI);
    s[1] = wrap(s[1], -M_PI, M_PI);
    s[2] = bound(s[2], -MAX_VEL_1, MAX_VEL_1);
    s[3] = bound(s[3], -MAX_VEL_2, MAX_VEL_2);

    bool done = -cos(s[0]) - cos(s[1] + s[0]) > 1.0;
    *reward = done ? 0.0 : -1.0;
    *terminated = done;
    *truncated = false;
    /* The state is float64 now: libm cos/sin in double, then cast. */
    o[0] = (float)cos(s[0]);
    o[1] = (float)sin(s[0]);
    o[2] = (float)cos(s[1]);
    o[3] = (float)sin(s[1]);
    o[4] = (float)s[2];
    o[5] = (float)s[3];
    return ENVD_OK;
}

/* gymnasium's AcrobotEnv.render geometry (500x500, y up). */
#define SCREEN_DIM 500

static int acrobot_render(const void *state, uint8_t *rgb)
{
    const double *s = ((const acrobot_t *)state)->s;
    envd_raster_t r = {rgb, SCREEN_DIM, SCREEN_DIM, true};
    const double bound = LINK_LENGTH_1 + LINK_LENGTH_2 + 0.2;
    const double scale = SCREEN_DIM / (bound * 2), offset = SCREEN_DIM / 2.0;
    envd_raster_fill(&r, (envd_color_t){255, 255, 255});
    envd_raster_line(&r, -2.2 * scale + offset, 1 * scale + offset, 2.2 * scale + offset,
                     1 * scale + offset, (envd_color_t){0, 0, 0});
    /* joints at the origin and at the end of link 1; gymnasium swaps x and y */
    const double xs[2] = {0, LINK_LENGTH_1 * sin(s[0]) * scale};
    const double ys[2] = {0, -LINK_LENGTH_1 * cos(s[0]) * scale};
    const double thetas[2] = {s[0] - M_PI / 2, s[0] + s[1] - M_PI / 2};
    const double lengths[2] = {LINK_LENGTH_1 * scale, LINK_LENGTH_2 * scale};
    for (int k = 0; k < 2; k++) {
        double x = xs[k] + offset, y = ys[k] + offset, link[8];
        envd_raster_box(0, lengths[k], -0.1 * scale, 0.1 * scale, thetas[k], x, y, link);
        envd_raster_polygon(&r, link, 4, (envd_color_t){0, 204, 204});
        envd_raster_circle(&r, envd_raster_trunc(x), envd_raster_trunc(y), (int)(0.1 * scale),
                           (envd_color_t){204, 204, 0});
    }
    return ENVD_OK;
}

const envd_env_def_t envd_builtin_acrobot = {
    .abi_version = ENVD_ABI_VERSION,
    .id = "Acrobot-v1",
    .observation_space = {.kind = ENVD_SPACE_BOX, .dtype = ENVD_DTYPE_FLOAT32, .ndim = 1,
                          .shape = {6}, .low = obs_low, .high = obs_high},
    .action_space = {.kind = ENVD_SPACE_DISCRETE, .dtype = ENVD_DTYPE_INT64, .n = 3},
    .state_size = sizeof(acrobot_t),
    .num_agents = 1,
    .max_episode_steps = 500,
    .params = NULL,
    .num_params = 0,
    .init = acrobot_init,
    .reset = acrobot_reset,
    .step = acrobot_step,
    .render_width = SCREEN_DIM,
    .render_height = SCREEN_DIM,
    .render_fps = 15,
    .render = acrobot_render,
};
