/*
 * bound_call.c -- envd.native._envd_call: a native call `int fn(void *arg)`
 * bound to its argument, called from Python without cffi's GIL dance.
 *
 * Why: a cffi call always releases the GIL and takes it back; its wrapper
 * costs about 600 instructions a call (callgrind), this call about 190 with
 * the question below; a cheap env's whole in-place step at N=64 costs about
 * 11,500 (puffer:squared; docs/benchmarks.md), and PufferLib's own binding
 * keeps the GIL through its vec_step.  So a bound call first calls a second
 * native function, `int if_short(void *arg)`, with the GIL held: it runs the
 * call itself when the call is short and waits for nothing (no lock another
 * thread holds, no pool thread), returning its result, or returns
 * BOUND_NOT_RUN having done nothing; then fn(arg) runs with the GIL released
 * (a long step, or one that waits for other threads, must not stall the
 * program's other Python threads, and a thread that holds a lock fn takes
 * may be waiting for the GIL).  For envd's sessions these are
 * envd_session_step and envd_session_step_if_short (session.h), their
 * addresses handed over by cffi (native_session.py), so this module links
 * nothing of envd.
 *
 * Bound(fn, arg, if_short): three addresses (integers; if_short may be 0:
 * always release the GIL).  call(bound): fn(arg) as an int.  bound.clear():
 * arg is NULL from now on, and stays NULL (envd's functions refuse a NULL
 * session with ENVD_EINVAL): the owner clears it before it frees arg.
 * A call reads arg under the GIL, so a clear cannot come between the read
 * and a short call; a call that released the GIL must not race the free of
 * arg, which its owner rules out (envd's VecEnv: its claim, vector_base.py).
 *
 * CPython's limited API (3.10), like the cffi module: one cp310-abi3 wheel.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <stdint.h>

typedef int (*bound_fn_t)(void *);

/* if_short's "not run" (session.h's ENVD_SESSION_NOT_RUN). */
#define BOUND_NOT_RUN INT_MIN

typedef struct {
    PyObject_HEAD
    bound_fn_t fn;
    bound_fn_t if_short; /* NULL: never short */
    void *arg;
} bound_t;

/* The Bound type (a heap type made once, at import; the module is never
 * unloaded, so it lives as long as the process). */
static PyTypeObject *bound_type;

static void *address(PyObject *value, const char *what)
{
    void *p = PyLong_AsVoidPtr(value);
    if (p == NULL && !PyErr_Occurred() && what != NULL)
        PyErr_Format(PyExc_ValueError, "Bound: %s must be a non-zero address", what);
    return p;
}

static PyObject *bound_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"fn", "arg", "if_short", NULL};
    PyObject *fn_obj, *arg_obj, *short_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:Bound", names, &fn_obj, &arg_obj,
                                     &short_obj))
        return NULL;
    void *fn = address(fn_obj, "fn");
    if (fn == NULL)
        return NULL;
    void *arg = address(arg_obj, NULL); /* (NULL allowed: a refusing call) */
    if (arg == NULL && PyErr_Occurred())
        return NULL;
    void *if_short = address(short_obj, NULL);
    if (if_short == NULL && PyErr_Occurred())
        return NULL;
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    bound_t *self = (bound_t *)alloc(type, 0);
    if (self == NULL)
        return NULL;
    /* Function pointers from integers: the addresses cffi took of functions
     * (conversion through uintptr_t, as POSIX's dlsym results are used). */
    self->fn = (bound_fn_t)(uintptr_t)fn;
    self->if_short = (bound_fn_t)(uintptr_t)if_short;
    self->arg = arg;
    return (PyObject *)self;
}

static void bound_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    freefunc free_ = (freefunc)PyType_GetSlot(type, Py_tp_free);
    free_(self);
    Py_DECREF(type); /* (a heap type's instances hold a reference to it) */
}

static PyObject *bound_clear(PyObject *self, PyObject *unused)
{
    (void)unused;
    ((bound_t *)self)->arg = NULL;
    Py_RETURN_NONE;
}

static PyObject *bound_cleared(PyObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((bound_t *)self)->arg == NULL);
}

static PyMethodDef bound_methods[] = {
    {"clear", bound_clear, METH_NOARGS,
     "Bind NULL from now on (before the argument is freed); idempotent."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef bound_getset[] = {
    {"cleared", bound_cleared, NULL, "Whether clear() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot bound_slots[] = {
    {Py_tp_doc, (void *)"Bound(fn, arg, if_short): int fn(void *) bound to arg (addresses); "
                        "call(bound) runs if_short(arg) holding the GIL, and fn(arg) with "
                        "the GIL released where if_short did not run it."},
    {Py_tp_new, (void *)bound_new},
    {Py_tp_dealloc, (void *)bound_dealloc},
    {Py_tp_methods, bound_methods},
    {Py_tp_getset, bound_getset},
    {0, NULL},
};

static PyType_Spec bound_spec = {
    .name = "envd.native._envd_call.Bound",
    .basicsize = sizeof(bound_t),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = bound_slots,
};

/* call(bound): the hot path, one METH_O call (no argument tuple). */
static PyObject *call(PyObject *module, PyObject *obj)
{
    (void)module;
    if (Py_TYPE(obj) != bound_type) {
        PyErr_SetString(PyExc_TypeError, "call() takes a Bound");
        return NULL;
    }
    const bound_t *b = (const bound_t *)obj;
    void *arg = b->arg; /* read under the GIL: see the top of the file */
    const bound_fn_t fn = b->fn;
    int rc = b->if_short != NULL ? b->if_short(arg) : BOUND_NOT_RUN;
    if (rc == BOUND_NOT_RUN) {
        Py_BEGIN_ALLOW_THREADS
        rc = fn(arg);
        Py_END_ALLOW_THREADS
    }
    return PyLong_FromLong(rc);
}

static PyMethodDef module_methods[] = {
    {"call", call, METH_O,
     "call(bound) -> int: bound's fn(arg), run by if_short(arg) with the GIL held where "
     "short, else with the GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "envd.native._envd_call",
    .m_doc = "A native call bound to its argument, called without cffi's GIL release "
             "when it is short (native/capi/bound_call.c).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__envd_call(void)
{
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (bound_type == NULL) {
        bound_type = (PyTypeObject *)PyType_FromSpec(&bound_spec);
        if (bound_type == NULL) {
            Py_DECREF(module);
            return NULL;
        }
    }
    if (PyModule_AddObjectRef(module, "Bound", (PyObject *)bound_type) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
