/*
 * ocean_python.h -- the little of Python's C-API an Ocean binding.c uses.
 *
 * PufferLib's bindings read their kwargs with unpack(kwargs, "name"), publish
 * their Log with assign_to_dict(dict, "name", value), and enduro's looks the
 * seed up with PyDict_GetItemString.  Here a "dict" is a fixed table of names
 * and doubles: envd's C kwargs going in, a Log's fields coming out.  No Python
 * runs; python/Python.h includes this file for the bindings that include
 * <Python.h> themselves.
 */
#ifndef ENVD_OCEAN_PYTHON_H
#define ENVD_OCEAN_PYTHON_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* More names than any Ocean binding reads or logs (enduro logs 14). */
#define ENVD_OCEAN_DICT_CAP 48

typedef struct envd_ocean_dict {
    int32_t count;
    /* set: envd_ocean_dict_set appends without looking for the name (the
     * glue's episode log, whose names it checks were distinct; see
     * ocean_episode_end) */
    bool append;
    const char *names[ENVD_OCEAN_DICT_CAP];
    double values[ENVD_OCEAN_DICT_CAP];
    /* the first problem met (a missing kwarg, a full table): "" when none */
    char error[96];
} envd_ocean_dict_t;

typedef envd_ocean_dict_t PyObject;

static inline void envd_ocean_dict_fail(envd_ocean_dict_t *d, const char *what, const char *key)
{
    if (d->error[0] == '\0')
        snprintf(d->error, sizeof(d->error), "%s '%s'", what, key);
}

/* Set name to value (replacing an entry of the same name). */
static inline void envd_ocean_dict_set(envd_ocean_dict_t *d, const char *name, double value)
{
    for (int32_t i = 0; !d->append && i < d->count; i++) {
        if (strcmp(d->names[i], name) == 0) {
            d->values[i] = value;
            return;
        }
    }
    if (d->count == ENVD_OCEAN_DICT_CAP) {
        envd_ocean_dict_fail(d, "too many entries at", name);
        return;
    }
    d->names[d->count] = name;
    d->values[d->count] = value;
    d->count++;
}

static inline const double *envd_ocean_dict_find(const envd_ocean_dict_t *d, const char *name)
{
    for (int32_t i = 0; i < d->count; i++)
        if (strcmp(d->names[i], name) == 0)
            return &d->values[i];
    return NULL;
}

/* PyDict_GetItemString: non-NULL when the key is present (the bindings only
 * test it, then unpack). */
static inline PyObject *PyDict_GetItemString(PyObject *dict, const char *key)
{
    return envd_ocean_dict_find(dict, key) ? dict : NULL;
}

/* PufferLib's unpack: the kwarg's value; a missing one is an error (there:
 * a TypeError, and 1 returned), reported by the glue after my_init. */
static inline double unpack(PyObject *kwargs, char *key)
{
    const double *v = envd_ocean_dict_find(kwargs, key);
    if (v == NULL) {
        envd_ocean_dict_fail(kwargs, "missing C kwarg", key);
        return 1;
    }
    return *v;
}

/* PufferLib's assign_to_dict: records one Log field (my_log's output). */
static inline int assign_to_dict(PyObject *dict, char *key, float value)
{
    envd_ocean_dict_set(dict, key, (double)value);
    return 0;
}

#endif /* ENVD_OCEAN_PYTHON_H */
