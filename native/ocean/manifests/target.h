/* target: pufferlib/ocean/target (class Target).  num_agents agents (rows)
 * per env chasing num_goals goals; obs 2 * (num_agents + num_goals) + 4
 * float32 in [0, 1]; MultiDiscrete([9, 5]) read as int32.  The arena's size
 * stays at the class's default (1080 x 720). */
#define ENVD_OCEAN_ENV "target"
/* Its obs is only written (compute_observations), never read back: it
 * writes its row directly, in-process and in a daemon (docs/ocean.md). */
#define ENVD_OCEAN_FLAGS (ENVD_ENV_OBS_ROWS)

enum { P_NUM_AGENTS, P_NUM_GOALS };

static const envd_param_t ocean_params[] = {
    {"num_agents", ENVD_PARAM_INT, 8, 1, 64, "agents per env (rows)"},
    {"num_goals", ENVD_PARAM_INT, 4, 1, 64, "goals per env"},
};

static void ocean_ckwargs(const double *p, envd_ocean_dict_t *kw)
{
    envd_ocean_dict_set(kw, "width", 1080);
    envd_ocean_dict_set(kw, "height", 720);
    envd_ocean_dict_set(kw, "num_agents", p[P_NUM_AGENTS]);
    envd_ocean_dict_set(kw, "num_goals", p[P_NUM_GOALS]);
}

static int ocean_layout(const double *p, envd_ocean_layout_t *l)
{
    int64_t agents = (int64_t)p[P_NUM_AGENTS], goals = (int64_t)p[P_NUM_GOALS];
    envd_ocean_flat_obs(l, 2 * (agents + goals) + 4, 0, 1);
    l->agents = (int32_t)agents;
    l->act_kind = ENVD_SPACE_MULTI_DISCRETE;
    l->act_ndim = 1;
    l->act_shape[0] = 2;
    l->act_nvec[0] = 9;
    l->act_nvec[1] = 5;
    return ENVD_OK;
}

/* The bytes one env allocates itself (ocean_layout.h's envd_ocean_chunk):
 * init: agents of num_agents Agents, goals of num_goals Goals. */
static uint64_t ocean_heap_bytes(const double *p)
{
    return envd_ocean_chunk(p[P_NUM_AGENTS], sizeof(Agent)) +
           envd_ocean_chunk(p[P_NUM_GOALS], sizeof(Goal));
}
