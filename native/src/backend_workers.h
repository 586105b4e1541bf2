/*
 * backend_workers.h -- the worker-process backend (backend.h): Python envs
 * hosted in worker processes (issue 17), or stepped inline by the caller.
 *
 * num_envs envs are spread over num_workers processes in contiguous slices
 * (worker w hosts envs [w*N/W, (w+1)*N/W)).  Everything the parent and the
 * workers share lies in one shared-memory segment the caller maps (a memfd):
 * one control block per worker and per-env words:
 *
 *   kind[i]   what env i is asked to do: ENVD_HOSTED_RESET (a reset, or
 *             NEXT_STEP's autoreset), or ENVD_HOSTED_STEP, with the flag
 *             ENVD_HOSTED_RESET_IF_DONE in SAME_STEP mode (reset at once if
 *             the step ends the episode)
 *   req[i]    bumped by the parent for every request of env i
 *   ack[i]    set to req[i] by the worker once env i's results are written
 *   status[i] 0, or the ENVD_E* code of env i's last request (ENVD_EENV: the
 *             env raised; the message is in its worker's control block)
 *
 * The parent writes kind/req (and the checked actions, seeds) of idle envs
 * only, then bumps its worker's cmd_seq and wakes it with a futex; the worker
 * steps every env of its slice whose req differs from its ack, acks each, then
 * bumps done_seq and wakes the parent if it sleeps.  Both sides spin briefly,
 * then sleep on the futex; the parent's sleeps time out every
 * ENVD_HOSTED_POLL_MS so that it notices a dead worker (its pidfd polls
 * readable) within a second, never a pipe or a message per step.
 *
 * The per-env rules are the parent's (env_slot.h: the refusals, the
 * autoreset modes, the episode statistics), as the pool vec's: it keeps an
 * env slot per env, asks envd_slot_next what a step of env i means before
 * it writes kind[i] (a refused env: nothing is asked), and, as it collects
 * the acks, applies the rules to the raw outputs the worker wrote: reward
 * (float64), terminated and truncated, which the env returned (0, false,
 * false for a reset).  The worker only runs env.reset / env.step and writes
 * the observation, those outputs and the info; in SAME_STEP mode it also
 * writes a done step's final observation and resets the env at once.
 *
 * A multi-agent env (config agents = A > 1, a PettingZoo env hosted by
 * native/hosted_worker.py) has A output rows per env, rows i*A .. i*A + A - 1
 * (the per-env words above stay per env): its worker writes each agent's
 * raw outputs in its row, and the parent keeps them as the pool vec keeps a
 * C multi-agent env's (env_slot.h: a dead agent's row masked, its
 * observation and reward zeroed, its final flags repeated; the env done
 * once every agent is).  In SAME_STEP mode the worker resets the env at
 * once when every agent ended, before or in this step (its flags, as the
 * bytes it wrote), the rule the parent applies to the same bytes.
 *
 * Inline (num_workers == 0): the caller's own run_inline callback steps the
 * requested envs before submit returns (the Python loop of SyncVectorEnv).
 *
 * Leaves (the daemon): the segment's batch buffers are private to the daemon
 * and its workers, and the client reads and writes a copy of them in its own
 * shared memory.  The backend copies those rows itself, in C, on whatever
 * thread calls it (the event loop, the doorbell's thread): for each input
 * leaf the rows of the envs a step or send asks, from the client's buffer
 * into the segment, BEFORE anything checks them (the client may write its
 * buffer at any time); for each output leaf the rows of the envs a reset,
 * step or batch finished (acked), from the segment into the client's buffer.
 * One entry per array of the layout, whatever its name.
 */
#ifndef ENVD_BACKEND_WORKERS_H
#define ENVD_BACKEND_WORKERS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "env_slot.h"

/* cffi:begin */
#define ENVD_HOSTED_RESET 1       /* = ENVD_SLOT_RESET: reset (seeds[i] if seed_pending[i]) */
#define ENVD_HOSTED_STEP 2        /* = ENVD_SLOT_STEP: step with the checked action */
#define ENVD_HOSTED_RESET_IF_DONE 8 /* = ENVD_SLOT_RESET_IF_DONE, a flag of a step */
#define ENVD_HOSTED_MESSAGE_BYTES 1024
#define ENVD_HOSTED_POLL_MS 100
#define ENVD_HOSTED_FREE_SPIN_NS 100000

/* One worker's control block in the shared segment (cache-line aligned, so
 * the two sides' words do not share a line with another worker's). */
typedef struct envd_worker_ctl {
    _Atomic uint32_t cmd_seq;         /* parent: bumped after new requests */
    _Atomic uint32_t worker_sleeping; /* worker: in FUTEX_WAIT on cmd_seq */
    _Atomic uint32_t exit;            /* parent: leave the loop */
    _Atomic uint32_t notify;          /* parent: write the notify eventfd after the
                                       * acks of this wake's requests (ENVD_JOB_NOTIFY) */
    _Atomic uint32_t done_seq __attribute__((aligned(64))); /* worker: bumped after acks */
    _Atomic uint32_t parent_sleeping; /* parent: in FUTEX_WAIT on done_seq */
    int64_t error_env;                /* worker: env of the message below, -1 none */
    char message[ENVD_HOSTED_MESSAGE_BYTES]; /* worker: "ExcType: text" (UTF-8, NUL) */
} __attribute__((aligned(64))) envd_worker_ctl_t;

/* One integer element of an action row (a Discrete, MultiDiscrete or
 * MultiBinary leaf's, envd/leaves.py) that must lie in [low, high]; checked
 * in the backend's private copy of the row, after the copy.  Box elements
 * have no check (gymnasium passes them to the env as they are). */
typedef struct envd_action_check {
    int64_t offset;    /* bytes into the row */
    int64_t low;       /* inclusive bounds */
    int64_t high;
    int32_t size;      /* 1, 2, 4 or 8 bytes, native byte order */
    int32_t is_signed;
} envd_action_check_t;
/* One array of the layout held twice: num_envs rows of row_bytes each (an
 * env's row: all its agents' rows, which are consecutive). */
typedef struct envd_workers_leaf {
    void *segment;             /* the rows in the segment (the workers' side) */
    void *client;              /* the rows in the client's shared memory */
    int64_t row_bytes;
    const uint32_t *used;      /* an output's per-env count of the bytes of its row
                                * that are meaningful (the info slots' lengths), in
                                * the segment: only min(used[i], row_bytes) bytes of
                                * row i are copied; NULL: the whole row */
} envd_workers_leaf_t;

typedef struct envd_workers_config {
    int64_t num_envs;
    int64_t agents;            /* rows per env of the output rows (env_slot.h), >= 1 */
    bool agent_rows;           /* agents == 1 kept as a multi-agent env's (a PettingZoo
                                * env of one agent: agent_mask, dead rows); below,
                                * "agents > 1" reads "agents > 1 or agent_rows" */
    int64_t num_workers;       /* 0: inline, run_inline steps them */
    envd_worker_ctl_t *ctl;    /* max(1, num_workers) blocks (inline: messages in ctl[0]) */
    const int *pidfds;         /* num_workers pidfds of the workers (copied) */
    uint8_t *kind;             /* per-env words, in the segment (above) */
    uint32_t *req;
    uint32_t *ack;
    int32_t *status;
    uint64_t *seeds;           /* the seed env i's next reset takes if seed_pending[i] */
    uint8_t *seed_pending;
    void *checked_actions;     /* in the segment: the rows the workers act on */
    const void *actions;       /* the caller's actions buffer (num_envs rows) */
    int64_t action_bytes;      /* bytes of one env's actions (its agents' rows) */
    const envd_action_check_t *action_checks; /* the row's integer elements (copied) */
    int64_t num_action_checks;
    /* The output rows (num_envs * agents each, in the segment; env_slot.h):
     * a worker writes an env's raw rewards (float64, here: the env's own,
     * so rows.rewards is NULL), terminated and truncated flags; the parent
     * reads them as bytes and writes the flags again, the episode
     * statistics, dones and (agents > 1) agent_mask as it collects the
     * acks, and zeroes a dead agent's reward.  rows.episode_times may be
     * NULL; rows.episode_log is NULL (no hosted env resets itself). */
    double *rewards;
    envd_slot_rows_t rows;
    /* agents > 1 (a multi-agent env, rows i*A .. i*A + A - 1): its one
     * observation leaf in the segment, obs_bytes a row (an agent's), whose
     * dead rows the parent zeroes, as the pool vec does; and in SAME_STEP
     * mode its final observation leaf (else NULL), whose rows of agents
     * dead before the done step are zeroed too. */
    void *observations;
    void *final_observations;
    int64_t obs_bytes;
    /* agents > 1: per row, in the segment, a byte the worker writes with
     * every reset of the env (a reset, NEXT_STEP's autoreset, SAME_STEP's
     * reset within the done step): not 0 when the agent is absent from the
     * reset (envd_slot_start_agent_rows: dead for the episode); NULL: every
     * agent is present at every reset. */
    const uint8_t *absent;
    int64_t spin_ns;           /* the parent's spin before it sleeps */
    int autoreset_mode;        /* envd_autoreset_mode_t */
    int (*run_inline)(void *ctx);  /* inline mode: step the requested envs */
    void *inline_ctx;
    bool notify;               /* the workers hold the daemon pool's eventfd: step_submit
                                * and ENVD_JOB_NOTIFY batches ask them to write it (a
                                * blocking step, e.g. the doorbell's, never does) */
    const int *pids;           /* num_workers pids, for messages (copied; NULL: none) */
    /* Leaves copied per env row (above; copied lists, NULL with 0: none). */
    const envd_workers_leaf_t *inputs;
    int64_t num_inputs;
    const envd_workers_leaf_t *outputs;
    int64_t num_outputs;
    int64_t timeout_ms;        /* > 0: a call that waits longer than this for its envs
                                * (a hung env) SIGKILLs every worker and fails as a dead
                                * worker's (envd_backend_workers_timed_out); 0: no bound */
    int64_t usable_cpus;       /* CPUs the parent and its workers may run on (affinity and
                                * cgroup quota, envd.cpus): once a worker of a wait finished,
                                * while the workers still stepping leave a CPU to the parent,
                                * it spins for their acks (at most ENVD_HOSTED_FREE_SPIN_NS a
                                * wait) instead of sleeping: the last ack costs no wake-up on
                                * the step's critical path.  0: never */
} envd_workers_config_t;

/* A backend over the segment config describes (copied; the segment must
 * outlive the backend).  ENVD_EINVAL, ENVD_ENOMEM. */
int envd_backend_workers_create(envd_backend_t **out, const envd_workers_config_t *config);

/* The most bytes envd_backend_workers_create allocates for a config of
 * num_envs envs of agents rows each (agent_rows: the config's) on
 * num_workers workers, num_leaves leaves (inputs and outputs) and
 * num_action_checks checks (what --max-state-bytes counts of a hosted
 * session beside its segment). */
uint64_t envd_backend_workers_bytes(int64_t num_envs, int64_t num_workers, int64_t agents,
                                    bool agent_rows, int64_t num_leaves,
                                    int64_t num_action_checks);

/* The worker whose death failed the last call (-1: none died).  The backend
 * refuses every later call with ENVD_EENV once a worker died. */
int64_t envd_backend_workers_dead(const envd_backend_t *backend);

/* The env the backend's last failure named (-1: none): a reset's too, which
 * the session does not record. */
int64_t envd_backend_workers_error_index(const envd_backend_t *backend);

/* What failed env index with ENVD_EENV (NUL-terminated UTF-8 into out, at
 * most size > 0 bytes): "worker W (pid P, envs A..B) died; close this env"
 * once a worker died, else "env I raised ExcType: message" (its worker's
 * last message).  The backend's error_message op: the doorbell hands it to
 * the client, whose EnvError says what the socket path's says. */
void envd_backend_workers_message(const envd_backend_t *backend, int64_t index, char *out,
                                  size_t size);

/* Whether a call ran past config->timeout_ms and killed the workers (the
 * backend then refuses every call, as after a worker's death). */
int envd_backend_workers_timed_out(const envd_backend_t *backend);

/* ---- the worker side (called from the worker's Python loop, GIL released) ---- */
/* Wait until ctl->cmd_seq differs from seen (spin spin_ns, then sleep) and
 * return it; returns seen unchanged only when ctl->exit is set. */
uint32_t envd_worker_wait(envd_worker_ctl_t *ctl, uint32_t seen, int64_t spin_ns);
/* A release fence: the worker calls it between writing an env's outputs and
 * writing its ack (plain numpy stores), so that the parent's acquire load of
 * the ack sees the outputs on any CPU (x86 orders stores anyway). */
void envd_worker_fence(void);
/* An acquire fence: the worker calls it after it read the req words that
 * tell it which envs are asked something, before it reads their kind, seeds
 * and checked actions, so that it acts on the inputs the parent wrote before
 * its release store of req (x86 orders loads anyway; aarch64 does not). */
void envd_worker_acquire(void);
/* Publish the acks written so far and wake the parent if it sleeps. */
void envd_worker_done(envd_worker_ctl_t *ctl);
/* Whether the parent asked for the notify eventfd since the last call (and
 * clear the request).  The worker calls it when it wakes, before it runs the
 * requests, and writes the eventfd after envd_worker_done if it was asked: a
 * request posted after the call bumps cmd_seq again, so it is never lost. */
int envd_worker_take_notify(envd_worker_ctl_t *ctl);
/* cffi:end */

#endif /* ENVD_BACKEND_WORKERS_H */
