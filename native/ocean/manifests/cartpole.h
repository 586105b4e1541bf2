/* cartpole: pufferlib/ocean/cartpole (class Cartpole).  One agent; obs 4
 * float32, unbounded; Discrete(2), or a Box(-1, 1, (1,)) force when
 * continuous.  binding.c reads a float action either way. */
#define ENVD_OCEAN_ENV "cartpole"
/* Its obs is only written (compute_observations), never read back: it
 * writes its row directly, in-process and in a daemon (docs/ocean.md). */
#define ENVD_OCEAN_FLAGS (ENVD_ENV_OBS_ROWS)

enum { P_CONTINUOUS };

static const envd_param_t ocean_params[] = {
    {"continuous", ENVD_PARAM_BOOL, 0, 0, 1, "a Box(-1, 1, (1,)) force instead of Discrete(2)"},
};

static void ocean_ckwargs(const double *p, envd_ocean_dict_t *kw)
{
    envd_ocean_dict_set(kw, "continuous", p[P_CONTINUOUS]);
}

static int ocean_layout(const double *p, envd_ocean_layout_t *l)
{
    envd_ocean_flat_obs(l, 4, -INFINITY, INFINITY);
    if (p[P_CONTINUOUS] != 0) {
        l->act_kind = ENVD_SPACE_BOX;
        l->act_ndim = 1;
        l->act_shape[0] = 1;
        l->act_low = -1;
        l->act_high = 1;
    } else {
        envd_ocean_discrete(l, 2);
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
