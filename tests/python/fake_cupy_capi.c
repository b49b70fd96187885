/* fake_cupy_capi.c -- the C functions of CuPy's Cython modules that gpumem.cupy's compiled path calls,
 * exported as Cython exports them (a module's __pyx_capi__: name -> capsule named by the C signature),
 * for tests/python/test_cupy_capsules.py. The values they return are set from Python, and each call is
 * counted, so that a test sees which of CuPy's functions the allocation called. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static int device, has_hooks, failing;
static intptr_t stream;
static long calls;

static int failed(void)
{
    calls++;
    if (failing)
        PyErr_SetString(PyExc_RuntimeError, "CuPy's C function failed");
    return failing;
}

static int get_device_id(int skip_dispatch)
{
    (void)skip_dispatch;
    return failed() ? -1 : device;
}

static intptr_t get_current_stream_ptr(void)
{
    return failed() ? -1 : stream;
}

static int has_memory_hooks(int skip_dispatch)
{
    (void)skip_dispatch;
    return failed() ? -1 : has_hooks;
}

static PyObject *set_values(PyObject *module, PyObject *arguments)
{
    (void)module;
    long long stream_value;
    if (!PyArg_ParseTuple(arguments, "iLii", &device, &stream_value, &has_hooks, &failing))
        return NULL;
    stream = (intptr_t)stream_value;
    Py_RETURN_NONE;
}

static PyObject *call_count(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromLong(calls);
}

static PyMethodDef methods[] = {
    {"set", set_values, METH_VARARGS, "set(device, stream pointer, has hooks, failing)"},
    {"calls", call_count, METH_NOARGS, "how many times the C functions were called"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {PyModuleDef_HEAD_INIT, "fake_cupy_capi", NULL, -1, methods,
                                        NULL, NULL, NULL, NULL};

/* module.NAME = {function: capsule named `signature`} */
static int export(PyObject *module, const char *name, const char *function, void *pointer, const char *signature)
{
    PyObject *capi = PyDict_New();
    PyObject *capsule = PyCapsule_New(pointer, signature, NULL);
    int result = capi && capsule ? PyDict_SetItemString(capi, function, capsule) : -1;
    Py_XDECREF(capsule);
    if (result == 0)
        result = PyModule_AddObject(module, name, capi);
    if (result != 0)
        Py_XDECREF(capi);
    return result;
}

PyMODINIT_FUNC PyInit_fake_cupy_capi(void)
{
    PyObject *module = PyModule_Create(&definition);
    if (module == NULL)
        return NULL;
    if (export(module, "device", "get_device_id", (void *)get_device_id, "int (int __pyx_skip_dispatch)") ||
        export(module, "stream", "get_current_stream_ptr", (void *)get_current_stream_ptr, "intptr_t (void)") ||
        export(module, "memory_hook", "_has_memory_hooks", (void *)has_memory_hooks, "int (int __pyx_skip_dispatch)") ||
        export(module, "wrong_device", "get_device_id", (void *)get_device_id, "long (int __pyx_skip_dispatch)")) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
