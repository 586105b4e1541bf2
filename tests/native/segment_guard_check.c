/*
 * segment_guard_check.c -- segment_guard.c under truncation, threads and
 * faults that are not its business.  Run plain and under TSAN / ASAN by
 * tests/native/test_segment_guard.py; argv[1] divides the loop counts.
 *
 * Checks:
 *   - a recorded mapping whose file is truncated (to 0 or to half) reads as
 *     zeros and takes writes instead of raising SIGBUS, and is revoked;
 *   - threads hammering a mapping while it is truncated all finish, while
 *     other threads map and unmap their own segments (table churn), and a
 *     bystander mapping keeps its contents;
 *   - a fault outside every recorded mapping still kills the process with
 *     SIGBUS, a SIGBUS sent by kill too, and a handler installed before the
 *     guard is called for such faults (in forked children).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "envd.h"
#include "segment_guard.h"
#include "stress_check.h"

#define PAGES 16

static long g_page;

/* The sanitizers' own SIGBUS handlers would report (and exit 66 on) the
 * faults the children must die of: leave SIGBUS to the program.  (Read by
 * the sanitizer runtimes only; unused in the plain build.) */
const char *__tsan_default_options(void);
const char *__asan_default_options(void);
const char *__tsan_default_options(void) { return "handle_sigbus=0"; }
const char *__asan_default_options(void) { return "handle_sigbus=0"; }
/* The zero pages the handler maps over a revoked segment race the other
 * threads still using it, by design: that memory was the client's to write
 * at any moment, so no one trusts its contents.  ThreadSanitizer sees the
 * mmap as a write of the whole range (often without a stack to match), so
 * the hammers' accesses are exempt; the guard's own table is not. */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void) { return "race:hammer\n"; }

/* A fresh shared-memory file of size bytes filled with byte. */
static int make_file(size_t size, unsigned char byte)
{
    int fd = memfd_create("envd-guard-check", MFD_CLOEXEC);
    CHECK(fd >= 0, "memfd_create");
    CHECK(ftruncate(fd, (off_t)size) == 0, "ftruncate");
    unsigned char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(p != MAP_FAILED, "mmap");
    memset(p, byte, size);
    munmap(p, size);
    return fd;
}

static volatile unsigned char *map_guarded(int fd, size_t size)
{
    void *p = NULL;
    int rc = envd_segment_map(fd, size, &p);
    CHECK(rc == ENVD_OK && p != NULL, "envd_segment_map: %d", rc);
    return p;
}

static void check_truncated(off_t new_size)
{
    const size_t size = PAGES * (size_t)g_page;
    const int64_t before = envd_segment_revocations();
    int fd = make_file(size, 7);
    volatile unsigned char *p = map_guarded(fd, size);
    CHECK(p[size - 1] == 7 && envd_segment_revoked((void *)p) == 0, "fresh mapping");
    CHECK(ftruncate(fd, new_size) == 0, "truncate");
    CHECK(p[size - 1] == 0, "a truncated page reads as zero");  /* faults once */
    CHECK(envd_segment_revoked((void *)p) == 1, "revoked");
    CHECK(p[0] == 0, "the whole mapping is replaced, not only the truncated pages");
    p[size - 1] = 9;
    CHECK(p[size - 1] == 9, "writes land in private memory");
    CHECK(envd_segment_revocations() == before + 1, "counted once");
    CHECK(envd_segment_unmap((void *)p) == ENVD_OK, "unmap");
    CHECK(envd_segment_revoked((void *)p) == ENVD_EINVAL, "forgotten after unmap");
    CHECK(envd_segment_unmap((void *)p) == ENVD_EINVAL, "unmap twice");
    close(fd);
}

/* ---- threads ----------------------------------------------------------------------- */
typedef struct {
    volatile unsigned char *victim;
    size_t size;
    _Atomic int *stop;
    long loops;
    size_t lane;   /* the byte of each page this thread writes (no data race) */
    _Atomic int *truncated;
    _Atomic long passes_after;  /* whole passes begun after the truncation */
} worker_t;

static void *hammer(void *arg)
{
    worker_t *w = arg;
    while (!atomic_load(w->stop)) {
        const int after = atomic_load(w->truncated);
        for (size_t i = 0; i < w->size; i += (size_t)g_page)
            w->victim[i + w->lane] = (unsigned char)(w->victim[i + w->lane] + 1);
        if (after)
            atomic_fetch_add(&w->passes_after, 1);
    }
    return NULL;
}

static void *churn(void *arg)
{
    worker_t *w = arg;
    const size_t size = 2 * (size_t)g_page;
    int fd = make_file(size, 3);
    for (long i = 0; i < w->loops; i++) {
        volatile unsigned char *p = map_guarded(fd, size);
        CHECK(p[0] == 3 && p[size - 1] == 3, "a churned mapping is intact");
        CHECK(envd_segment_unmap((void *)p) == ENVD_OK, "churn unmap");
    }
    close(fd);
    return NULL;
}

static void check_threads(long loops)
{
    const size_t size = PAGES * (size_t)g_page;
    for (long round = 0; round < loops; round++) {
        int victim_fd = make_file(size, 1), bystander_fd = make_file(size, 5);
        volatile unsigned char *victim = map_guarded(victim_fd, size);
        volatile unsigned char *bystander = map_guarded(bystander_fd, size);
        _Atomic int stop = 0, truncated = 0;
        worker_t w[4];
        pthread_t threads[4];
        for (int i = 0; i < 4; i++) {
            w[i] = (worker_t){victim, size, &stop, 200, (size_t)i, &truncated, 0};
            CHECK(pthread_create(&threads[i], NULL, i < 3 ? hammer : churn, &w[i]) == 0,
                  "pthread_create");
        }
        usleep(1000);
        CHECK(ftruncate(victim_fd, round % 2 ? 0 : (off_t)size / 2) == 0, "truncate");
        atomic_store(&truncated, 1);
        /* Every hammer crosses the truncated pages at least once (however
         * slowly a loaded machine schedules it). */
        for (int i = 0; i < 3; i++)
            while (atomic_load(&w[i].passes_after) == 0)
                usleep(100);
        atomic_store(&stop, 1);
        for (int i = 0; i < 4; i++)
            pthread_join(threads[i], NULL);
        CHECK(envd_segment_revoked((void *)victim) == 1, "the victim is revoked");
        CHECK(envd_segment_revoked((void *)bystander) == 0, "the bystander is not");
        for (size_t i = 0; i < size; i++)
            CHECK(bystander[i] == 5, "the bystander's byte %zu is intact", i);
        CHECK(envd_segment_unmap((void *)victim) == ENVD_OK, "unmap victim");
        CHECK(envd_segment_unmap((void *)bystander) == ENVD_OK, "unmap bystander");
        close(victim_fd);
        close(bystander_fd);
    }
}

/* ---- faults that are not the guard's --------------------------------------------- */
static void previous_handler(int sig)
{
    _exit(sig == SIGBUS ? 42 : 43);
}

/* Read a truncated page of a mapping the guard does not know. */
static void fault_outside(void)
{
    const size_t size = 2 * (size_t)g_page;
    int fd = make_file(size, 1);
    volatile unsigned char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(p != MAP_FAILED, "mmap");
    CHECK(ftruncate(fd, 0) == 0, "truncate");
    (void)p[size - 1];
}

/* Fork; in the child, optionally install previous_handler, install the
 * guard, revoke one guarded mapping (the guard works), then do `what`
 * (0: fault outside, 1: kill itself with SIGBUS).  Its wait status. */
static int child_status(int with_previous, int what)
{
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        if (with_previous)
            signal(SIGBUS, previous_handler);
        CHECK(envd_segment_guard_install() == ENVD_OK, "install");
        check_truncated(0);
        if (what == 0)
            fault_outside();
        else
            kill(getpid(), SIGBUS);
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    return status;
}

static void check_not_ours(void)
{
    int status = child_status(0, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS,
          "a fault outside the segments kills with SIGBUS (status %#x)", status);
    status = child_status(0, 1);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS,
          "a SIGBUS sent by kill still kills (status %#x)", status);
    status = child_status(1, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 42,
          "the previous handler gets a fault outside the segments (status %#x)", status);
}

int main(int argc, char **argv)
{
    const long divisor = argc > 1 ? atol(argv[1]) : 1;
    g_page = sysconf(_SC_PAGESIZE);
    check_not_ours();  /* first: forks while this process has one thread */
    CHECK(envd_segment_guard_install() == ENVD_OK, "install");
    CHECK(envd_segment_guard_install() == ENVD_OK, "install twice");
    CHECK(envd_segment_map(-1, 4096, &(void *){NULL}) == ENVD_EINVAL, "bad fd");
    check_truncated(0);
    check_truncated(PAGES / 2 * g_page);
    check_truncated(1);
    check_threads(40 / divisor + 1);
    printf("segment_guard: ok\n");
    return 0;
}
