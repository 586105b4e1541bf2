/*
 * stress_check.h -- the failure macro shared by the C stress programs.
 * A failed check prints where and why, then exits 1: the pytest wrapper
 * (cbuild.run_stress) reports the exit status and the output.
 */
#ifndef ENVD_STRESS_CHECK_H
#define ENVD_STRESS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

#endif /* ENVD_STRESS_CHECK_H */
