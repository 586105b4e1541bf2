/* connect4: pufferlib/ocean/connect4 (class Connect4).  One agent (against
 * the env's own opponent); obs 42 float32 in [0, 1]; Discrete(7).  No
 * kwargs. */
#define ENVD_OCEAN_ENV "connect4"
/* Its obs is only written (c_reset clears it, compute_observation sets the
 * occupied cells), never read back: it writes its row directly, in-process
 * and in a daemon (docs/ocean.md). */
#define ENVD_OCEAN_FLAGS (ENVD_ENV_OBS_ROWS)
#define ENVD_OCEAN_NO_PARAMS

static void ocean_ckwargs(const double *p, envd_ocean_dict_t *kw)
{
    (void)p;
    (void)kw;
}

static int ocean_layout(const double *p, envd_ocean_layout_t *l)
{
    (void)p;
    envd_ocean_flat_obs(l, 42, 0, 1);
    envd_ocean_discrete(l, 7);
    return ENVD_OK;
}

/* The bytes one env allocates itself (ocean_layout.h's envd_ocean_chunk):
 * init allocates nothing (allocate_cconnect4's buffers are the state block's). */
static uint64_t ocean_heap_bytes(const double *p)
{
    (void)p;
    return 0;
}
