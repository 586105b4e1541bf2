/* A made-up Ocean env's manifest for ocean_glue_edges.c: the observation is
 * a float32 Box of shape (d0, d1, d2); the action a Box of shape (a0,) when
 * a0 > 0, else Discrete(2).  The C kwarg "extra", which my_init reads, is
 * given only when missing_extra is 0. */
#define ENVD_OCEAN_ENV "glue_edges"

enum { P_D0, P_D1, P_D2, P_A0, P_MISSING_EXTRA };

static const envd_param_t ocean_params[] = {
    {"d0", ENVD_PARAM_INT, 2, 1, 1 << 30, ""},
    {"d1", ENVD_PARAM_INT, 2, 1, 1 << 30, ""},
    {"d2", ENVD_PARAM_INT, 2, 1, 1 << 30, ""},
    {"a0", ENVD_PARAM_INT, 0, -1, 1 << 30, ""},
    {"missing_extra", ENVD_PARAM_BOOL, 0, 0, 1, ""},
};

static void ocean_ckwargs(const double *p, envd_ocean_dict_t *kw)
{
    if (p[P_MISSING_EXTRA] == 0)
        envd_ocean_dict_set(kw, "extra", 1);
}

static int ocean_layout(const double *p, envd_ocean_layout_t *l)
{
    l->agents = 1;
    l->obs_dtype = ENVD_DTYPE_FLOAT32;
    l->obs_ndim = 3;
    l->obs_shape[0] = (int64_t)p[P_D0];
    l->obs_shape[1] = (int64_t)p[P_D1];
    l->obs_shape[2] = (int64_t)p[P_D2];
    l->obs_low = 0;
    l->obs_high = 1;
    if (p[P_A0] != 0) {
        l->act_kind = ENVD_SPACE_BOX;
        l->act_ndim = 1;
        l->act_shape[0] = (int64_t)p[P_A0];
        l->act_low = -1;
        l->act_high = 1;
    } else {
        envd_ocean_discrete(l, 2);
    }
    return ENVD_OK;
}

static uint64_t ocean_heap_bytes(const double *p)
{
    (void)p;
    return envd_ocean_chunk(1000, 1);
}
