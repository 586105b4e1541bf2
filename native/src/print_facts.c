/*
 * print_facts.c -- a program run at build time, not part of the library: it
 * prints the facts that the Python side shares with the C core, for
 * native/build_ffi.py to write into the module envd._native_facts (so the client,
 * which never loads native code, still reads them from one source).  The
 * compiler computes every value -- the X-macro tables of envd.h and
 * builtin_envs.h, the macros, offsetof and sizeof of the doorbell -- so
 * nothing is counted by hand.
 *
 * One fact per line, fields separated by tabs:
 *   const  NAME  VALUE            an integer constant
 *   error  NAME  VALUE  MESSAGE   a row of ENVD_ERRNO_MAP, in table order
 *   field  NAME  OFFSET  SIZE     a field of envd_doorbell_header_t (bytes)
 *   env    ID                     a built-in env, in envd_builtin_get's order
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>

#include "builtin_envs.h"
#include "envd.h"
#include "doorbell.h"
#include "pool.h"
#include "vec.h"

#define PRINT_CONST(name) printf("const\t%s\t%" PRId64 "\n", #name, (int64_t)(name))
#define PRINT_ERROR(name, value, message) printf("error\t%s\t%d\t%s\n", #name, (value), message);
#define PRINT_FIELD(name)                                                                  \
    printf("field\t%s\t%zu\t%zu\n", #name, offsetof(envd_doorbell_header_t, name),            \
           sizeof(((envd_doorbell_header_t *)0)->name))

int main(void)
{
    PRINT_CONST(ENVD_ABI_VERSION);
    PRINT_CONST(ENVD_ABI_VERSION_MIN);
    PRINT_CONST(ENVD_ERROR_MIN);
    ENVD_ERRNO_MAP(PRINT_ERROR)
    PRINT_CONST(ENVD_VEC_MAX_ENVS);
    PRINT_CONST(ENVD_POOL_MAX_THREADS);
    PRINT_CONST(ENVD_DOORBELL_OFFSET);
    PRINT_CONST(ENVD_DOORBELL_STEP);
    PRINT_CONST(ENVD_DOORBELL_SEND);
    PRINT_CONST(ENVD_DOORBELL_RECV);
    PRINT_CONST(ENVD_DOORBELL_SENDRECV);
    PRINT_CONST(ENVD_DOORBELL_LAYOUT);
    PRINT_CONST(ENVD_DOORBELL_SHUTTING_DOWN);
    printf("const\tENVD_DOORBELL_HEADER_SIZE\t%zu\n", sizeof(envd_doorbell_header_t));
    PRINT_FIELD(req_seq);
    PRINT_FIELD(req_kind);
    PRINT_FIELD(client_waiting);
    PRINT_FIELD(req_count);
    PRINT_FIELD(done_seq);
    PRINT_FIELD(status);
    PRINT_FIELD(result);
    PRINT_FIELD(error_index);
    PRINT_FIELD(closed);
    PRINT_FIELD(contended);
    PRINT_FIELD(sent);
    PRINT_FIELD(server_asleep);
    PRINT_FIELD(missed_rings);
    PRINT_FIELD(message);
    for (int i = 0; i < envd_builtin_count(); i++)
        printf("env\t%s\n", envd_builtin_get(i)->id);
    return ferror(stdout) ? 1 : 0;
}
