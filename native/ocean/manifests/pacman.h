/* pacman: pufferlib/ocean/pacman (class Pacman).  One agent; obs
 * 11 + 9 * 4 + 244 float32 in [0, 1] (player, four ghosts, the dots);
 * Discrete(4). */
#define ENVD_OCEAN_ENV "pacman"
/* Its obs is only written (compute_observations), never read back: it
 * writes its row directly, in-process and in a daemon (docs/ocean.md). */
#define ENVD_OCEAN_FLAGS (ENVD_ENV_OBS_ROWS)

enum { P_RANDOMIZE_STARTING_POSITION, P_MIN_START_TIMEOUT, P_MAX_START_TIMEOUT,
       P_FRIGHTENED_TIME, P_MAX_MODE_CHANGES, P_SCATTER_MODE_LENGTH, P_CHASE_MODE_LENGTH,
       P_COUNT };

static const envd_param_t ocean_params[] = {
    {"randomize_starting_position", ENVD_PARAM_BOOL, 0, 0, 1,
     "start pacman on a random dot instead of its usual tile"},
    {"min_start_timeout", ENVD_PARAM_INT, 0, 0, 49, "fewest idle ticks before ghosts leave"},
    {"max_start_timeout", ENVD_PARAM_INT, 49, 0, 100, "most idle ticks before ghosts leave"},
    {"frightened_time", ENVD_PARAM_INT, 35, 1, 100, "ticks ghosts stay frightened"},
    {"max_mode_changes", ENVD_PARAM_INT, 6, 0, 20, "scatter/chase switches per level"},
    {"scatter_mode_length", ENVD_PARAM_INT, 70, 1, 200, "ticks of scatter mode"},
    {"chase_mode_length", ENVD_PARAM_INT, 140, 1, 400, "ticks of chase mode"},
};

static void ocean_ckwargs(const double *p, envd_ocean_dict_t *kw)
{
    envd_ocean_same_kwargs(kw, ocean_params, P_COUNT, p);
}

static int ocean_layout(const double *p, envd_ocean_layout_t *l)
{
    /* rand() % (max - min + 1) + min draws the timeout: max below min is no range */
    if (p[P_MAX_START_TIMEOUT] < p[P_MIN_START_TIMEOUT])
        return ENVD_ERANGE;
    envd_ocean_flat_obs(l, 11 + 9 * 4 + 244, 0, 1);
    envd_ocean_discrete(l, 4);
    return ENVD_OK;
}

/* The bytes one env allocates itself (ocean_layout.h's envd_ocean_chunk):
 * init: game_map of MAP_WIDTH * MAP_HEIGHT Tiles, possible_spawn_pos of
 * NUM_DOTS Positions, pickup_obs of NUM_DOTS + NUM_POWERUPS floats,
 * pickup_obs_map of MAP_WIDTH * MAP_HEIGHT pointers. */
static uint64_t ocean_heap_bytes(const double *p)
{
    (void)p;
    return envd_ocean_chunk(MAP_WIDTH * MAP_HEIGHT, sizeof(Tile)) +
           envd_ocean_chunk(NUM_DOTS, sizeof(Position)) +
           envd_ocean_chunk(NUM_DOTS + NUM_POWERUPS, sizeof(float)) +
           envd_ocean_chunk(MAP_WIDTH * MAP_HEIGHT, sizeof(float *));
}
