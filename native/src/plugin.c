/*
 * plugin.c -- open a plugin shared library and check its env table.
 *
 * Invariants: a library is only kept open when its whole table is valid, and
 * once the host has registered its envs it is never closed -- vecs point
 * into its definitions and code.  The ABI
 * version is read before anything else because envd_plugin_t's first field
 * keeps its place in every ABI version, while the rest may change.  Tables of
 * ABI ENVD_ABI_VERSION_MIN..ENVD_ABI_VERSION load; each definition is then
 * read as its own abi_version says (see envd_env_def_render_info).
 */
#include <dlfcn.h>
#include <stdio.h>

#include "plugin.h"

int envd_plugin_open(const char *path, const envd_plugin_t **out, void **handle_out, char *error,
                     size_t size)
{
    *out = NULL;
    *handle_out = NULL;
    /* RTLD_LOCAL: plugins cannot see each other's symbols (two plugins may
     * both define a helper called step); RTLD_NOW: an unresolved symbol
     * fails here, not in the middle of a step. */
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        const char *why = dlerror();
        snprintf(error, size, "cannot load it: %s", why ? why : "unknown dlopen error");
        return ENVD_ESYS;
    }
    int rc = ENVD_EINVAL;
    envd_plugin_fn entry;
    *(void **)&entry = dlsym(handle, ENVD_PLUGIN_SYMBOL);
    const envd_plugin_t *table = entry ? entry() : NULL;
    if (entry == NULL) {
        snprintf(error, size, "it does not export %s() (see \"plugins\" in envd.h)",
                 ENVD_PLUGIN_SYMBOL);
        rc = ENVD_ENOTFOUND;
    } else if (table == NULL) {
        snprintf(error, size, "%s() returned NULL", ENVD_PLUGIN_SYMBOL);
    } else if (table->abi_version < ENVD_ABI_VERSION_MIN ||
               table->abi_version > ENVD_ABI_VERSION) {
        snprintf(error, size,
                 "it was built for envd ABI %u but this envd has ABI %u (and loads ABI %u..%u); "
                 "rebuild it against this envd's envd.h (python -m envd.native --include)",
                 (unsigned)table->abi_version, (unsigned)ENVD_ABI_VERSION,
                 (unsigned)ENVD_ABI_VERSION_MIN, (unsigned)ENVD_ABI_VERSION);
        rc = ENVD_EABI;
    } else if (table->num_envs < 1 || table->envs == NULL) {
        snprintf(error, size, "%s() returned a table without envs (num_envs %d)",
                 ENVD_PLUGIN_SYMBOL, (int)table->num_envs);
    } else {
        rc = ENVD_OK;
        for (int32_t i = 0; i < table->num_envs && rc == ENVD_OK; i++) {
            const envd_env_def_t *def = table->envs[i];
            const char *problem = envd_env_def_problem(def);
            if (problem != NULL) {
                snprintf(error, size, "env #%d (%s) is invalid: %s", (int)i,
                         def && def->id ? def->id : "no id", problem);
                rc = envd_env_def_validate(def) == ENVD_EABI ? ENVD_EABI : ENVD_EINVAL;
            }
        }
    }
    if (rc != ENVD_OK) {
        dlclose(handle);
        return rc;
    }
    *out = table;
    *handle_out = handle;
    return ENVD_OK;
}

void envd_plugin_unload(void *handle)
{
    if (handle)
        dlclose(handle);
}
