/* go: pufferlib/ocean/go (class Go).  One agent (against the env's own
 * opponent); obs grid_size^2 * 2 + 2 float32 in [0, 1]; Discrete(grid_size^2
 * + 1).  The class passes height = 64 * (grid_size + 1) whatever height it is
 * given, so height is no make kwarg; width, board_width, board_height and
 * grid_square_size only size the window (render), and moves_made, score and
 * last_capture_position seed the game's state: they stay at the class's
 * defaults. */
#define ENVD_OCEAN_ENV "go"
/* Its obs is only written (compute_observations), never read back: it
 * writes its row directly, in-process and in a daemon (docs/ocean.md). */
#define ENVD_OCEAN_FLAGS (ENVD_ENV_OBS_ROWS)

enum { P_GRID_SIZE, P_KOMI, P_REWARD_MOVE_PASS, P_REWARD_MOVE_INVALID, P_REWARD_MOVE_VALID,
       P_REWARD_PLAYER_CAPTURE, P_REWARD_OPPONENT_CAPTURE, P_COUNT };

static const envd_param_t ocean_params[] = {
    {"grid_size", ENVD_PARAM_INT, 7, 5, 13, "board side (intersections)"},
    {"komi", ENVD_PARAM_FLOAT, 7.5, 0, 10, "white's compensation"},
    {"reward_move_pass", ENVD_PARAM_FLOAT, -0.25, -1, 1, "reward of a pass"},
    {"reward_move_invalid", ENVD_PARAM_FLOAT, -0.1, -1, 1, "reward of an invalid move"},
    {"reward_move_valid", ENVD_PARAM_FLOAT, 0.1, -1, 1, "reward of a valid move"},
    {"reward_player_capture", ENVD_PARAM_FLOAT, 0.25, -1, 1, "reward per stone captured"},
    {"reward_opponent_capture", ENVD_PARAM_FLOAT, -0.25, -1, 1, "reward per stone lost"},
};

static void ocean_ckwargs(const double *p, envd_ocean_dict_t *kw)
{
    envd_ocean_same_kwargs(kw, ocean_params, P_COUNT, p);
    envd_ocean_dict_set(kw, "width", 950);
    envd_ocean_dict_set(kw, "height", 64 * (p[P_GRID_SIZE] + 1));
    envd_ocean_dict_set(kw, "board_width", 600);
    envd_ocean_dict_set(kw, "board_height", 600);
    envd_ocean_dict_set(kw, "grid_square_size", 600.0 / 9);
    envd_ocean_dict_set(kw, "moves_made", 0);
    envd_ocean_dict_set(kw, "score", 0.0);
    envd_ocean_dict_set(kw, "last_capture_position", -1);
}

static int ocean_layout(const double *p, envd_ocean_layout_t *l)
{
    int64_t g = (int64_t)p[P_GRID_SIZE];
    envd_ocean_flat_obs(l, g * g * 2 + 2, 0, 1);
    envd_ocean_discrete(l, g * g + 1);
    return ENVD_OK;
}

/* The bytes one env allocates itself (ocean_layout.h's envd_ocean_chunk):
 * init: board_x, board_y of (grid_size - 1)^2 ints; board_states, visited,
 * previous_board_state, temp_board_states of grid_size^2 ints; capture_count of
 * 2; groups, temp_groups of grid_size^2 Groups. */
static uint64_t ocean_heap_bytes(const double *p)
{
    double g = p[P_GRID_SIZE];
    return 2 * envd_ocean_chunk((g - 1) * (g - 1), sizeof(int)) +
           4 * envd_ocean_chunk(g * g, sizeof(int)) + envd_ocean_chunk(2, sizeof(int)) +
           2 * envd_ocean_chunk(g * g, sizeof(Group));
}
