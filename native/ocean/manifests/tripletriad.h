/* tripletriad: pufferlib/ocean/tripletriad (class TripleTriad).  One agent
 * (against the env's own opponent); obs 114 float32 in [0, 1]; Discrete(14).
 * No make kwargs: the window and card sizes place the board's cards, fixed
 * at the class's defaults. */
#define ENVD_OCEAN_ENV "tripletriad"
/* Its obs is only written (compute_observations), never read back: it
 * writes its row directly, in-process and in a daemon (docs/ocean.md). */
#define ENVD_OCEAN_FLAGS (ENVD_ENV_OBS_ROWS)
#define ENVD_OCEAN_NO_PARAMS

static void ocean_ckwargs(const double *p, envd_ocean_dict_t *kw)
{
    (void)p;
    envd_ocean_dict_set(kw, "width", 990);
    envd_ocean_dict_set(kw, "height", 690);
    envd_ocean_dict_set(kw, "card_width", 192);
    envd_ocean_dict_set(kw, "card_height", 224);
}

static int ocean_layout(const double *p, envd_ocean_layout_t *l)
{
    (void)p;
    envd_ocean_flat_obs(l, 114, 0, 1);
    envd_ocean_discrete(l, 14);
    return ENVD_OK;
}

/* The bytes one env allocates itself (ocean_layout.h's envd_ocean_chunk):
 * init_ctripletriad: 9 fixed arrays (board_x, board_y of 9 floats, ...), 2
 * hands of 5 cards of 4 ints, 3 board rows of 3 ints, 2 card_locations of 5,
 * 3 rows of 3 card values of 4 ints. */
static uint64_t ocean_heap_bytes(const double *p)
{
    (void)p;
    return 2 * envd_ocean_chunk(9, sizeof(float)) + envd_ocean_chunk(2, sizeof(int **)) +
           envd_ocean_chunk(2, sizeof(int)) + envd_ocean_chunk(2, sizeof(int *)) +
           envd_ocean_chunk(15, sizeof(int)) + envd_ocean_chunk(3, sizeof(int *)) +
           envd_ocean_chunk(3, sizeof(int **)) + envd_ocean_chunk(2, sizeof(int)) +
           2 * (envd_ocean_chunk(5, sizeof(int *)) + 5 * envd_ocean_chunk(4, sizeof(int))) +
           3 * envd_ocean_chunk(3, sizeof(int)) + 2 * envd_ocean_chunk(5, sizeof(int)) +
           3 * (envd_ocean_chunk(3, sizeof(int *)) + 3 * envd_ocean_chunk(4, sizeof(int)));
}
