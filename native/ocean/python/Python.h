/* envd's Python.h stand-in for Ocean bindings that include <Python.h>
 * themselves (enduro): the few names they use, without Python (see
 * ocean_python.h). */
#include "../ocean_python.h"
