/*
 * env_slot.c -- the per-env rules off the hot path: the books' set-up, the
 * action checks, resets' rows and a multi-agent env's rows; see env_slot.h.
 */
#include "env_slot.h"

#include <stdlib.h>

/* The index of the episode field called name, -1 without one. */
static int episode_field(const envd_slot_config_t *c, const char *name)
{
    for (int k = 0; k < c->num_episode_fields; k++)
        if (strcmp(c->episode_fields[k], name) == 0)
            return k;
    return -1;
}

/* An env that resets itself and whose log lacks its return or its length:
 * the host keeps running sums of its rows' episodes (books->host_sums). */
static bool keeps_sums(const envd_slot_config_t *c)
{
    return c->resets_itself &&
           (episode_field(c, "episode_return") < 0 || episode_field(c, "episode_length") < 0);
}

envd_slot_config_t envd_slot_config_of(const envd_env_def_t *def, int autoreset_mode,
                                       int64_t max_episode_steps)
{
    const envd_env_def_t *v5 = envd_env_def_v5(def);
    return (envd_slot_config_t){
        .autoreset_mode = autoreset_mode,
        .max_episode_steps = max_episode_steps,
        .agents = def->num_agents,
        .resets_itself = v5 && (v5->flags & ENVD_ENV_RESETS_ITSELF),
        .episode_fields = v5 ? v5->episode_fields : NULL,
        .num_episode_fields = v5 ? v5->num_episode_fields : 0,
    };
}

uint64_t envd_slot_books_bytes_per_env(const envd_slot_config_t *config)
{
    /* its episode's start, its rows_set flag, its rows' books (agents, sums) */
    uint64_t bytes = sizeof(double) + sizeof(bool);
    if (config->agents > 1 || config->agent_rows)
        bytes += (uint64_t)config->agents * sizeof(envd_agent_books_t);
    if (keeps_sums(config))
        bytes += (uint64_t)config->agents * (sizeof(double) + sizeof(int64_t));
    return bytes;
}

int envd_slot_books_init(envd_slot_books_t *books, const envd_slot_config_t *config,
                         const envd_slot_rows_t *rows, int64_t num_envs)
{
    const size_t n = (size_t)num_envs, A = (size_t)config->agents;
    *books = (envd_slot_books_t){
        .rows = *rows,
        .autoreset_mode = config->autoreset_mode,
        .max_episode_steps = config->max_episode_steps,
        .agents = config->agents,
        .resets_itself = config->resets_itself,
        .host_sums = keeps_sums(config),
        .num_log = config->num_episode_fields,
        .log_return = episode_field(config, "episode_return"),
        .log_length = episode_field(config, "episode_length"),
    };
    books->episode_starts = calloc(n, sizeof *books->episode_starts);
    if (!books->episode_starts)
        return ENVD_ENOMEM;
    if ((A > 1 || config->agent_rows) &&
        !(books->agent_books = calloc(n * A, sizeof *books->agent_books)))
        return ENVD_ENOMEM;
    if (books->host_sums) {
        books->sum_returns = calloc(n * A, sizeof *books->sum_returns);
        books->sum_lengths = calloc(n * A, sizeof *books->sum_lengths);
        if (!books->sum_returns || !books->sum_lengths)
            return ENVD_ENOMEM;
    }
    if (books->resets_itself) {
        /* whatever the rows hold, the first step writes every env's */
        books->rows_set = malloc(n * sizeof *books->rows_set);
        if (!books->rows_set)
            return ENVD_ENOMEM;
        memset(books->rows_set, true, n * sizeof *books->rows_set);
    }
    return ENVD_OK;
}

void envd_slot_books_free(envd_slot_books_t *books)
{
    free(books->episode_starts);
    free(books->agent_books);
    free(books->rows_set);
    free(books->sum_returns);
    free(books->sum_lengths);
    books->episode_starts = NULL;
    books->agent_books = NULL;
    books->rows_set = NULL;
    books->sum_returns = NULL;
    books->sum_lengths = NULL;
}

int envd_slot_action_in_space(const envd_space_t *as, const void *action)
{
    switch (as->kind) {
    case ENVD_SPACE_DISCRETE:
        return envd_in_discrete_range(*(const int64_t *)action, as->start, as->n) ? ENVD_OK
                                                                                  : ENVD_ERANGE;
    case ENVD_SPACE_MULTI_DISCRETE: {
        const int64_t *a = action;
        int64_t numel = envd_space_numel(as);
        for (int64_t k = 0; k < numel; k++)
            if (!envd_in_discrete_range(a[k], as->nvec_start ? as->nvec_start[k] : 0,
                                        as->nvec[k]))
                return ENVD_ERANGE;
        return ENVD_OK;
    }
    case ENVD_SPACE_MULTI_BINARY: {
        const int8_t *a = action;
        int64_t numel = envd_space_numel(as);
        for (int64_t k = 0; k < numel; k++)
            if (a[k] != 0 && a[k] != 1)
                return ENVD_ERANGE;
        return ENVD_OK;
    }
    default: return ENVD_OK;
    }
}

int envd_slot_actions_in_space(const envd_space_t *space, int64_t agents, size_t action_bytes,
                               const void *actions)
{
    const size_t one = action_bytes / (size_t)agents;
    for (int64_t a = 0; a < agents; a++) {
        int rc = envd_slot_action_in_space(space, (const unsigned char *)actions + (size_t)a * one);
        if (rc != ENVD_OK)
            return rc;
    }
    return ENVD_OK;
}

void envd_slot_reset_rows(const envd_slot_books_t *books, int64_t i)
{
    const envd_slot_rows_t *r = &books->rows;
    for (int64_t row = i * books->agents; row < (i + 1) * books->agents; row++) {
        if (r->rewards)
            r->rewards[row] = 0.0f;
        r->terminations[row] = false;
        r->truncations[row] = false;
        if (r->dones)
            r->dones[row] = false;
        if (books->agent_books)
            r->agent_mask[row] = true;
    }
}

/* Statistics of one agent's row: its return and live length if it ended in
 * this step, zeros otherwise. */
static void write_agent_stats(const envd_slot_books_t *books, int64_t row,
                              const envd_agent_books_t *agent, bool ended, double episode_start,
                              envd_slot_clock_t *clock)
{
    const envd_slot_rows_t *r = &books->rows;
    r->episode_returns[row] = ended ? agent->episode_return : 0.0;
    r->episode_lengths[row] = ended ? agent->episode_length : 0;
    if (r->episode_times)
        r->episode_times[row] =
            ended ? rint((envd_slot_clock_seconds(clock) - episode_start) * 1e6) / 1e6 : 0.0;
    if (r->dones)
        r->dones[row] = ended;
}

void envd_slot_autoreset_agent_rows(const envd_slot_books_t *books, int64_t i,
                                    envd_slot_clock_t *clock)
{
    const envd_slot_rows_t *r = &books->rows;
    const int64_t A = books->agents;
    for (int64_t row = i * A; row < (i + 1) * A; row++) {
        if (r->rewards)
            r->rewards[row] = 0.0f;
        r->terminations[row] = r->truncations[row] = false;
        r->agent_mask[row] = true;
        write_agent_stats(books, row, &books->agent_books[row], false, 0.0, clock);
    }
}

int64_t envd_slot_finish_agent_rows(const envd_slot_books_t *books, envd_env_slot_t *slot,
                                    int64_t i, unsigned char *obs, size_t one_obs,
                                    const double *reward, const bool *term, const bool *trunc,
                                    bool *all_done, envd_slot_clock_t *clock)
{
    const bool time_limit = envd_slot_last_step(books, slot);
    slot->elapsed_steps++;
    const envd_slot_rows_t *r = &books->rows;
    const int64_t A = books->agents;
    const double episode_start = books->episode_starts[i];
    int64_t ended_rows = 0;
    *all_done = true;
    for (int64_t a = 0; a < A; a++) {
        const int64_t row = i * A + a;
        envd_agent_books_t *agent = &books->agent_books[row];
        bool ended = false;
        if (agent->done) {
            memset(obs + (size_t)a * one_obs, 0, one_obs);
            if (r->rewards)
                r->rewards[row] = 0.0f;
            r->terminations[row] = agent->final_term;
            r->truncations[row] = agent->final_trunc;
            r->agent_mask[row] = false;
        } else {
            const bool t = term[a], u = trunc[a] || time_limit;
            agent->episode_return += reward[a];
            agent->episode_length++;
            if (r->rewards)
                r->rewards[row] = (float)reward[a];
            r->terminations[row] = t;
            r->truncations[row] = u;
            r->agent_mask[row] = true;
            ended = t || u;
            if (ended) {
                agent->done = true;
                agent->final_term = t;
                agent->final_trunc = u;
            }
        }
        write_agent_stats(books, row, agent, ended, episode_start, clock);
        ended_rows += ended;
        *all_done = *all_done && agent->done;
    }
    if (*all_done)
        slot->needs_reset = true;
    return ended_rows;
}

void envd_slot_live_rows(const envd_slot_books_t *books, int64_t i)
{
    for (int64_t row = i * books->agents; row < (i + 1) * books->agents; row++)
        books->rows.agent_mask[row] = true;
}

void envd_slot_start_agent_rows(const envd_slot_books_t *books, int64_t i,
                                const volatile unsigned char *absent, unsigned char *obs,
                                size_t one_obs, bool in_done_step)
{
    const int64_t A = books->agents;
    for (int64_t a = 0; a < A; a++) {
        const int64_t row = i * A + a;
        const bool gone = absent[a] != 0;
        /* (in the done step a row whose agent ended in it stays unmasked:
         * that step's transition is the learner's, whatever the next
         * episode holds for the agent) */
        books->rows.agent_mask[row] = !gone || (in_done_step && books->rows.agent_mask[row]);
        if (!gone)
            continue;
        envd_agent_books_t *agent = &books->agent_books[row];
        agent->done = true;
        /* truncated: a dead row repeats its final flags, and every row that
         * dies says so in them (an env is done when all its rows are
         * flagged, as for an agent the env dropped without a flag) */
        agent->final_term = false;
        agent->final_trunc = true;
        memset(obs + (size_t)a * one_obs, 0, one_obs);
    }
}
