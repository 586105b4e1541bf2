/* checkers: pufferlib/ocean/checkers (class Checkers).  One agent (against
 * the env's own random opponent); obs size * size uint8 in [0, 1];
 * Discrete(size * size * 8).  Its opponent reseeds from time(NULL) before
 * every move: in PufferLib it is not reproducible; here time() is the env's
 * virtual clock, so a seed gives one game. */
#define ENVD_OCEAN_ENV "checkers"
/* Its obs is its board: c_step reads it back (legal moves, captures,
 * kings), so it writes its row directly only over private memory. */
#define ENVD_OCEAN_FLAGS (ENVD_ENV_OBS_ROWS | ENVD_ENV_OBS_ROWS_PRIVATE)

enum { P_SIZE };

static const envd_param_t ocean_params[] = {
    {"size", ENVD_PARAM_INT, 8, 8, 12, "board side (squares)"},
};

static void ocean_ckwargs(const double *p, envd_ocean_dict_t *kw)
{
    envd_ocean_dict_set(kw, "size", p[P_SIZE]);
}

static int ocean_layout(const double *p, envd_ocean_layout_t *l)
{
    int64_t size = (int64_t)p[P_SIZE];
    envd_ocean_flat_obs(l, size * size, 0, 1);
    l->obs_dtype = ENVD_DTYPE_UINT8;
    envd_ocean_discrete(l, size * size * 8);
    return ENVD_OK;
}

/* The bytes one env allocates itself (ocean_layout.h's envd_ocean_chunk):
 * the env allocates nothing. */
static uint64_t ocean_heap_bytes(const double *p)
{
    (void)p;
    return 0;
}
