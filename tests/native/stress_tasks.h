/*
 * stress_tasks.h -- the threads of this process as /proc lists them, for the
 * C stress programs that find a thread the code under test started
 * (doorbell_stress.c, doorbell_alongside.c).
 */
#ifndef ENVD_STRESS_TASKS_H
#define ENVD_STRESS_TASKS_H

#include <dirent.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/types.h>

/* The tasks of this process, or -1 when /proc does not list them. */
static inline int list_tasks_once(pid_t *out, int cap)
{
    DIR *dir = opendir("/proc/self/task");
    if (dir == NULL)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        if (e->d_name[0] != '.' && n < cap)
            out[n++] = (pid_t)atoi(e->d_name);
    closedir(dir);
    return n;
}

static inline bool has_task(const pid_t *tasks, int n, pid_t tid)
{
    for (int i = 0; i < n; i++)
        if (tasks[i] == tid)
            return true;
    return false;
}

#endif /* ENVD_STRESS_TASKS_H */
