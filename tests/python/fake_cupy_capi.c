/* fake_cupy_capi.c -- the C parts of CuPy that gpumem.cupy's compiled path meets, for
 * tests/python/test_cupy_capsules.py:
 *   - the C functions of CuPy's Cython modules it calls, exported as Cython exports them (a module's
 *     __pyx_capi__: name -> capsule named by the C signature); the values they return are set from
 *     Python (get_memory_hooks calls a function set from Python), and each call is counted, so that a
 *     test sees which of CuPy's functions the allocation called;
 *   - CuPy's memory types as Cython lays them out (CuPy 14: BaseMemory with public ptr, size and device_id,
 *     subclassable; UnownedMemory adding a read-only _owner; MemoryPointer and PinnedMemoryPointer with a
 *     vtable pointer and read-only fields; tp_new sets the vtable and None in object fields, __init__
 *     parses its arguments and sets the fields), whose constructors and tp_new calls are counted.
 *     Switches: `stamping` makes each __init__, and BaseMemory's ptr setter, also set a field tp_new leaves
 *     0 (a constructor or setter that does more than the fields gpumem.cupy knows), `failing_new` makes
 *     tp_new raise. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

static int device, has_hooks, failing;
static intptr_t stream;
static long calls;
static char failing_only[64]; /* the one function that fails, or "" for all */

/* Whether `function` returns -1. failing 1: raise and return -1 (Cython's `except? -1`); 2: raise and
 * return the usual value (`except *`). */
static int failed(const char *function)
{
    calls++;
    if (!failing || (failing_only[0] && strcmp(failing_only, function) != 0))
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "CuPy's C function failed");
    return failing == 1;
}

static int get_device_id(int skip_dispatch)
{
    (void)skip_dispatch;
    return failed("get_device_id") ? -1 : device;
}

static intptr_t get_current_stream_ptr(void)
{
    return failed("get_current_stream_ptr") ? -1 : stream;
}

static int has_memory_hooks(int skip_dispatch)
{
    (void)skip_dispatch;
    return failed("_has_memory_hooks") ? -1 : has_hooks;
}

static PyObject *hooks_source; /* () -> the thread's dict of hooks: the stand-in's get_memory_hooks */

static PyObject *get_memory_hooks(int skip_dispatch)
{
    (void)skip_dispatch;
    if (failed("get_memory_hooks") || PyErr_Occurred()) /* an object's error is always NULL */
        return NULL;
    if (hooks_source == NULL)
        return PyDict_New();
    return PyObject_CallNoArgs(hooks_source);
}

static PyObject *set_hooks_source(PyObject *module, PyObject *function)
{
    (void)module;
    Py_XDECREF(hooks_source);
    Py_INCREF(function);
    hooks_source = function;
    Py_RETURN_NONE;
}

static PyObject *set_values(PyObject *module, PyObject *arguments)
{
    (void)module;
    long long stream_value;
    const char *only = "";
    if (!PyArg_ParseTuple(arguments, "iLii|s", &device, &stream_value, &has_hooks, &failing, &only))
        return NULL;
    snprintf(failing_only, sizeof failing_only, "%s", only);
    stream = (intptr_t)stream_value;
    Py_RETURN_NONE;
}

static PyObject *call_count(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromLong(calls);
}


/* ---- CuPy's memory types ---- */

static int stamping, failing_new;
static long constructed, made_new;
static int vtable; /* what the vtable pointer points at */

typedef struct {
    PyObject_HEAD
    intptr_t ptr;
    size_t size;
    int device_id;
    int stamp;
} BaseMemory;

typedef struct {
    BaseMemory base;
    PyObject *owner;
    int stamp;
} UnownedMemory;

typedef struct {
    PyObject_HEAD
    void *vtab;
    intptr_t ptr;
    int device_id;
    PyObject *mem;
    int stamp;
} MemoryPointer;

typedef struct {
    PyObject_HEAD
    void *vtab;
    PyObject *mem;
    size_t ptr;
    Py_ssize_t shape[1], strides[1];
    int stamp;
} PinnedMemoryPointer;

/* tp_new as Cython's: the object zeroed, its vtable set, None in its object field. */
static PyObject *cython_new(PyTypeObject *type, Py_ssize_t vtab_offset, Py_ssize_t object_offset)
{
    if (failing_new) {
        PyErr_SetString(PyExc_RuntimeError, "tp_new failed");
        return NULL;
    }
    PyObject *object = type->tp_alloc(type, 0);
    if (object == NULL)
        return NULL;
    made_new++;
    if (vtab_offset >= 0)
        *(void **)((char *)object + vtab_offset) = &vtable;
    if (object_offset >= 0) {
        Py_INCREF(Py_None);
        *(PyObject **)((char *)object + object_offset) = Py_None;
    }
    return object;
}

static PyObject *base_new(PyTypeObject *type, PyObject *arguments, PyObject *keywords)
{
    (void)arguments, (void)keywords;
    return cython_new(type, -1, -1);
}

static PyObject *unowned_new(PyTypeObject *type, PyObject *arguments, PyObject *keywords)
{
    (void)arguments, (void)keywords;
    return cython_new(type, -1, offsetof(UnownedMemory, owner));
}

static PyObject *pointer_new(PyTypeObject *type, PyObject *arguments, PyObject *keywords)
{
    (void)arguments, (void)keywords;
    return cython_new(type, offsetof(MemoryPointer, vtab), offsetof(MemoryPointer, mem));
}

static PyObject *pinned_new(PyTypeObject *type, PyObject *arguments, PyObject *keywords)
{
    (void)arguments, (void)keywords;
    return cython_new(type, offsetof(PinnedMemoryPointer, vtab), offsetof(PinnedMemoryPointer, mem));
}

static PyTypeObject BaseMemoryType;

static int unowned_init(UnownedMemory *self, PyObject *arguments, PyObject *keywords)
{
    static char *names[] = {"ptr", "size", "owner", "device_id", NULL};
    Py_ssize_t ptr, size;
    PyObject *owner;
    int device = -1;
    if (!PyArg_ParseTupleAndKeywords(arguments, keywords, "nnO|i", names, &ptr, &size, &owner, &device))
        return -1;
    if (device < 0) {
        PyErr_SetString(PyExc_RuntimeError, "the fake UnownedMemory needs a device");
        return -1;
    }
    constructed++;
    self->base.ptr = ptr;
    self->base.size = (size_t)size;
    self->base.device_id = device;
    Py_INCREF(owner);
    Py_SETREF(self->owner, owner);
    self->stamp = stamping;
    return 0;
}

static int pointer_init(MemoryPointer *self, PyObject *arguments, PyObject *keywords)
{
    static char *names[] = {"mem", "offset", NULL};
    PyObject *mem;
    Py_ssize_t offset;
    if (!PyArg_ParseTupleAndKeywords(arguments, keywords, "O!n", names, &BaseMemoryType, &mem, &offset))
        return -1;
    constructed++;
    self->ptr = ((BaseMemory *)mem)->ptr + offset;
    self->device_id = ((BaseMemory *)mem)->device_id;
    Py_INCREF(mem);
    Py_SETREF(self->mem, mem);
    self->stamp = stamping;
    return 0;
}

static int pinned_init(PinnedMemoryPointer *self, PyObject *arguments, PyObject *keywords)
{
    static char *names[] = {"mem", "offset", NULL};
    PyObject *mem, *ptr;
    Py_ssize_t offset;
    if (!PyArg_ParseTupleAndKeywords(arguments, keywords, "On", names, &mem, &offset))
        return -1;
    if ((ptr = PyObject_GetAttrString(mem, "ptr")) == NULL)
        return -1;
    size_t value = (size_t)PyLong_AsUnsignedLongLong(ptr);
    Py_DECREF(ptr);
    if (PyErr_Occurred())
        return -1;
    constructed++;
    Py_INCREF(mem);
    Py_SETREF(self->mem, mem);
    self->ptr = value + (size_t)offset;
    self->stamp = stamping;
    return 0;
}

/* The object field of each type, for the garbage collector and deallocation. */
static PyObject **object_field(PyObject *self)
{
    newfunc new = Py_TYPE(self)->tp_new;
    if (new == unowned_new)
        return &((UnownedMemory *)self)->owner;
    return new == pointer_new ? &((MemoryPointer *)self)->mem : &((PinnedMemoryPointer *)self)->mem;
}

static int traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(*object_field(self));
    return 0;
}

static int clear(PyObject *self)
{
    Py_CLEAR(*object_field(self));
    return 0;
}

static void dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    clear(self);
    Py_TYPE(self)->tp_free(self);
}

/* BaseMemory's public ptr, through a setter as Cython makes one (which `stamping` makes do more). */
static PyObject *base_get_ptr(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(((BaseMemory *)self)->ptr);
}

static int base_set_ptr(PyObject *self, PyObject *value, void *unused)
{
    (void)unused;
    Py_ssize_t ptr = value ? PyLong_AsSsize_t(value) : -1;
    if (value == NULL)
        PyErr_SetString(PyExc_AttributeError, "ptr cannot be deleted");
    if (PyErr_Occurred())
        return -1;
    ((BaseMemory *)self)->ptr = ptr;
    ((BaseMemory *)self)->stamp = stamping;
    return 0;
}

static PyGetSetDef base_getset[] = {{"ptr", base_get_ptr, base_set_ptr, NULL, NULL}, {NULL, NULL, NULL, NULL, NULL}};

static PyMemberDef base_members[] = {
    {"size", T_PYSSIZET, offsetof(BaseMemory, size), 0, NULL},
    {"device_id", T_INT, offsetof(BaseMemory, device_id), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};
static PyMemberDef unowned_members[] = {{"_owner", T_OBJECT, offsetof(UnownedMemory, owner), READONLY, NULL},
                                        {NULL, 0, 0, 0, NULL}};
static PyMemberDef pointer_members[] = {
    {"ptr", T_PYSSIZET, offsetof(MemoryPointer, ptr), READONLY, NULL},
    {"device_id", T_INT, offsetof(MemoryPointer, device_id), READONLY, NULL},
    {"mem", T_OBJECT, offsetof(MemoryPointer, mem), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};
static PyMemberDef pinned_members[] = {
    {"ptr", T_PYSSIZET, offsetof(PinnedMemoryPointer, ptr), READONLY, NULL},
    {"mem", T_OBJECT, offsetof(PinnedMemoryPointer, mem), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject BaseMemoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fake_cupy_capi.BaseMemory",
    .tp_basicsize = sizeof(BaseMemory),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = base_new,
    .tp_members = base_members,
    .tp_getset = base_getset,
};

#define GC_TYPE_FLAGS (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC)

static PyTypeObject UnownedMemoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fake_cupy_capi.UnownedMemory",
    .tp_basicsize = sizeof(UnownedMemory),
    .tp_flags = GC_TYPE_FLAGS,
    .tp_base = &BaseMemoryType,
    .tp_new = unowned_new,
    .tp_init = (initproc)unowned_init,
    .tp_dealloc = dealloc,
    .tp_traverse = traverse,
    .tp_clear = clear,
    .tp_members = unowned_members,
};

static PyTypeObject MemoryPointerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fake_cupy_capi.MemoryPointer",
    .tp_basicsize = sizeof(MemoryPointer),
    .tp_flags = GC_TYPE_FLAGS,
    .tp_new = pointer_new,
    .tp_init = (initproc)pointer_init,
    .tp_dealloc = dealloc,
    .tp_traverse = traverse,
    .tp_clear = clear,
    .tp_members = pointer_members,
};

static PyTypeObject PinnedMemoryPointerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fake_cupy_capi.PinnedMemoryPointer",
    .tp_basicsize = sizeof(PinnedMemoryPointer),
    .tp_flags = GC_TYPE_FLAGS,
    .tp_new = pinned_new,
    .tp_init = (initproc)pinned_init,
    .tp_dealloc = dealloc,
    .tp_traverse = traverse,
    .tp_clear = clear,
    .tp_members = pinned_members,
};

static PyObject *set_objects(PyObject *module, PyObject *arguments)
{
    (void)module;
    if (!PyArg_ParseTuple(arguments, "ii", &stamping, &failing_new))
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *object_counts(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    return Py_BuildValue("(ll)", constructed, made_new);
}

/* A BaseMemory that is a heap type, as Cython makes its types where it builds through type specs. */
static PyObject *heap_base_memory(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    PyType_Slot slots[] = {{0, NULL}};
    PyType_Spec spec = {"fake_cupy_capi.HeapBaseMemory", (int)sizeof(BaseMemory), 0,
                        Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, slots};
    PyObject *bases = PyTuple_Pack(1, (PyObject *)&BaseMemoryType);
    PyObject *type = bases ? PyType_FromSpecWithBases(&spec, bases) : NULL;
    Py_XDECREF(bases);
    return type;
}

static PyMethodDef methods[] = {
    {"set", set_values, METH_VARARGS,
     "set(device, stream pointer, has hooks, failing: 0, 1 (-1 returned) or 2[, the one function failing])"},
    {"calls", call_count, METH_NOARGS, "how many times the C functions were called"},
    {"set_hooks_source", set_hooks_source, METH_O, "the function get_memory_hooks's C function calls"},
    {"set_objects", set_objects, METH_VARARGS, "set_objects(stamping, failing_new): the memory types' switches"},
    {"object_counts", object_counts, METH_NOARGS, "(constructor calls, tp_new calls) of the memory types"},
    {"heap_base_memory", heap_base_memory, METH_NOARGS, "a new heap type subclassing BaseMemory, adding nothing"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {PyModuleDef_HEAD_INIT, "fake_cupy_capi", NULL, -1, methods,
                                        NULL, NULL, NULL, NULL};

/* module.NAME[function] = a capsule named `signature` (module.NAME made on its first function) */
static int export(PyObject *module, const char *name, const char *function, void *pointer, const char *signature)
{
    PyObject *capi = PyObject_GetAttrString(module, name);
    if (capi == NULL) {
        PyErr_Clear();
        capi = PyDict_New();
        if (capi == NULL || PyModule_AddObject(module, name, capi) != 0) {
            Py_XDECREF(capi);
            return -1;
        }
        Py_INCREF(capi);
    }
    PyObject *capsule = PyCapsule_New(pointer, signature, NULL);
    int result = capsule ? PyDict_SetItemString(capi, function, capsule) : -1;
    Py_XDECREF(capsule);
    Py_DECREF(capi);
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
        export(module, "memory_hook", "get_memory_hooks", (void *)get_memory_hooks,
               "PyObject *(int __pyx_skip_dispatch)") ||
        export(module, "wrong_device", "get_device_id", (void *)get_device_id, "long (int __pyx_skip_dispatch)")) {
        Py_DECREF(module);
        return NULL;
    }
    PyTypeObject *types[] = {&BaseMemoryType, &UnownedMemoryType, &MemoryPointerType, &PinnedMemoryPointerType};
    const char *names[] = {"BaseMemory", "UnownedMemory", "MemoryPointer", "PinnedMemoryPointer"};
    for (int index = 0; index < 4; index++) {
        if (PyType_Ready(types[index]) < 0 || PyModule_AddObject(module, names[index], (PyObject *)types[index]) < 0) {
            Py_DECREF(module);
            return NULL;
        }
        Py_INCREF(types[index]);
    }
    return module;
}
