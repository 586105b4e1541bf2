/* tetris: pufferlib/ocean/tetris (class Tetris).  One agent; obs
 * n_cols * n_rows + 6 + 7 * (deck_size + 1) float32 in [0, 1]; Discrete(7). */
#define ENVD_OCEAN_ENV "tetris"
/* Its obs is only written (compute_observations), never read back: it
 * writes its row directly, in-process and in a daemon (docs/ocean.md). */
#define ENVD_OCEAN_FLAGS (ENVD_ENV_OBS_ROWS)

enum { P_N_COLS, P_N_ROWS, P_DECK_SIZE, P_COUNT };

static const envd_param_t ocean_params[] = {
    {"n_cols", ENVD_PARAM_INT, 10, 6, 14, "board width (cells)"},
    {"n_rows", ENVD_PARAM_INT, 20, 10, 30, "board height (cells)"},
    {"deck_size", ENVD_PARAM_INT, 3, 1, 7, "tetrominoes shown ahead"},
};

static void ocean_ckwargs(const double *p, envd_ocean_dict_t *kw)
{
    envd_ocean_same_kwargs(kw, ocean_params, P_COUNT, p);
}

static int ocean_layout(const double *p, envd_ocean_layout_t *l)
{
    envd_ocean_flat_obs(l, (int64_t)p[P_N_COLS] * (int64_t)p[P_N_ROWS] + 6
                               + 7 * ((int64_t)p[P_DECK_SIZE] + 1), 0, 1);
    envd_ocean_discrete(l, 7);
    return ENVD_OK;
}

/* The bytes one env allocates itself (ocean_layout.h's envd_ocean_chunk):
 * init: grid of n_rows * n_cols ints, tetromino_deck of deck_size ints. */
static uint64_t ocean_heap_bytes(const double *p)
{
    return envd_ocean_chunk(p[P_N_ROWS] * p[P_N_COLS], sizeof(int)) +
           envd_ocean_chunk(p[P_DECK_SIZE], sizeof(int));
}
