/*
 * plugin.h -- open a plugin shared library (see "plugins" in envd.h).
 */
#ifndef ENVD_PLUGIN_H
#define ENVD_PLUGIN_H

#include <stddef.h>

#include "envd.h"

/* Load the shared library at path, call its ENVD_PLUGIN_SYMBOL and check the
 * table: ABI version, at least one env, every definition valid.  On success
 * *out is the table and the library stays loaded for the life of the process
 * (env definitions must outlive every vec built from them).  On failure the
 * library is unloaded, *out is NULL and error (error_size bytes, NUL
 * terminated) says what is wrong: ENVD_ESYS (dlopen failed), ENVD_ENOTFOUND
 * (no entry symbol), ENVD_EABI (another ABI version), ENVD_EINVAL (a bad
 * table or definition).  Checking ids against the host's registry is the
 * caller's job. */
int envd_plugin_open(const char *path, const envd_plugin_t **out, char *error, size_t error_size);

#endif /* ENVD_PLUGIN_H */
