/*
 * segment_guard.h -- the daemon survives a client that truncates its session
 * segment.
 *
 * A session's segment is a file under /dev/shm that its client can open and
 * ftruncate at any moment (same uid).  A shared mapping of a truncated file
 * raises SIGBUS on any access past the new end of file: without a guard, a
 * pool worker stepping the envs, the doorbell's thread or the event loop's
 * Python would kill the daemon and every other session with it.
 *
 * The guard (the design libwayland-server uses for client wl_shm pools):
 * segments are mapped with envd_segment_map, which records the mapping in a
 * fixed table readable from a signal handler; a process-wide SIGBUS handler
 * (envd_segment_guard_install) that finds the faulting address inside a
 * recorded mapping maps private anonymous zero pages over the whole mapping
 * (mmap MAP_FIXED), marks it revoked and returns, so the faulting instruction
 * runs again on the zero pages and succeeds.  From then on the daemon works on
 * private memory the client cannot see: its results are lost to the client
 * (it truncated them away), nothing else is touched, and the daemon closes
 * the session once it sees envd_segment_revoked.  A SIGBUS anywhere else is a
 * real bug: the handler hands it to the handler installed before it (Python's
 * faulthandler, say), or restores the default action so the fault, raised
 * again as the instruction re-runs, kills the process as it would have.
 *
 * Signal safety: the handler takes no lock and allocates nothing; it reads
 * the table's atomics and calls mmap (a system call).  A slot being retired
 * (envd_segment_unmap) is not reused or unmapped while a handler uses it:
 * the handler counts itself in the slot's users before checking its state,
 * and unmap marks the state first, then waits for users to drop to zero.
 *
 * Threads: map, unmap and revoked may be called from any thread.  A mapping
 * must be unmapped once, by its owner, after every thread stopped using it.
 */
#ifndef ENVD_SEGMENT_GUARD_H
#define ENVD_SEGMENT_GUARD_H

#include <stddef.h>
#include <stdint.h>

/* cffi:begin */
/* Mappings recorded at once; map refuses more (ENVD_ENOMEM). */
#define ENVD_SEGMENT_GUARD_SLOTS 65536

/* Install the SIGBUS handler (once per process; later calls do nothing).
 * Call it after anything else that installs a SIGBUS handler (faulthandler):
 * that one is then chained for faults outside the segments. */
int envd_segment_guard_install(void);

/* Map size bytes of fd (shared, read-write) and record the mapping; *out is
 * its address.  ENVD_EINVAL (bad arguments), ENVD_ESYS (mmap failed, see
 * errno) or ENVD_ENOMEM (the table is full). */
int envd_segment_map(int fd, size_t size, void **out);

/* Forget the mapping at addr (from envd_segment_map) and unmap it;
 * ENVD_EINVAL if addr is not a recorded mapping. */
int envd_segment_unmap(void *addr);

/* 1 if the mapping at addr was revoked (its file was truncated under it and
 * zero pages replaced it), 0 if not, ENVD_EINVAL if addr is not recorded. */
int envd_segment_revoked(const void *addr);

/* Revocations since the process started (every mapping counted once). */
int64_t envd_segment_revocations(void);
/* cffi:end */

#endif
