/*
 * spin.h -- what spinning threads share (the pool's workers, the doorbell's
 * server threads): a CPU hint for busy-wait loops, a monotonic clock and the
 * number of CPUs to share.  Includers define _GNU_SOURCE (sched_getaffinity).
 */
#ifndef ENVD_SPIN_H
#define ENVD_SPIN_H

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

/* Tell the CPU this is a spin-wait (frees the sibling hyper-thread, saves power). */
static inline void envd_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

static inline int64_t envd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* CPUs this process may run on (its affinity mask, which containers narrow),
 * falling back to the online count; at least 1. */
static inline int envd_usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

#endif /* ENVD_SPIN_H */
