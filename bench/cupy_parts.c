/* cupy_parts.c -- the C half of bench/cupy_parts.py: times, from C, each step of gpumem.cupy's compiled
 * allocator functions (python/gpumem/cupy_allocate.c, cupy_pinned.c, cupy_objects.c) one at a time, so
 * that no Python loop is counted and the steps add up to the allocation and free they make.
 *
 * The three files are included here, so that each step is timed through the very functions the
 * allocator function calls (static ones included), on the allocator function gpumem.cupy.install()
 * made: its Allocate (or PinnedAllocate) is read from the function's self, whose layout is this copy's
 * (the type's name and size are checked). The copy's module is made at import (PyInit of the included
 * file: its types, names), and its blocking hook set by cupy_parts.py as gpumem.cupy sets the real one's.
 *
 *   device_part(name, allocator function, count) / pinned_part(...)  nanoseconds per step, one of
 *                 device_part_names() / pinned_part_names(): what the allocation and the free do, in order
 *   objects_call  UnownedMemory(pointer, size, owner, device) and MemoryPointer(memory, 0) through their
 *                 constructors, and dropped (what the allocator function does where it cannot do better)
 *   objects_new   the same two objects through tp_new alone (CuPy's pool's way)
 *   capsule_call  one of CuPy's C functions, from its capsule
 *   returns_object  a C function that returns a fixed object: the Python loop's own cost around a call
 * The objects' steps time a batch of BATCH made, then the batch dropped, so that making and dropping are
 * two steps; their blocks have no memory (pointer NULL), and their free's hooks check is a stub (the check
 * is its own step). Where the memory object is gpumem's own BaseMemory, its type (and so its dealloc) is
 * the one the real module made, which frees through the same code as this copy's. Built by cupy_parts.py
 * with the system's C compiler.
 */
#include "../python/gpumem/cupy_allocate.c"
#include "../python/gpumem/cupy_pinned.c"
#include "../python/gpumem/cupy_objects.c"

#include <time.h>

#define BATCH 64
#define DEVICE_SIZE 256
#define PINNED_SIZE 4096

typedef int (*int_function)(int skip_dispatch);
typedef intptr_t (*pointer_function)(void);

static PyObject *device_size_object, *pinned_size_object;

static double now_ns(void)
{
    struct timespec time;
    clock_gettime(CLOCK_MONOTONIC, &time);
    return time.tv_sec * 1e9 + time.tv_nsec;
}

/* The allocator function's self, if it is `type`'s as this copy lays it out; else NULL, an exception set. */
static PyObject *self_of(PyObject *function, PyTypeObject *type)
{
    PyObject *self = PyCFunction_Check(function) ? PyCFunction_GET_SELF(function) : NULL;
    if (self == NULL || strcmp(Py_TYPE(self)->tp_name, type->tp_name) != 0 ||
        Py_TYPE(self)->tp_basicsize != type->tp_basicsize) {
        PyErr_Format(PyExc_TypeError, "not a compiled allocator function of gpumem.cupy with a %s", type->tp_name);
        return NULL;
    }
    return self;
}

/* What every step after the first few needs: the current device, its _Device and handle cell. */
typedef struct {
    PyObject *device; /* a reference */
    int id;
    PyObject *state; /* borrowed from the dict */
    void **cell;
} where;

static int find_where(where *at, cupy_device_id_function device_id, PyObject *get_device, PyObject *devices,
                      gmcupy_device_cells *cells)
{
    at->device = gmcupy_current_device(device_id, get_device, &at->id);
    if (at->device == NULL)
        return -1;
    at->state = gmcupy_device_state(devices, cells, at->device, at->id, &at->cell);
    if (at->state != NULL)
        return 0;
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "the current device has no gpumem allocator yet (allocate once first)");
    Py_CLEAR(at->device);
    return -1;
}

static int no_hooks(int skip_dispatch)
{
    (void)skip_dispatch;
    return 0;
}

/* Run `statement` `count` times, or until it sets `failed`; `elapsed` its time. */
#define TIMED(statement)                                                                                        \
    do {                                                                                                        \
        double start_ = now_ns();                                                                               \
        for (Py_ssize_t index_ = 0; index_ < count && !failed; index_++) {                                      \
            statement;                                                                                          \
        }                                                                                                       \
        elapsed = now_ns() - start_;                                                                            \
    } while (0)

/* The index of `name` in `names` (NULL-terminated), or -1 with an exception set. */
static int step_index(const char **names, const char *name)
{
    for (int index = 0; names[index]; index++)
        if (strcmp(names[index], name) == 0)
            return index;
    PyErr_Format(PyExc_ValueError, "no step named %s", name);
    return -1;
}

/* The blocking hook set and cleared around two gpumem calls, as GPUMEM_CALL does. */
static int hook_twice(void)
{
    gmcupy_released_gil released = {NULL};
    for (int call = 0; call < 2; call++) {
        gmcupy_set_blocking_hook(gmcupy_release_gil, &released);
        gmcupy_set_blocking_hook(NULL, NULL);
    }
    return released.saved != NULL;
}

/* ---- device memory: the steps of allocate() and of its Block's free ---- */

static const char *device_names[] = {
    "size argument", "memory hooks check, allocation", "current device", "thread's context check",
    "device's allocator found", "current stream", "gm_malloc + gm_free", "blocking hook set and cleared, twice",
    "objects made: the memory (gpumem's BaseMemory, or Block and UnownedMemory), MemoryPointer", "objects dropped",
    "memory hooks check, free", NULL,
};
enum { D_SIZE, D_HOOKS, D_DEVICE, D_CONTEXT, D_STATE, D_STREAM, D_GPUMEM, D_BLOCKING, D_MADE, D_DROPPED, D_HOOKS_FREE };

static double device_steps(Allocate *self, int step, Py_ssize_t count)
{
    where at;
    if (find_where(&at, self->device_id, self->get_device, self->devices, &self->cells) < 0)
        return -1;
    size_t stream = 0;
    int failed = current_stream(self, at.device, &stream) != 0, id;
    double elapsed = 0;
    void *handle = *at.cell, **cell, *pointer;
    PyObject *device;
    switch (failed ? -1 : step) {
    case D_SIZE:
        TIMED(failed = PyLong_AsSize_t(device_size_object) != DEVICE_SIZE);
        break;
    case D_HOOKS:
    case D_HOOKS_FREE: /* the free runs the very check the allocation runs (CuPy's _has_memory_hooks through
                        * its capsule, where there is one): two rows because it is paid twice, and a
                        * difference between them is the machine's, not the code's */
        TIMED(failed = hooks_registered(self) != 0);
        break;
    case D_DEVICE:
        TIMED(device = gmcupy_current_device(self->device_id, self->get_device, &id); failed = device == NULL;
              Py_XDECREF(device));
        break;
    case D_CONTEXT:
        TIMED(failed = gmcupy_context_for_thread(self->make_current, at.device) != 0);
        break;
    case D_STATE:
        TIMED(failed = gmcupy_device_state(self->devices, &self->cells, at.device, at.id, &cell) == NULL);
        break;
    case D_STREAM:
        TIMED(failed = current_stream(self, at.device, &stream) != 0);
        break;
    case D_GPUMEM:
        TIMED(failed = self->malloc(handle, DEVICE_SIZE, stream, &pointer) != 0 || self->free(handle, pointer) != 0);
        break;
    case D_BLOCKING:
        TIMED(failed = hook_twice());
        break;
    }
    Py_DECREF(at.device);
    if (failed && !PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError, "the step %s failed", device_names[step]);
    return failed ? -1 : elapsed / count;
}

/* A copy of `self` whose hooks check is a stub: the blocks of the objects' steps. */
static Allocate *quiet_copy(Allocate *self)
{
    Allocate *copy = PyObject_New(Allocate, &AllocateType);
    if (copy == NULL)
        return NULL;
    memcpy((char *)copy + sizeof(PyObject), (char *)self + sizeof(PyObject), sizeof(Allocate) - sizeof(PyObject));
    for (PyObject **field = &copy->get_device; field < &copy->get_device + ALLOCATE_OBJECTS; field++)
        Py_INCREF(*field);
    for (int slot = 0; slot < GMCUPY_CACHED_DEVICES; slot++)
        Py_XINCREF(copy->cells.state[slot]);
    Py_XINCREF(copy->owned_recipe.type);
    Py_XINCREF(copy->memory_recipe.type);
    Py_XINCREF(copy->pointer_recipe.type);
    copy->has_hooks_function = no_hooks;
    return copy;
}

/* The objects' steps: made (`dropped` 0) or dropped (1), per object set. */
static double device_objects(Allocate *self, int dropped, Py_ssize_t count)
{
    where at;
    if (find_where(&at, self->device_id, self->get_device, self->devices, &self->cells) < 0)
        return -1;
    Allocate *copy = quiet_copy(self);
    double made = 0, gone = 0;
    Py_ssize_t rounds = count / BATCH > 0 ? count / BATCH : 1, round = 0;
    for (; copy != NULL && round < rounds; round++) {
        PyObject *objects[BATCH];
        double start = now_ns();
        int index = 0;
        for (; index < BATCH; index++)
            if ((objects[index] = wrap(copy, at.state, at.cell, at.device, at.id, NULL, NULL, device_size_object,
                                       DEVICE_SIZE)) == NULL)
                break;
        double middle = now_ns();
        for (int object = 0; object < index; object++)
            Py_DECREF(objects[object]);
        made += middle - start;
        gone += now_ns() - middle;
        if (index < BATCH)
            break;
    }
    Py_XDECREF(copy);
    Py_DECREF(at.device);
    if (PyErr_Occurred() || copy == NULL)
        return -1;
    return (dropped ? gone : made) / (rounds * BATCH);
}

static PyObject *names_list(const char **names)
{
    PyObject *list = PyList_New(0);
    for (int index = 0; list != NULL && names[index]; index++) {
        PyObject *name = PyUnicode_FromString(names[index]);
        if (name == NULL || PyList_Append(list, name) < 0)
            Py_CLEAR(list);
        Py_XDECREF(name);
    }
    return list;
}

static PyObject *device_part_names(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    return names_list(device_names);
}

/* The arguments of device_part and pinned_part, (step name, allocator function, count): the function's
 * object of `type` (NULL with the error set), the step's index among `names` and the count. */
static PyObject *part_arguments(PyObject *arguments, PyTypeObject *type, const char **names, int *step_out,
                                Py_ssize_t *count_out)
{
    const char *name;
    PyObject *function;
    if (!PyArg_ParseTuple(arguments, "sOn", &name, &function, count_out))
        return NULL;
    PyObject *self = self_of(function, type);
    *step_out = self ? step_index(names, name) : -1;
    if (*step_out < 0)
        return NULL;
    if (*count_out <= 0)
        return PyErr_Format(PyExc_ValueError, "count must be positive");
    if (gmcupy_set_blocking_hook == NULL)
        return PyErr_Format(PyExc_RuntimeError, "set this copy's blocking hook first (module.use_blocking_hook)");
    return self;
}

static PyObject *device_part(PyObject *module, PyObject *arguments)
{
    (void)module;
    int step;
    Py_ssize_t count;
    Allocate *self = (Allocate *)part_arguments(arguments, &AllocateType, device_names, &step, &count);
    if (!self)
        return NULL;
    double nanoseconds = step == D_MADE || step == D_DROPPED ? device_objects(self, step == D_DROPPED, count)
                                                              : device_steps(self, step, count);
    return nanoseconds < 0 ? NULL : PyFloat_FromDouble(nanoseconds);
}

/* ---- pinned memory: the steps of allocate_pinned() and of its PinnedBlock's free ---- */

static const char *pinned_names[] = {
    "size argument", "current device", "thread's context check", "device's allocator found",
    "current stream, allocation", "gm_host_malloc + gm_host_free_with_streams",
    "blocking hook set and cleared, twice", "objects made: PinnedBlock, its ptr, PinnedMemoryPointer",
    "objects dropped", "current stream, free", NULL,
};
enum { P_SIZE, P_DEVICE, P_CONTEXT, P_STATE, P_STREAM, P_GPUMEM, P_BLOCKING, P_MADE, P_DROPPED, P_STREAM_FREE };

static double pinned_objects(PinnedAllocate *self, where *at, int dropped, Py_ssize_t count)
{
    double made = 0, gone = 0;
    Py_ssize_t rounds = count / BATCH > 0 ? count / BATCH : 1;
    for (Py_ssize_t round = 0; round < rounds; round++) {
        PyObject *objects[BATCH];
        double start = now_ns();
        int index = 0;
        for (; index < BATCH; index++)
            if ((objects[index] = pinned_wrap(self, at->state, at->cell, at->device, at->id, Py_None, 0, NULL,
                                              pinned_size_object)) == NULL)
                break;
        double middle = now_ns();
        for (int object = 0; object < index; object++)
            Py_DECREF(objects[object]);
        made += middle - start;
        gone += now_ns() - middle;
        if (index < BATCH)
            return -1;
    }
    return (dropped ? gone : made) / (rounds * BATCH);
}

static double pinned_steps(PinnedAllocate *self, int step, Py_ssize_t count)
{
    where at;
    if (find_where(&at, self->device_id, self->get_device, self->devices, &self->cells) < 0)
        return -1;
    if (step == P_MADE || step == P_DROPPED) {
        double result = pinned_objects(self, &at, step == P_DROPPED, count);
        Py_DECREF(at.device);
        return result;
    }
    size_t stream = 0;
    PyObject *asked = allocation_stream(self, &stream), *device;
    int failed = asked == NULL, id, known;
    Py_XDECREF(asked);
    double elapsed = 0;
    void *handle = *at.cell, **cell, *pointer;
    switch (failed ? -1 : step) {
    case P_SIZE:
        TIMED(failed = PyLong_AsSize_t(pinned_size_object) != PINNED_SIZE);
        break;
    case P_DEVICE:
        TIMED(device = gmcupy_current_device(self->device_id, self->get_device, &id); failed = device == NULL;
              Py_XDECREF(device));
        break;
    case P_CONTEXT:
        TIMED(failed = gmcupy_context_for_thread(self->make_current, at.device) != 0);
        break;
    case P_STATE:
        TIMED(failed = gmcupy_device_state(self->devices, &self->cells, at.device, at.id, &cell) == NULL);
        break;
    case P_STREAM:
        TIMED(asked = allocation_stream(self, &stream); failed = asked == NULL; Py_XDECREF(asked));
        break;
    case P_GPUMEM:
        TIMED(failed = self->host_malloc(handle, PINNED_SIZE, &pointer) != 0 ||
                       self->host_free_with_streams(handle, pointer, &stream, 1) != 0);
        break;
    case P_BLOCKING:
        TIMED(failed = hook_twice());
        break;
    case P_STREAM_FREE:
        TIMED(stream_at_free(self, at.device, at.id, &known); failed = !known);
        break;
    }
    Py_DECREF(at.device);
    if (failed && !PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError, "the step %s failed", pinned_names[step]);
    return failed ? -1 : elapsed / count;
}

static PyObject *pinned_part_names(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    return names_list(pinned_names);
}

static PyObject *pinned_part(PyObject *module, PyObject *arguments)
{
    (void)module;
    int step;
    Py_ssize_t count;
    PinnedAllocate *self = (PinnedAllocate *)part_arguments(arguments, &PinnedAllocateType, pinned_names, &step, &count);
    if (!self)
        return NULL;
    double nanoseconds = pinned_steps(self, step, count);
    return nanoseconds < 0 ? NULL : PyFloat_FromDouble(nanoseconds);
}

/* ---- CuPy's objects and C functions alone ---- */

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

static PyObject *returns_object(PyObject *module, PyObject *argument)
{
    (void)argument;
    Py_INCREF(module);
    return module;
}

static PyMethodDef methods[] = {
    {"device_part_names", device_part_names, METH_NOARGS, "the steps of a device allocation and its free"},
    {"device_part", device_part, METH_VARARGS, "(step, allocator function, count) -> ns per step"},
    {"pinned_part_names", pinned_part_names, METH_NOARGS, "the steps of a pinned allocation and its free"},
    {"pinned_part", pinned_part, METH_VARARGS, "(step, pinned allocator function, count) -> ns per step"},
    {"objects_call", objects_call, METH_VARARGS, "(UnownedMemory, MemoryPointer, owner, count) -> ns"},
    {"objects_new", objects_new, METH_VARARGS, "(UnownedMemory, MemoryPointer, count) -> ns"},
    {"capsule_call", capsule_call, METH_VARARGS, "(capsule, signature, count) -> ns"},
    {"returns_object", returns_object, METH_O, "(anything) -> a fixed object: the cost of a call alone"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {PyModuleDef_HEAD_INIT, "_cupy_parts", NULL, -1, methods,
                                        NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cupy_parts(void)
{
    PyObject *copy = PyInit__gpumem_cupy_allocate(); /* this copy's types and names made ready */
    if (copy == NULL)
        return NULL;
    device_size_object = PyLong_FromLong(DEVICE_SIZE);
    pinned_size_object = PyLong_FromLong(PINNED_SIZE);
    PyObject *module = device_size_object && pinned_size_object ? PyModule_Create(&definition) : NULL;
    if (module == NULL || PyModule_AddObject(module, "module", copy) < 0) {
        Py_XDECREF(module);
        Py_DECREF(copy);
        return NULL;
    }
    return module;
}
