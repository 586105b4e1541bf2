/* tripletriad: pufferlib/ocean/tripletriad (class TripleTriad).  One agent
 * (against the env's own opponent); obs 114 float32 in [0, 1]; Discrete(14).
 * No make kwargs: the window and card sizes place the board's cards, fixed
 * at the class's defaults. */
#define ENVD_OCEAN_ENV "tripletriad"
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
