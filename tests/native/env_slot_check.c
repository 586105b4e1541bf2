/*
 * env_slot_check.c -- native/src/env_slot.{h,c} on its own: the per-env rules
 * called directly with made-up raw outputs (no env, no vec), each checked
 * against what gymnasium documents, not against envd's output.  Built plain
 * and with -fsanitize=address,undefined by test_env_slot.py.
 *
 * The expectations, from gymnasium 1.x's documentation:
 *  - TimeLimit: the step whose elapsed count reaches max_episode_steps
 *    returns truncated=True; an episode ends on terminated or truncated.
 *  - RecordEpisodeStatistics: at an episode's end, its return (the sum of
 *    its rewards), its length (its steps) and its wall time "t" (rounded to
 *    microseconds); vector envs report them where the episode ended, 0
 *    elsewhere.
 *  - Autoreset NEXT_STEP: the step after the one that ended the episode
 *    resets it, ignores its action and returns reward 0, not terminated,
 *    not truncated; SAME_STEP resets within the done step; DISABLED leaves
 *    the reset to the caller (stepping a done env is an error: envd's
 *    refusal, as stepping an env never reset is).
 *  - PettingZoo: an agent that ended is dead for the rest of the episode;
 *    envd.h ("Multi-agent envs") gives its row zero observation, reward 0,
 *    its final flags again and agent_mask false.
 *
 * Prints "env_slot_check: ok" and exits 0, or names the failed check.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env_slot.h"
#include "stress_check.h"

#define ROWS 8

/* Output rows for up to ROWS rows, filled with junk so that a row the rules
 * leave alone shows. */
typedef struct rows_store {
    float rewards[ROWS];
    bool terminations[ROWS], truncations[ROWS], dones[ROWS], agent_mask[ROWS];
    double episode_returns[ROWS], episode_times[ROWS], episode_log[ROWS * 4];
    int64_t episode_lengths[ROWS];
} rows_store_t;

static envd_slot_rows_t rows_of(rows_store_t *s)
{
    memset(s, 0x5a, sizeof *s);
    for (int r = 0; r < ROWS; r++)
        s->terminations[r] = s->truncations[r] = s->dones[r] = s->agent_mask[r] = true;
    return (envd_slot_rows_t){s->rewards, s->terminations, s->truncations, s->episode_returns,
                              s->episode_lengths, s->episode_times, s->dones, s->agent_mask,
                              s->episode_log};
}

/* The rules' config of an env kind. */
static envd_slot_config_t config_of(int64_t agents, int mode, int64_t max_steps,
                                    bool resets_itself, const char *const *fields,
                                    int num_fields)
{
    return (envd_slot_config_t){mode, max_steps, agents, resets_itself, fields, num_fields, false};
}

typedef struct fixture {
    rows_store_t store;
    envd_slot_books_t books;
    envd_env_slot_t slot[ROWS];
} fixture_t;

static void setup(fixture_t *f, int32_t agents, int mode, int64_t max_steps, int64_t num_envs)
{
    memset(f->slot, 0, sizeof f->slot);
    const envd_slot_config_t config = config_of(agents, mode, max_steps, false, NULL, 0);
    envd_slot_rows_t rows = rows_of(&f->store);
    CHECK(envd_slot_books_init(&f->books, &config, &rows, num_envs) == ENVD_OK, "books init");
}

/* One single-agent step of env i as the vec runs it (rules only): returns
 * whether the episode ended. */
static bool step(fixture_t *f, int64_t i, double reward, bool term, bool trunc,
                 envd_slot_clock_t *clock)
{
    envd_env_slot_t *slot = &f->slot[i];
    bool done = false;
    if (slot->needs_reset) {
        envd_slot_begin_episode(&f->books, slot, i, clock); /* NEXT_STEP's autoreset */
        reward = 0.0;
        term = trunc = false;
    } else {
        done = envd_slot_account_step(&f->books, slot, reward, term, &trunc);
    }
    envd_slot_write_row(&f->books, slot, i, reward, term, trunc, done, clock);
    if (done && envd_slot_resets_at_once(&f->books))
        envd_slot_begin_episode(&f->books, slot, i, clock);
    return done;
}

static void check_refusals_and_kinds(void)
{
    fixture_t f;
    envd_slot_clock_t clock = {10.0};
    /* never reset: refused in every mode */
    for (int mode = 0; mode <= 2; mode++) {
        setup(&f, 1, mode, 0, 1);
        CHECK(envd_slot_next(&f.books, &f.slot[0]) == ENVD_SLOT_REFUSED, "mode %d", mode);
        CHECK(envd_slot_startable(&f.books, &f.slot[0]) == ENVD_ESTATE, "mode %d", mode);
        CHECK(envd_slot_states_matter(&f.books, false), "an env never reset matters");
        CHECK(envd_slot_states_matter(&f.books, true) == (mode == ENVD_AUTORESET_DISABLED),
              "mode %d", mode);
        envd_slot_begin_episode(&f.books, &f.slot[0], 0, &clock);
        const int expected = ENVD_SLOT_STEP |
                             (mode == ENVD_AUTORESET_SAME_STEP ? ENVD_SLOT_RESET_IF_DONE : 0);
        CHECK(envd_slot_next(&f.books, &f.slot[0]) == expected, "mode %d", mode);
        CHECK(envd_slot_startable(&f.books, &f.slot[0]) == ENVD_OK, "mode %d", mode);
        CHECK(step(&f, 0, 1.0, true, false, &clock), "terminated ends the episode");
        const int after = envd_slot_next(&f.books, &f.slot[0]);
        if (mode == ENVD_AUTORESET_NEXT_STEP)
            CHECK(after == ENVD_SLOT_RESET, "next step: reset (%d)", after);
        else if (mode == ENVD_AUTORESET_SAME_STEP)
            CHECK(after == (ENVD_SLOT_STEP | ENVD_SLOT_RESET_IF_DONE), "reset at once (%d)", after);
        else
            CHECK(after == ENVD_SLOT_REFUSED && envd_slot_startable(&f.books, &f.slot[0]) ==
                                                    ENVD_ESTATE,
                  "disabled: a done env is refused (%d)", after);
        envd_slot_books_free(&f.books);
    }
    /* the workers' kind words equal the slot's (backend_workers.h) */
    CHECK(ENVD_SLOT_RESET == 1 && ENVD_SLOT_STEP == 2, "kind words");
}

static void check_time_limit_and_stats(void)
{
    fixture_t f;
    setup(&f, 1, ENVD_AUTORESET_NEXT_STEP, 3, 2);
    envd_slot_clock_t start = {100.0};
    envd_slot_begin_episode(&f.books, &f.slot[1], 1, &start);
    envd_slot_reset_rows(&f.books, 1);
    CHECK(f.store.rewards[1] == 0.0f && !f.store.terminations[1] && !f.store.truncations[1] &&
              !f.store.dones[1],
          "a reset's row");
    CHECK(f.store.rewards[0] != 0.0f, "a reset touches its own row only");
    const double rewards[3] = {1.0, 2.0, 0.5};
    for (int k = 0; k < 3; k++) {
        envd_slot_clock_t clock = {101.5};
        const bool last = k == 2;
        CHECK(((envd_slot_next(&f.books, &f.slot[1]) & ENVD_SLOT_LAST_STEP) != 0) == last,
              "step %d: the time limit's last step is flagged before it runs", k + 1);
        const bool done = step(&f, 1, rewards[k], false, false, &clock);
        CHECK(done == last, "step %d of 3: done %d", k + 1, done);
        CHECK(f.store.truncations[1] == last && !f.store.terminations[1], "step %d flags", k + 1);
        CHECK(f.store.rewards[1] == (float)rewards[k], "step %d reward", k + 1);
        CHECK(f.store.dones[1] == last, "step %d dones", k + 1);
        CHECK(f.store.episode_returns[1] == (last ? 3.5 : 0.0), "step %d return %g", k + 1,
              f.store.episode_returns[1]);
        CHECK(f.store.episode_lengths[1] == (last ? 3 : 0), "step %d length", k + 1);
        CHECK(f.store.episode_times[1] == (last ? 1.5 : 0.0), "step %d time %g", k + 1,
              f.store.episode_times[1]);
    }
    /* NEXT_STEP: the step after resets, reward 0, not done, statistics 0 */
    envd_slot_clock_t later = {200.25};
    CHECK(!step(&f, 1, 7.0, true, true, &later), "the autoreset step is not done");
    CHECK(f.store.rewards[1] == 0.0f && !f.store.terminations[1] && !f.store.truncations[1] &&
              !f.store.dones[1] && f.store.episode_returns[1] == 0.0 &&
              f.store.episode_lengths[1] == 0,
          "the autoreset step's row");
    CHECK(f.slot[1].elapsed_steps == 0 && f.books.episode_starts[1] == 200.25,
          "a new episode from the autoreset on");
    /* the env's own truncation ends an episode too; the time limit restarts */
    CHECK(step(&f, 1, -1.0, false, true, &later), "truncated by the env");
    CHECK(f.store.episode_returns[1] == -1.0 && f.store.episode_lengths[1] == 1, "one step");
    envd_slot_books_free(&f.books);

    /* no time limit: a long episode is never truncated */
    setup(&f, 1, ENVD_AUTORESET_NEXT_STEP, 0, 1);
    envd_slot_clock_t clock = {1.0};
    envd_slot_begin_episode(&f.books, &f.slot[0], 0, &clock);
    for (int k = 0; k < 10000; k++)
        CHECK(!step(&f, 0, 0.0, false, false, &clock) && !f.store.truncations[0], "step %d", k);
    envd_slot_books_free(&f.books);
}

static void check_same_step(void)
{
    fixture_t f;
    setup(&f, 1, ENVD_AUTORESET_SAME_STEP, 0, 1);
    envd_slot_clock_t clock = {5.0};
    envd_slot_begin_episode(&f.books, &f.slot[0], 0, &clock);
    CHECK(!step(&f, 0, 2.0, false, false, &clock), "going on");
    envd_slot_clock_t end = {5.000001};
    CHECK(step(&f, 0, 3.0, true, false, &end), "terminated");
    CHECK(f.store.terminations[0] && f.store.rewards[0] == 3.0f && f.store.dones[0],
          "the done step reports its own outcome");
    CHECK(f.store.episode_returns[0] == 5.0 && f.store.episode_lengths[0] == 2 &&
              f.store.episode_times[0] == 1e-6,
          "its statistics (time %.9f)", f.store.episode_times[0]);
    CHECK(!f.slot[0].needs_reset && f.slot[0].elapsed_steps == 0 &&
              f.slot[0].episode_return == 0.0,
          "reset within the step");
    CHECK(!step(&f, 0, 1.0, false, false, &end) && f.store.rewards[0] == 1.0f,
          "the next step steps the new episode");
    envd_slot_books_free(&f.books);
}

static void check_agents(void)
{
    fixture_t f;
    /* env 1 of 2, 3 agents (rows 3..5), time limit 3 */
    setup(&f, 3, ENVD_AUTORESET_NEXT_STEP, 3, 2);
    CHECK(f.books.agent_books != NULL, "agent books");
    envd_slot_clock_t clock = {50.0};
    envd_slot_begin_episode(&f.books, &f.slot[1], 1, &clock);
    envd_slot_reset_rows(&f.books, 1);
    for (int r = 3; r < 6; r++)
        CHECK(f.store.agent_mask[r] && !f.store.dones[r], "a reset's rows are live");
    unsigned char obs[3 * 2];
    memset(obs, 7, sizeof obs);
    bool all_done, limit;
    /* step 1: agent 0 terminates, agent 2 is truncated by the env */
    double reward[3] = {1.0, 2.0, 4.0};
    bool term[3] = {true, false, false}, trunc[3] = {false, false, true};
    limit = envd_slot_last_step(&f.books, &f.slot[1]);
    int64_t ended = envd_slot_finish_agent_rows(&f.books, &f.slot[1], 1, obs, 2, reward, term,
                                                trunc, &all_done, &clock);
    CHECK(!limit && ended == 2 && !all_done, "step 1: two agents end");
    CHECK(f.store.dones[3] && !f.store.dones[4] && f.store.dones[5], "step 1 dones");
    CHECK(f.store.episode_returns[3] == 1.0 && f.store.episode_lengths[3] == 1 &&
              f.store.episode_returns[4] == 0.0 && f.store.episode_returns[5] == 4.0,
          "step 1 statistics");
    /* step 2: the dead rows repeat their final flags; agent 1 goes on */
    double reward2[3] = {9.0, 0.5, 9.0};
    bool none[3] = {false, false, false}, all[3] = {true, false, true};
    limit = envd_slot_last_step(&f.books, &f.slot[1]);
    ended = envd_slot_finish_agent_rows(&f.books, &f.slot[1], 1, obs, 2, reward2, all, none,
                                        &all_done, &clock);
    CHECK(!limit && ended == 0 && !all_done, "step 2: nobody ends");
    CHECK(obs[0] == 0 && obs[1] == 0 && obs[2] == 7 && obs[4] == 0 && obs[5] == 0,
          "dead rows' observations zeroed, a live one's kept");
    CHECK(f.store.rewards[3] == 0.0f && f.store.terminations[3] && !f.store.truncations[3] &&
              !f.store.agent_mask[3] && !f.store.dones[3],
          "dead row 0: reward 0, its final flags, not live, not done again");
    CHECK(f.store.rewards[5] == 0.0f && !f.store.terminations[5] && f.store.truncations[5] &&
              !f.store.agent_mask[5],
          "dead row 2");
    CHECK(f.store.rewards[4] == 0.5f && f.store.agent_mask[4] && !f.store.terminations[4],
          "live row 1");
    /* step 3: the time limit truncates the last live agent: the env is done */
    limit = envd_slot_last_step(&f.books, &f.slot[1]);
    ended = envd_slot_finish_agent_rows(&f.books, &f.slot[1], 1, obs, 2, reward2, none, none,
                                        &all_done, &clock);
    CHECK(limit && ended == 1 && all_done, "step 3: the time limit ends agent 1");
    CHECK(f.store.truncations[4] && f.store.dones[4] && f.store.episode_returns[4] == 3.0 &&
              f.store.episode_lengths[4] == 3,
          "agent 1's episode: 2 + 0.5 + 0.5 over 3 steps (%g, %lld)",
          f.store.episode_returns[4], (long long)f.store.episode_lengths[4]);
    CHECK(f.slot[1].needs_reset && envd_slot_next(&f.books, &f.slot[1]) == ENVD_SLOT_RESET,
          "every agent done: the env needs its autoreset");
    /* NEXT_STEP's autoreset of the env: every row live, reward 0 */
    envd_slot_begin_episode(&f.books, &f.slot[1], 1, &clock);
    envd_slot_autoreset_agent_rows(&f.books, 1, &clock);
    for (int r = 3; r < 6; r++)
        CHECK(f.store.agent_mask[r] && f.store.rewards[r] == 0.0f && !f.store.dones[r] &&
                  !f.store.terminations[r] && f.store.episode_lengths[r] == 0,
              "row %d after the autoreset", r);
    CHECK(!f.books.agent_books[3].done && f.books.agent_books[3].episode_length == 0,
          "the agents' books start again");
    envd_slot_books_free(&f.books);
}

/* Agents absent at a reset (envd_slot_start_agent_rows, the workers
 * backend's): dead for the episode from the reset on, truncated from its
 * first step (a dead row's final flags), no statistics; the env done once
 * the others are; in the done step of a reset within it, a row whose agent
 * ended in that step keeps its mask.  And agent_rows: one agent
 * kept as a multi-agent env's rows (agent books, agent_mask). */
static void check_absent_agents(void)
{
    fixture_t f;
    setup(&f, 3, ENVD_AUTORESET_NEXT_STEP, 0, 2);
    envd_slot_clock_t clock = {60.0};
    envd_slot_begin_episode(&f.books, &f.slot[1], 1, &clock);
    envd_slot_reset_rows(&f.books, 1);
    unsigned char obs[3 * 2];
    memset(obs, 7, sizeof obs);
    const volatile unsigned char absent[3] = {0, 9, 0}; /* agent 1 (any byte) */
    envd_slot_start_agent_rows(&f.books, 1, absent, obs, 2, false);
    CHECK(f.store.agent_mask[3] && !f.store.agent_mask[4] && f.store.agent_mask[5],
          "the absent agent's row is masked from the reset on");
    CHECK(obs[0] == 7 && obs[2] == 0 && obs[3] == 0 && obs[4] == 7, "its observation zeroed");
    CHECK(!f.store.terminations[4] && !f.store.truncations[4], "its flags false");
    bool all_done;
    double reward[3] = {1.0, 5.0, 2.0};
    bool term[3] = {true, true, false}, none[3] = {false, false, false};
    int64_t ended = envd_slot_finish_agent_rows(&f.books, &f.slot[1], 1, obs, 2, reward, term,
                                                none, &all_done, &clock);
    CHECK(ended == 1 && !all_done, "agent 0 ends; the absent one does not (%lld)",
          (long long)ended);
    CHECK(!f.store.agent_mask[4] && !f.store.terminations[4] && f.store.truncations[4] &&
              !f.store.dones[4] && f.store.episode_returns[4] == 0.0 &&
              f.store.rewards[4] == 0.0f,
          "the absent row stays dead: truncated, reward 0, no statistics");
    bool last[3] = {false, false, true};
    ended = envd_slot_finish_agent_rows(&f.books, &f.slot[1], 1, obs, 2, reward, none, last,
                                        &all_done, &clock);
    CHECK(ended == 1 && all_done && f.slot[1].needs_reset,
          "the env is done once its present agents are");
    CHECK(!f.store.dones[4] && !f.store.terminations[4] && f.store.truncations[4],
          "the absent row never ends an episode (truncated, no statistics)");
    /* a reset within this done step (SAME_STEP) that misses agent 0, which
     * ended in an earlier step, and agent 2, which ended in this one: agent
     * 2's row keeps this step's mask, agent 0's (dead before) stays masked,
     * and the agent present again (1) is live */
    const volatile unsigned char next_absent[3] = {1, 0, 1};
    envd_slot_begin_episode(&f.books, &f.slot[1], 1, &clock);
    envd_slot_start_agent_rows(&f.books, 1, next_absent, obs, 2, true);
    CHECK(!f.store.agent_mask[3] && f.store.agent_mask[4] && f.store.agent_mask[5],
          "the done step's mask kept for the row that ended in it");
    envd_slot_books_free(&f.books);
    /* one agent with agent_rows: its books and mask as a multi-agent env's */
    envd_slot_config_t config = config_of(1, ENVD_AUTORESET_NEXT_STEP, 0, false, NULL, 0);
    const uint64_t without = envd_slot_books_bytes_per_env(&config);
    config.agent_rows = true;
    CHECK(envd_slot_books_bytes_per_env(&config) == without + sizeof(envd_agent_books_t),
          "agent_rows counts one agent's books");
    envd_slot_rows_t rows = rows_of(&f.store);
    memset(f.slot, 0, sizeof f.slot);
    CHECK(envd_slot_books_init(&f.books, &config, &rows, 2) == ENVD_OK, "books init");
    CHECK(f.books.agent_books != NULL, "one agent's books with agent_rows");
    envd_slot_begin_episode(&f.books, &f.slot[0], 0, &clock);
    envd_slot_reset_rows(&f.books, 0);
    bool one_term[1] = {true}, one_none[1] = {false};
    ended = envd_slot_finish_agent_rows(&f.books, &f.slot[0], 0, obs, 2, reward, one_term,
                                        one_none, &all_done, &clock);
    CHECK(ended == 1 && all_done && f.store.agent_mask[0] && f.store.dones[0],
          "its only agent ends the env");
    envd_slot_books_free(&f.books);
}

static void check_self_resetting(void)
{
    /* a log with the length but no return: the host sums returns */
    static const char *const fields[] = {"score", "episode_length"};
    rows_store_t store;
    const envd_slot_config_t config =
        config_of(1, ENVD_AUTORESET_NEXT_STEP, 0, true, fields, 2);
    envd_slot_rows_t rows = rows_of(&store);
    envd_slot_books_t books;
    CHECK(envd_slot_books_init(&books, &config, &rows, 3) == ENVD_OK, "books");
    CHECK(books.resets_itself && books.host_sums && books.num_log == 2 &&
              books.log_return == -1 && books.log_length == 1,
          "the log's fields");
    CHECK(envd_slot_books_bytes_per_env(&config) ==
              sizeof(double) + sizeof(bool) + sizeof(double) + sizeof(int64_t),
          "bytes per env");
    envd_slot_clock_t clock = {3.0};
    for (int64_t i = 0; i < 3; i++)
        books.episode_starts[i] = 1.0;
    /* the first step clears every env's rows, whatever they held */
    const double r1[1] = {1.5};
    const bool t0[1] = {false}, t1[1] = {true};
    envd_slot_self_reset_clear(&books, 2, 1);
    envd_slot_self_reset_outputs(&books, 2, 1, r1, t0);
    CHECK(!books.rows_set[2] && store.rewards[2] == 1.5f && !store.terminations[2] &&
              !store.truncations[2] && store.episode_returns[2] == 0.0 && !store.dones[2] &&
              store.episode_log[4] == 0.0 && store.episode_log[5] == 0.0,
          "cleared rows");
    CHECK(books.rows_set[1], "env 1 untouched");
    const double r2[1] = {2.0};
    envd_slot_self_reset_clear(&books, 2, 1);
    envd_slot_self_reset_outputs(&books, 2, 1, r2, t1);
    const double values[2] = {42.0, 2.4};
    CHECK(envd_slot_self_reset_ended(&books, 2, 1, values, &clock) == 1, "one row ended");
    CHECK(store.terminations[2] && store.dones[2] && store.episode_returns[2] == 3.5 &&
              store.episode_lengths[2] == 2 && store.episode_times[2] == 2.0 &&
              store.episode_log[4] == 42.0 && store.episode_log[5] == 2.4,
          "the ended episode: host's return 1.5 + 2, the log's length rounded");
    CHECK(books.sum_returns[2] == 0.0 && books.sum_lengths[2] == 0 &&
              books.episode_starts[2] == 3.0 && books.rows_set[2],
          "the next episode starts");
    envd_slot_self_reset_clear(&books, 2, 1);
    CHECK(!store.dones[2] && store.episode_returns[2] == 0.0 && store.episode_log[4] == 0.0,
          "the step after clears the ended episode's rows");
    /* rows of envs stepped together */
    const double many[3] = {1.0, 2.0, 3.0};
    envd_slot_self_reset_rewards(&books, 0, 3, many);
    CHECK(store.rewards[0] == 1.0f && store.rewards[2] == 3.0f && books.sum_returns[2] == 3.0 &&
              books.sum_lengths[1] == 1,
          "rewards and sums");
    envd_slot_books_free(&books);

    /* rounded; 0 for what is no length; a huge one capped, not overflowed */
    CHECK(envd_slot_as_length(2.6) == 3 && envd_slot_as_length(-1.0) == 0 &&
              envd_slot_as_length(NAN) == 0 && envd_slot_as_length(-INFINITY) == 0 &&
              envd_slot_as_length(1e30) >= INT64_C(9000000000000000000) &&
              envd_slot_as_length(INFINITY) >= INT64_C(9000000000000000000),
          "lengths from the log");
}

static void check_actions(void)
{
    envd_space_t d;
    memset(&d, 0, sizeof d);
    d.kind = ENVD_SPACE_DISCRETE;
    d.dtype = ENVD_DTYPE_INT64;
    d.n = 3;
    d.start = -1;
    const int64_t ok[] = {-1, 0, 1}, bad[] = {2, -2, INT64_MIN, INT64_MAX};
    for (size_t k = 0; k < COUNT(ok); k++)
        CHECK(envd_slot_action_in_space(&d, &ok[k]) == ENVD_OK, "%lld", (long long)ok[k]);
    for (size_t k = 0; k < COUNT(bad); k++)
        CHECK(envd_slot_action_in_space(&d, &bad[k]) == ENVD_ERANGE, "%lld", (long long)bad[k]);
    /* two agents' rows: the second one's bad action is found */
    const int64_t two[] = {0, 2};
    CHECK(envd_slot_actions_in_space(&d, 2, sizeof two, two) == ENVD_ERANGE, "agent 1");
    CHECK(envd_slot_actions_in_space(&d, 1, sizeof two[0], two) == ENVD_OK, "agent 0");

    envd_space_t md;
    memset(&md, 0, sizeof md);
    md.kind = ENVD_SPACE_MULTI_DISCRETE;
    md.dtype = ENVD_DTYPE_INT64;
    md.ndim = 1;
    md.shape[0] = 2;
    const int64_t nvec[2] = {2, 5}, starts[2] = {0, 10};
    md.nvec = nvec;
    md.nvec_start = starts;
    const int64_t md_ok[2] = {1, 14}, md_bad[2] = {1, 15}, md_low[2] = {0, 9};
    CHECK(envd_slot_action_in_space(&md, md_ok) == ENVD_OK, "multi-discrete in range");
    CHECK(envd_slot_action_in_space(&md, md_bad) == ENVD_ERANGE, "over the second's");
    CHECK(envd_slot_action_in_space(&md, md_low) == ENVD_ERANGE, "under the second's start");

    envd_space_t mb;
    memset(&mb, 0, sizeof mb);
    mb.kind = ENVD_SPACE_MULTI_BINARY;
    mb.dtype = ENVD_DTYPE_INT8;
    mb.ndim = 1;
    mb.shape[0] = 3;
    const int8_t mb_ok[3] = {0, 1, 1}, mb_bad[3] = {0, 2, 1};
    CHECK(envd_slot_action_in_space(&mb, mb_ok) == ENVD_OK, "binary");
    CHECK(envd_slot_action_in_space(&mb, mb_bad) == ENVD_ERANGE, "not binary");

    envd_space_t box;
    memset(&box, 0, sizeof box);
    box.kind = ENVD_SPACE_BOX;
    const double any = 1e300;
    CHECK(envd_slot_action_in_space(&box, &any) == ENVD_OK, "a Box action is passed as given");
}

/* A definition's config: ABI 5's fields read only from an ABI 5 definition. */
static void check_config_of(void)
{
    static const char *const fields[] = {"episode_return", "episode_length", "score"};
    envd_env_def_t def;
    memset(&def, 0, sizeof def);
    def.abi_version = 5;
    def.num_agents = 2;
    def.flags = ENVD_ENV_RESETS_ITSELF;
    def.episode_fields = fields;
    def.num_episode_fields = 3;
    envd_slot_config_t c = envd_slot_config_of(&def, ENVD_AUTORESET_NEXT_STEP, 0);
    CHECK(c.agents == 2 && c.resets_itself && c.num_episode_fields == 3 &&
              c.episode_fields == fields && c.autoreset_mode == ENVD_AUTORESET_NEXT_STEP,
          "an ABI 5 definition");
    /* its log has both: no host sums, so no sum arrays counted */
    CHECK(envd_slot_books_bytes_per_env(&c) ==
              sizeof(double) + sizeof(bool) + 2 * sizeof(envd_agent_books_t),
          "bytes of an env whose log has its return and length");
    def.abi_version = 4; /* the ABI 5 fields are not there to read */
    c = envd_slot_config_of(&def, ENVD_AUTORESET_SAME_STEP, 7);
    CHECK(!c.resets_itself && c.num_episode_fields == 0 && c.episode_fields == NULL &&
              c.max_episode_steps == 7 && c.autoreset_mode == ENVD_AUTORESET_SAME_STEP,
          "an ABI 4 definition");
}

int main(void)
{
    check_config_of();
    check_refusals_and_kinds();
    check_time_limit_and_stats();
    check_same_step();
    check_agents();
    check_absent_agents();
    check_self_resetting();
    check_actions();
    printf("env_slot_check: ok\n");
    return 0;
}
