/* enduro: pufferlib/ocean/enduro (class Enduro).  One agent; obs
 * 8 + 5 * max_enemies + 9 + 1 float32 in [0, 1]; Discrete(9).  No make
 * kwargs: init sets max_enemies to its compiled MAX_ENEMIES (10) whatever it
 * is given, and the obs is sized from it; the screen and car sizes drive the
 * game's geometry, fixed at the class's defaults.  Its own rand_r stream
 * starts from the injected seed kwarg. */
#define ENVD_OCEAN_ENV "enduro"
/* Its obs is only written (compute_observations), never read back: it
 * writes its row directly, in-process and in a daemon (docs/ocean.md). */
#define ENVD_OCEAN_FLAGS (ENVD_ENV_OBS_ROWS)

#define ENVD_OCEAN_NO_PARAMS

static void ocean_ckwargs(const double *p, envd_ocean_dict_t *kw)
{
    (void)p;
    envd_ocean_dict_set(kw, "width", 152);
    envd_ocean_dict_set(kw, "height", 210);
    envd_ocean_dict_set(kw, "car_width", 16);
    envd_ocean_dict_set(kw, "car_height", 11);
    envd_ocean_dict_set(kw, "max_enemies", 10);
    envd_ocean_dict_set(kw, "frameskip", 1);
    envd_ocean_dict_set(kw, "continuous", 0);
}

static int ocean_layout(const double *p, envd_ocean_layout_t *l)
{
    (void)p;
    envd_ocean_flat_obs(l, 8 + 5 * 10 + 9 + 1, 0, 1);
    envd_ocean_discrete(l, 9);
    return ENVD_OK;
}

/* The bytes one env allocates itself (ocean_layout.h's envd_ocean_chunk):
 * init allocates nothing (allocate's buffers are the state block's). */
static uint64_t ocean_heap_bytes(const double *p)
{
    (void)p;
    return 0;
}
