/*
 * workers_check.c -- backend_workers.c on its own (REVIEW_ISSUE17.md items 2,
 * 4, 5, 9), built with -fsanitize=undefined by test_backend_workers.py:
 *
 *   - a reset mask is read as bytes (a client can write 2 or 255; read as C
 *     bool that is undefined behaviour, which UBSan reports);
 *   - a Discrete range check with a negative start never overflows (the
 *     element check of envd_action_check_t);
 *   - a send naming an env twice is refused with ENVD_EBUSY naming it;
 *   - a call that waits longer than timeout_ms for a worker that never
 *     answers SIGKILLs the workers and fails with ENVD_EENV (timed_out set);
 *   - the worker's acquire fence exists (the weakly ordered CPUs' half of
 *     the req/inputs handshake; x86 cannot show its absence);
 *   - with usable_cpus set, the parent that spins for a slow worker once
 *     another one finished (the free CPU) still sleeps and is woken by the
 *     slow worker's ack past ENVD_HOSTED_FREE_SPIN_NS, and still notices a
 *     worker that died mid-call;
 *   - the parent keeps the books by env_slot.h's rules over the raw outputs
 *     its (inline) worker writes (issue 39): the kind word of each step
 *     (NEXT_STEP's autoreset, SAME_STEP's flag), refusals before anything is
 *     asked and in the pool vec's order (per env: state, then action), the
 *     episode statistics and dones, flags written as any non-zero byte, a
 *     failed reset leaving its env never reset;
 *   - a multi-agent env's rows (agents > 1, rows i*A .. i*A + A - 1) kept as
 *     the pool vec keeps a C multi-agent env's (issue 39): a dead agent's
 *     row masked, its observation and reward zeroed and its final flags
 *     repeated; the env done once every agent is; NEXT_STEP's autoreset of
 *     the whole env, SAME_STEP's final observation (the rows of agents dead
 *     before the done step zeroed) and live rows after its reset.
 *
 * Prints "workers_check: ok" and exits 0, or names the failed check.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend_workers.h"
#include "envd.h"

#define N 4

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "workers_check: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

/* The segment's words and buffers, private here (the inline mode steps in
 * this process; the timeout check's worker never reads them). */
static uint8_t kind[N], seed_pending[N];
static uint32_t req[N], ack[N];
static int32_t status[N];
static uint64_t seeds[N];
static int64_t checked_actions[N], actions[N];
static double rewards[N], returns[N], times[N];
static int64_t lengths[N];
static bool terms[N], truncs[N], dones[N];
static envd_worker_ctl_t ctl[1];
/* What the inline worker answers a step of env i with (a reset: 0, false,
 * and next_status), and the kind words it was last asked. */
static double next_reward[N];
static unsigned char next_term[N];
static int32_t next_status[N];
static uint8_t asked[N];
/* Discrete(3, start=-1): the one element of each row in [-1, 1]. */
static const envd_action_check_t discrete_check = {
    .offset = 0, .low = -1, .high = 1, .size = sizeof(int64_t), .is_signed = 1};

/* Inline run: answer every request at once, as a worker: the raw outputs
 * of a step as next_* say (a reset's: 0, not terminated), status
 * next_status[i]; never truncated. */
static int run_inline(void *ctx)
{
    (void)ctx;
    for (int i = 0; i < N; i++) {
        if (ack[i] == req[i])
            continue;
        asked[i] = kind[i];
        const bool reset = kind[i] == ENVD_HOSTED_RESET;
        rewards[i] = reset ? 0.0 : next_reward[i];
        memset(&terms[i], reset ? 0 : next_term[i], 1); /* (any byte: numpy's, or not) */
        truncs[i] = false;
        status[i] = next_status[i];
        ack[i] = req[i];
    }
    return ENVD_OK;
}

static envd_workers_config_t config(int64_t num_workers, const int *pidfds, int64_t timeout_ms)
{
    return (envd_workers_config_t){
        .num_envs = N, .num_workers = num_workers, .ctl = ctl, .pidfds = pidfds,
        .kind = kind, .req = req, .ack = ack, .status = status, .seeds = seeds,
        .seed_pending = seed_pending, .checked_actions = checked_actions, .actions = actions,
        .action_bytes = sizeof(int64_t), .action_checks = &discrete_check,
        .num_action_checks = 1, .agents = 1, .rewards = rewards,
        .rows = {.terminations = terms, .truncations = truncs, .episode_returns = returns,
                 .episode_lengths = lengths, .episode_times = times, .dones = dones},
        .spin_ns = 0,
        .autoreset_mode = ENVD_AUTORESET_NEXT_STEP,
        .run_inline = num_workers == 0 ? run_inline : NULL, .timeout_ms = timeout_ms};
}

static void check_mask_bytes_and_actions(void)
{
    envd_workers_config_t cfg = config(0, NULL, 0);
    envd_backend_t *b;
    CHECK(envd_backend_workers_create(&b, &cfg) == ENVD_OK);
    const unsigned char mask_bytes[N] = {0, 2, 0, 255};
    bool mask[N];
    memcpy(mask, mask_bytes, sizeof mask); /* (what a client's bytes are, as bool) */
    CHECK(b->ops->reset(b->impl, NULL, mask) == ENVD_OK);
    CHECK(b->ops->reset_count(b->impl) == 2);
    CHECK(b->ops->reset(b->impl, NULL, NULL) == ENVD_OK);

    /* Discrete(3, start=-1): only -1, 0, 1; a - start overflowed near INT64_MAX. */
    const int64_t bad[] = {INT64_MAX, INT64_MIN, 2, -2};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        actions[0] = 0, actions[1] = bad[k], actions[2] = 1, actions[3] = -1;
        CHECK(b->ops->step(b->impl) == ENVD_ERANGE);
        CHECK(b->ops->error_index(b->impl) == 1);
    }
    actions[1] = 1;
    CHECK(b->ops->step(b->impl) == 0);

    /* A repeated id: refused whole, naming it; then the ids are free again. */
    envd_backend_batch_t *batch;
    CHECK(b->ops->batch_create(b->impl, &batch, N) == ENVD_OK);
    const int64_t twice[] = {2, 0, 2};
    CHECK(b->ops->batch_submit(b->impl, batch, twice, 3, 0) == ENVD_EBUSY);
    CHECK(b->ops->error_index(b->impl) == 2);
    const int64_t once[] = {2, 0};
    CHECK(b->ops->batch_submit(b->impl, batch, once, 2, 0) == ENVD_OK);
    CHECK(b->ops->batch_done(batch));
    CHECK(b->ops->batch_finish(b->impl, batch) == 0);
    b->ops->batch_destroy(b->impl, batch);
    b->ops->destroy(b);
}

/* A step of every env whose outputs say env `ends` terminates (-1: none),
 * each env's reward 0.5; returns the step's code. */
static int step_all(envd_backend_t *b, int ends)
{
    for (int i = 0; i < N; i++) {
        next_reward[i] = 0.5;
        next_term[i] = i == ends ? 2 : 0; /* (2: a flag byte need not be 1) */
        actions[i] = 0;
    }
    return b->ops->step(b->impl);
}

static void check_rules(int mode)
{
    memset(next_status, 0, sizeof next_status);
    envd_workers_config_t cfg = config(0, NULL, 0);
    cfg.autoreset_mode = mode;
    envd_backend_t *b;
    CHECK(envd_backend_workers_create(&b, &cfg) == ENVD_OK);
    uint32_t before[N];
    memcpy(before, req, sizeof before);
    /* A step before any reset: refused, nothing asked. */
    CHECK(step_all(b, -1) == ENVD_ESTATE);
    CHECK(b->ops->error_index(b->impl) == 0 && !b->ops->env_started(b->impl, 0));
    CHECK(memcmp(before, req, sizeof before) == 0);
    const bool first_two[N] = {true, true, false, false};
    CHECK(b->ops->reset(b->impl, NULL, first_two) == ENVD_OK);
    /* The vec's order, env by env, its state then its action: env 1's
     * action out of range is named before env 2, never reset. */
    actions[1] = 5;
    CHECK(b->ops->step(b->impl) == ENVD_ERANGE && b->ops->error_index(b->impl) == 1);
    actions[1] = 0;
    CHECK(b->ops->step(b->impl) == ENVD_ESTATE && b->ops->error_index(b->impl) == 2);
    CHECK(memcmp(before, req, sizeof before) != 0); /* (the reset asked envs 0 and 1) */
    /* A failed reset: its env stays never reset, the others start. */
    next_status[3] = ENVD_EENV;
    CHECK(b->ops->reset(b->impl, NULL, NULL) == ENVD_EENV);
    CHECK(b->ops->error_index(b->impl) == 3 && !b->ops->env_started(b->impl, 3));
    CHECK(b->ops->env_started(b->impl, 2));
    next_status[3] = 0;
    CHECK(b->ops->reset(b->impl, NULL, NULL) == ENVD_OK);
    for (int i = 0; i < N; i++)
        CHECK(rewards[i] == 0.0 && !terms[i] && !dones[i]);
    /* Three steps, env 1 terminating in the third. */
    const uint8_t step_kind =
        ENVD_HOSTED_STEP | (mode == ENVD_AUTORESET_SAME_STEP ? ENVD_HOSTED_RESET_IF_DONE : 0);
    CHECK(step_all(b, -1) == 0 && step_all(b, -1) == 0);
    CHECK(step_all(b, 1) == 1);
    for (int i = 0; i < N; i++) {
        CHECK(asked[i] == step_kind);
        CHECK(dones[i] == (i == 1) && terms[i] == (i == 1) && !truncs[i]);
        CHECK(returns[i] == (i == 1 ? 1.5 : 0.0) && lengths[i] == (i == 1 ? 3 : 0));
        CHECK(i == 1 ? times[i] >= 0.0 : times[i] == 0.0);
        CHECK(rewards[i] == 0.5);
    }
    if (mode == ENVD_AUTORESET_DISABLED) {
        CHECK(step_all(b, -1) == ENVD_ESTATE && b->ops->error_index(b->impl) == 1);
        const bool only_one[N] = {false, true, false, false};
        CHECK(b->ops->reset(b->impl, NULL, only_one) == ENVD_OK);
    }
    /* The next step: NEXT_STEP resets env 1 (reward 0, not done); SAME_STEP
     * (reset at once) and DISABLED (reset above) step it, its new episode's
     * first step. */
    CHECK(step_all(b, -1) == 0);
    CHECK(asked[1] == (mode == ENVD_AUTORESET_NEXT_STEP ? ENVD_HOSTED_RESET : step_kind));
    CHECK(asked[0] == step_kind && !dones[1] && returns[1] == 0.0 && lengths[1] == 0);
    CHECK(rewards[1] == (mode == ENVD_AUTORESET_NEXT_STEP ? 0.0 : 0.5));
    /* Env 1's next episode ends with its return and length counted from its
     * start: NEXT_STEP's autoreset step counts nothing. */
    const bool next_step = mode == ENVD_AUTORESET_NEXT_STEP;
    CHECK(step_all(b, 1) == 1);
    CHECK(dones[1] && lengths[1] == (next_step ? 1 : 2) && returns[1] == (next_step ? 0.5 : 1.0));
    b->ops->destroy(b);
}

static void check_timeout_kills_a_silent_worker(void)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) { /* a worker that never answers */
        for (;;)
            pause();
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    CHECK(pidfd >= 0);
    memset(ack, 0, sizeof ack), memset(req, 0, sizeof req);
    envd_workers_config_t cfg = config(1, &pidfd, 200);
    envd_backend_t *b;
    CHECK(envd_backend_workers_create(&b, &cfg) == ENVD_OK);
    CHECK(b->ops->reset(b->impl, NULL, NULL) == ENVD_EENV);
    CHECK(envd_backend_workers_timed_out(b));
    CHECK(envd_backend_workers_dead(b) == 0);
    CHECK(b->ops->reset(b->impl, NULL, NULL) == ENVD_EENV); /* and every call after */
    int wstatus;
    CHECK(waitpid(pid, &wstatus, 0) == pid);
    CHECK(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL);
    b->ops->destroy(b);
    close(pidfd);
}

/* The words two forked workers share with the parent (MAP_SHARED). */
typedef struct shared_words {
    envd_worker_ctl_t ctl[2];
    uint8_t kind[N], seed_pending[N];
    uint32_t req[N], ack[N];
    int32_t status[N];
    uint64_t seeds[N];
    int64_t checked_actions[N], actions[N];
    double rewards[N], returns[N], times[N];
    int64_t lengths[N];
    bool terms[N], truncs[N], dones[N];
} shared_words_t;

/* Worker w of two (envs [2w, 2w+2)): ack every request, the slow one
 * (w == 1) 20 ms late, until its `calls`-th wake, at which it exits without
 * acking (a death mid-call). */
static void two_workers_child(shared_words_t *s, int w, int calls)
{
    uint32_t seen = 0;
    for (int call = 1;; call++) {
        seen = envd_worker_wait(&s->ctl[w], seen, 0);
        if (call == calls)
            _exit(0);
        envd_worker_acquire();
        if (w == 1)
            nanosleep(&(struct timespec){.tv_nsec = 20000000}, NULL);
        for (int i = 2 * w; i < 2 * w + 2; i++) {
            s->rewards[i] = 0.0;
            s->terms[i] = s->truncs[i] = false;
            envd_worker_fence();
            __atomic_store_n(&s->ack[i], s->req[i], __ATOMIC_RELEASE);
        }
        envd_worker_done(&s->ctl[w]);
    }
}

static void check_free_spin_then_sleep(void)
{
    shared_words_t *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(s != MAP_FAILED);
    memset(s, 0, sizeof *s);
    pid_t pids[2];
    int pidfds[2];
    for (int w = 0; w < 2; w++) {
        pids[w] = fork();
        CHECK(pids[w] >= 0);
        if (pids[w] == 0)
            two_workers_child(s, w, w == 1 ? 3 : 1000);
        pidfds[w] = (int)syscall(SYS_pidfd_open, pids[w], 0);
        CHECK(pidfds[w] >= 0);
    }
    envd_workers_config_t cfg = {
        .num_envs = N, .num_workers = 2, .ctl = s->ctl, .pidfds = pidfds,
        .kind = s->kind, .req = s->req, .ack = s->ack, .status = s->status, .seeds = s->seeds,
        .seed_pending = s->seed_pending, .checked_actions = s->checked_actions,
        .actions = s->actions, .action_bytes = sizeof(int64_t), .agents = 1,
        .rewards = s->rewards,
        .rows = {.terminations = s->terms, .truncations = s->truncs,
                 .episode_returns = s->returns, .episode_lengths = s->lengths,
                 .episode_times = s->times, .dones = s->dones},
        .autoreset_mode = ENVD_AUTORESET_NEXT_STEP, .timeout_ms = 0, .usable_cpus = 2};
    envd_backend_t *b;
    CHECK(envd_backend_workers_create(&b, &cfg) == ENVD_OK);
    CHECK(b->ops->reset(b->impl, NULL, NULL) == ENVD_OK); /* worker 1: 20 ms after 0 */
    CHECK(b->ops->step(b->impl) == 0);
    CHECK(b->ops->step(b->impl) == ENVD_EENV); /* worker 1 exited on its 3rd wake */
    CHECK(envd_backend_workers_dead(b) == 1);
    CHECK(!envd_backend_workers_timed_out(b));
    b->ops->destroy(b);
    for (int w = 0; w < 2; w++) {
        syscall(SYS_pidfd_send_signal, pidfds[w], SIGKILL, NULL, 0);
        CHECK(waitpid(pids[w], NULL, 0) == pids[w]);
        close(pidfds[w]);
    }
    munmap(s, sizeof *s);
}

/* ---- a multi-agent env: MA_N envs of MA_A agents, an agent's observation
 * two doubles ---- */
#define MA_N 2
#define MA_A 3
#define MA_ROWS (MA_N * MA_A)
static uint8_t ma_kind[MA_N], ma_seed_pending[MA_N];
static uint32_t ma_req[MA_N], ma_ack[MA_N];
static int32_t ma_status[MA_N];
static uint64_t ma_seeds[MA_N];
static int64_t ma_checked[MA_ROWS], ma_actions[MA_ROWS];
static double ma_rewards[MA_ROWS], ma_returns[MA_ROWS], ma_times[MA_ROWS];
static int64_t ma_lengths[MA_ROWS];
static bool ma_terms[MA_ROWS], ma_truncs[MA_ROWS], ma_dones[MA_ROWS], ma_mask[MA_ROWS];
static double ma_obs[MA_ROWS][2], ma_final[MA_ROWS][2];
/* What the inline worker answers a step with, per row (as a worker hosting
 * a PettingZoo env writes every row it is asked: a dead agent's too, here,
 * so that the parent's zeroing shows), and the kind words it was asked. */
static unsigned char ma_next_term[MA_ROWS], ma_next_trunc[MA_ROWS];
static uint8_t ma_asked[MA_N];
static int ma_same_step;
/* The absent bytes (config absent) and what the inline worker writes there
 * with each reset it runs, per row (an agent absent from that reset). */
static uint8_t ma_absent[MA_ROWS], ma_next_absent[MA_ROWS];

static int run_inline_agents(void *ctx)
{
    (void)ctx;
    for (int i = 0; i < MA_N; i++) {
        if (ma_ack[i] == ma_req[i])
            continue;
        ma_asked[i] = ma_kind[i];
        const bool reset = ma_kind[i] == ENVD_HOSTED_RESET;
        bool done = !reset;
        for (int a = 0; a < MA_A; a++)
            done = done && (ma_next_term[i * MA_A + a] || ma_next_trunc[i * MA_A + a]);
        const bool reset_at_once =
            done && ma_same_step && (ma_kind[i] & ENVD_HOSTED_RESET_IF_DONE);
        for (int a = 0; a < MA_A; a++) {
            const int row = i * MA_A + a;
            if (reset || reset_at_once)
                ma_absent[row] = ma_next_absent[row];
            ma_rewards[row] = reset ? 0.0 : 0.5;
            memset(&ma_terms[row], reset ? 0 : ma_next_term[row], 1);
            memset(&ma_truncs[row], reset ? 0 : ma_next_trunc[row], 1);
            ma_obs[row][0] = ma_obs[row][1] = 1.0 + row;
            if (reset_at_once) {
                ma_final[row][0] = ma_final[row][1] = 1.0 + row; /* then reset at once */
                ma_obs[row][0] = ma_obs[row][1] = 100.0 + row;
            }
        }
        ma_status[i] = 0;
        ma_ack[i] = ma_req[i];
    }
    return ENVD_OK;
}

static envd_workers_config_t agents_config(int mode)
{
    return (envd_workers_config_t){
        .num_envs = MA_N, .agents = MA_A, .num_workers = 0, .ctl = ctl, .kind = ma_kind,
        .req = ma_req, .ack = ma_ack, .status = ma_status, .seeds = ma_seeds,
        .seed_pending = ma_seed_pending, .checked_actions = ma_checked, .actions = ma_actions,
        .action_bytes = MA_A * sizeof(int64_t), .rewards = ma_rewards,
        .rows = {.terminations = ma_terms, .truncations = ma_truncs,
                 .episode_returns = ma_returns, .episode_lengths = ma_lengths,
                 .episode_times = ma_times, .dones = ma_dones, .agent_mask = ma_mask},
        .observations = ma_obs, .final_observations = ma_final, .obs_bytes = sizeof ma_obs[0],
        .autoreset_mode = mode, .run_inline = run_inline_agents};
}

/* A step whose raw outputs flag (term, trunc) for these rows (0: none). */
static int agents_step(envd_backend_t *b, const unsigned char *term, const unsigned char *trunc)
{
    memcpy(ma_next_term, term, sizeof ma_next_term);
    memcpy(ma_next_trunc, trunc, sizeof ma_next_trunc);
    return b->ops->step(b->impl);
}

static void check_agent_rows(int mode)
{
    ma_same_step = mode == ENVD_AUTORESET_SAME_STEP;
    envd_workers_config_t cfg = agents_config(mode);
    envd_backend_t *b;
    /* a multi-agent env needs its mask and its observation leaf */
    cfg.rows.agent_mask = NULL;
    CHECK(envd_backend_workers_create(&b, &cfg) == ENVD_EINVAL);
    cfg = agents_config(mode);
    cfg.observations = NULL;
    CHECK(envd_backend_workers_create(&b, &cfg) == ENVD_EINVAL);
    cfg = agents_config(mode);
    cfg.agents = 0;
    CHECK(envd_backend_workers_create(&b, &cfg) == ENVD_EINVAL);
    /* one agent kept as agent rows (a PettingZoo env's) needs them too */
    cfg = agents_config(mode);
    cfg.agents = 1;
    cfg.agent_rows = true;
    cfg.action_bytes = sizeof(int64_t);
    cfg.rows.agent_mask = NULL;
    CHECK(envd_backend_workers_create(&b, &cfg) == ENVD_EINVAL);
    cfg.rows.agent_mask = ma_mask;
    CHECK(envd_backend_workers_create(&b, &cfg) == ENVD_OK);
    b->ops->destroy(b);
    cfg = agents_config(mode);
    CHECK(envd_backend_workers_create(&b, &cfg) == ENVD_OK);
    CHECK(b->ops->reset(b->impl, NULL, NULL) == ENVD_OK);
    for (int row = 0; row < MA_ROWS; row++)
        CHECK(ma_mask[row] && !ma_terms[row] && !ma_dones[row]);
    const unsigned char none[MA_ROWS] = {0};
    const unsigned char first[MA_ROWS] = {2}; /* env 0's agent 0 terminates (any byte) */
    CHECK(agents_step(b, none, none) == 0);
    CHECK(agents_step(b, first, none) == 1);
    CHECK(ma_terms[0] && ma_dones[0] && ma_mask[0] && ma_returns[0] == 1.0);
    CHECK(ma_lengths[0] == 2 && ma_rewards[0] == 0.5 && ma_obs[0][0] == 1.0);
    for (int row = 1; row < MA_ROWS; row++)
        CHECK(!ma_terms[row] && !ma_dones[row] && ma_mask[row] && ma_returns[row] == 0.0);
    /* its row is dead from now on: masked, observation and reward zeroed,
     * its final flags again, whatever the worker wrote there */
    CHECK(agents_step(b, none, none) == 0);
    CHECK(!ma_mask[0] && ma_terms[0] && !ma_truncs[0] && !ma_dones[0]);
    CHECK(ma_rewards[0] == 0.0 && ma_obs[0][0] == 0.0 && ma_obs[0][1] == 0.0);
    CHECK(ma_returns[0] == 0.0 && ma_lengths[0] == 0);
    CHECK(ma_mask[1] && ma_rewards[1] == 0.5 && ma_obs[1][0] == 2.0);
    const uint8_t step_kind =
        ENVD_HOSTED_STEP | (ma_same_step ? ENVD_HOSTED_RESET_IF_DONE : 0);
    CHECK(ma_asked[0] == step_kind);
    /* the others of env 0 truncate (the dead row's raw flags say done too,
     * as a worker's dropped agent's): env 0 is done, env 1 is not */
    const unsigned char rest[MA_ROWS] = {1, 1, 1};
    CHECK(agents_step(b, none, rest) == 2);
    CHECK(ma_truncs[1] && ma_truncs[2] && ma_dones[1] && ma_dones[2] && !ma_dones[0]);
    CHECK(ma_returns[1] == 2.0 && ma_lengths[1] == 4 && !ma_truncs[0] && ma_terms[0]);
    if (ma_same_step) {
        /* reset at once: the final observation as the pool's (the agent dead
         * before the step zeroed), every row live in the next episode */
        CHECK(ma_final[0][0] == 0.0 && ma_final[0][1] == 0.0 && ma_final[1][0] == 2.0);
        CHECK(ma_mask[0] && ma_mask[1] && ma_mask[2] && ma_obs[0][0] == 100.0);
        CHECK(agents_step(b, none, none) == 0);
        CHECK(ma_asked[0] == step_kind && ma_mask[0] && ma_rewards[0] == 0.5);
    } else {
        CHECK(!ma_mask[0] && ma_mask[1] && ma_obs[0][0] == 0.0);
        CHECK(agents_step(b, none, none) == 0); /* NEXT_STEP: the whole env resets */
        CHECK(ma_asked[0] == ENVD_HOSTED_RESET && ma_asked[1] == step_kind);
        for (int row = 0; row < MA_A; row++)
            CHECK(ma_mask[row] && ma_rewards[row] == 0.0 && !ma_terms[row] &&
                  !ma_truncs[row] && !ma_dones[row] && ma_obs[row][0] == 1.0 + row);
        CHECK(agents_step(b, first, none) == 1);
        CHECK(ma_dones[0] && ma_lengths[0] == 1 && ma_returns[0] == 0.5);
    }
    b->ops->destroy(b);
}

/* Agents absent at reset (config absent, the bytes a worker writes with
 * every reset): dead for the whole episode from the reset on (masked,
 * observation zeroed whatever the worker wrote, reward 0, truncated, no
 * statistics), the env done once the others are; live again at a reset
 * that finds them. */
static void check_absent_rows(int mode)
{
    ma_same_step = mode == ENVD_AUTORESET_SAME_STEP;
    envd_workers_config_t cfg = agents_config(mode);
    cfg.absent = ma_absent;
    envd_backend_t *b;
    CHECK(envd_backend_workers_create(&b, &cfg) == ENVD_OK);
    memset(ma_next_absent, 0, sizeof ma_next_absent);
    ma_next_absent[2] = 7; /* env 0's agent 2 (any byte) */
    CHECK(b->ops->reset(b->impl, NULL, NULL) == ENVD_OK);
    CHECK(ma_mask[0] && ma_mask[1] && !ma_mask[2] && ma_mask[3] && ma_mask[4] && ma_mask[5]);
    CHECK(ma_obs[2][0] == 0.0 && ma_obs[2][1] == 0.0 && ma_obs[3][0] == 4.0);
    const unsigned char none[MA_ROWS] = {0};
    /* the worker writes the absent row's raw outputs (even a done flag):
     * the parent's books say dead, truncated (its final flags) */
    const unsigned char stray[MA_ROWS] = {0, 0, 1};
    CHECK(agents_step(b, none, stray) == 0);
    CHECK(!ma_mask[2] && !ma_terms[2] && ma_truncs[2] && !ma_dones[2]);
    CHECK(ma_rewards[2] == 0.0 && ma_obs[2][0] == 0.0 && ma_rewards[1] == 0.5);
    /* env 0's present agents end: the env is done, 2 rows ended, not 3 */
    memset(ma_next_absent, 0, sizeof ma_next_absent);
    ma_next_absent[1] = 1; /* the next reset of env 0 misses agent 1 instead */
    const unsigned char ends[MA_ROWS] = {1, 1, 1};
    CHECK(agents_step(b, ends, none) == 2);
    CHECK(ma_dones[0] && ma_dones[1] && !ma_dones[2] && ma_returns[0] == 1.0);
    CHECK(!ma_terms[2] && ma_truncs[2] && ma_returns[2] == 0.0 && ma_lengths[2] == 0);
    if (ma_same_step) {
        /* reset at once: the step's rows are the next episode's, agent 1
         * dead in it; its row keeps this step's mask (it ended in it) */
        CHECK(ma_mask[0] && ma_mask[1] && ma_mask[2]);
        CHECK(ma_obs[1][0] == 0.0 && ma_obs[2][0] == 102.0 && ma_final[1][0] == 2.0);
        CHECK(ma_final[2][0] == 0.0);
    } else {
        if (mode == ENVD_AUTORESET_NEXT_STEP) {
            CHECK(agents_step(b, none, none) == 0); /* the whole env resets */
        } else { /* DISABLED: refused until the caller resets env 0 */
            CHECK(agents_step(b, none, none) == ENVD_ESTATE);
            const bool env0[MA_N] = {true, false};
            CHECK(b->ops->reset(b->impl, NULL, env0) == ENVD_OK);
        }
        CHECK(ma_asked[0] == ENVD_HOSTED_RESET);
        CHECK(ma_mask[0] && !ma_mask[1] && ma_mask[2] && ma_obs[1][0] == 0.0);
    }
    CHECK(agents_step(b, none, none) == 0);
    CHECK(!ma_mask[1] && ma_mask[2] && ma_rewards[1] == 0.0 && ma_rewards[2] == 0.5);
    memset(ma_next_absent, 0, sizeof ma_next_absent);
    b->ops->destroy(b);
}

int main(void)
{
    check_mask_bytes_and_actions();
    check_rules(ENVD_AUTORESET_NEXT_STEP);
    check_rules(ENVD_AUTORESET_SAME_STEP);
    check_rules(ENVD_AUTORESET_DISABLED);
    check_timeout_kills_a_silent_worker();
    check_free_spin_then_sleep();
    check_agent_rows(ENVD_AUTORESET_NEXT_STEP);
    check_agent_rows(ENVD_AUTORESET_SAME_STEP);
    check_absent_rows(ENVD_AUTORESET_NEXT_STEP);
    check_absent_rows(ENVD_AUTORESET_SAME_STEP);
    check_absent_rows(ENVD_AUTORESET_DISABLED);
    envd_worker_acquire(); /* (it links: the worker's fence exists) */
    puts("workers_check: ok");
    return 0;
}
