/*
 * backend_workers.c -- the worker-process backend (see backend_workers.h for
 * the shared-memory protocol).  The parent side: copy and check the inputs,
 * post requests, wake workers, wait for acks, notice dead workers, and keep
 * the envs' books by the rules of env_slot.h.
 */
#define _GNU_SOURCE
#include "backend_workers.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "env_slot.h"
#include "envd.h"
#include "futex.h"
#include "pool.h" /* ENVD_JOB_NOTIFY */

/* The kind words are envd_slot_next's answers (what the workers read). */
_Static_assert(ENVD_HOSTED_RESET == ENVD_SLOT_RESET, "a reset's kind word");
_Static_assert(ENVD_HOSTED_STEP == ENVD_SLOT_STEP, "a step's kind word");
_Static_assert(ENVD_HOSTED_RESET_IF_DONE == ENVD_SLOT_RESET_IF_DONE, "same step's flag");

struct envd_backend_batch {
    struct workers_backend *backend; /* (batch_done gets only the batch) */
    int64_t capacity;
    int64_t count;
    int64_t ids[];
};

typedef struct workers_backend {
    envd_backend_t base;
    envd_workers_config_t cfg;
    int *pidfds;        /* private copy */
    int *pids;          /* private copy (0: unknown) */
    envd_workers_leaf_t *leaves; /* private copy: cfg.num_inputs inputs, then outputs */
    int64_t *worker_of; /* env -> worker */
    bool *mask;         /* private copy of the last reset's mask */
    /* The envs' books (env_slot.h), the parent's alone: a step is checked
     * against them before anything is asked (a refused step changes
     * nothing, as the pool vec's), and only the acks of a reset or step
     * change them.  No time limit: a hosted env's is its own (gymnasium's
     * TimeLimit wrapper truncates inside env.step, as SyncVectorEnv's envs). */
    envd_env_slot_t *slots;
    envd_slot_books_t books;
    bool *touched;      /* scratch: the workers a call asks something of */
    envd_action_check_t *checks; /* private copy of cfg.action_checks */
    bool *in_batch;     /* scratch: the envs of the send being checked (all false between calls) */
    int64_t reset_count;
    int64_t error_index;
    int64_t dead;       /* a worker that died, -1 */
    bool timed_out;     /* a wait ran past cfg.timeout_ms and killed every worker */
    bool step_pending;
} workers_backend_t;

static int64_t slice_begin(const workers_backend_t *b, int64_t w)
{
    return w * b->cfg.num_envs / b->cfg.num_workers;
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* ---- the parent side ---- */

static bool acked(const workers_backend_t *b, int64_t i)
{
    return atomic_load_explicit((_Atomic uint32_t *)&b->cfg.ack[i], memory_order_acquire) ==
           b->cfg.req[i];
}

/* Has worker w exited?  (Its pidfd polls readable.)  Remembered. */
static bool worker_dead(workers_backend_t *b, int64_t w)
{
    if (b->dead >= 0)
        return true;
    struct pollfd p = {.fd = b->pidfds[w], .events = POLLIN};
    if (poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL))) {
        b->dead = w;
        return true;
    }
    return false;
}

/* Copy env i's row of every input leaf from the client's buffer into the
 * segment (before anything checks it: the client may rewrite its buffer at
 * any time, the segment only the daemon writes). */
static void copy_inputs(const workers_backend_t *b, int64_t i)
{
    for (int64_t k = 0; k < b->cfg.num_inputs; k++) {
        const envd_workers_leaf_t *leaf = &b->leaves[k];
        const size_t row = (size_t)leaf->row_bytes;
        memcpy((unsigned char *)leaf->segment + (size_t)i * row,
               (const unsigned char *)leaf->client + (size_t)i * row, row);
    }
}

/* Copy env i's row of every output leaf from the segment into the client's
 * buffer (i acked: its worker no longer writes it).  A leaf with a used
 * count (the info slots) copies only that many bytes of its row, read once
 * from the segment (which only the daemon and its workers write) and
 * clamped to the row: an empty info costs nothing per step. */
static void copy_outputs(const workers_backend_t *b, int64_t i)
{
    const envd_workers_leaf_t *outputs = b->leaves + b->cfg.num_inputs;
    for (int64_t k = 0; k < b->cfg.num_outputs; k++) {
        const size_t row = (size_t)outputs[k].row_bytes;
        size_t bytes = row;
        if (outputs[k].used != NULL) {
            const uint32_t used = ((const volatile uint32_t *)outputs[k].used)[i];
            bytes = used < row ? (size_t)used : row;
        }
        memcpy((unsigned char *)outputs[k].client + (size_t)i * row,
               (const unsigned char *)outputs[k].segment + (size_t)i * row, bytes);
    }
}

/* SIGKILL every worker (through its pidfd: no pid can have been reused). */
static void kill_workers(workers_backend_t *b)
{
    for (int64_t w = 0; w < b->cfg.num_workers; w++)
        syscall(SYS_pidfd_send_signal, b->pidfds[w], SIGKILL, NULL, 0);
}

/* Ask env i for kind (the caller has written its inputs). */
static void request(workers_backend_t *b, int64_t i, uint8_t kind)
{
    b->cfg.kind[i] = kind;
    b->cfg.status[i] = 0;
    atomic_store_explicit((_Atomic uint32_t *)&b->cfg.req[i], b->cfg.req[i] + 1,
                          memory_order_release);
}

/* Wake the workers in touched (num_workers flags), or run inline. */
static int wake(workers_backend_t *b, const bool *touched)
{
    if (b->cfg.num_workers == 0)
        return b->cfg.run_inline(b->cfg.inline_ctx);
    for (int64_t w = 0; w < b->cfg.num_workers; w++) {
        if (!touched[w])
            continue;
        envd_worker_ctl_t *ctl = &b->cfg.ctl[w];
        atomic_fetch_add(&ctl->cmd_seq, 1);
        if (atomic_load(&ctl->worker_sleeping))
            envd_futex_wake(&ctl->cmd_seq, 1, ENVD_FUTEX_SHARED);
    }
    return ENVD_OK;
}

/* First env of ids (NULL: all) not acked yet, or -1.  A dead worker counts
 * as done (its envs fail at finish). */
static int64_t first_pending(workers_backend_t *b, const int64_t *ids, int64_t count)
{
    for (int64_t k = 0; k < count; k++) {
        int64_t i = ids ? ids[k] : k;
        if (!acked(b, i))
            return worker_dead(b, b->worker_of[i]) ? -1 : i;
    }
    return -1;
}

/* Workers with an env of ids[from..count) not acked yet (an upper bound:
 * a worker whose envs are not consecutive in ids counts once per run). */
static int64_t busy_workers(const workers_backend_t *b, const int64_t *ids, int64_t from,
                            int64_t count)
{
    int64_t busy = 0, last = -1;
    for (int64_t k = from; k < count; k++) {
        int64_t i = ids ? ids[k] : k;
        if (b->worker_of[i] != last && !acked(b, i)) {
            busy++;
            last = b->worker_of[i];
        }
    }
    return busy;
}

/* Block until every env of ids is acked or a worker it waits for died.
 * Acked envs stay acked while the caller waits, so one pass over ids does;
 * a worker's pidfd is polled only after a futex wait came back without the
 * env's ack (a wake-up or the ENVD_HOSTED_POLL_MS timeout).  A wait longer
 * than cfg.timeout_ms (a hung env) kills every worker, then ends as a dead
 * worker's does (its pidfd polls readable once the SIGKILL landed). */
static void wait_envs(workers_backend_t *b, const int64_t *ids, int64_t count)
{
    if (b->cfg.num_workers == 0)
        return;
    const double start = now_ns();
    const double deadline = start + (double)b->cfg.timeout_ms * 1e6;
    double free_spin_end = 0; /* set when a worker first finished */
    double spin_until = start + (double)b->cfg.spin_ns;
    /* (the workers this wait began with: one that finished since left its CPU) */
    const int64_t first_busy = b->cfg.usable_cpus > 0 ? busy_workers(b, ids, 0, count) : 0;
    for (int64_t k = 0; k < count;) {
        int64_t i = ids ? ids[k] : k;
        if (acked(b, i)) {
            k++;
            continue;
        }
        double now = now_ns();
        if (now < spin_until) {
            cpu_relax();
            continue;
        }
        /* A worker of this wait finished (and sleeps: the parent, woken by
         * it, runs on the CPU it left) and the workers still stepping leave
         * that CPU to the parent: spin on it a while (the last ack then
         * costs no wake-up on the step's critical path), asking again every
         * 2 us (the scan is O(count)).  Never before a worker finished: on
         * a loaded machine a CPU counted free may be another process's. */
        if (first_busy > 1 && (free_spin_end == 0 || now < free_spin_end)) {
            const int64_t busy = busy_workers(b, ids, k, count);
            if (busy < first_busy && busy + 1 <= b->cfg.usable_cpus) {
                if (free_spin_end == 0)
                    free_spin_end = now + ENVD_HOSTED_FREE_SPIN_NS;
                spin_until = now + 2000.0;
                continue;
            }
        }
        int64_t w = b->worker_of[i];
        envd_worker_ctl_t *ctl = &b->cfg.ctl[w];
        uint32_t seen = atomic_load(&ctl->done_seq);
        atomic_store(&ctl->parent_sleeping, 1);
        if (!acked(b, i))
            envd_futex_wait(&ctl->done_seq, seen, ENVD_HOSTED_POLL_MS * 1000000LL,
                            ENVD_FUTEX_SHARED);
        atomic_store(&ctl->parent_sleeping, 0);
        if (!acked(b, i) && worker_dead(b, w))
            return; /* its envs fail at finish */
        if (b->cfg.timeout_ms > 0 && !b->timed_out && now_ns() >= deadline) {
            b->timed_out = true;
            kill_workers(b);
        }
    }
}

/* Env i's agent rows (A > 1, or agent_rows) as its reset (of any kind)
 * leaves them: live, but those of agents its worker found absent from it;
 * in_done_step: SAME_STEP's reset within the step that ended the episode
 * (envd_slot_start_agent_rows). */
static void start_agent_rows(workers_backend_t *b, int64_t i, bool in_done_step)
{
    const int64_t A = b->cfg.agents;
    if (b->cfg.absent == NULL) {
        envd_slot_live_rows(&b->books, i);
        return;
    }
    const size_t one_obs = (size_t)b->cfg.obs_bytes;
    envd_slot_start_agent_rows(&b->books, i,
                               (const volatile unsigned char *)b->cfg.absent + i * A,
                               (unsigned char *)b->cfg.observations + (size_t)(i * A) * one_obs,
                               one_obs, in_done_step);
}

/* The rows of env i (A > 1 agents) after a step its worker acked: the
 * rules of a multi-agent env over the raw outputs of its A rows, as vec.c's
 * step_multi_agent_env (dead rows' observations and rewards zeroed, their
 * final flags again).  Returns the rows whose agent ended in this step. */
static int64_t apply_agent_rules(workers_backend_t *b, int64_t i, envd_slot_clock_t *clock)
{
    const envd_slot_books_t *books = &b->books;
    envd_env_slot_t *slot = &b->slots[i];
    const int64_t A = b->cfg.agents;
    const size_t one_obs = (size_t)b->cfg.obs_bytes;
    /* A <= ENVD_MAX_AGENTS: at most 40 KiB on the caller's stack.  Each
     * read once, the flags as bytes (numpy wrote them). */
    double reward[A];
    bool term[A], trunc[A];
    for (int64_t a = 0; a < A; a++) {
        const int64_t row = i * A + a;
        reward[a] = ((const volatile double *)b->cfg.rewards)[row];
        term[a] = ((const volatile unsigned char *)books->rows.terminations)[row] != 0;
        trunc[a] = ((const volatile unsigned char *)books->rows.truncations)[row] != 0;
    }
    /* A SAME_STEP step that ends the env's episode (every agent ended
     * before or in it: the worker decides by the same rule, over the same
     * flag bytes) was reset at once by the worker: the observation leaf
     * holds the next episode's, and the dead rows to zero are those of the
     * final observation (vec.c zeroes them before it copies the final
     * observation and resets). */
    bool reset_at_once = envd_slot_resets_at_once(books);
    for (int64_t a = 0; a < A && reset_at_once; a++)
        reset_at_once = books->agent_books[i * A + a].done || term[a] || trunc[a];
    unsigned char *obs = reset_at_once ? b->cfg.final_observations : b->cfg.observations;
    bool all_done;
    const int64_t ended =
        envd_slot_finish_agent_rows(books, slot, i, obs + (size_t)(i * A) * one_obs, one_obs,
                                    reward, term, trunc, &all_done, clock);
    for (int64_t row = i * A; row < (i + 1) * A; row++)
        if (!books->rows.agent_mask[row])
            b->cfg.rewards[row] = 0.0;
    if (reset_at_once) {
        envd_slot_begin_episode(books, slot, i, clock);
        start_agent_rows(b, i, true); /* the reset's rows are the next episode's */
    }
    return ended;
}

/* Env i's books and rows after its worker acked a reset (step false) or a
 * step of it without a failure: the rules of env_slot.h over the raw
 * outputs the worker wrote.  What the step was is what envd_slot_next says
 * now (it asked the same when the step was submitted, and only an ack
 * changes the slot).  Returns the rows whose episode ended (an env of one
 * agent: whether its episode ended). */
static int64_t apply_rules(workers_backend_t *b, int64_t i, bool step, envd_slot_clock_t *clock)
{
    const envd_slot_books_t *books = &b->books;
    envd_env_slot_t *slot = &b->slots[i];
    const bool agents = books->agent_books != NULL; /* (agents > 1, or agent_rows) */
    if (!step) {
        envd_slot_begin_episode(books, slot, i, clock);
        envd_slot_reset_rows(books, i);
        if (agents)
            start_agent_rows(b, i, false);
        return 0;
    }
    if (envd_slot_next(books, slot) == ENVD_SLOT_RESET) { /* NEXT_STEP's autoreset */
        envd_slot_begin_episode(books, slot, i, clock);
        if (agents) {
            envd_slot_autoreset_agent_rows(books, i, clock);
            start_agent_rows(b, i, false);
        } else {
            envd_slot_write_outcome(books, slot, i, false, false, false, clock);
        }
        return 0;
    }
    if (agents)
        return apply_agent_rules(b, i, clock);
    /* Each read once, the flags as bytes (numpy wrote them). */
    const double reward = ((const volatile double *)b->cfg.rewards)[i];
    const bool term = ((const volatile unsigned char *)books->rows.terminations)[i] != 0;
    bool trunc = ((const volatile unsigned char *)books->rows.truncations)[i] != 0;
    const bool done = envd_slot_account_step(books, slot, reward, term, &trunc);
    envd_slot_write_outcome(books, slot, i, term, trunc, done, clock);
    if (done && envd_slot_resets_at_once(books)) /* the worker reset it at once */
        envd_slot_begin_episode(books, slot, i, clock);
    return done;
}

/* After a wait: ENVD_EENV naming the first failed env of ids (or the first
 * env of a dead worker), else the number of rows of ids' envs whose episode
 * ended (an env of one agent: a row).
 * Keeps the books of every acked env of ids (steps: a step's; else the
 * masked envs of a reset).  A failed reset leaves its env never reset; a
 * failed step leaves its env needing a reset (the worker may have failed
 * after env.step ended the episode -- a same-step reset that raised, an
 * info too big -- and an env that raised is in no known state), so the
 * next step autoresets it, or is refused under DISABLED until a reset, as
 * the pool's books do. */
static int finish_envs(workers_backend_t *b, const int64_t *ids, int64_t count, bool steps)
{
    int64_t done = 0;
    int rc = ENVD_OK;
    envd_slot_clock_t clock = {0};
    for (int64_t k = 0; k < count; k++) {
        int64_t i = ids ? ids[k] : k;
        if (!steps && !b->mask[i])
            continue;
        if (!acked(b, i))
            continue; /* (its worker died: ENVD_EENV below) */
        /* Read once, after the ack's acquire; the worker (the env's own
         * Python) may have written any word there: whatever is not 0 is the
         * env's failure, never a count or another code to pass on. */
        const bool failed = ((const volatile int32_t *)b->cfg.status)[i] != 0;
        if (failed && rc == ENVD_OK) {
            b->error_index = i;
            rc = ENVD_EENV;
        }
        if (!failed)
            done += apply_rules(b, i, steps, &clock);
        else if (steps)
            b->slots[i].needs_reset = true;
        else
            b->slots[i].started = false;
        copy_outputs(b, i);
    }
    if (b->dead >= 0) {
        b->error_index = slice_begin(b, b->dead);
        return ENVD_EENV;
    }
    return rc != ENVD_OK ? rc : (int)done;
}

/* Does the element check c names lie in its bounds?  (Read from the
 * private row: an unsigned value above INT64_MAX is out of any bounds.) */
static bool action_in_range(const unsigned char *row, const envd_action_check_t *c)
{
    int64_t v;
    if (c->size == 1) {
        v = c->is_signed ? (int64_t)(int8_t)row[c->offset] : (int64_t)row[c->offset];
    } else if (c->size == 2) {
        uint16_t u;
        memcpy(&u, row + c->offset, sizeof u);
        v = c->is_signed ? (int64_t)(int16_t)u : (int64_t)u;
    } else if (c->size == 4) {
        uint32_t u;
        memcpy(&u, row + c->offset, sizeof u);
        v = c->is_signed ? (int64_t)(int32_t)u : (int64_t)u;
    } else {
        uint64_t u;
        memcpy(&u, row + c->offset, sizeof u);
        if (!c->is_signed && u > (uint64_t)INT64_MAX)
            return false;
        v = (int64_t)u;
    }
    return v >= c->low && v <= c->high;
}

/* For each env of ids (NULL: all) in turn, as the pool vec checks them:
 * refuse it (ENVD_ESTATE) if its state refuses a step (never reset, or done
 * in DISABLED mode), else copy its inputs, then its actions, into the
 * segment and check the copy's integer elements (ENVD_ERANGE); the first
 * refused env is named. */
static int take_inputs(workers_backend_t *b, const int64_t *ids, int64_t count)
{
    const size_t row = (size_t)b->cfg.action_bytes;
    for (int64_t k = 0; k < count; k++) {
        int64_t i = ids ? ids[k] : k;
        if (envd_slot_startable(&b->books, &b->slots[i]) != ENVD_OK) {
            b->error_index = i;
            return ENVD_ESTATE;
        }
        copy_inputs(b, i);
        unsigned char *dst = (unsigned char *)b->cfg.checked_actions + (size_t)i * row;
        memcpy(dst, (const unsigned char *)b->cfg.actions + (size_t)i * row, row);
        for (int64_t c = 0; c < b->cfg.num_action_checks; c++) {
            if (!action_in_range(dst, &b->checks[c])) {
                b->error_index = i;
                return ENVD_ERANGE;
            }
        }
    }
    return ENVD_OK;
}

/* Post a step of ids (NULL: all), each env's kind word what envd_slot_next
 * says, and wake their workers; notify: they write the notify eventfd once
 * done. */
static int submit_steps(workers_backend_t *b, const int64_t *ids, int64_t count, bool notify)
{
    b->error_index = -1;
    if (b->dead >= 0)
        return finish_envs(b, NULL, 0, false);
    int rc = take_inputs(b, ids, count);
    if (rc != ENVD_OK)
        return rc;
    bool *touched = b->touched;
    memset(touched, 0, (size_t)(b->cfg.num_workers + 1) * sizeof *touched);
    for (int64_t k = 0; k < count; k++) {
        int64_t i = ids ? ids[k] : k;
        request(b, i, (uint8_t)envd_slot_next(&b->books, &b->slots[i]));
        touched[b->worker_of[i]] = true;
    }
    if (notify) /* before wake's cmd_seq bump: the worker takes it when it wakes */
        for (int64_t w = 0; w < b->cfg.num_workers; w++)
            if (touched[w])
                atomic_store(&b->cfg.ctl[w].notify, 1);
    return wake(b, touched);
}

static void seed(void *impl, const uint64_t *seeds)
{
    workers_backend_t *b = impl;
    for (int64_t i = 0; i < b->cfg.num_envs; i++) {
        b->cfg.seeds[i] = seeds[i];
        b->cfg.seed_pending[i] = 1;
    }
}

static int reset(void *impl, const uint64_t *seeds, const bool *mask)
{
    workers_backend_t *b = impl;
    const int64_t n = b->cfg.num_envs;
    b->error_index = -1;
    if (b->dead >= 0)
        return finish_envs(b, NULL, 0, false);
    /* The private copy, then only it.  Each byte read once, as a byte: the
     * mask may lie in a client's shared memory (any value, rewritten at any
     * time), and a C bool holding anything but 0 or 1 is undefined. */
    const volatile unsigned char *bytes = (const volatile unsigned char *)mask;
    for (int64_t i = 0; i < n; i++)
        b->mask[i] = bytes == NULL || bytes[i] != 0;
    bool *touched = b->touched;
    memset(touched, 0, (size_t)(b->cfg.num_workers + 1) * sizeof *touched);
    b->reset_count = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!b->mask[i])
            continue;
        if (seeds != NULL) {
            b->cfg.seeds[i] = seeds[i];
            b->cfg.seed_pending[i] = 1;
        }
        request(b, i, ENVD_HOSTED_RESET);
        touched[b->worker_of[i]] = true;
        b->reset_count++;
    }
    if (b->reset_count == 0)
        return ENVD_OK;
    int rc = wake(b, touched);
    if (rc != ENVD_OK)
        return rc;
    wait_envs(b, NULL, n);
    for (int64_t i = 0; i < n; i++)
        if (!b->mask[i])
            b->cfg.status[i] = 0;
    rc = finish_envs(b, NULL, n, false); /* (its books: the masked envs only) */
    return rc < 0 ? rc : ENVD_OK;
}

static int64_t reset_count(const void *impl) { return ((const workers_backend_t *)impl)->reset_count; }

static int step_submit(void *impl)
{
    workers_backend_t *b = impl;
    int rc = submit_steps(b, NULL, b->cfg.num_envs, b->cfg.notify);
    b->step_pending = rc == ENVD_OK;
    return rc;
}

static int step_done(const void *impl)
{
    workers_backend_t *b = (workers_backend_t *)impl;
    return first_pending(b, NULL, b->cfg.num_envs) < 0;
}

static int step_finish(void *impl)
{
    workers_backend_t *b = impl;
    wait_envs(b, NULL, b->cfg.num_envs);
    b->step_pending = false;
    return finish_envs(b, NULL, b->cfg.num_envs, true);
}

/* A blocking step (the doorbell's, in-process): its caller waits, so the
 * workers need not write the daemon's eventfd. */
static int step(void *impl)
{
    workers_backend_t *b = impl;
    int rc = submit_steps(b, NULL, b->cfg.num_envs, false);
    b->step_pending = rc == ENVD_OK;
    return rc < 0 ? rc : step_finish(impl);
}

static int batch_create(void *impl, envd_backend_batch_t **out, int64_t capacity)
{
    envd_backend_batch_t *batch = malloc(sizeof *batch + (size_t)capacity * sizeof(int64_t));
    if (batch == NULL)
        return ENVD_ENOMEM;
    batch->backend = impl;
    batch->capacity = capacity;
    batch->count = 0;
    *out = batch;
    return ENVD_OK;
}

static void batch_destroy(void *impl, envd_backend_batch_t *batch)
{
    (void)impl;
    free(batch);
}

/* ENVD_EBUSY naming the first env that ids names twice (session.h leaves
 * repeats to the backend; vec.c refuses them with its in_batch flags too):
 * one request per env, else the session would count it in flight twice. */
static int refuse_repeats(workers_backend_t *b, const int64_t *ids, int64_t count)
{
    int rc = ENVD_OK;
    int64_t k = 0;
    for (; k < count; k++) {
        if (b->in_batch[ids[k]]) {
            b->error_index = ids[k];
            rc = ENVD_EBUSY;
            break;
        }
        b->in_batch[ids[k]] = true;
    }
    while (k-- > 0) /* (back to all false: only the flags set above) */
        b->in_batch[ids[k]] = false;
    return rc;
}

static int batch_submit(void *impl, envd_backend_batch_t *batch, const int64_t *ids,
                        int64_t count, int flags)
{
    workers_backend_t *b = impl;
    /* ENVD_JOB_NOTIFY: the workers write the daemon pool's eventfd when done,
     * which only workers given it at spawn (cfg.notify) can. */
    if ((flags & ~ENVD_JOB_NOTIFY) != 0 || ((flags & ENVD_JOB_NOTIFY) && !b->cfg.notify) ||
        count < 1 || count > batch->capacity)
        return ENVD_EINVAL;
    memcpy(batch->ids, ids, (size_t)count * sizeof *ids);
    for (int64_t k = 0; k < count; k++)
        if (batch->ids[k] < 0 || batch->ids[k] >= b->cfg.num_envs) {
            b->error_index = batch->ids[k];
            return ENVD_EINVAL;
        }
    int rc = refuse_repeats(b, batch->ids, count);
    if (rc != ENVD_OK)
        return rc;
    batch->count = count;
    return submit_steps(b, batch->ids, count, (flags & ENVD_JOB_NOTIFY) != 0);
}

static int batch_done(const envd_backend_batch_t *batch)
{
    return first_pending(batch->backend, batch->ids, batch->count) < 0;
}

static void batch_wait(void *impl, envd_backend_batch_t *batch)
{
    wait_envs(impl, batch->ids, batch->count);
}

static int batch_finish(void *impl, envd_backend_batch_t *batch)
{
    workers_backend_t *b = impl;
    wait_envs(b, batch->ids, batch->count);
    return finish_envs(b, batch->ids, batch->count, true);
}

static uint64_t frame_bytes(const void *impl)
{
    (void)impl;
    return 0;
}

static int render(void *impl, int64_t index, uint8_t *rgb)
{
    (void)impl, (void)index, (void)rgb;
    return ENVD_EINVAL;
}

static int64_t error_index(const void *impl) { return ((const workers_backend_t *)impl)->error_index; }
static int env_started(const void *impl, int64_t index)
{
    return ((const workers_backend_t *)impl)->slots[index].started ? 1 : 0;
}

static void error_message(const void *impl, int64_t index, char *out, size_t size)
{
    const workers_backend_t *b = impl;
    if (b->dead >= 0) {
        const int64_t w = b->dead;
        const int64_t end = (w + 1) * b->cfg.num_envs / b->cfg.num_workers;
        if (b->timed_out)  /* (every worker was killed: w is the first found dead) */
            snprintf(out, size, "a call waited longer than %g s for its envs (a hung env?): "
                     "every worker was killed; close this env",
                     (double)b->cfg.timeout_ms / 1000.0);
        else
            snprintf(out, size, "worker %lld (pid %d, envs %lld..%lld) died; close this env",
                     (long long)w, b->pids[w], (long long)slice_begin(b, w),
                     (long long)end - 1);
        return;
    }
    if (index < 0 || index >= b->cfg.num_envs) {
        snprintf(out, size, "an env failed");
        return;
    }
    /* The message lies in the segment, which only the daemon and its workers
     * write; bounded all the same (a worker may write it concurrently). */
    const envd_worker_ctl_t *ctl = &b->cfg.ctl[b->worker_of[index]];
    char text[ENVD_HOSTED_MESSAGE_BYTES];
    memcpy(text, ctl->message, sizeof text);
    text[sizeof text - 1] = '\0';
    if (ctl->error_env != index)
        snprintf(text, sizeof text, "an exception (its message was overwritten by a later one)");
    snprintf(out, size, "env %lld raised %s", (long long)index, text);
}

static const void *checked_actions(const void *impl)
{
    return ((const workers_backend_t *)impl)->cfg.checked_actions;
}

static void set_chunk(void *impl, int64_t chunk) { (void)impl, (void)chunk; }

static void stats(const void *impl, envd_vec_stats_t *out)
{
    (void)impl;
    memset(out, 0, sizeof *out);
}

/* Everything b allocated, and b (whatever of it was allocated). */
static void free_backend(workers_backend_t *b)
{
    free(b->pidfds);
    free(b->pids);
    free(b->leaves);
    free(b->worker_of);
    free(b->mask);
    free(b->slots);
    envd_slot_books_free(&b->books);
    free(b->touched);
    free(b->checks);
    free(b->in_batch);
    free(b);
}

static void destroy(envd_backend_t *backend)
{
    workers_backend_t *b = (workers_backend_t *)backend;
    for (int64_t w = 0; w < b->cfg.num_workers; w++) {
        envd_worker_ctl_t *ctl = &b->cfg.ctl[w];
        atomic_store(&ctl->exit, 1);
        atomic_fetch_add(&ctl->cmd_seq, 1);
        envd_futex_wake(&ctl->cmd_seq, 1, ENVD_FUTEX_SHARED);
    }
    free_backend(b);
}

static const envd_backend_ops_t WORKERS_OPS = {
    .seed = seed, .reset = reset, .reset_count = reset_count, .step = step,
    .step_submit = step_submit, .step_done = step_done, .step_finish = step_finish,
    .batch_create = batch_create, .batch_destroy = batch_destroy,
    .batch_submit = batch_submit, .batch_done = batch_done, .batch_wait = batch_wait,
    .batch_finish = batch_finish, .frame_bytes = frame_bytes, .render = render,
    .error_index = error_index, .env_started = env_started, .error_message = error_message,
    .checked_actions = checked_actions, .set_chunk = set_chunk, .stats = stats,
    .destroy = destroy,
};

/* Every check names a whole 1, 2, 4 or 8-byte element inside the row. */
static bool action_checks_valid(const envd_workers_config_t *config)
{
    if (config->num_action_checks < 0 ||
        (config->num_action_checks > 0 && config->action_checks == NULL))
        return false;
    for (int64_t c = 0; c < config->num_action_checks; c++) {
        const envd_action_check_t *check = &config->action_checks[c];
        int32_t size = check->size;
        if ((size != 1 && size != 2 && size != 4 && size != 8) || check->offset < 0 ||
            check->offset > config->action_bytes - size || check->low > check->high)
            return false;
    }
    return true;
}

/* A list of count leaves (NULL only when empty), each of rows > 0 bytes. */
static bool leaves_valid(const envd_workers_leaf_t *leaves, int64_t count)
{
    if (count < 0 || (count > 0 && leaves == NULL))
        return false;
    for (int64_t k = 0; k < count; k++)
        if (leaves[k].segment == NULL || leaves[k].client == NULL || leaves[k].row_bytes < 1)
            return false;
    return true;
}

/* The output rows: agents in 1..ENVD_MAX_AGENTS, num_envs * agents rows
 * within the vec's bound; the rows the rules write given (rows.rewards and
 * rows.episode_log NULL: above); a multi-agent env's agent_mask and
 * observation leaf (and SAME_STEP's final one). */
static bool rows_valid(const envd_workers_config_t *c)
{
    const envd_slot_rows_t *r = &c->rows;
    if (c->agents < 1 || c->agents > ENVD_MAX_AGENTS ||
        c->num_envs > ENVD_VEC_MAX_ENVS / c->agents || c->rewards == NULL ||
        r->rewards != NULL || r->episode_log != NULL || r->terminations == NULL ||
        r->truncations == NULL || r->episode_returns == NULL || r->episode_lengths == NULL ||
        r->dones == NULL)
        return false;
    if (c->agents == 1 && !c->agent_rows)
        return true;
    return r->agent_mask != NULL && c->observations != NULL && c->obs_bytes >= 1 &&
           (c->autoreset_mode != ENVD_AUTORESET_SAME_STEP || c->final_observations != NULL);
}

uint64_t envd_backend_workers_bytes(int64_t num_envs, int64_t num_workers, int64_t agents,
                                    bool agent_rows, int64_t num_leaves,
                                    int64_t num_action_checks)
{
    const uint64_t n = (uint64_t)num_envs, workers = (uint64_t)num_workers + 1;
    const envd_slot_config_t rules = {.agents = agents, .agent_rows = agent_rows};
    return sizeof(workers_backend_t) + workers * (2 * sizeof(int) + sizeof(bool)) +
           ((uint64_t)num_leaves + 1) * sizeof(envd_workers_leaf_t) +
           ((uint64_t)num_action_checks + 1) * sizeof(envd_action_check_t) +
           n * (sizeof(int64_t) + 2 * sizeof(bool) + sizeof(envd_env_slot_t) +
                envd_slot_books_bytes_per_env(&rules));
}

int envd_backend_workers_create(envd_backend_t **out, const envd_workers_config_t *config)
{
    if (out == NULL || config == NULL || config->num_envs < 1 ||
        config->num_envs > ENVD_VEC_MAX_ENVS || config->num_workers < 0 ||
        config->num_workers > config->num_envs || config->ctl == NULL ||
        (config->num_workers == 0 && config->run_inline == NULL) ||
        (config->num_workers > 0 && config->pidfds == NULL) || config->action_bytes < 1 ||
        !action_checks_valid(config) ||
        !leaves_valid(config->inputs, config->num_inputs) ||
        !leaves_valid(config->outputs, config->num_outputs) ||
        config->timeout_ms < 0 || config->autoreset_mode < ENVD_AUTORESET_NEXT_STEP ||
        config->autoreset_mode > ENVD_AUTORESET_DISABLED || !rows_valid(config))
        return ENVD_EINVAL;
    workers_backend_t *b = calloc(1, sizeof *b);
    const int64_t n = config->num_envs, workers = config->num_workers;
    if (b == NULL)
        return ENVD_ENOMEM;
    const int64_t num_leaves = config->num_inputs + config->num_outputs;
    b->pidfds = malloc((size_t)(workers + 1) * sizeof *b->pidfds);
    b->pids = calloc((size_t)(workers + 1), sizeof *b->pids);
    b->leaves = malloc((size_t)(num_leaves + 1) * sizeof *b->leaves);
    b->worker_of = malloc((size_t)n * sizeof *b->worker_of);
    b->mask = malloc((size_t)n * sizeof *b->mask);
    b->slots = calloc((size_t)n, sizeof *b->slots);
    b->touched = calloc((size_t)(workers + 1), sizeof *b->touched);
    b->checks = malloc((size_t)(config->num_action_checks + 1) * sizeof *b->checks);
    b->in_batch = calloc((size_t)n, sizeof *b->in_batch);
    /* The rewards are the envs' own (the workers write them, float64: the
     * rules read them); no time limit (above). */
    const envd_slot_config_t rules = {.autoreset_mode = config->autoreset_mode,
                                      .agents = config->agents,
                                      .agent_rows = config->agent_rows};
    if (b->pidfds == NULL || b->pids == NULL || b->leaves == NULL || b->worker_of == NULL ||
        b->mask == NULL || b->slots == NULL || b->touched == NULL || b->checks == NULL ||
        b->in_batch == NULL || envd_slot_books_init(&b->books, &rules, &config->rows, n) != ENVD_OK) {
        free_backend(b);
        return ENVD_ENOMEM;
    }
    b->cfg = *config;
    if (config->num_action_checks > 0)
        memcpy(b->checks, config->action_checks,
               (size_t)config->num_action_checks * sizeof *b->checks);
    b->cfg.action_checks = b->checks;
    if (workers > 0)
        memcpy(b->pidfds, config->pidfds, (size_t)workers * sizeof *b->pidfds);
    if (workers > 0 && config->pids != NULL)
        memcpy(b->pids, config->pids, (size_t)workers * sizeof *b->pids);
    if (config->num_inputs > 0)
        memcpy(b->leaves, config->inputs, (size_t)config->num_inputs * sizeof *b->leaves);
    if (config->num_outputs > 0)
        memcpy(b->leaves + config->num_inputs, config->outputs,
               (size_t)config->num_outputs * sizeof *b->leaves);
    for (int64_t w = 0; w < (workers ? workers : 1); w++) {
        int64_t end = workers ? (w + 1) * n / workers : n;
        for (int64_t i = workers ? slice_begin(b, w) : 0; i < end; i++)
            b->worker_of[i] = w;
    }
    b->error_index = -1;
    b->dead = -1;
    b->base = (envd_backend_t){.ops = &WORKERS_OPS, .impl = b, .num_envs = n};
    *out = &b->base;
    return ENVD_OK;
}

int64_t envd_backend_workers_dead(const envd_backend_t *backend)
{
    return ((const workers_backend_t *)backend)->dead;
}

int64_t envd_backend_workers_error_index(const envd_backend_t *backend)
{
    return ((const workers_backend_t *)backend)->error_index;
}

void envd_backend_workers_message(const envd_backend_t *backend, int64_t index, char *out,
                                  size_t size)
{
    error_message(backend->impl, index, out, size);
}

int envd_backend_workers_timed_out(const envd_backend_t *backend)
{
    return ((const workers_backend_t *)backend)->timed_out;
}

/* ---- the worker side ---- */

uint32_t envd_worker_wait(envd_worker_ctl_t *ctl, uint32_t seen, int64_t spin_ns)
{
    double spin_until = now_ns() + (double)spin_ns;
    for (;;) {
        uint32_t seq = atomic_load(&ctl->cmd_seq);
        if (atomic_load(&ctl->exit))
            return seen;
        if (seq != seen)
            return seq;
        if (now_ns() < spin_until) {
            cpu_relax();
            continue;
        }
        atomic_store(&ctl->worker_sleeping, 1);
        if (atomic_load(&ctl->cmd_seq) == seen)
            envd_futex_wait(&ctl->cmd_seq, seen, 1000000000LL, ENVD_FUTEX_SHARED);
        atomic_store(&ctl->worker_sleeping, 0);
    }
}

void envd_worker_fence(void)
{
    atomic_thread_fence(memory_order_release);
}

void envd_worker_acquire(void)
{
    atomic_thread_fence(memory_order_acquire);
}

int envd_worker_take_notify(envd_worker_ctl_t *ctl)
{
    return atomic_exchange(&ctl->notify, 0) != 0;
}

void envd_worker_done(envd_worker_ctl_t *ctl)
{
    atomic_fetch_add(&ctl->done_seq, 1);
    if (atomic_load(&ctl->parent_sleeping))
        envd_futex_wake(&ctl->done_seq, 1, ENVD_FUTEX_SHARED);
}
