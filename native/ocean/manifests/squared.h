/* squared: pufferlib/ocean/squared (class Squared).  One agent on a
 * size x size grid; obs size * size uint8 in [0, 1]; Discrete(5). */
#define ENVD_OCEAN_ENV "squared"
/* Its obs is its grid: c_step reads it back (is the agent's cell the
 * target?), so it writes its row directly only over private memory. */
#define ENVD_OCEAN_FLAGS (ENVD_ENV_OBS_ROWS | ENVD_ENV_OBS_ROWS_PRIVATE)

enum { P_SIZE };

static const envd_param_t ocean_params[] = {
    {"size", ENVD_PARAM_INT, 11, 3, 41, "grid side (cells)"},
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
    envd_ocean_discrete(l, 5);
    return ENVD_OK;
}

/* The bytes one env allocates itself (ocean_layout.h's envd_ocean_chunk):
 * the env allocates nothing. */
static uint64_t ocean_heap_bytes(const double *p)
{
    (void)p;
    return 0;
}
