/* terraform: pufferlib/ocean/terraform (class Terraform).  num_agents dozers
 * (rows) per env; obs 2 * 11 * 11 + 5 + 36 * 2 float32 in [0, 1];
 * MultiDiscrete([5, 5, 3]) read as int32.  The class's map_size is the C
 * kwarg size, and must stay 64 (the obs and quadrant grid assume it).  Its
 * init seeds the terrain from the clock and pid: here the env's virtual ones,
 * derived from its seed, so a terraform env is reproducible in envd (never
 * equal to PufferLib's, which is not reproducible).  init writes a global:
 * envd inits terraform envs one at a time. */
#define ENVD_OCEAN_ENV "terraform"
/* Its obs is only written (c_reset's memset, compute_all_observations),
 * never read back: it writes its rows directly, in-process and in a daemon
 * (docs/ocean.md). */
#define ENVD_OCEAN_FLAGS (ENVD_ENV_SERIAL_INIT | ENVD_ENV_OBS_ROWS)

enum { P_NUM_AGENTS, P_MAP_SIZE, P_RESET_FREQUENCY, P_REWARD_SCALE };

static const envd_param_t ocean_params[] = {
    {"num_agents", ENVD_PARAM_INT, 8, 1, 8, "dozers per env (rows)"},
    {"map_size", ENVD_PARAM_INT, 64, 64, 64, "map side (cells)"},
    {"reset_frequency", ENVD_PARAM_INT, 8192, 64, 65536, "ticks between map resets"},
    {"reward_scale", ENVD_PARAM_FLOAT, 0.01, 0, 1, "scale of the dirt-moved reward"},
};

static void ocean_ckwargs(const double *p, envd_ocean_dict_t *kw)
{
    envd_ocean_dict_set(kw, "size", p[P_MAP_SIZE]);
    envd_ocean_dict_set(kw, "num_agents", p[P_NUM_AGENTS]);
    envd_ocean_dict_set(kw, "reset_frequency", p[P_RESET_FREQUENCY]);
    envd_ocean_dict_set(kw, "reward_scale", p[P_REWARD_SCALE]);
}

static int ocean_layout(const double *p, envd_ocean_layout_t *l)
{
    envd_ocean_flat_obs(l, 2 * 11 * 11 + 5 + 36 * 2, 0, 1);
    l->agents = (int32_t)p[P_NUM_AGENTS];
    l->act_kind = ENVD_SPACE_MULTI_DISCRETE;
    l->act_ndim = 1;
    l->act_shape[0] = 3;
    l->act_nvec[0] = 5;
    l->act_nvec[1] = 5;
    l->act_nvec[2] = 3;
    return ENVD_OK;
}

/* The bytes one env allocates itself (ocean_layout.h's envd_ocean_chunk):
 * init: orig_map, map, target_map of size^2 floats and grid_indices of
 * size^2 ints; with q = ((size + 10) / 11)^2 quadrants (as init computes it):
 * quadrant_centroids of 2q floats, five arrays of q, in_progress_quadrants of
 * q * (num_agents + 1) ints; agent_logs of num_agents Logs, dozers of
 * num_agents Dozers each with load_indices of (2 * SCOOP_SIZE + 1)^2 ints,
 * returns and stuck_count of num_agents. */
static uint64_t ocean_heap_bytes(const double *p)
{
    double s = p[P_MAP_SIZE], a = p[P_NUM_AGENTS];
    double side = (double)(((int64_t)s + 10) / 11), q = side * side;
    double scoop = (2 * SCOOP_SIZE + 1) * (2 * SCOOP_SIZE + 1);
    return 4 * envd_ocean_chunk(s * s, sizeof(float)) + envd_ocean_chunk(2 * q, sizeof(float)) +
           5 * envd_ocean_chunk(q, sizeof(float)) +
           envd_ocean_chunk(q * (a + 1), sizeof(int)) + envd_ocean_chunk(a, sizeof(Log)) +
           envd_ocean_chunk(a, sizeof(Dozer)) + (uint64_t)a * envd_ocean_chunk(scoop, sizeof(int)) +
           2 * envd_ocean_chunk(a, sizeof(float));
}
