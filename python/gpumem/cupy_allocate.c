/* cupy_allocate.c -- gpumem.cupy's allocation hot path, compiled.
 *
 * CuPy calls its allocator function at every array it makes, and drops the memory object when the array
 * goes. CuPy's own pool does both in compiled code; gpumem.cupy's Python path pays for a Python frame,
 * a ctypes call and a Python owner object each way. This module does the common case of that path in C:
 * make_allocate() returns CuPy's allocator function (size -> cupy.cuda.MemoryPointer), whose blocks are
 * owned by a small C object that frees them when CuPy drops the memory.
 *
 * gpumem.cupy (cupy.py) stays the reference: this file does what its Python allocate() and _Block do,
 * in the same order, and hands every other case back to that Python code, which it is given:
 *   - a memory hook is registered on the calling thread: the Python path calls the hooks;
 *   - the device has no gpumem allocator yet: the Python path makes it;
 *   - the current stream is not the default one and not kept alive yet: the Python keep_stream;
 *   - gm_malloc or gm_free fails: the Python function that raises what the Python path raises.
 * The allocator's handle is read at every call from where the Python Allocator stores it (zeroed in
 * place once the allocator is closed, which gpumem then refuses), never cached here. The GIL is kept
 * through a call into gpumem unless gpumem is about to wait (GPUMEM_CALL below): a thread must not hold
 * it while waiting for gpumem's lock, which another thread may hold while it calls back into Python, or
 * for the device, whose host callbacks may need it.
 * libgpumem's functions come as their addresses in the loaded library, so the module links to nothing
 * but Python. gpumem/compiled.py builds it on first use.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if PY_VERSION_HEX < 0x03090000
#define PyObject_Vectorcall _PyObject_Vectorcall
#endif
#if PY_VERSION_HEX < 0x030D0000
#define Py_IsFinalizing _Py_IsFinalizing
#endif

typedef void (*gm_set_blocking_hook_function)(void (*hook)(void *context), void *context);

/* gm_set_blocking_hook of the loaded libgpumem (use_blocking_hook), or NULL. With it the GIL is kept
 * through a gpumem call unless gpumem is about to wait (for a lock another thread holds, for the
 * device, for a callback): libgpumem calls release_gil right before its first wait, and the GIL is taken
 * back after the call. Letting the GIL go around every call would cost more than a call served from
 * gpumem's cache. Without it (never set), the GIL is let go around every call, as ctypes does. */
static gm_set_blocking_hook_function set_blocking_hook;

typedef struct {
    PyThreadState *saved;
} released_gil;

static void release_gil(void *context)
{
    ((released_gil *)context)->saved = PyEval_SaveThread();
}

/* Run `statement`, calls into libgpumem, without holding the GIL while gpumem waits. */
#define GPUMEM_CALL(statement)                                                                                  \
    do {                                                                                                        \
        if (set_blocking_hook) {                                                                                \
            released_gil released_ = {NULL};                                                                    \
            set_blocking_hook(release_gil, &released_);                                                         \
            statement;                                                                                          \
            set_blocking_hook(NULL, NULL);                                                                      \
            if (released_.saved)                                                                                \
                PyEval_RestoreThread(released_.saved);                                                          \
        } else {                                                                                                \
            Py_BEGIN_ALLOW_THREADS statement;                                                                   \
            Py_END_ALLOW_THREADS                                                                                \
        }                                                                                                       \
    } while (0)

typedef int (*gm_malloc_function)(void *allocator, size_t size, size_t stream, void **pointer_out);
typedef int (*gm_free_function)(void *allocator, void *pointer);

/* CuPy's own C functions, where its Cython modules export them (__pyx_capi__) with these signatures:
 * cupy.cuda.device.get_device_id, cupy.cuda.stream.get_current_stream_ptr and
 * cupy.cuda.memory_hook._has_memory_hooks. Calling them costs no Python call; a capsule of any other
 * signature is not used, and the Python functions are called instead. */
#define CUPY_DEVICE_ID_SIGNATURE "int (int __pyx_skip_dispatch)"
#define CUPY_STREAM_POINTER_SIGNATURE "intptr_t (void)"
#define CUPY_HAS_HOOKS_SIGNATURE "int (int __pyx_skip_dispatch)"
typedef int (*cupy_device_id_function)(int skip_dispatch);
typedef intptr_t (*cupy_stream_pointer_function)(void);
typedef int (*cupy_has_hooks_function)(int skip_dispatch);

/* Everything the allocate function and its blocks use, given once by make_allocate. */
typedef struct {
    PyObject_HEAD
    gm_malloc_function malloc;
    gm_free_function free;
    cupy_device_id_function device_id;       /* CuPy's C functions, or NULL */
    cupy_stream_pointer_function stream_pointer;
    cupy_has_hooks_function has_hooks_function;
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

/* The PyObject fields of Allocate, which follow its two function pointers. */
#define ALLOCATE_OBJECTS ((sizeof(Allocate) - offsetof(Allocate, get_device)) / sizeof(PyObject *))

/* One gpumem block, the owner of CuPy's UnownedMemory: freed when CuPy drops the memory. */
typedef struct {
    PyObject_HEAD
    Allocate *allocate;
    PyObject *device_state; /* keeps the handle's storage */
    void **handle_cell;
    PyObject *device;
    void *pointer;
    void *memory; /* the UnownedMemory's address: its id(), which CuPy's hooks are told at the free */
} Block;

static PyObject *name_handle_address, *name_ptr, *zero;

static PyObject *call_nothing(PyObject *function)
{
    return PyObject_Vectorcall(function, NULL, 0, NULL);
}

/* 1 if function() is true, 0 if false, -1 with an exception set. */
static int call_truth(PyObject *function)
{
    PyObject *answer = call_nothing(function);
    if (answer == NULL)
        return -1;
    int truth = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return truth;
}

/* Whether this thread's first allocation has made its device's context current: make_current (cupy.py's
 * _context_maker, which says why) is called once per thread, at its first allocation of either kind. */
static _Thread_local int thread_has_context;

static int context_for_thread(PyObject *make_current, PyObject *device)
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
static PyObject *call_with_status(PyObject *function, int status, PyObject *extra)
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
static void report_failed_free(PyObject *free_failed, int status)
{
    Py_XDECREF(call_with_status(free_failed, status, NULL));
    if (PyErr_Occurred())
        PyErr_WriteUnraisable(free_failed);
}

/* 1 if hooks are registered on this thread now, 0 if none, -1 with an exception set. */
static int hooks_registered(Allocate *self)
{
    int maybe;
    if (self->has_hooks_function) {
        maybe = self->has_hooks_function(0);
        if (maybe == -1 && PyErr_Occurred())
            return -1;
        maybe = maybe != 0;
    } else {
        maybe = call_truth(self->has_hooks);
    }
    return maybe > 0 ? call_truth(self->registered_hooks) : maybe;
}

/* The current device, as an int object: from CuPy's C function `device_id` where there is one, else
 * from `get_device`. */
static PyObject *current_device(cupy_device_id_function device_id, PyObject *get_device)
{
    if (!device_id)
        return call_nothing(get_device);
    int device = device_id(0);
    return device == -1 && PyErr_Occurred() ? NULL : PyLong_FromLong(device);
}

/* Where a gpumem.cupy._Device's allocator handle is stored (its handle_address): the allocator is read
 * from there at each call, NULL once it is closed (Allocator.close zeroes it in place). */
static int handle_cell_of(PyObject *device_state, void ***cell_out)
{
    PyObject *address = PyObject_GetAttr(device_state, name_handle_address);
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

static void block_free(Block *self)
{
    Allocate *allocate = self->allocate;
    int hooks = hooks_registered(allocate);
    if (hooks < 0) /* as the Python path: at interpreter exit CuPy's modules may be gone already */
        PyErr_Clear();
    if (hooks > 0) {
        PyObject *pointer = PyLong_FromVoidPtr(self->pointer), *memory = PyLong_FromVoidPtr(self->memory);
        PyObject *done = NULL;
        if (pointer != NULL && memory != NULL) {
            PyObject *arguments[4] = {self->device_state, pointer, self->device, memory};
            done = PyObject_Vectorcall(allocate->free_slow, arguments, 4, NULL);
        }
        Py_XDECREF(pointer);
        Py_XDECREF(memory);
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
    report_failed_free(allocate->free_failed, status);
}

static void block_dealloc(Block *self)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    block_free(self);
    PyErr_Restore(type, value, traceback);
    Py_DECREF(self->allocate);
    Py_DECREF(self->device_state);
    Py_DECREF(self->device);
    PyObject_Free(self);
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
    PyObject *asked = stream ? NULL : call_nothing(self->get_stream);
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
        if (pointer == -1 && PyErr_Occurred())
            return -1;
        *stream_out = (size_t)pointer;
        if (pointer == 0)
            return 0;
        PyObject *pointer_object = PyLong_FromSize_t((size_t)pointer);
        int result = pointer_object ? keep_stream(self, device, pointer_object, NULL) : -1;
        Py_XDECREF(pointer_object);
        return result;
    }
    PyObject *stream = call_nothing(self->get_stream);
    if (stream == NULL)
        return -1;
    PyObject *pointer = PyObject_GetAttr(stream, name_ptr);
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

/* CuPy's MemoryPointer to a new block: the block owns it, CuPy's UnownedMemory owns the block. If
 * making CuPy's objects fails, dropping the block frees the memory again. */
static PyObject *wrap(Allocate *self, PyObject *device_state, void **handle_cell, PyObject *device,
                      void *handle, void *pointer, PyObject *size)
{
    Block *block = PyObject_New(Block, &BlockType);
    if (block == NULL) {
        GPUMEM_CALL(self->free(handle, pointer));
        return NULL;
    }
    Py_INCREF(self);
    Py_INCREF(device_state);
    Py_INCREF(device);
    block->allocate = self;
    block->device_state = device_state;
    block->handle_cell = handle_cell;
    block->device = device;
    block->pointer = pointer;
    block->memory = NULL;
    PyObject *pointer_object = PyLong_FromVoidPtr(pointer);
    PyObject *memory = NULL;
    if (pointer_object != NULL) {
        PyObject *arguments[4] = {pointer_object, size, (PyObject *)block, device};
        memory = PyObject_Vectorcall(self->unowned_memory, arguments, 4, NULL);
        Py_DECREF(pointer_object);
    }
    block->memory = memory;
    Py_DECREF(block);
    if (memory == NULL)
        return NULL;
    PyObject *arguments[2] = {memory, zero};
    PyObject *result = PyObject_Vectorcall(self->memory_pointer, arguments, 2, NULL);
    Py_DECREF(memory);
    return result;
}

static PyObject *allocate_on(Allocate *self, PyObject *device, PyObject *size_object, size_t size)
{
    PyObject *device_state = PyDict_GetItemWithError(self->devices, device); /* borrowed */
    if (device_state == NULL)
        return PyErr_Occurred() ? NULL : PyObject_Vectorcall(self->slow_allocate, &size_object, 1, NULL);
    Py_INCREF(device_state); /* the dict entry may change while the GIL is released */
    size_t stream;
    void **handle_cell;
    void *pointer = NULL;
    PyObject *result = NULL;
    if (current_stream(self, device, &stream) == 0 && handle_cell_of(device_state, &handle_cell) == 0) {
        void *handle = *handle_cell;
        int status;
        GPUMEM_CALL(status = self->malloc(handle, size, stream, &pointer));
        result = status == 0 ? wrap(self, device_state, handle_cell, device, handle, pointer, size_object)
                             : call_with_status(self->malloc_failed, status, size_object);
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
    PyObject *device = current_device(self->device_id, self->get_device);
    if (device == NULL)
        return NULL;
    PyObject *result = context_for_thread(self->make_current, device) == 0 ? allocate_on(self, device, size_object, size)
                                                                           : NULL;
    Py_DECREF(device);
    return result;
}

static void allocate_dealloc(Allocate *self)
{
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
static void *capsule_function(PyObject *capsule, const char *signature)
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
    PyObject *device_capsule = NULL, *stream_capsule = NULL, *hooks_capsule = NULL;
    if (!PyArg_ParseTuple(arguments, "KKOOOOO!O!OOOOOOOO|OOO:make_allocate", &malloc_address, &free_address,
                          &parsed.get_device, &parsed.get_stream, &parsed.has_hooks, &parsed.registered_hooks,
                          &PyDict_Type, &parsed.devices, &PyDict_Type, &parsed.kept_streams, &parsed.keep_stream,
                          &parsed.slow_allocate, &parsed.malloc_failed, &parsed.free_slow, &parsed.free_failed,
                          &parsed.unowned_memory, &parsed.memory_pointer, &parsed.make_current, &device_capsule,
                          &stream_capsule, &hooks_capsule))
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
    self->device_id = (cupy_device_id_function)capsule_function(device_capsule, CUPY_DEVICE_ID_SIGNATURE);
    self->stream_pointer = (cupy_stream_pointer_function)capsule_function(stream_capsule, CUPY_STREAM_POINTER_SIGNATURE);
    self->has_hooks_function = (cupy_has_hooks_function)capsule_function(hooks_capsule, CUPY_HAS_HOOKS_SIGNATURE);
    memcpy(&self->get_device, &parsed.get_device, ALLOCATE_OBJECTS * sizeof(PyObject *));
    for (PyObject **field = &self->get_device; field < &self->get_device + ALLOCATE_OBJECTS; field++)
        Py_INCREF(*field);
    PyObject *function = PyCFunction_New(&allocate_method, (PyObject *)self);
    Py_DECREF(self);
    return function;
}

/* ---- Pinned host memory: CuPy's pinned memory allocator, as cupy.py's _pinned_allocate and _PinnedBlock ---- */

typedef int (*gm_host_malloc_function)(void *allocator, size_t size, void **pointer_out);
typedef int (*gm_host_free_function)(void *allocator, void *pointer);
typedef int (*gm_host_record_stream_function)(void *allocator, void *pointer, size_t stream);

typedef struct {
    PyObject_HEAD
    gm_host_malloc_function host_malloc;
    gm_host_free_function host_free;
    gm_host_record_stream_function host_record_stream;
    cupy_device_id_function device_id; /* CuPy's C functions, or NULL, as Allocate's */
    cupy_stream_pointer_function stream_pointer;
    PyObject *get_device;            /* () -> the current device */
    PyObject *get_stream;            /* () -> the current device's current cupy Stream */
    PyObject *stream_of_device;      /* device -> that device's current Stream (CuPy's get_current_stream) */
    PyObject *stream_of_device_slow; /* the same for CuPys whose get_current_stream takes no device (Python) */
    PyObject *devices;               /* as Allocate's */
    PyObject *slow_allocate;         /* size -> PinnedMemoryPointer: the Python path */
    PyObject *malloc_failed;         /* status -> raises what the Python path raises */
    PyObject *free_failed;           /* status -> raises gpumem's error */
    PyObject *pinned_memory_pointer; /* cupy.cuda.PinnedMemoryPointer */
    PyObject *make_current;          /* as Allocate's */
} PinnedAllocate;

#define PINNED_OBJECTS ((sizeof(PinnedAllocate) - offsetof(PinnedAllocate, get_device)) / sizeof(PyObject *))

/* One block of the pinned host cache as the memory of CuPy's PinnedMemoryPointer (which reads `ptr` and
 * `size`): dropping it records the streams it may be used on, then gives it back. */
typedef struct {
    PyObject_HEAD
    PinnedAllocate *allocate;
    PyObject *device_state; /* keeps the handle's storage */
    void **handle_cell;
    PyObject *stream;         /* the Stream current at the allocation, alive until the free; None: the default one */
    size_t stream_pointer;    /* its pointer */
    void *pointer;
    PyObject *ptr, *size, *device;
} PinnedBlock;

/* The pointer of `device`'s current stream, or 0 with *known 0 where CuPy cannot say it: from CuPy's C
 * functions when `device` is the current device, else from its Python ones. */
static size_t stream_at_free(PinnedAllocate *allocate, PyObject *device, int *known)
{
    if (allocate->device_id && allocate->stream_pointer) {
        int current = allocate->device_id(0);
        if (!PyErr_Occurred() && PyLong_AsLong(device) == current) {
            intptr_t pointer = allocate->stream_pointer();
            if (!PyErr_Occurred()) {
                *known = 1;
                return (size_t)pointer;
            }
        }
        PyErr_Clear();
    }
    PyObject *stream = PyObject_Vectorcall(allocate->stream_of_device, &device, 1, NULL);
    if (stream == NULL) {
        PyErr_Clear();
        stream = PyObject_Vectorcall(allocate->stream_of_device_slow, &device, 1, NULL);
    }
    PyObject *pointer = stream ? PyObject_GetAttr(stream, name_ptr) : NULL;
    Py_XDECREF(stream);
    size_t value = pointer ? (size_t)PyLong_AsUnsignedLongLong(pointer) : 0;
    Py_XDECREF(pointer);
    *known = !PyErr_Occurred();
    PyErr_Clear();
    return *known ? value : 0;
}

/* Record the block's streams, then free it; a block whose streams could not be recorded is not freed
 * (as the Python path: never reused while a copy may use it). */
static void record_and_free(PinnedAllocate *allocate, void *handle, void *pointer, const size_t *streams,
                            int count, int *status_out)
{
    int status = 0;
    for (int stream = 0; stream < count && status == 0; stream++)
        status = allocate->host_record_stream(handle, pointer, streams[stream]);
    *status_out = status == 0 ? allocate->host_free(handle, pointer) : status;
}

static void pinned_block_free(PinnedBlock *self)
{
    PinnedAllocate *allocate = self->allocate;
    if (self->pointer == NULL || Py_IsFinalizing()) /* size 0, or CUDA may be gone already */
        return;
    size_t streams[2] = {self->stream_pointer, 0};
    int count = 1, known;
    size_t current = stream_at_free(allocate, self->device, &known);
    if (known && current != streams[0])
        streams[count++] = current;
    void *handle = *self->handle_cell;
    int status = 0;
    GPUMEM_CALL(record_and_free(allocate, handle, self->pointer, streams, count, &status));
    if (status == 0)
        return;
    report_failed_free(allocate->free_failed, status);
}

static void pinned_block_dealloc(PinnedBlock *self)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    pinned_block_free(self);
    PyErr_Restore(type, value, traceback);
    Py_DECREF(self->allocate);
    Py_DECREF(self->device_state);
    Py_DECREF(self->stream);
    Py_XDECREF(self->ptr);
    Py_DECREF(self->size);
    Py_DECREF(self->device);
    PyObject_Free(self);
}

static PyObject *pinned_block_int(PyObject *self)
{
    PyObject *ptr = ((PinnedBlock *)self)->ptr;
    Py_INCREF(ptr);
    return ptr;
}

static PyMemberDef pinned_block_members[] = {
    {"ptr", T_OBJECT_EX, offsetof(PinnedBlock, ptr), READONLY, "the block's address"},
    {"size", T_OBJECT_EX, offsetof(PinnedBlock, size), READONLY, "the bytes asked for"},
    {"device", T_OBJECT_EX, offsetof(PinnedBlock, device), READONLY, "the device current at the allocation"},
    {NULL, 0, 0, 0, NULL},
};

static PyNumberMethods pinned_block_number = {.nb_int = pinned_block_int};

static PyTypeObject PinnedBlockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_gpumem_cupy_allocate.PinnedBlock",
    .tp_basicsize = sizeof(PinnedBlock),
    .tp_dealloc = (destructor)pinned_block_dealloc,
    .tp_as_number = &pinned_block_number,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One block of gpumem's pinned host cache held by CuPy; given back when CuPy drops it.",
    .tp_members = pinned_block_members,
};

/* CuPy's PinnedMemoryPointer to a new block; if making it fails, dropping the block gives it back. */
static PyObject *pinned_wrap(PinnedAllocate *self, PyObject *device_state, void **handle_cell, PyObject *device,
                             PyObject *stream, size_t stream_pointer, void *pointer, PyObject *size)
{
    PinnedBlock *block = PyObject_New(PinnedBlock, &PinnedBlockType);
    if (block == NULL) {
        void *handle = *handle_cell;
        GPUMEM_CALL(self->host_free(handle, pointer));
        return NULL;
    }
    Py_INCREF(self);
    Py_INCREF(device_state);
    Py_INCREF(stream);
    Py_INCREF(size);
    Py_INCREF(device);
    block->allocate = self;
    block->device_state = device_state;
    block->handle_cell = handle_cell;
    block->stream = stream;
    block->stream_pointer = stream_pointer;
    block->pointer = pointer;
    block->size = size;
    block->device = device;
    block->ptr = PyLong_FromVoidPtr(pointer);
    PyObject *result = NULL;
    if (block->ptr != NULL) {
        PyObject *arguments[2] = {(PyObject *)block, zero};
        result = PyObject_Vectorcall(self->pinned_memory_pointer, arguments, 2, NULL);
    }
    Py_DECREF(block);
    return result;
}

/* The current stream at an allocation and its pointer: None for the default stream, which CuPy's C
 * function says with no Python call and which needs keeping alive by no one; any other the Stream. */
static PyObject *allocation_stream(PinnedAllocate *self, size_t *pointer_out)
{
    if (self->stream_pointer) {
        intptr_t pointer = self->stream_pointer();
        if (pointer == -1 && PyErr_Occurred())
            return NULL;
        *pointer_out = 0;
        if (pointer == 0)
            Py_RETURN_NONE;
    }
    PyObject *stream = call_nothing(self->get_stream);
    PyObject *pointer = stream ? PyObject_GetAttr(stream, name_ptr) : NULL;
    if (pointer != NULL)
        *pointer_out = (size_t)PyLong_AsUnsignedLongLong(pointer);
    Py_XDECREF(pointer);
    if (pointer == NULL || PyErr_Occurred())
        Py_CLEAR(stream);
    return stream;
}

static PyObject *pinned_allocate_on(PinnedAllocate *self, PyObject *device, PyObject *size_object, size_t size)
{
    PyObject *device_state = PyDict_GetItemWithError(self->devices, device); /* borrowed */
    if (device_state == NULL)
        return PyErr_Occurred() ? NULL : PyObject_Vectorcall(self->slow_allocate, &size_object, 1, NULL);
    Py_INCREF(device_state);
    void **handle_cell;
    size_t stream_pointer;
    PyObject *result = NULL, *stream = NULL;
    if (handle_cell_of(device_state, &handle_cell) == 0 && (stream = allocation_stream(self, &stream_pointer)) != NULL) {
        void *handle = *handle_cell, *pointer = NULL;
        int status;
        GPUMEM_CALL(status = self->host_malloc(handle, size, &pointer));
        result = status == 0 ? pinned_wrap(self, device_state, handle_cell, device, stream, stream_pointer, pointer,
                                           size_object)
                             : call_with_status(self->malloc_failed, status, NULL);
    }
    Py_XDECREF(stream);
    Py_DECREF(device_state);
    return result;
}

/* CuPy's pinned memory allocator: size -> cupy.cuda.PinnedMemoryPointer. */
static PyObject *pinned_allocate(PyObject *self_object, PyObject *size_object)
{
    PinnedAllocate *self = (PinnedAllocate *)self_object;
    size_t size = PyLong_AsSize_t(size_object);
    if (size == (size_t)-1 && PyErr_Occurred())
        return NULL;
    PyObject *device = current_device(self->device_id, self->get_device);
    if (device == NULL)
        return NULL;
    PyObject *result = context_for_thread(self->make_current, device) == 0
                           ? pinned_allocate_on(self, device, size_object, size)
                           : NULL;
    Py_DECREF(device);
    return result;
}

static void pinned_allocate_dealloc(PinnedAllocate *self)
{
    for (PyObject **field = &self->get_device; field < &self->get_device + PINNED_OBJECTS; field++)
        Py_DECREF(*field);
    PyObject_Free(self);
}

static PyTypeObject PinnedAllocateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_gpumem_cupy_allocate.PinnedAllocate",
    .tp_basicsize = sizeof(PinnedAllocate),
    .tp_dealloc = (destructor)pinned_allocate_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What CuPy's pinned memory allocator function and its blocks share.",
};

static PyMethodDef pinned_allocate_method = {"allocate_pinned", pinned_allocate, METH_O,
                                             "CuPy's pinned memory allocator: size -> PinnedMemoryPointer."};

static PyObject *make_pinned_allocate(PyObject *module, PyObject *arguments)
{
    (void)module;
    unsigned long long malloc_address, free_address, record_address;
    PinnedAllocate parsed;
    PyObject *device_capsule = NULL, *stream_capsule = NULL;
    if (!PyArg_ParseTuple(arguments, "KKKOOOOO!OOOOO|OO:make_pinned_allocate", &malloc_address, &free_address,
                          &record_address, &parsed.get_device, &parsed.get_stream, &parsed.stream_of_device,
                          &parsed.stream_of_device_slow, &PyDict_Type, &parsed.devices, &parsed.slow_allocate,
                          &parsed.malloc_failed, &parsed.free_failed, &parsed.pinned_memory_pointer,
                          &parsed.make_current, &device_capsule, &stream_capsule))
        return NULL;
    if (malloc_address == 0 || free_address == 0 || record_address == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "make_pinned_allocate: gm_host_malloc, gm_host_free and gm_host_record_stream need their addresses");
        return NULL;
    }
    PinnedAllocate *self = PyObject_New(PinnedAllocate, &PinnedAllocateType);
    if (self == NULL)
        return NULL;
    self->host_malloc = (gm_host_malloc_function)(uintptr_t)malloc_address;
    self->host_free = (gm_host_free_function)(uintptr_t)free_address;
    self->host_record_stream = (gm_host_record_stream_function)(uintptr_t)record_address;
    self->device_id = (cupy_device_id_function)capsule_function(device_capsule, CUPY_DEVICE_ID_SIGNATURE);
    self->stream_pointer = (cupy_stream_pointer_function)capsule_function(stream_capsule, CUPY_STREAM_POINTER_SIGNATURE);
    memcpy(&self->get_device, &parsed.get_device, PINNED_OBJECTS * sizeof(PyObject *));
    for (PyObject **field = &self->get_device; field < &self->get_device + PINNED_OBJECTS; field++)
        Py_INCREF(*field);
    PyObject *function = PyCFunction_New(&pinned_allocate_method, (PyObject *)self);
    Py_DECREF(self);
    return function;
}

static PyObject *use_blocking_hook(PyObject *module, PyObject *address_object)
{
    (void)module;
    void *address = PyLong_AsVoidPtr(address_object);
    if (address == NULL && PyErr_Occurred())
        return NULL;
    set_blocking_hook = (gm_set_blocking_hook_function)address;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"use_blocking_hook", use_blocking_hook, METH_O,
     "use_blocking_hook(gm_set_blocking_hook's address, or 0): keep the GIL through gpumem calls unless gpumem "
     "waits"},
    {"make_allocate", make_allocate, METH_VARARGS,
     "make_allocate(gm_malloc address, gm_free address, get_device, get_stream, has_hooks, registered_hooks, "
     "devices, kept_streams, keep_stream, slow_allocate, malloc_failed, free_slow, free_failed, UnownedMemory, "
     "MemoryPointer, make_current[, CuPy's capsules of get_device_id, get_current_stream_ptr, _has_memory_hooks]) -> CuPy's "
     "allocator function"},
    {"make_pinned_allocate", make_pinned_allocate, METH_VARARGS,
     "make_pinned_allocate(gm_host_malloc, gm_host_free and gm_host_record_stream addresses, get_device, "
     "get_stream, stream_of_device, stream_of_device_slow, devices, slow_allocate, malloc_failed, free_failed, "
     "PinnedMemoryPointer, make_current[, CuPy's capsules of get_device_id, get_current_stream_ptr]) -> CuPy's pinned memory allocator function"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "_gpumem_cupy_allocate", "gpumem.cupy's allocation hot path, compiled.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__gpumem_cupy_allocate(void)
{
    if (PyType_Ready(&BlockType) < 0 || PyType_Ready(&AllocateType) < 0 || PyType_Ready(&PinnedBlockType) < 0 ||
        PyType_Ready(&PinnedAllocateType) < 0)
        return NULL;
    name_handle_address = PyUnicode_InternFromString("handle_address");
    name_ptr = PyUnicode_InternFromString("ptr");
    zero = PyLong_FromLong(0);
    if (name_handle_address == NULL || name_ptr == NULL || zero == NULL)
        return NULL;
    return PyModule_Create(&module_definition);
}
