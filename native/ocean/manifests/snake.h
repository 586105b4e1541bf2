/* snake: pufferlib/ocean/snake (class Snake).  num_snakes agents (rows) per
 * env; obs (2 * vision + 1)^2 int8 cells in [0, 2], shape (2v+1, 2v+1);
 * Discrete(4).  C kwargs as the class derives them: num_food -> "num_food",
 * max_snake_length capped at width * height, cell_size =
 * ceil(1280 / max(width, height)). */
#define ENVD_OCEAN_ENV "snake"
/* Its obs is only written (compute_observations, from its grid), never read back: it
 * writes its row directly, in-process and in a daemon (docs/ocean.md). */
#define ENVD_OCEAN_FLAGS (ENVD_ENV_OBS_ROWS)

enum { P_WIDTH, P_HEIGHT, P_NUM_SNAKES, P_NUM_FOOD, P_VISION, P_LEAVE_CORPSE_ON_DEATH,
       P_REWARD_FOOD, P_REWARD_CORPSE, P_REWARD_DEATH, P_MAX_SNAKE_LENGTH };

static const envd_param_t ocean_params[] = {
    {"width", ENVD_PARAM_INT, 640, 24, 1280, "grid width (cells)"},
    {"height", ENVD_PARAM_INT, 360, 24, 1280, "grid height (cells)"},
    {"num_snakes", ENVD_PARAM_INT, 256, 1, 1024, "snakes per env (rows)"},
    {"num_food", ENVD_PARAM_INT, 4096, 1, 65536, "food on the grid"},
    {"vision", ENVD_PARAM_INT, 5, 1, 10, "cells seen on each side of the head"},
    {"leave_corpse_on_death", ENVD_PARAM_BOOL, 1, 0, 1, "a dead snake leaves food-like corpse"},
    {"reward_food", ENVD_PARAM_FLOAT, 0.1, -10, 10, "reward per food eaten"},
    {"reward_corpse", ENVD_PARAM_FLOAT, 0.1, -10, 10, "reward per corpse cell eaten"},
    {"reward_death", ENVD_PARAM_FLOAT, -1.0, -10, 10, "reward at death"},
    {"max_snake_length", ENVD_PARAM_INT, 1024, 2, 4096, "longest snake (cells)"},
};

static void ocean_ckwargs(const double *p, envd_ocean_dict_t *kw)
{
    double area = p[P_WIDTH] * p[P_HEIGHT];
    double longest = p[P_WIDTH] > p[P_HEIGHT] ? p[P_WIDTH] : p[P_HEIGHT];
    envd_ocean_dict_set(kw, "width", p[P_WIDTH]);
    envd_ocean_dict_set(kw, "height", p[P_HEIGHT]);
    envd_ocean_dict_set(kw, "num_snakes", p[P_NUM_SNAKES]);
    envd_ocean_dict_set(kw, "num_food", p[P_NUM_FOOD]);
    envd_ocean_dict_set(kw, "vision", p[P_VISION]);
    envd_ocean_dict_set(kw, "leave_corpse_on_death", p[P_LEAVE_CORPSE_ON_DEATH]);
    envd_ocean_dict_set(kw, "reward_food", p[P_REWARD_FOOD]);
    envd_ocean_dict_set(kw, "reward_corpse", p[P_REWARD_CORPSE]);
    envd_ocean_dict_set(kw, "reward_death", p[P_REWARD_DEATH]);
    envd_ocean_dict_set(kw, "max_snake_length",
                        p[P_MAX_SNAKE_LENGTH] < area ? p[P_MAX_SNAKE_LENGTH] : area);
    envd_ocean_dict_set(kw, "cell_size", ceil(1280.0 / longest));
}

static int ocean_layout(const double *p, envd_ocean_layout_t *l)
{
    int64_t w = (int64_t)p[P_WIDTH], h = (int64_t)p[P_HEIGHT], v = (int64_t)p[P_VISION];
    /* the class's own check; and snakes and food must leave the grid room
       (placing them retries random cells until one is free) */
    if (w < 2 * v + 2 || h < 2 * v + 2)
        return ENVD_ERANGE;
    if ((int64_t)p[P_NUM_SNAKES] * 2 + (int64_t)p[P_NUM_FOOD] > (w - 2 * v) * (h - 2 * v) / 2)
        return ENVD_ERANGE;
    l->agents = (int32_t)p[P_NUM_SNAKES];
    l->obs_dtype = ENVD_DTYPE_INT8;
    l->obs_ndim = 2;
    l->obs_shape[0] = 2 * v + 1;
    l->obs_shape[1] = 2 * v + 1;
    l->obs_low = 0;
    l->obs_high = 2;
    envd_ocean_discrete(l, 4);
    return ENVD_OK;
}

/* The bytes one env allocates itself (ocean_layout.h's envd_ocean_chunk):
 * init_csnake: grid of width * height chars, snake of num_snakes * 2 *
 * max_snake_length ints (the C kwarg: capped at the area), snake_lengths,
 * snake_ptr, snake_lifetimes, snake_colors of num_snakes ints, snake_logs of
 * num_snakes Logs. */
static uint64_t ocean_heap_bytes(const double *p)
{
    double area = p[P_WIDTH] * p[P_HEIGHT];
    double longest = p[P_MAX_SNAKE_LENGTH] < area ? p[P_MAX_SNAKE_LENGTH] : area;
    double n = p[P_NUM_SNAKES];
    return envd_ocean_chunk(area, sizeof(char)) + envd_ocean_chunk(n * 2 * longest, sizeof(int)) +
           4 * envd_ocean_chunk(n, sizeof(int)) + envd_ocean_chunk(n, sizeof(Log));
}
