/*
 * segment_guard.c -- SIGBUS on a truncated session segment revokes that
 * segment instead of killing the daemon (see segment_guard.h).
 *
 * The table: a slot is FREE, BUSY (being filled by map, or retired by unmap:
 * the handler ignores it) or ACTIVE (start and length are set and stay set
 * until the slot leaves ACTIVE).  Only map moves a slot FREE -> BUSY ->
 * ACTIVE, only unmap ACTIVE -> BUSY -> FREE, each with a compare-and-swap, so
 * two threads never own one slot.  users counts the handlers inside a slot;
 * the handler increments it, then re-reads the state (both seq_cst), and
 * unmap stores BUSY, then waits for users == 0: either the handler sees BUSY
 * and leaves, or unmap sees the handler and waits for it, so the handler
 * never maps zero pages over an address range that was given back (and
 * perhaps reused by an unrelated mapping).
 */
#define _GNU_SOURCE
#include "segment_guard.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "envd.h"

enum { SLOT_FREE = 0, SLOT_BUSY = 1, SLOT_ACTIVE = 2 };

typedef struct {
    _Atomic int state;
    _Atomic int users;          /* signal handlers inside this slot now */
    _Atomic int revoked;
    _Atomic uintptr_t start;
    _Atomic size_t length;      /* a whole number of pages */
} slot_t;

static slot_t g_slots[ENVD_SEGMENT_GUARD_SLOTS];
/* One past the highest slot ever claimed: scans stop there (slots are
 * claimed lowest first, so it stays near the most sessions ever open). */
static _Atomic int g_high;
static _Atomic int g_installed;
static _Atomic int64_t g_revocations;
/* The handler before ours (written once, by install, before ours can run:
 * a SIGBUS between sigaction's swap and its copy-out sees it zeroed, which
 * is SIG_DFL: the right fallback). */
static struct sigaction g_previous;

static size_t page_round(size_t size)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (size + page - 1) / page * page;
}

/* Replace the mapping of slot s by zero pages if it contains addr: whether it
 * did (then the faulting access may run again). */
static int revoke_if_inside(slot_t *s, uintptr_t addr)
{
    int done = 0;
    atomic_fetch_add(&s->users, 1);
    const uintptr_t start = atomic_load(&s->start);
    const size_t length = atomic_load(&s->length);
    if (atomic_load(&s->state) == SLOT_ACTIVE && addr >= start && addr - start < length) {
        /* Anonymous private pages: the client cannot reach them, and they
         * cannot be truncated.  Several threads may fault at once: each maps
         * zero pages again, harmless on memory nobody reads any more. */
        void *p = mmap((void *)start, length, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (p != MAP_FAILED) {
            if (atomic_exchange(&s->revoked, 1) == 0)
                atomic_fetch_add(&g_revocations, 1);
            done = 1;
        }
    }
    atomic_fetch_sub(&s->users, 1);
    return done;
}

/* A SIGBUS that is not ours: what would have happened without the guard. */
static void pass_on(int sig, siginfo_t *info, void *context)
{
    if ((g_previous.sa_flags & SA_SIGINFO) && g_previous.sa_sigaction != NULL) {
        g_previous.sa_sigaction(sig, info, context);
        return;
    }
    if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN &&
        g_previous.sa_handler != NULL) {
        g_previous.sa_handler(sig);
        return;
    }
    /* The default action: a fault re-runs its instruction and faults again,
     * now fatal (with the true context in the core dump); a signal sent by
     * kill or raise is raised again, delivered once this handler returns. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGBUS, &dfl, NULL);
    if (info == NULL || info->si_code <= 0)
        raise(SIGBUS);
}

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    const int saved_errno = errno;
    int handled = 0;
    if (info != NULL && info->si_code > 0) {  /* a fault, not a kill */
        const uintptr_t addr = (uintptr_t)info->si_addr;
        const int high = atomic_load(&g_high);
        for (int i = 0; i < high && !handled; i++) {
            slot_t *s = &g_slots[i];
            if (atomic_load_explicit(&s->state, memory_order_acquire) != SLOT_ACTIVE)
                continue;
            handled = revoke_if_inside(s, addr);
        }
    }
    if (!handled)
        pass_on(sig, info, context);
    errno = saved_errno;
}

int envd_segment_guard_install(void)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&g_installed, &expected, 1))
        return ENVD_OK;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, &g_previous) != 0) {
        atomic_store(&g_installed, 0);
        return ENVD_ESYS;
    }
    return ENVD_OK;
}

int envd_segment_map(int fd, size_t size, void **out)
{
    if (fd < 0 || size == 0 || out == NULL)
        return ENVD_EINVAL;
    const size_t length = page_round(size);
    void *p = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return ENVD_ESYS;
    for (int i = 0; i < ENVD_SEGMENT_GUARD_SLOTS; i++) {
        slot_t *s = &g_slots[i];
        int expected = SLOT_FREE;
        if (!atomic_compare_exchange_strong(&s->state, &expected, SLOT_BUSY))
            continue;
        atomic_store(&s->start, (uintptr_t)p);
        atomic_store(&s->length, length);
        atomic_store(&s->revoked, 0);
        int high = atomic_load(&g_high);
        while (high < i + 1 && !atomic_compare_exchange_weak(&g_high, &high, i + 1))
            ;
        atomic_store_explicit(&s->state, SLOT_ACTIVE, memory_order_release);
        *out = p;
        return ENVD_OK;
    }
    munmap(p, length);
    return ENVD_ENOMEM;
}

/* The ACTIVE slot of the mapping at addr, or NULL. */
static slot_t *find(const void *addr)
{
    const int high = atomic_load(&g_high);
    for (int i = 0; i < high; i++) {
        slot_t *s = &g_slots[i];
        if (atomic_load_explicit(&s->state, memory_order_acquire) == SLOT_ACTIVE &&
            atomic_load(&s->start) == (uintptr_t)addr)
            return s;
    }
    return NULL;
}

int envd_segment_unmap(void *addr)
{
    for (;;) {
        slot_t *s = find(addr);
        if (s == NULL)
            return ENVD_EINVAL;
        int expected = SLOT_ACTIVE;
        if (!atomic_compare_exchange_strong(&s->state, &expected, SLOT_BUSY))
            continue;  /* retired or reused meanwhile: look again */
        while (atomic_load(&s->users) != 0)
            sched_yield();  /* a handler finishing its mmap: microseconds */
        munmap(addr, atomic_load(&s->length));
        atomic_store(&s->start, 0);
        atomic_store(&s->length, 0);
        atomic_store_explicit(&s->state, SLOT_FREE, memory_order_release);
        return ENVD_OK;
    }
}

int envd_segment_revoked(const void *addr)
{
    const slot_t *s = find(addr);
    if (s == NULL)
        return ENVD_EINVAL;
    return atomic_load(&((slot_t *)s)->revoked);
}

int64_t envd_segment_revocations(void)
{
    return atomic_load(&g_revocations);
}
