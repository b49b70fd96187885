/* cupy_allocate.c -- gpumem.cupy's allocation hot path, compiled.
 *
 * CuPy calls its allocator function at every array it makes, and drops the memory object when the array
 * goes. CuPy's own pool does both in compiled code; gpumem.cupy's Python path pays for a Python frame,
 * a ctypes call and a Python owner object each way. This module does the common case of that path in C:
 * make_allocate() returns CuPy's allocator function (size -> cupy.cuda.MemoryPointer), whose blocks are
 * owned by a small C object that frees them when CuPy drops the memory: CuPy's memory object itself where
 * it can be (a subclass of CuPy's BaseMemory, as CuPy's pool's PooledMemory is, which spares an object per
 * allocation), else a Block under CuPy's UnownedMemory, as the Python path does. The pinned memory
 * allocator is in cupy_pinned.c, CuPy's objects made without their constructors in cupy_objects.c, what
 * the three files share in cupy_allocate.h; this file also holds the helpers both paths use and the
 * module itself.
 *
 * gpumem.cupy (cupy.py) stays the reference: this file does what its Python allocate() and _Block do,
 * in the same order, and hands every other case back to that Python code, which it is given:
 *   - a memory hook is registered on the calling thread: the Python path calls the hooks;
 *   - the device has no gpumem allocator yet: the Python path makes it;
 *   - the current stream is not the default one and not kept alive yet: the Python keep_stream;
 *   - gm_malloc or gm_free fails: the Python function that raises what the Python path raises.
 * The allocator's handle is read at every call from where the Python Allocator stores it (zeroed in
 * place once the allocator is closed, which gpumem then refuses), never cached here; where that storage
 * is, is remembered per device (gmcupy_device_cells). The GIL is kept through a call into gpumem unless
 * gpumem is about to wait (GPUMEM_CALL, cupy_allocate.h): a thread must not hold it while waiting for
 * gpumem's lock, which another thread may hold while it calls back into Python, or for the device, whose
 * host callbacks may need it.
 * libgpumem's functions come as their addresses in the loaded library, so the module links to nothing
 * but Python. gpumem/compiled.py builds it on first use.
 */
#include "cupy_allocate.h"

#include <limits.h>

gm_set_blocking_hook_function gmcupy_set_blocking_hook;

void gmcupy_release_gil(void *context)
{
    ((gmcupy_released_gil *)context)->saved = PyEval_SaveThread();
}

typedef int (*gm_malloc_function)(void *allocator, size_t size, size_t stream, void **pointer_out);
typedef int (*gm_free_function)(void *allocator, void *pointer);

/* Everything the allocate function and its blocks use, given once by make_allocate. */
typedef struct {
    PyObject_HEAD
    gm_malloc_function malloc;
    gm_free_function free;
    cupy_device_id_function device_id;       /* CuPy's C functions, or NULL */
    cupy_stream_pointer_function stream_pointer;
    cupy_has_hooks_function has_hooks_function;
    cupy_get_hooks_function get_hooks_function;
    gmcupy_device_cells cells;    /* where each device's handle lives */
    gmcupy_recipe owned_recipe;   /* gpumem's own memory object (a BaseMemory), where it can be used */
    gmcupy_recipe memory_recipe;  /* else UnownedMemory without its constructor, where it can */
    gmcupy_recipe pointer_recipe; /* MemoryPointer likewise */
    PyObject *get_device;       /* () -> the current device (int) */
    PyObject *get_stream;       /* () -> the current device's current cupy Stream */
    PyObject *has_hooks;        /* () -> whether the thread may have memory hooks (CuPy's own check) */
    PyObject *registered_hooks; /* () -> the thread's memory hooks, or None */
    PyObject *devices;          /* dict: device -> gpumem.cupy._Device, whose allocator has the handle */
    PyObject *kept_streams;     /* dict: (device, stream pointer) -> the Stream kept alive */
    PyObject *keep_stream;      /* (device, stream) -> None: keeps the stream alive */
    PyObject *slow_allocate;    /* size -> MemoryPointer: the Python path */
    PyObject *malloc_failed;    /* (status, size) -> raises what the Python path raises */
    PyObject *free_slow;        /* (device state, pointer, device, memory id) -> None: the free under hooks */
    PyObject *free_failed;      /* status -> raises gpumem's error */
    PyObject *unowned_memory;   /* cupy.cuda.UnownedMemory */
    PyObject *memory_pointer;   /* cupy.cuda.MemoryPointer */
    PyObject *make_current;     /* device -> None: the device's context made current (context_for_thread) */
} Allocate;

/* The PyObject fields of Allocate, which end it. */
#define ALLOCATE_OBJECTS ((sizeof(Allocate) - offsetof(Allocate, get_device)) / sizeof(PyObject *))

/* One gpumem block as its owner holds it: gpumem's own memory object (a subclass of CuPy's BaseMemory,
 * cupy_objects.c), or where that cannot be used a Block under CuPy's UnownedMemory. */
typedef struct {
    Allocate *allocate;     /* NULL in a memory object that owns no block (the recipe checks' probes) */
    PyObject *device_state; /* keeps the handle's storage */
    void **handle_cell;
    PyObject *device;
    void *pointer;
} OwnedBlock;

typedef struct {
    PyObject_HEAD
    OwnedBlock block;
    void *memory; /* the UnownedMemory's address: its id(), which CuPy's hooks are told at the free */
} Block;

PyObject *gmcupy_name_handle_address, *gmcupy_name_ptr, *gmcupy_zero, *gmcupy_empty_tuple;

PyObject *gmcupy_call_nothing(PyObject *function)
{
    return PyObject_Vectorcall(function, NULL, 0, NULL);
}

/* 1 if function() is true, 0 if false, -1 with an exception set. */
static int call_truth(PyObject *function)
{
    PyObject *answer = gmcupy_call_nothing(function);
    if (answer == NULL)
        return -1;
    int truth = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return truth;
}

/* Whether this thread's first allocation has made its device's context current: make_current (cupy.py's
 * _context_maker, which says why) is called once per thread, at its first allocation of either kind. */
static _Thread_local int thread_has_context;

int gmcupy_context_for_thread(PyObject *make_current, PyObject *device)
{
    if (thread_has_context)
        return 0;
    PyObject *done = PyObject_Vectorcall(make_current, &device, 1, NULL);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    thread_has_context = 1;
    return 0;
}

/* function(status[, extra]): the Python function that raises what a failed gpumem call raises. */
PyObject *gmcupy_call_with_status(PyObject *function, int status, PyObject *extra)
{
    PyObject *status_object = PyLong_FromLong(status);
    if (status_object == NULL)
        return NULL;
    PyObject *arguments[2] = {status_object, extra};
    PyObject *result = PyObject_Vectorcall(function, arguments, extra ? 2 : 1, NULL);
    Py_DECREF(status_object);
    return result;
}

/* A free that gpumem refused, reported as Python reports an error raised in __del__. */
void gmcupy_report_failed_free(PyObject *free_failed, int status)
{
    Py_XDECREF(gmcupy_call_with_status(free_failed, status, NULL));
    if (PyErr_Occurred())
        PyErr_WriteUnraisable(free_failed);
}

/* 1 if the thread's dict of hooks (CuPy's C get_memory_hooks) holds any, 0 if not, -1 with an exception
 * set. */
static int hooks_in_registry(Allocate *self)
{
    PyObject *hooks = self->get_hooks_function(0);
    if (hooks == NULL)
        return -1;
    int truth = PyErr_Occurred() ? -1 : PyObject_IsTrue(hooks);
    Py_DECREF(hooks);
    return truth;
}

/* 1 if hooks are registered on this thread now, 0 if none, -1 with an exception set. CuPy's
 * _has_memory_hooks is true once the thread's dict of hooks exists, which the first `with hook:` makes
 * and which stays after the hook is gone (empty): then the dict itself is asked, through CuPy's C
 * function where there is one, as CuPy's pool does at every allocation and free, else through Python. */
static int hooks_registered(Allocate *self)
{
    int maybe;
    if (self->has_hooks_function) {
        maybe = self->has_hooks_function(0);
        if (PyErr_Occurred())
            return -1;
        maybe = maybe != 0;
    } else {
        maybe = call_truth(self->has_hooks);
    }
    if (maybe <= 0)
        return maybe;
    return self->get_hooks_function ? hooks_in_registry(self) : call_truth(self->registered_hooks);
}

PyObject *gmcupy_current_device(cupy_device_id_function device_id, PyObject *get_device, int *device_out)
{
    if (device_id) {
        int device = device_id(0);
        if (PyErr_Occurred())
            return NULL;
        *device_out = device;
        return PyLong_FromLong(device);
    }
    PyObject *device = gmcupy_call_nothing(get_device);
    if (device == NULL)
        return NULL;
    long value = PyLong_AsLong(device);
    if (value == -1 && PyErr_Occurred()) {
        Py_DECREF(device);
        return NULL;
    }
    if (value < INT_MIN || value > INT_MAX) {
        Py_DECREF(device);
        PyErr_SetString(PyExc_OverflowError, "gpumem.cupy: the current device is out of range");
        return NULL;
    }
    *device_out = (int)value;
    return device;
}

/* Where a gpumem.cupy._Device's allocator handle is stored (its handle_address): the allocator is read
 * from there at each call, NULL once it is closed (Allocator.close zeroes it in place). */
static int handle_cell_of(PyObject *device_state, void ***cell_out)
{
    PyObject *address = PyObject_GetAttr(device_state, gmcupy_name_handle_address);
    if (address == NULL)
        return -1;
    *cell_out = PyLong_AsVoidPtr(address);
    Py_DECREF(address);
    if (*cell_out == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "gpumem.cupy: a device's handle_address is 0");
        return -1;
    }
    return 0;
}

PyObject *gmcupy_device_state(PyObject *devices, gmcupy_device_cells *cells, PyObject *device, int device_id,
                              void ***cell_out)
{
    PyObject *state = PyDict_GetItemWithError(devices, device); /* borrowed */
    if (state == NULL)
        return NULL;
    int slot = device_id >= 0 && device_id < GMCUPY_CACHED_DEVICES ? device_id : -1;
    if (slot >= 0 && cells->state[slot] == state) {
        *cell_out = cells->cell[slot];
        return state;
    }
    if (handle_cell_of(state, cell_out) < 0)
        return NULL;
    if (slot >= 0) {
        PyObject *old = cells->state[slot];
        Py_INCREF(state);
        cells->state[slot] = state;
        cells->cell[slot] = *cell_out;
        Py_XDECREF(old); /* last: it may run code, but `state` is held here now */
    }
    return state;
}

void gmcupy_device_cells_clear(gmcupy_device_cells *cells)
{
    for (int slot = 0; slot < GMCUPY_CACHED_DEVICES; slot++)
        Py_CLEAR(cells->state[slot]);
}

/* Give the block back, under CuPy's memory hooks if this thread has any; `memory` is CuPy's memory
 * object, whose id() the hooks are told. */
static void block_free(OwnedBlock *self, void *memory)
{
    Allocate *allocate = self->allocate;
    int hooks = hooks_registered(allocate);
    if (hooks < 0) /* as the Python path: at interpreter exit CuPy's modules may be gone already */
        PyErr_Clear();
    if (hooks > 0) {
        PyObject *pointer = PyLong_FromVoidPtr(self->pointer), *memory_id = PyLong_FromVoidPtr(memory);
        PyObject *done = NULL;
        if (pointer != NULL && memory_id != NULL) {
            PyObject *arguments[4] = {self->device_state, pointer, self->device, memory_id};
            done = PyObject_Vectorcall(allocate->free_slow, arguments, 4, NULL);
        }
        Py_XDECREF(pointer);
        Py_XDECREF(memory_id);
        if (done == NULL)
            PyErr_WriteUnraisable(allocate->free_slow);
        Py_XDECREF(done);
        return;
    }
    if (self->pointer == NULL) /* size 0 */
        return;
    void *handle = *self->handle_cell;
    int status;
    GPUMEM_CALL(status = allocate->free(handle, self->pointer));
    if (status == 0)
        return;
    gmcupy_report_failed_free(allocate->free_failed, status);
}

/* The block freed (an exception being raised meanwhile kept), and its owner's references dropped. */
static void owned_block_release(OwnedBlock *block, void *memory)
{
    if (block->allocate == NULL)
        return;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    block_free(block, memory);
    PyErr_Restore(type, value, traceback);
    Py_DECREF(block->allocate);
    Py_DECREF(block->device_state);
    Py_DECREF(block->device);
}

/* Takes references to what the block needs until its free. */
static void owned_block_set(OwnedBlock *block, Allocate *allocate, PyObject *device_state, void **handle_cell,
                            PyObject *device, void *pointer)
{
    Py_INCREF(allocate);
    Py_INCREF(device_state);
    Py_INCREF(device);
    block->allocate = allocate;
    block->device_state = device_state;
    block->handle_cell = handle_cell;
    block->device = device;
    block->pointer = pointer;
}

static void block_dealloc(Block *self)
{
    owned_block_release(&self->block, self->memory);
    PyObject_Free(self);
}

static OwnedBlock *owned_block_of(PyObject *memory)
{
    return (OwnedBlock *)((char *)memory + gmcupy_owned_fields_offset(Py_TYPE(memory)->tp_base));
}

/* gpumem's memory object dropped: the block freed (CuPy's hooks told this object's id), then BaseMemory's
 * own dealloc, then the reference each object of a heap type holds to it (BaseMemory is a static type,
 * whose dealloc does not drop it: CPython's subtype_dealloc does the same). */
static void owned_memory_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    owned_block_release(owned_block_of(self), self);
    type->tp_base->tp_dealloc(self);
    Py_DECREF(type);
}

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_gpumem_cupy_allocate.Block",
    .tp_basicsize = sizeof(Block),
    .tp_dealloc = (destructor)block_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One gpumem block owned by CuPy's memory object; freed when CuPy drops it.",
};

/* Keeps the current stream alive as the Python path does, unless it is kept already. `stream` is the
 * Stream object, or NULL: then it is asked for only if it must be kept. */
static int keep_stream(Allocate *self, PyObject *device, PyObject *pointer, PyObject *stream)
{
    PyObject *key = PyTuple_Pack(2, device, pointer);
    if (key == NULL)
        return -1;
    int kept = PyDict_Contains(self->kept_streams, key);
    Py_DECREF(key);
    if (kept != 0)
        return kept < 0 ? -1 : 0;
    PyObject *asked = stream ? NULL : gmcupy_call_nothing(self->get_stream);
    if (stream == NULL && asked == NULL)
        return -1;
    PyObject *arguments[2] = {device, stream ? stream : asked};
    PyObject *done = PyObject_Vectorcall(self->keep_stream, arguments, 2, NULL);
    Py_XDECREF(asked);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* The current stream's pointer; a stream other than the default one is kept alive. */
static int current_stream(Allocate *self, PyObject *device, size_t *stream_out)
{
    if (self->stream_pointer) {
        intptr_t pointer = self->stream_pointer();
        if (PyErr_Occurred())
            return -1;
        *stream_out = (size_t)pointer;
        if (pointer == 0)
            return 0;
        PyObject *pointer_object = PyLong_FromSize_t((size_t)pointer);
        int result = pointer_object ? keep_stream(self, device, pointer_object, NULL) : -1;
        Py_XDECREF(pointer_object);
        return result;
    }
    PyObject *stream = gmcupy_call_nothing(self->get_stream);
    if (stream == NULL)
        return -1;
    PyObject *pointer = PyObject_GetAttr(stream, gmcupy_name_ptr);
    int result = -1;
    if (pointer != NULL) {
        *stream_out = (size_t)PyLong_AsUnsignedLongLong(pointer);
        if (!PyErr_Occurred())
            result = *stream_out ? keep_stream(self, device, pointer, stream) : 0;
        Py_DECREF(pointer);
    }
    Py_DECREF(stream);
    return result;
}

/* CuPy's memory object of a new block, which owns the block: gpumem's own memory where its recipe is
 * usable, else CuPy's UnownedMemory owning a Block. If it cannot be made, the memory is freed again
 * (by dropping the Block where there is one, under the hooks as any drop). */
static PyObject *memory_of_block(Allocate *self, PyObject *device_state, void **handle_cell, PyObject *device,
                                 int device_id, void *handle, void *pointer, PyObject *size_object, size_t size)
{
    if (self->owned_recipe.type != NULL) {
        PyObject *memory = gmcupy_owned_memory(&self->owned_recipe, pointer, size, device_id);
        if (memory == NULL)
            GPUMEM_CALL(self->free(handle, pointer));
        else
            owned_block_set(owned_block_of(memory), self, device_state, handle_cell, device, pointer);
        return memory;
    }
    Block *block = PyObject_New(Block, &BlockType);
    if (block == NULL) {
        GPUMEM_CALL(self->free(handle, pointer));
        return NULL;
    }
    owned_block_set(&block->block, self, device_state, handle_cell, device, pointer);
    PyObject *memory = gmcupy_unowned_memory(&self->memory_recipe, self->unowned_memory, pointer, size_object, size,
                                             (PyObject *)block, device, device_id);
    block->memory = memory;
    Py_DECREF(block);
    return memory;
}

/* CuPy's MemoryPointer to a new block. If it cannot be made, dropping the memory frees the block. */
static PyObject *wrap(Allocate *self, PyObject *device_state, void **handle_cell, PyObject *device, int device_id,
                      void *handle, void *pointer, PyObject *size_object, size_t size)
{
    PyObject *memory =
        memory_of_block(self, device_state, handle_cell, device, device_id, handle, pointer, size_object, size);
    if (memory == NULL)
        return NULL;
    PyObject *result = gmcupy_memory_pointer(&self->pointer_recipe, self->memory_pointer, memory, pointer, device_id);
    Py_DECREF(memory);
    return result;
}

static PyObject *allocate_on(Allocate *self, PyObject *device, int device_id, PyObject *size_object, size_t size)
{
    void **handle_cell;
    PyObject *device_state = gmcupy_device_state(self->devices, &self->cells, device, device_id, &handle_cell);
    if (device_state == NULL)
        return PyErr_Occurred() ? NULL : PyObject_Vectorcall(self->slow_allocate, &size_object, 1, NULL);
    Py_INCREF(device_state); /* the dict entry may change while the GIL is released */
    size_t stream;
    void *pointer = NULL;
    PyObject *result = NULL;
    if (current_stream(self, device, &stream) == 0) {
        void *handle = *handle_cell;
        int status;
        GPUMEM_CALL(status = self->malloc(handle, size, stream, &pointer));
        result = status == 0
                     ? wrap(self, device_state, handle_cell, device, device_id, handle, pointer, size_object, size)
                     : gmcupy_call_with_status(self->malloc_failed, status, size_object);
    }
    Py_DECREF(device_state);
    return result;
}

/* CuPy's allocator function: size -> cupy.cuda.MemoryPointer. */
static PyObject *allocate(PyObject *self_object, PyObject *size_object)
{
    Allocate *self = (Allocate *)self_object;
    size_t size = PyLong_AsSize_t(size_object);
    if (size == (size_t)-1 && PyErr_Occurred())
        return NULL;
    int hooks = hooks_registered(self);
    if (hooks != 0)
        return hooks < 0 ? NULL : PyObject_Vectorcall(self->slow_allocate, &size_object, 1, NULL);
    int device_id;
    PyObject *device = gmcupy_current_device(self->device_id, self->get_device, &device_id);
    if (device == NULL)
        return NULL;
    PyObject *result = gmcupy_context_for_thread(self->make_current, device) == 0
                           ? allocate_on(self, device, device_id, size_object, size)
                           : NULL;
    Py_DECREF(device);
    return result;
}

static void allocate_dealloc(Allocate *self)
{
    gmcupy_device_cells_clear(&self->cells);
    gmcupy_recipe_clear(&self->owned_recipe);
    gmcupy_recipe_clear(&self->memory_recipe);
    gmcupy_recipe_clear(&self->pointer_recipe);
    for (PyObject **field = &self->get_device; field < &self->get_device + ALLOCATE_OBJECTS; field++)
        Py_DECREF(*field);
    PyObject_Free(self);
}

static PyTypeObject AllocateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_gpumem_cupy_allocate.Allocate",
    .tp_basicsize = sizeof(Allocate),
    .tp_dealloc = (destructor)allocate_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What CuPy's allocator function and its blocks share.",
};

/* The function a capsule holds if it has `signature` (its name), else NULL. */
void *gmcupy_capsule_function(PyObject *capsule, const char *signature)
{
    if (capsule == NULL || capsule == Py_None || !PyCapsule_IsValid(capsule, signature))
        return NULL;
    return PyCapsule_GetPointer(capsule, signature);
}

static PyMethodDef allocate_method = {"allocate", allocate, METH_O, "CuPy's allocator: size -> MemoryPointer."};

static PyObject *make_allocate(PyObject *module, PyObject *arguments)
{
    (void)module;
    unsigned long long malloc_address, free_address;
    Allocate parsed;
    PyObject *device_capsule = NULL, *stream_capsule = NULL, *hooks_capsule = NULL, *base_memory = NULL,
             *get_hooks_capsule = NULL;
    if (!PyArg_ParseTuple(arguments, "KKOOOOO!O!OOOOOOOO|OOOOO:make_allocate", &malloc_address, &free_address,
                          &parsed.get_device, &parsed.get_stream, &parsed.has_hooks, &parsed.registered_hooks,
                          &PyDict_Type, &parsed.devices, &PyDict_Type, &parsed.kept_streams, &parsed.keep_stream,
                          &parsed.slow_allocate, &parsed.malloc_failed, &parsed.free_slow, &parsed.free_failed,
                          &parsed.unowned_memory, &parsed.memory_pointer, &parsed.make_current, &device_capsule,
                          &stream_capsule, &hooks_capsule, &base_memory, &get_hooks_capsule))
        return NULL;
    if (malloc_address == 0 || free_address == 0) {
        PyErr_SetString(PyExc_ValueError, "make_allocate: gm_malloc and gm_free need their addresses");
        return NULL;
    }
    Allocate *self = PyObject_New(Allocate, &AllocateType);
    if (self == NULL)
        return NULL;
    self->malloc = (gm_malloc_function)(uintptr_t)malloc_address;
    self->free = (gm_free_function)(uintptr_t)free_address;
    self->device_id = (cupy_device_id_function)gmcupy_capsule_function(device_capsule, CUPY_DEVICE_ID_SIGNATURE);
    self->stream_pointer =
        (cupy_stream_pointer_function)gmcupy_capsule_function(stream_capsule, CUPY_STREAM_POINTER_SIGNATURE);
    self->has_hooks_function =
        (cupy_has_hooks_function)gmcupy_capsule_function(hooks_capsule, CUPY_HAS_HOOKS_SIGNATURE);
    self->get_hooks_function =
        (cupy_get_hooks_function)gmcupy_capsule_function(get_hooks_capsule, CUPY_GET_HOOKS_SIGNATURE);
    memset(&self->cells, 0, sizeof self->cells);
    memcpy(&self->get_device, &parsed.get_device, ALLOCATE_OBJECTS * sizeof(PyObject *));
    for (PyObject **field = &self->get_device; field < &self->get_device + ALLOCATE_OBJECTS; field++)
        Py_INCREF(*field);
    gmcupy_owned_memory_recipe(&self->owned_recipe, base_memory == Py_None ? NULL : base_memory,
                               sizeof(OwnedBlock), owned_memory_dealloc);
    self->memory_recipe.type = NULL;
    if (self->owned_recipe.type == NULL)
        gmcupy_unowned_memory_recipe(&self->memory_recipe, self->unowned_memory);
    gmcupy_memory_pointer_recipe(&self->pointer_recipe, self->memory_pointer, self->unowned_memory,
                                 &self->owned_recipe);
    PyObject *function = PyCFunction_New(&allocate_method, (PyObject *)self);
    Py_DECREF(self);
    return function;
}

static PyObject *use_blocking_hook(PyObject *module, PyObject *address_object)
{
    (void)module;
    void *address = PyLong_AsVoidPtr(address_object);
    if (address == NULL && PyErr_Occurred())
        return NULL;
    gmcupy_set_blocking_hook = (gm_set_blocking_hook_function)address;
    Py_RETURN_NONE;
}

/* The Allocate behind a device allocator function of this module, or NULL. */
static Allocate *allocate_of(PyObject *function)
{
    PyObject *self = PyCFunction_Check(function) ? PyCFunction_GET_SELF(function) : NULL;
    return self != NULL && Py_TYPE(self) == &AllocateType ? (Allocate *)self : NULL;
}

/* made_by_constructors(allocator function) -> (the memory object's, MemoryPointer's) or
 * (PinnedMemoryPointer's,): whether each of CuPy's objects is made through its constructor (True) or
 * through tp_new and its fields (False, cupy_objects.c), for the tests and bench/cupy_parts.py. */
static PyObject *made_by_constructors(PyObject *module, PyObject *function)
{
    (void)module;
    Allocate *allocate = allocate_of(function);
    if (allocate != NULL)
        return Py_BuildValue("(OO)", allocate->owned_recipe.type || allocate->memory_recipe.type ? Py_False : Py_True,
                             allocate->pointer_recipe.type ? Py_False : Py_True);
    PyObject *self = PyCFunction_Check(function) ? PyCFunction_GET_SELF(function) : NULL;
    const gmcupy_recipe *pinned = self ? gmcupy_pinned_recipe(self) : NULL;
    if (pinned == NULL) {
        PyErr_SetString(PyExc_TypeError, "made_by_constructors: not an allocator function of this module");
        return NULL;
    }
    return Py_BuildValue("(O)", pinned->type ? Py_False : Py_True);
}

/* memory_type(device allocator function) -> the type of the memory objects its MemoryPointers hold:
 * gpumem's own subclass of CuPy's BaseMemory, or CuPy's UnownedMemory (which then owns a Block). */
static PyObject *memory_type(PyObject *module, PyObject *function)
{
    (void)module;
    Allocate *allocate = allocate_of(function);
    if (allocate == NULL) {
        PyErr_SetString(PyExc_TypeError, "memory_type: not a device allocator function of this module");
        return NULL;
    }
    PyObject *type = allocate->owned_recipe.type ? (PyObject *)allocate->owned_recipe.type : allocate->unowned_memory;
    Py_INCREF(type);
    return type;
}

static PyMethodDef module_methods[] = {
    {"use_blocking_hook", use_blocking_hook, METH_O,
     "use_blocking_hook(gm_set_blocking_hook's address, or 0): keep the GIL through gpumem calls unless gpumem "
     "waits"},
    {"make_allocate", make_allocate, METH_VARARGS,
     "make_allocate(gm_malloc address, gm_free address, get_device, get_stream, has_hooks, registered_hooks, "
     "devices, kept_streams, keep_stream, slow_allocate, malloc_failed, free_slow, free_failed, UnownedMemory, "
     "MemoryPointer, make_current[, CuPy's capsules of get_device_id, get_current_stream_ptr, _has_memory_hooks, "
     "CuPy's BaseMemory, CuPy's capsule of get_memory_hooks]) -> CuPy's allocator function"},
    {"make_pinned_allocate", gmcupy_make_pinned_allocate, METH_VARARGS,
     "make_pinned_allocate(gm_host_malloc and gm_host_free_with_streams addresses, get_device, "
     "get_stream, stream_of_device, stream_of_device_slow, devices, slow_allocate, malloc_failed, free_failed, "
     "PinnedMemoryPointer, make_current[, CuPy's capsules of get_device_id, get_current_stream_ptr]) -> CuPy's pinned memory allocator function"},
    {"made_by_constructors", made_by_constructors, METH_O,
     "made_by_constructors(allocator function) -> a tuple: for each of CuPy's objects it makes, whether through "
     "its constructor"},
    {"memory_type", memory_type, METH_O,
     "memory_type(device allocator function) -> the type of the memory objects it hands CuPy"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "_gpumem_cupy_allocate", "gpumem.cupy's allocation hot path, compiled.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__gpumem_cupy_allocate(void)
{
    if (PyType_Ready(&BlockType) < 0 || PyType_Ready(&AllocateType) < 0 || gmcupy_pinned_ready() < 0 ||
        gmcupy_objects_ready() < 0)
        return NULL;
    gmcupy_name_handle_address = PyUnicode_InternFromString("handle_address");
    gmcupy_name_ptr = PyUnicode_InternFromString("ptr");
    gmcupy_zero = PyLong_FromLong(0);
    gmcupy_empty_tuple = PyTuple_New(0);
    if (gmcupy_name_handle_address == NULL || gmcupy_name_ptr == NULL || gmcupy_zero == NULL ||
        gmcupy_empty_tuple == NULL)
        return NULL;
    return PyModule_Create(&module_definition);
}
