/*
 * plugin.h -- open a plugin shared library (see "plugins" in envd.h).
 */
#ifndef ENVD_PLUGIN_H
#define ENVD_PLUGIN_H

#include <stddef.h>

#include "envd.h"

/* cffi:begin */
/* Load the shared library at path, call its ENVD_PLUGIN_SYMBOL and check the
 * table: ABI version, at least one env, every definition valid.  On success
 * *out is the table and *handle the library's, which stays loaded until
 * envd_plugin_unload(*handle) -- call that only when the host refuses the
 * plugin after all (e.g. a duplicate id) and before anything used it: env
 * definitions must outlive every vec built from them.  On failure the library
 * is unloaded, *out and *handle are NULL and error (error_size bytes, NUL
 * terminated) says what is wrong: ENVD_ESYS (dlopen failed), ENVD_ENOTFOUND
 * (no entry symbol), ENVD_EABI (another ABI version), ENVD_EINVAL (a bad
 * table or definition). */
int envd_plugin_open(const char *path, const envd_plugin_t **out, void **handle, char *error,
                     size_t error_size);
void envd_plugin_unload(void *handle);
/* cffi:end */

#endif /* ENVD_PLUGIN_H */
