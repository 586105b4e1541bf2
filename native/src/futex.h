/*
 * futex.h -- the futex calls of envd's C (pool.c, doorbell.c, backend_workers.c),
 * written once.
 *
 * A word is private (ENVD_FUTEX_PRIVATE: only this process's threads wait on
 * it, the pool's) or shared (ENVD_FUTEX_SHARED: it lies in a MAP_SHARED
 * segment another process waits on too, the doorbell's and the hosted
 * workers' words).  Includers define _GNU_SOURCE (syscall).
 */
#ifndef ENVD_FUTEX_H
#define ENVD_FUTEX_H

#include <errno.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { ENVD_FUTEX_SHARED = 0, ENVD_FUTEX_PRIVATE = FUTEX_PRIVATE_FLAG };
/* envd_futex_wait's timeout: none, sleep until woken. */
#define ENVD_FUTEX_FOREVER (-1)

/* Sleep while *word == expected, for at most timeout_ns (ENVD_FUTEX_FOREVER:
 * no bound).  1 when the wait ran out, else 0 (woken, a signal, or *word
 * differed at once): callers re-check their condition in every case. */
static inline int envd_futex_wait(_Atomic uint32_t *word, uint32_t expected,
                                  int64_t timeout_ns, int flags)
{
    struct timespec ts = {.tv_sec = timeout_ns / 1000000000LL,
                          .tv_nsec = timeout_ns % 1000000000LL};
    return syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT | flags, expected,
                   timeout_ns < 0 ? NULL : &ts, NULL, 0) != 0 &&
           errno == ETIMEDOUT;
}

/* Wake at most count threads waiting on word (INT_MAX: all of them). */
static inline void envd_futex_wake(_Atomic uint32_t *word, int count, int flags)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE | flags, count, NULL, NULL, 0);
}

#endif /* ENVD_FUTEX_H */
