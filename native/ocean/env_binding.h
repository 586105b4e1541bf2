/*
 * env_binding.h -- envd's, standing where PufferLib's stands.
 *
 * `envd ocean build` puts this file at the path an Ocean binding.c's
 * `#include "../env_binding.h"` resolves to, so binding.c and <env>.h compile
 * unmodified: binding.c has defined Env (and included <env>.h, hence Log,
 * c_reset, c_step, c_close) before it includes this file, and defines my_init
 * and my_log after it.  In place of PufferLib's Python glue this file brings
 * the kwargs stand-in (ocean_python.h), the env's manifest (its make kwargs,
 * its C kwargs and spaces as functions of them: manifest.h, copied from
 * manifests/<env>.h) and the envd ABI 5 definition over them (ocean_glue.h).
 */
#include <envd.h>

#include "ocean_python.h"
#include "ocean_layout.h"

static int my_log(PyObject *dict, Log *log);
static int my_init(Env *env, PyObject *args, PyObject *kwargs);
/* Every manifest defines it (the glue's describe reports it as heap_bytes):
 * without one the plugin does not build. */
static uint64_t ocean_heap_bytes(const double *params);

#include "manifest.h"
#include "ocean_glue.h"
