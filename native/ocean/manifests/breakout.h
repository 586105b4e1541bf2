/* breakout: pufferlib/ocean/breakout (class Breakout).  One agent; obs
 * 10 + brick_rows*brick_cols float32 in [0, 1]; Discrete(3), or a Box(-1, 1,
 * (1,)) when continuous.  binding.c reads a float action either way. */
#define ENVD_OCEAN_ENV "breakout"
/* Its obs is only written (compute_observations), never read back: it
 * writes its row directly, in-process and in a daemon (docs/ocean.md). */
#define ENVD_OCEAN_FLAGS (ENVD_ENV_OBS_ROWS)

enum { P_FRAMESKIP, P_WIDTH, P_HEIGHT, P_PADDLE_WIDTH, P_PADDLE_HEIGHT, P_BALL_WIDTH,
       P_BALL_HEIGHT, P_BRICK_ROWS, P_BRICK_COLS, P_CONTINUOUS };

/* Geometry stays near the defaults: bricks must fit the screen (18 columns of
 * 32 px fill the 576 px width), so the brick size is no make kwarg (32 x 12,
 * the class's default). */
static const envd_param_t ocean_params[] = {
    {"frameskip", ENVD_PARAM_INT, 4, 1, 8, "physics ticks per step"},
    {"width", ENVD_PARAM_INT, 576, 576, 1024, "screen width (px)"},
    {"height", ENVD_PARAM_INT, 330, 330, 640, "screen height (px)"},
    {"paddle_width", ENVD_PARAM_INT, 62, 20, 100, "paddle width (px)"},
    {"paddle_height", ENVD_PARAM_INT, 8, 4, 16, "paddle height (px)"},
    {"ball_width", ENVD_PARAM_INT, 32, 8, 32, "ball width (px)"},
    {"ball_height", ENVD_PARAM_INT, 32, 8, 32, "ball height (px)"},
    {"brick_rows", ENVD_PARAM_INT, 6, 1, 6, "rows of bricks"},
    {"brick_cols", ENVD_PARAM_INT, 18, 1, 18, "columns of bricks"},
    {"continuous", ENVD_PARAM_BOOL, 0, 0, 1, "a Box(-1, 1, (1,)) action instead of Discrete(3)"},
};

static void ocean_ckwargs(const double *p, envd_ocean_dict_t *kw)
{
    envd_ocean_same_kwargs(kw, ocean_params, P_CONTINUOUS + 1, p);
    envd_ocean_dict_set(kw, "brick_width", 32);
    envd_ocean_dict_set(kw, "brick_height", 12);
}

static int ocean_layout(const double *p, envd_ocean_layout_t *l)
{
    envd_ocean_flat_obs(l, 10 + (int64_t)p[P_BRICK_ROWS] * (int64_t)p[P_BRICK_COLS], 0, 1);
    if (p[P_CONTINUOUS] != 0) {
        l->act_kind = ENVD_SPACE_BOX;
        l->act_ndim = 1;
        l->act_shape[0] = 1;
        l->act_low = -1;
        l->act_high = 1;
    } else {
        envd_ocean_discrete(l, 3);
    }
    return ENVD_OK;
}

/* The bytes one env allocates itself (ocean_layout.h's envd_ocean_chunk):
 * init: brick_x, brick_y, brick_states of brick_rows * brick_cols floats. */
static uint64_t ocean_heap_bytes(const double *p)
{
    return 3 * envd_ocean_chunk(p[P_BRICK_ROWS] * p[P_BRICK_COLS], sizeof(float));
}
