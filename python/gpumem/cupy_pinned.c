/* cupy_pinned.c -- gpumem.cupy's pinned host memory allocator function, compiled.
 *
 * CuPy calls its pinned memory allocator for cupy.cuda.alloc_pinned_memory, cupyx.empty_pinned and the
 * staging buffers of its transfers, and drops the PinnedMemoryPointer when it is done. This file does
 * what gpumem.cupy's Python _pinned_allocate and _PinnedBlock do (cupy.py, which says why), in the same
 * order: a block of the current device's pinned host cache (gm_host_malloc), owned by a PinnedBlock that
 * CuPy's PinnedMemoryPointer holds as its memory (CuPy reads its `ptr` and `size`). Dropping it gives the
 * block back with its streams recorded, the one current at the allocation and the one current at the
 * drop, in one call under one lock (gm_host_free_with_streams), so the cache reuses it only after their
 * work is done.
 *
 * The current device and stream come from CuPy's C functions where it exports them, else from its
 * Python ones; the stream current at the drop is asked of CuPy's Python function when the block's device
 * is not the current one. The device's first allocation, and a failure, go to the Python functions it is
 * given (slow_allocate, malloc_failed, free_failed). cupy_allocate.h has what it shares with the device
 * path (the GIL around gpumem calls, the device cells, the object recipes).
 */
#include "cupy_allocate.h"

typedef int (*gm_host_malloc_function)(void *allocator, size_t size, void **pointer_out);
/* gm_host_free_with_streams; a gm_stream is a uintptr_t, the size of a size_t here (Linux) */
typedef int (*gm_host_free_with_streams_function)(void *allocator, void *pointer, const size_t *streams, size_t count);

typedef struct {
    PyObject_HEAD
    gm_host_malloc_function host_malloc;
    gm_host_free_with_streams_function host_free_with_streams;
    cupy_device_id_function device_id; /* CuPy's C functions, or NULL, as Allocate's */
    cupy_stream_pointer_function stream_pointer;
    gmcupy_device_cells cells;         /* where each device's handle lives */
    gmcupy_recipe pointer_recipe;      /* PinnedMemoryPointer without its constructor, where it can */
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

/* The PyObject fields of PinnedAllocate, which end it. */
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
    int device_id;
    PyObject *ptr, *size, *device;
} PinnedBlock;

/* The pointer of `device`'s current stream, or 0 with *known 0 where CuPy cannot say it: from CuPy's C
 * functions when `device` is the current device, else from its Python ones. */
static size_t stream_at_free(PinnedAllocate *allocate, PyObject *device, int device_id, int *known)
{
    if (allocate->device_id && allocate->stream_pointer) {
        int current = allocate->device_id(0);
        if (!PyErr_Occurred() && device_id == current) {
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
    PyObject *pointer = stream ? PyObject_GetAttr(stream, gmcupy_name_ptr) : NULL;
    Py_XDECREF(stream);
    size_t value = pointer ? (size_t)PyLong_AsUnsignedLongLong(pointer) : 0;
    Py_XDECREF(pointer);
    *known = !PyErr_Occurred();
    PyErr_Clear();
    return *known ? value : 0;
}

static void pinned_block_free(PinnedBlock *self)
{
    PinnedAllocate *allocate = self->allocate;
    if (self->pointer == NULL || Py_IsFinalizing()) /* size 0, or CUDA may be gone already */
        return;
    size_t streams[2] = {self->stream_pointer, 0};
    int count = 1, known;
    size_t current = stream_at_free(allocate, self->device, self->device_id, &known);
    if (known && current != streams[0])
        streams[count++] = current;
    void *handle = *self->handle_cell;
    int status = 0;
    /* the streams recorded and the block freed in one call; a block whose streams could not be recorded is
     * not freed (as the Python path: never reused while a copy may use it) */
    GPUMEM_CALL(status = allocate->host_free_with_streams(handle, self->pointer, streams, (size_t)count));
    if (status == 0)
        return;
    gmcupy_report_failed_free(allocate->free_failed, status);
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
                             int device_id, PyObject *stream, size_t stream_pointer, void *pointer, PyObject *size)
{
    PinnedBlock *block = PyObject_New(PinnedBlock, &PinnedBlockType);
    if (block == NULL) {
        void *handle = *handle_cell;
        GPUMEM_CALL(self->host_free_with_streams(handle, pointer, NULL, 0));
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
    block->device_id = device_id;
    block->size = size;
    block->device = device;
    block->ptr = PyLong_FromVoidPtr(pointer);
    PyObject *result = NULL;
    if (block->ptr != NULL)
        result = gmcupy_pinned_pointer(&self->pointer_recipe, self->pinned_memory_pointer, (PyObject *)block, pointer);
    Py_DECREF(block);
    return result;
}

/* The current stream at an allocation and its pointer: None for the default stream, which CuPy's C
 * function says with no Python call and which needs keeping alive by no one; any other the Stream. */
static PyObject *allocation_stream(PinnedAllocate *self, size_t *pointer_out)
{
    if (self->stream_pointer) {
        intptr_t pointer = self->stream_pointer();
        if (PyErr_Occurred())
            return NULL;
        *pointer_out = 0;
        if (pointer == 0)
            Py_RETURN_NONE;
    }
    PyObject *stream = gmcupy_call_nothing(self->get_stream);
    PyObject *pointer = stream ? PyObject_GetAttr(stream, gmcupy_name_ptr) : NULL;
    if (pointer != NULL)
        *pointer_out = (size_t)PyLong_AsUnsignedLongLong(pointer);
    Py_XDECREF(pointer);
    if (pointer == NULL || PyErr_Occurred())
        Py_CLEAR(stream);
    return stream;
}

static PyObject *pinned_allocate_on(PinnedAllocate *self, PyObject *device, int device_id, PyObject *size_object,
                                    size_t size)
{
    void **handle_cell; /* device_state: borrowed from the dict */
    PyObject *device_state = gmcupy_device_state(self->devices, &self->cells, device, device_id, &handle_cell);
    if (device_state == NULL)
        return PyErr_Occurred() ? NULL : PyObject_Vectorcall(self->slow_allocate, &size_object, 1, NULL);
    Py_INCREF(device_state);
    size_t stream_pointer;
    PyObject *result = NULL, *stream = allocation_stream(self, &stream_pointer);
    if (stream != NULL) {
        void *handle = *handle_cell, *pointer = NULL;
        int status;
        GPUMEM_CALL(status = self->host_malloc(handle, size, &pointer));
        result = status == 0 ? pinned_wrap(self, device_state, handle_cell, device, device_id, stream, stream_pointer,
                                           pointer, size_object)
                             : gmcupy_call_with_status(self->malloc_failed, status, NULL);
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
    int device_id;
    PyObject *device = gmcupy_current_device(self->device_id, self->get_device, &device_id);
    if (device == NULL)
        return NULL;
    PyObject *result = NULL;
    if (gmcupy_context_for_thread(self->make_current, device) == 0)
        result = pinned_allocate_on(self, device, device_id, size_object, size);
    Py_DECREF(device);
    return result;
}

static void pinned_allocate_dealloc(PinnedAllocate *self)
{
    gmcupy_device_cells_clear(&self->cells);
    gmcupy_recipe_clear(&self->pointer_recipe);
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

const gmcupy_recipe *gmcupy_pinned_recipe(PyObject *allocate)
{
    return Py_TYPE(allocate) == &PinnedAllocateType ? &((PinnedAllocate *)allocate)->pointer_recipe : NULL;
}

int gmcupy_pinned_ready(void)
{
    return PyType_Ready(&PinnedBlockType) < 0 || PyType_Ready(&PinnedAllocateType) < 0 ? -1 : 0;
}

static PyMethodDef pinned_allocate_method = {"allocate_pinned", pinned_allocate, METH_O,
                                             "CuPy's pinned memory allocator: size -> PinnedMemoryPointer."};

PyObject *gmcupy_make_pinned_allocate(PyObject *module, PyObject *arguments)
{
    (void)module;
    unsigned long long malloc_address, free_address;
    PinnedAllocate parsed;
    PyObject *device_capsule = NULL, *stream_capsule = NULL;
    if (!PyArg_ParseTuple(arguments, "KKOOOOO!OOOOO|OO:make_pinned_allocate", &malloc_address, &free_address,
                          &parsed.get_device, &parsed.get_stream, &parsed.stream_of_device,
                          &parsed.stream_of_device_slow, &PyDict_Type, &parsed.devices, &parsed.slow_allocate,
                          &parsed.malloc_failed, &parsed.free_failed, &parsed.pinned_memory_pointer,
                          &parsed.make_current, &device_capsule, &stream_capsule))
        return NULL;
    if (malloc_address == 0 || free_address == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "make_pinned_allocate: gm_host_malloc and gm_host_free_with_streams need their addresses");
        return NULL;
    }
    PinnedAllocate *self = PyObject_New(PinnedAllocate, &PinnedAllocateType);
    if (self == NULL)
        return NULL;
    self->host_malloc = (gm_host_malloc_function)(uintptr_t)malloc_address;
    self->host_free_with_streams = (gm_host_free_with_streams_function)(uintptr_t)free_address;
    self->device_id = (cupy_device_id_function)gmcupy_capsule_function(device_capsule, CUPY_DEVICE_ID_SIGNATURE);
    self->stream_pointer =
        (cupy_stream_pointer_function)gmcupy_capsule_function(stream_capsule, CUPY_STREAM_POINTER_SIGNATURE);
    memset(&self->cells, 0, sizeof self->cells);
    memcpy(&self->get_device, &parsed.get_device, PINNED_OBJECTS * sizeof(PyObject *));
    for (PyObject **field = &self->get_device; field < &self->get_device + PINNED_OBJECTS; field++)
        Py_INCREF(*field);
    gmcupy_pinned_pointer_recipe(&self->pointer_recipe, self->pinned_memory_pointer);
    PyObject *function = PyCFunction_New(&pinned_allocate_method, (PyObject *)self);
    Py_DECREF(self);
    return function;
}
