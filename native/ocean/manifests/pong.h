/* pong: pufferlib/ocean/pong (class Pong).  One agent; obs 8 float32 in
 * [0, 1]; Discrete(3), or a Box(-1, 1, (1,)) when continuous.  binding.c reads
 * a float action either way. */
#define ENVD_OCEAN_ENV "pong"
/* Its obs is only written (compute_observations), never read back: it
 * writes its row directly, in-process and in a daemon (docs/ocean.md). */
#define ENVD_OCEAN_FLAGS (ENVD_ENV_OBS_ROWS)

enum { P_WIDTH, P_HEIGHT, P_PADDLE_WIDTH, P_PADDLE_HEIGHT, P_BALL_WIDTH, P_BALL_HEIGHT,
       P_PADDLE_SPEED, P_BALL_INITIAL_SPEED_X, P_BALL_INITIAL_SPEED_Y, P_BALL_MAX_SPEED_Y,
       P_BALL_SPEED_Y_INCREMENT, P_MAX_SCORE, P_FRAMESKIP, P_CONTINUOUS };

static const envd_param_t ocean_params[] = {
    {"width", ENVD_PARAM_INT, 500, 200, 1000, "court width (px)"},
    {"height", ENVD_PARAM_INT, 640, 200, 1000, "court height (px)"},
    {"paddle_width", ENVD_PARAM_INT, 20, 5, 40, "paddle width (px)"},
    {"paddle_height", ENVD_PARAM_INT, 70, 20, 150, "paddle height (px)"},
    {"ball_width", ENVD_PARAM_INT, 32, 4, 40, "ball width (px)"},
    {"ball_height", ENVD_PARAM_INT, 32, 4, 40, "ball height (px)"},
    {"paddle_speed", ENVD_PARAM_FLOAT, 8, 1, 20, "paddle speed (px per tick)"},
    {"ball_initial_speed_x", ENVD_PARAM_FLOAT, 10, 1, 20, "ball's initial x speed"},
    {"ball_initial_speed_y", ENVD_PARAM_FLOAT, 1, 0, 10, "ball's initial y speed"},
    {"ball_max_speed_y", ENVD_PARAM_FLOAT, 13, 1, 30, "ball's largest y speed"},
    {"ball_speed_y_increment", ENVD_PARAM_FLOAT, 3, 0, 10, "y speed added per paddle hit"},
    {"max_score", ENVD_PARAM_INT, 21, 1, 100, "points that end a game"},
    {"frameskip", ENVD_PARAM_INT, 1, 1, 8, "physics ticks per step"},
    {"continuous", ENVD_PARAM_BOOL, 0, 0, 1, "a Box(-1, 1, (1,)) action instead of Discrete(3)"},
};

static void ocean_ckwargs(const double *p, envd_ocean_dict_t *kw)
{
    envd_ocean_same_kwargs(kw, ocean_params, P_CONTINUOUS + 1, p);
}

static int ocean_layout(const double *p, envd_ocean_layout_t *l)
{
    envd_ocean_flat_obs(l, 8, 0, 1);
    if (p[P_CONTINUOUS] != 0) {
        l->act_kind = ENVD_SPACE_BOX;
        l->act_ndim = 1; /* the class's Box(-1, 1) without a shape: gymnasium makes it (1,) */
        l->act_shape[0] = 1;
        l->act_low = -1;
        l->act_high = 1;
    } else {
        envd_ocean_discrete(l, 3);
    }
    return ENVD_OK;
}

/* The bytes one env allocates itself (ocean_layout.h's envd_ocean_chunk):
 * init allocates nothing (allocate's buffers are the state block's). */
static uint64_t ocean_heap_bytes(const double *p)
{
    (void)p;
    return 0;
}
