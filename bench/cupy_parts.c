/* cupy_parts.c -- the C half of bench/cupy_parts.py: times, from C, the parts of gpumem.cupy's compiled
 * allocator function (python/gpumem/cupy_allocate.c) one at a time, so that no Python loop is counted.
 *   objects_call  UnownedMemory(pointer, size, owner, device) and MemoryPointer(memory, 0) through their
 *                 constructors, as the allocator function makes them, and dropped
 *   objects_new   the same two objects through tp_new alone (CuPy's pool makes its own without the
 *                 constructors' argument parsing)
 *   gpumem_pair   gm_malloc(256 B, stream 0) and gm_free through the addresses the allocator function uses
 *   device_id / stream_pointer / has_hooks   CuPy's C functions the allocator function calls, from their
 *                 capsules (cupy.cuda.device.get_device_id, stream.get_current_stream_ptr,
 *                 memory_hook._has_memory_hooks)
 * Each returns nanoseconds per iteration. Built by cupy_parts.py with the system's C compiler.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef int (*malloc_function)(void *allocator, size_t size, size_t stream, void **pointer_out);
typedef int (*free_function)(void *allocator, void *pointer);
typedef int (*int_function)(int skip_dispatch);
typedef intptr_t (*pointer_function)(void);

static double now_ns(void)
{
    struct timespec time;
    clock_gettime(CLOCK_MONOTONIC, &time);
    return time.tv_sec * 1e9 + time.tv_nsec;
}

static PyObject *objects_call(PyObject *module, PyObject *arguments)
{
    (void)module;
    PyObject *unowned_memory, *memory_pointer, *owner;
    long count;
    if (!PyArg_ParseTuple(arguments, "OOOl", &unowned_memory, &memory_pointer, &owner, &count))
        return NULL;
    PyObject *zero = PyLong_FromLong(0), *size = PyLong_FromLong(256), *pointer = PyLong_FromLong(1L << 40);
    double start = now_ns();
    for (long index = 0; index < count; index++) {
        PyObject *memory_arguments[4] = {pointer, size, owner, zero};
        PyObject *memory = PyObject_Vectorcall(unowned_memory, memory_arguments, 4, NULL);
        if (memory == NULL)
            return NULL;
        PyObject *pointer_arguments[2] = {memory, zero};
        PyObject *result = PyObject_Vectorcall(memory_pointer, pointer_arguments, 2, NULL);
        Py_DECREF(memory);
        if (result == NULL)
            return NULL;
        Py_DECREF(result);
    }
    double elapsed = now_ns() - start;
    Py_DECREF(zero), Py_DECREF(size), Py_DECREF(pointer);
    return PyFloat_FromDouble(elapsed / count);
}

static PyObject *objects_new(PyObject *module, PyObject *arguments)
{
    (void)module;
    PyTypeObject *unowned_memory, *memory_pointer;
    long count;
    if (!PyArg_ParseTuple(arguments, "O!O!l", &PyType_Type, &unowned_memory, &PyType_Type, &memory_pointer, &count))
        return NULL;
    PyObject *empty = PyTuple_New(0);
    double start = now_ns();
    for (long index = 0; index < count; index++) {
        PyObject *memory = unowned_memory->tp_new(unowned_memory, empty, NULL);
        PyObject *result = memory ? memory_pointer->tp_new(memory_pointer, empty, NULL) : NULL;
        Py_XDECREF(memory);
        if (result == NULL)
            return NULL;
        Py_DECREF(result);
    }
    double elapsed = now_ns() - start;
    Py_DECREF(empty);
    return PyFloat_FromDouble(elapsed / count);
}

static PyObject *gpumem_pair(PyObject *module, PyObject *arguments)
{
    (void)module;
    unsigned long long malloc_address, free_address, handle_address;
    long count;
    if (!PyArg_ParseTuple(arguments, "KKKl", &malloc_address, &free_address, &handle_address, &count))
        return NULL;
    malloc_function allocate = (malloc_function)(uintptr_t)malloc_address;
    free_function release = (free_function)(uintptr_t)free_address;
    void *handle = *(void **)(uintptr_t)handle_address;
    double start = now_ns();
    for (long index = 0; index < count; index++) {
        void *pointer;
        int status = allocate(handle, 256, 0, &pointer);
        if (status != 0)
            return PyErr_Format(PyExc_RuntimeError, "gm_malloc failed with status %d", status);
        release(handle, pointer);
    }
    return PyFloat_FromDouble((now_ns() - start) / count);
}

/* capsule_call(capsule, signature, count): one of CuPy's C functions called `count` times. */
static PyObject *capsule_call(PyObject *module, PyObject *arguments)
{
    (void)module;
    PyObject *capsule;
    const char *signature;
    long count;
    if (!PyArg_ParseTuple(arguments, "Osl", &capsule, &signature, &count))
        return NULL;
    void *function = PyCapsule_GetPointer(capsule, signature);
    if (function == NULL)
        return NULL;
    long sum = 0;
    double start = now_ns();
    for (long index = 0; index < count; index++)
        sum += strcmp(signature, "intptr_t (void)") == 0 ? (long)((pointer_function)function)()
                                                          : ((int_function)function)(0);
    double elapsed = now_ns() - start;
    if (PyErr_Occurred())
        return NULL;
    (void)sum;
    return PyFloat_FromDouble(elapsed / count);
}

static PyMethodDef methods[] = {
    {"objects_call", objects_call, METH_VARARGS, "(UnownedMemory, MemoryPointer, owner, count) -> ns"},
    {"objects_new", objects_new, METH_VARARGS, "(UnownedMemory, MemoryPointer, count) -> ns"},
    {"gpumem_pair", gpumem_pair, METH_VARARGS, "(gm_malloc, gm_free, handle's address, count) -> ns"},
    {"capsule_call", capsule_call, METH_VARARGS, "(capsule, signature, count) -> ns"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {PyModuleDef_HEAD_INIT, "_cupy_parts", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cupy_parts(void)
{
    return PyModule_Create(&definition);
}
