/*
 * step_choice.h -- whether a blocking whole-vec step that is worth a wake-up
 * (envd_vec_step over the dispatch's inline threshold) runs on the pool or
 * inline: the way whose steps were measured faster, each way timed as a whole
 * step on the calling thread's clock.
 *
 * Why not the per-env cost the threshold reads: that estimate sums the chunks'
 * own times, and a pooled chunk costs more per env than an inline step (its
 * envs' state moves between the two CPUs' caches from step to step; the chunk
 * leaves out the wake-up and the wait for the other thread's last chunk).
 * pong at N=1024 on a 2-CPU VM: 25 us a step inline, 47 us pooled, and its
 * chunks summed to 40-50 us, which kept it over the 40 us threshold and on
 * the pool (docs/benchmarks.md, "Auto against serial").
 *
 * The way not taken is measured again now and then (a probe: PROBE_STEPS
 * steps the other way), so that a change of load or of the env's cost can
 * change the choice.  The first step after a change of way is not sampled:
 * it wakes a sleeping worker, or moves the envs' state back to one cache,
 * which a run of steps that way does not pay each step.  A probe that
 * confirms the choice doubles the steps before the next one (up to
 * PROBE_PERIOD_MAX), so a settled vec spends about 1/1000 of its steps
 * probing (8 in 8192).
 *
 * A probe's estimate is its fastest sampled step, and a probe whose steps
 * are still getting faster runs on (up to PROBE_STEPS_MAX): after a long
 * inline stretch the pool's first several steps, not only its first, cost
 * more than its settled ones.  squared at N=4096 on a 2-CPU VM (issue 36),
 * the pool's first steps after 2000 inline steps of another vec: 162, 245,
 * 122, 122, 106, 93, 79, 78 us (medians over 7 such probes), settled ones
 * 73-79 us, inline ones 84 us (the worker's CPU had been idle: its chunks
 * ran 2-4x slower than settled, and it started its first chunk 10-90 us
 * after the submit); the mean of the seven sampled steps, 121 us, kept the
 * vec inline.  A probe runs on one step for each step that lowered its best
 * by over 10%, so by at most log(first / settled) / log(1 / 0.9) steps: 7
 * for a first sampled step at twice the settled cost.  Steps that are
 * slower the other way (other load on the second CPU) stay slower at their
 * best: the probe changes nothing.  A chosen way's estimate stays a mean: a
 * probe that wins on its best step and then runs slower than the other way
 * loses the choice again within a few steps.
 *
 * Pure bookkeeping, no clock and no threads: the caller passes each step's
 * time (the vec's caller thread only; tests/native/step_choice_check.c
 * drives it with made-up times).
 */
#ifndef ENVD_STEP_CHOICE_H
#define ENVD_STEP_CHOICE_H

#include <stdbool.h>
#include <stdint.h>

/* Steps the other way in a probe; the first is not sampled (see above). */
#define ENVD_CHOICE_PROBE_STEPS 8
/* A probe runs on while its last step was faster than its best before by
 * more than ENVD_CHOICE_SETTLE (not settled yet), up to this many steps. */
#define ENVD_CHOICE_PROBE_STEPS_MAX 32
#define ENVD_CHOICE_SETTLE 0.9
/* Steps one way before the first probe, and the most between two probes. */
#define ENVD_CHOICE_PROBE_PERIOD 256
#define ENVD_CHOICE_PROBE_PERIOD_MAX 8192
/* An estimate is the mean of its first ENVD_CHOICE_MEAN_OF samples, then an
 * EWMA of that weight; a sample is clamped to within this factor of a
 * positive estimate (a preempted step cannot flip the choice on its own).
 * An estimate of 0 (a step shorter than the clock's tick) is not clamped
 * around: that range is [0, 0], and the estimate would stay 0 for good. */
#define ENVD_CHOICE_MEAN_OF 8
#define ENVD_CHOICE_CLAMP 2.0

typedef enum envd_way { ENVD_WAY_NONE = 0, ENVD_WAY_INLINE, ENVD_WAY_POOLED } envd_way_t;

typedef struct envd_way_estimate {
    double ns;       /* wall time of a step, per env; 0 before any sample */
    int64_t samples; /* since the estimate was last restarted (capped) */
    bool restart;    /* a probe began: its first sample replaces the estimate
                        (kept until then: a probe may end before it samples) */
} envd_way_estimate_t;

typedef struct envd_step_choice {
    envd_way_estimate_t inline_ns, pooled_ns;
    envd_way_t last;     /* the way the previous recorded step ran */
    int64_t streak;      /* steps the chosen way since the last probe */
    int64_t period;      /* steps the chosen way before the next probe */
    int probe_left;      /* steps of the probe in progress still to run */
    int probe_steps;     /* steps the probe in progress has run */
    envd_way_t probing;  /* the way a probe in progress runs */
    bool pool_tried;     /* a probe of the pool began */
} envd_step_choice_t;

static inline void envd_choice_init(envd_step_choice_t *c)
{
    *c = (envd_step_choice_t){.period = ENVD_CHOICE_PROBE_PERIOD};
}

static inline envd_way_estimate_t *envd_choice_estimate(envd_step_choice_t *c, envd_way_t way)
{
    return way == ENVD_WAY_POOLED ? &c->pooled_ns : &c->inline_ns;
}

static inline void envd_choice_sample(envd_way_estimate_t *e, double sample)
{
    if (e->restart) {
        e->samples = 0;
        e->restart = false;
    }
    if (e->samples > 0 && e->ns > 0.0) {
        if (sample > e->ns * ENVD_CHOICE_CLAMP)
            sample = e->ns * ENVD_CHOICE_CLAMP;
        if (sample < e->ns / ENVD_CHOICE_CLAMP)
            sample = e->ns / ENVD_CHOICE_CLAMP;
    }
    if (e->samples < ENVD_CHOICE_MEAN_OF)
        e->samples++;
    e->ns += (sample - e->ns) / (double)e->samples;
}

/* The way measured faster; a way with no sample yet first (pooled before
 * inline: the dispatch's threshold sent the step here). */
static inline envd_way_t envd_choice_better(const envd_step_choice_t *c)
{
    if (c->pooled_ns.samples == 0)
        return ENVD_WAY_POOLED;
    if (c->inline_ns.samples == 0)
        return ENVD_WAY_INLINE;
    return c->pooled_ns.ns < c->inline_ns.ns ? ENVD_WAY_POOLED : ENVD_WAY_INLINE;
}

/* A probe's sample (see above): the estimate is the probe's fastest step;
 * a step still faster than that by more than the settle factor runs the
 * probe one step longer.  The clamp still bounds a sample below (a clock
 * glitch cannot make a way look free). */
static inline void envd_choice_probe_sample(envd_step_choice_t *c, envd_way_estimate_t *e,
                                            double sample)
{
    if (e->restart) {
        e->restart = false;
        e->samples = 1;
        e->ns = sample;
        return;
    }
    if (e->ns > 0.0 && sample < e->ns / ENVD_CHOICE_CLAMP)
        sample = e->ns / ENVD_CHOICE_CLAMP;
    if (sample < e->ns * ENVD_CHOICE_SETTLE &&
        c->probe_steps + c->probe_left < ENVD_CHOICE_PROBE_STEPS_MAX)
        c->probe_left++;
    if (sample < e->ns)
        e->ns = sample;
    if (e->samples < ENVD_CHOICE_MEAN_OF)
        e->samples++;
}

static inline envd_way_t envd_choice_start_probe(envd_step_choice_t *c, envd_way_t way)
{
    c->streak = 0;
    c->probing = way;
    c->probe_left = ENVD_CHOICE_PROBE_STEPS - 1;
    c->probe_steps = 1;
    envd_choice_estimate(c, way)->restart = true;
    if (way == ENVD_WAY_POOLED)
        c->pool_tried = true;
    return way;
}

/* The way the next blocking step runs.  over_threshold: the dispatch's
 * threshold says the step is worth a wake-up; a step under it runs inline
 * (and ends a probe in progress).  Then record it (envd_choice_record),
 * whichever way the dispatch finally ran it. */
static inline envd_way_t envd_choice_pick(envd_step_choice_t *c, bool over_threshold)
{
    if (!over_threshold) {
        c->probe_left = 0;
        c->probing = ENVD_WAY_NONE;
        return ENVD_WAY_INLINE;
    }
    if (c->probe_left > 0) {
        c->probe_left--;
        c->probe_steps++;
        return c->probing;
    }
    if (c->pooled_ns.samples == 0) {
        /* the pool not measured yet: a probe (a run of steps, not one cold
         * one) at once the first time; a probe that ended under the
         * threshold before it sampled is tried again only after a period */
        if (!c->pool_tried || ++c->streak >= c->period)
            return envd_choice_start_probe(c, ENVD_WAY_POOLED);
        return ENVD_WAY_INLINE;
    }
    const envd_way_t best = envd_choice_better(c);
    if (best == c->last && ++c->streak >= c->period)
        return envd_choice_start_probe(c, best == ENVD_WAY_POOLED ? ENVD_WAY_INLINE
                                                                  : ENVD_WAY_POOLED);
    return best;
}

/* A blocking step ran `way` and took ns for n envs: every blocking step, the
 * ones under the threshold too (they keep the inline estimate current).
 * Sampled unless the step before ran the other way. */
static inline void envd_choice_record(envd_step_choice_t *c, envd_way_t way, double ns, int64_t n)
{
    const envd_way_t before = c->last;
    c->last = way;
    if (before == way && n > 0 && c->probing == way)
        envd_choice_probe_sample(c, envd_choice_estimate(c, way), ns / (double)n);
    else if (before == way && n > 0)
        envd_choice_sample(envd_choice_estimate(c, way), ns / (double)n);
    else
        c->streak = 0;
    if (c->probing == way && c->probe_left == 0) {
        /* the probe's last step: a probe that left the choice as it was
         * waits longer for the next one, one that changed it restarts */
        c->probing = ENVD_WAY_NONE;
        const bool changed = envd_choice_better(c) == way;
        const int64_t longer = c->period * 2 < ENVD_CHOICE_PROBE_PERIOD_MAX
                                   ? c->period * 2
                                   : ENVD_CHOICE_PROBE_PERIOD_MAX;
        c->period = changed ? ENVD_CHOICE_PROBE_PERIOD : longer;
    }
}

#endif /* ENVD_STEP_CHOICE_H */
