/*
 * step_choice_check.c -- native/src/step_choice.h on its own, with made-up
 * step times (no clock): built plain and with -fsanitize=address,undefined
 * by test_step_choice.py.
 *
 * A simulated vec steps N_ENVS envs per step; each way's step takes the time
 * its scenario gives, and the first step after a change of way pays an extra
 * COLD_NS (a sleeping worker's wake-up, the envs' state moving caches), as on
 * a real pool.  Checked: a vec whose pooled steps are slower than inline ones
 * stays inline but for its probes, however close it is to the threshold; one
 * whose pooled steps are faster stays pooled; the choice follows a change of
 * the times within a probe period; a preempted step or a cold first step does
 * not flip it; an estimate of 0 ns follows later samples; steps under the
 * threshold always run inline; the share of steps spent probing shrinks once
 * settled.
 *
 * Prints "step_choice_check: ok" and exits 0, or names the failed check.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "step_choice.h"
#include "stress_check.h"

#define N_ENVS 1024
#define COLD_NS 80000.0

typedef struct sim {
    envd_step_choice_t choice;
    envd_way_t last;
    int64_t inline_steps, pooled_steps, longest_pooled_run, pooled_run;
    int64_t inline_run, inline_run_before; /* inline steps in a row; before this pooled run */
} sim_t;

static void sim_init(sim_t *s)
{
    *s = (sim_t){0};
    envd_choice_init(&s->choice);
}

/* One blocking step over the threshold (or not): pick, "run", record. */
static envd_way_t sim_step(sim_t *s, double inline_ns, double pooled_ns, bool over)
{
    const envd_way_t way = envd_choice_pick(&s->choice, over);
    double ns = way == ENVD_WAY_POOLED ? pooled_ns : inline_ns;
    if (s->last != ENVD_WAY_NONE && way != s->last)
        ns += COLD_NS;
    s->last = way;
    envd_choice_record(&s->choice, way, ns, N_ENVS);
    if (way == ENVD_WAY_POOLED) {
        s->pooled_steps++;
        if (s->pooled_run == 0)
            s->inline_run_before = s->inline_run;
        s->inline_run = 0;
        if (++s->pooled_run > s->longest_pooled_run)
            s->longest_pooled_run = s->pooled_run;
    } else {
        s->inline_steps++;
        s->inline_run++;
        s->pooled_run = 0;
    }
    return way;
}

/* Steps until the choice settles, then `steps` more counted from zero. */
static void sim_run(sim_t *s, double inline_ns, double pooled_ns, int64_t steps)
{
    for (int k = 0; k < 64; k++)
        sim_step(s, inline_ns, pooled_ns, true);
    s->inline_steps = s->pooled_steps = s->longest_pooled_run = 0;
    for (int64_t k = 0; k < steps; k++)
        sim_step(s, inline_ns, pooled_ns, true);
}

/* pong at N=1024 on 2 CPUs: 25 us inline, 47 us pooled, over the threshold
 * (its pooled chunks' sum kept it there): inline but for probes. */
static void slower_pool_stays_inline(int64_t steps)
{
    sim_t s;
    sim_init(&s);
    sim_run(&s, 25000.0, 47000.0, steps);
    CHECK(s.longest_pooled_run <= ENVD_CHOICE_PROBE_STEPS, "a pooled run of %lld steps",
          (long long)s.longest_pooled_run);
    CHECK(s.pooled_steps * 100 <= steps, "%lld of %lld steps pooled", (long long)s.pooled_steps,
          (long long)steps);
    CHECK(s.choice.pooled_ns.ns > s.choice.inline_ns.ns, "estimates %g %g",
          s.choice.pooled_ns.ns, s.choice.inline_ns.ns);
}

/* go at N=1024: 400 us inline, 210 us pooled: pooled but for probes. */
static void faster_pool_stays_pooled(int64_t steps)
{
    sim_t s;
    sim_init(&s);
    sim_run(&s, 400000.0, 210000.0, steps);
    CHECK(s.inline_steps * 100 <= steps, "%lld of %lld steps inline", (long long)s.inline_steps,
          (long long)steps);
}

/* The times change (another process takes the second CPU): the choice
 * follows within the longest probe period, both ways. */
static void follows_a_change(void)
{
    sim_t s;
    sim_init(&s);
    sim_run(&s, 400000.0, 210000.0, 20000); /* settled on the pool: long periods */
    int64_t k;
    for (k = 0; envd_choice_better(&s.choice) != ENVD_WAY_INLINE; k++) {
        CHECK(k <= ENVD_CHOICE_PROBE_PERIOD_MAX + ENVD_CHOICE_PROBE_STEPS,
              "still pooled after %lld steps", (long long)k);
        sim_step(&s, 400000.0, 600000.0, true);
    }
    for (k = 0; k < 1000; k++)
        sim_step(&s, 400000.0, 600000.0, true);
    for (k = 0; envd_choice_better(&s.choice) != ENVD_WAY_POOLED; k++) {
        CHECK(k <= ENVD_CHOICE_PROBE_PERIOD_MAX + ENVD_CHOICE_PROBE_STEPS,
              "still inline after %lld steps", (long long)k);
        sim_step(&s, 400000.0, 210000.0, true);
    }
}

/* One preempted step (4 ms) among pooled ones, and a cold first step after
 * every probe, leave a pooled choice pooled. */
static void outliers_do_not_flip(void)
{
    sim_t s;
    sim_init(&s);
    sim_run(&s, 400000.0, 300000.0, 1000);
    for (int k = 0; k < 5; k++) {
        CHECK(sim_step(&s, 400000.0, 300000.0, true) == ENVD_WAY_POOLED || s.choice.probe_left > 0,
              "left the pool");
        s.last = ENVD_WAY_POOLED;
        envd_choice_record(&s.choice, ENVD_WAY_POOLED, 4e6, N_ENVS);
        CHECK(envd_choice_better(&s.choice) == ENVD_WAY_POOLED, "one preempted step flipped it");
        for (int j = 0; j < 20; j++)
            sim_step(&s, 400000.0, 300000.0, true);
    }
}

/* An estimate of exactly 0 ns (a clock too coarse for a step, a step of
 * nothing) follows the next samples: the clamp bounds a sample only around a
 * positive estimate, else [0, 0] would keep it at 0 for good -- and a pooled
 * estimate of 0 would keep every later step on the pool, however slow. */
static void a_zero_estimate_does_not_stick(void)
{
    envd_way_estimate_t e = {0};
    envd_choice_sample(&e, 0.0);
    envd_choice_sample(&e, 0.0);
    CHECK(e.ns == 0.0 && e.samples == 2, "estimate %g after %lld zero samples", e.ns,
          (long long)e.samples);
    for (int k = 0; k < 64; k++)
        envd_choice_sample(&e, 500.0);
    CHECK(e.ns > 250.0 && e.ns <= 500.0, "estimate %g after 64 samples of 500", e.ns);

    sim_t s;
    sim_init(&s);
    for (int k = 0; k < 64; k++) /* the pool's first steps measured at 0 ns */
        sim_step(&s, 25000.0, 0.0, true);
    int64_t k;
    for (k = 0; envd_choice_better(&s.choice) != ENVD_WAY_INLINE; k++) {
        CHECK(k <= ENVD_CHOICE_PROBE_PERIOD_MAX + ENVD_CHOICE_PROBE_STEPS,
              "still pooled after %lld steps (pooled estimate %g)", (long long)k,
              s.choice.pooled_ns.ns);
        sim_step(&s, 25000.0, 47000.0, true);
    }
}

/* Under the threshold every step runs inline, a probe in progress ends, and
 * nothing is probed. */
static void under_the_threshold_is_inline(void)
{
    sim_t s;
    sim_init(&s);
    CHECK(sim_step(&s, 25000.0, 47000.0, true) == ENVD_WAY_POOLED, "an unmeasured pool is probed");
    for (int k = 0; k < 10000; k++)
        CHECK(sim_step(&s, 25000.0, 10000.0, false) == ENVD_WAY_INLINE, "step %d pooled", k);
    CHECK(s.choice.probe_left == 0 && s.choice.probing == ENVD_WAY_NONE, "a probe left open");
}

/* Steps that cross the threshold one at a time (pong on a loaded host: its
 * estimate near 40 us) end each probe after its first, cold step, before it
 * samples: the pool stays unmeasured, and is probed again only after a
 * period, not at every crossing; a way's estimate outlives a probe that
 * ends before it samples. */
static void probes_ended_under_the_threshold_are_rare(int64_t steps)
{
    sim_t s;
    sim_init(&s);
    for (int64_t k = 0; k < steps; k++)
        sim_step(&s, 25000.0, 47000.0, k % 2 == 1);
    CHECK(s.choice.pooled_ns.samples == 0, "the pool was sampled");
    CHECK(s.pooled_steps <= 1 + steps / 2 / ENVD_CHOICE_PROBE_PERIOD, "%lld of %lld steps pooled",
          (long long)s.pooled_steps, (long long)steps);
    sim_init(&s);
    sim_run(&s, 25000.0, 47000.0, 1000);
    const double pooled = s.choice.pooled_ns.ns;
    for (int64_t k = 0; k < steps; k++)
        sim_step(&s, 25000.0, 47000.0, k % 2 == 1);
    CHECK(s.choice.pooled_ns.samples > 0 && s.choice.pooled_ns.ns == pooled,
          "the pool's estimate was lost: %g, was %g", s.choice.pooled_ns.ns, pooled);
}

/* Settled, the probes' share falls: the period doubles up to its maximum. */
static void probes_become_rare(void)
{
    sim_t s;
    sim_init(&s);
    sim_run(&s, 25000.0, 47000.0, 4 * ENVD_CHOICE_PROBE_PERIOD_MAX);
    CHECK(s.choice.period == ENVD_CHOICE_PROBE_PERIOD_MAX, "period %lld",
          (long long)s.choice.period);
    s.pooled_steps = 0;
    for (int64_t k = 0; k < 4 * ENVD_CHOICE_PROBE_PERIOD_MAX; k++)
        sim_step(&s, 25000.0, 47000.0, true);
    CHECK(s.pooled_steps <= 4 * ENVD_CHOICE_PROBE_STEPS, "%lld pooled steps",
          (long long)s.pooled_steps);
}

/* Issue 36: after a long inline stretch the pool's first steps cost more
 * than its settled ones, for several steps (squared at N=4096 on 2 CPUs,
 * step_choice.h): a pooled step's cost here is WARM_US[k] for the k-th
 * pooled step after a run of at least a probe period of inline steps, then
 * decays by `decay` a step to settled_us (an inline probe's 8 steps leave
 * the worker's CPU warm: the settled cost at once).  A pool that is faster
 * settled wins the choice at a probe and keeps it; a warm-up that lasts
 * longer than a probe's 8 steps runs the probe on until it settles. */
static const double WARM_US[] = {162, 245, 122, 122, 106, 93, 79, 78};
#define N_WARM ((int)(sizeof WARM_US / sizeof WARM_US[0]))

static double warming_pool_ns(const sim_t *s, double settled_us, double decay)
{
    const int64_t inline_before = s->pooled_run == 0 ? s->inline_run : s->inline_run_before;
    if (inline_before < ENVD_CHOICE_PROBE_PERIOD)
        return settled_us * 1000.0;
    if (s->pooled_run < N_WARM) /* pooled_run: the pooled steps in a row so far */
        return WARM_US[s->pooled_run] * 1000.0;
    double us = WARM_US[N_WARM - 1];
    for (int64_t k = N_WARM; k <= s->pooled_run && us * decay > settled_us; k++)
        us *= decay;
    return (us > settled_us ? us : settled_us) * 1000.0;
}

static void a_warming_pool_is_measured_settled(int64_t steps, double inline_us, double decay,
                                               double settled_us)
{
    const double inline_ns = inline_us * 1000.0;
    sim_t s;
    sim_init(&s);
    /* a long inline stretch: steps under the threshold */
    for (int k = 0; k < ENVD_CHOICE_PROBE_PERIOD; k++)
        sim_step(&s, inline_ns, inline_ns, false);
    int64_t pooled_after_first = 0, longest_probe = 0;
    for (int64_t k = 0; k < steps; k++) {
        const envd_way_t way =
            sim_step(&s, inline_ns, warming_pool_ns(&s, settled_us, decay), true);
        if (s.choice.probe_steps > longest_probe) /* (kept after a probe ends) */
            longest_probe = s.choice.probe_steps;
        if (k >= 2 * ENVD_CHOICE_PROBE_STEPS_MAX)
            pooled_after_first += way == ENVD_WAY_POOLED;
    }
    CHECK(envd_choice_better(&s.choice) == ENVD_WAY_POOLED,
          "inline chosen: estimates inline %g pooled %g", s.choice.inline_ns.ns,
          s.choice.pooled_ns.ns);
    CHECK(pooled_after_first * 100 >= (steps - 2 * ENVD_CHOICE_PROBE_STEPS_MAX) * 95,
          "%lld of %lld steps pooled", (long long)pooled_after_first, (long long)steps);
    CHECK(longest_probe <= ENVD_CHOICE_PROBE_STEPS_MAX, "a probe of %lld steps",
          (long long)longest_probe);
}

/* A pool whose steps are fast now and then but slower on average (another
 * process shares the second CPU: alternately 50 and 130 us, inline 84): a
 * probe may pick it on its best step, but the chosen way's mean gives the
 * choice back within a few steps, so the vec is never measurably slower
 * than inline all along. */
static void a_pool_fast_at_best_but_slower_on_average_stays_inline(int64_t steps)
{
    sim_t s;
    sim_init(&s);
    double total_ns = 0.0;
    for (int64_t k = 0; k < steps; k++) {
        const double pooled = k % 2 ? 130000.0 : 50000.0;
        const envd_way_t way = sim_step(&s, 84000.0, pooled, true);
        total_ns += way == ENVD_WAY_POOLED ? pooled : 84000.0;
    }
    CHECK(total_ns <= 84000.0 * (double)steps * 1.05, "%.1f us a step on average, inline 84",
          total_ns / (double)steps / 1000.0);
}

int main(int argc, char **argv)
{
    const int64_t divisor = argc > 1 ? atoll(argv[1]) : 1;
    const int64_t steps = 100000 / (divisor > 0 ? divisor : 1);
    slower_pool_stays_inline(steps);
    faster_pool_stays_pooled(steps);
    follows_a_change();
    outliers_do_not_flip();
    under_the_threshold_is_inline();
    a_zero_estimate_does_not_stick();
    probes_ended_under_the_threshold_are_rare(steps);
    probes_become_rare();
    a_warming_pool_is_measured_settled(steps, 84.0, 1.0, 75.0);
    /* every step of the first 8 slower than inline, settled after 14 more */
    a_warming_pool_is_measured_settled(steps, 70.0, 0.88, 40.0);
    a_pool_fast_at_best_but_slower_on_average_stays_inline(steps);
    printf("step_choice_check: ok\n");
    return 0;
}
