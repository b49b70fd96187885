/* cupy_allocate.h -- what the files of gpumem.cupy's compiled allocation paths share.
 *
 * The module _gpumem_cupy_allocate is built from three files (gpumem/compiled.py compiles them together):
 *   cupy_allocate.c  the device memory allocator function, the helpers both paths use, the module itself;
 *   cupy_pinned.c    the pinned host memory allocator function;
 *   cupy_objects.c   CuPy's memory objects made the way CuPy's own pools make them (tp_new, then the
 *                    fields), where that is verified to give the objects the constructors give.
 * This header declares what crosses between them: how a gpumem call lets the GIL go, CuPy's C functions,
 * the cache of where each device's allocator handle lives, and the object recipes. Everything else stays
 * static in its file; the files name nothing alike, so that one translation unit may include all three
 * (bench/cupy_parts.c does, to time their steps one by one).
 */
#ifndef GPUMEM_CUPY_ALLOCATE_H
#define GPUMEM_CUPY_ALLOCATE_H

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
 * device, for a callback): libgpumem calls gmcupy_release_gil right before its first wait, and the GIL
 * is taken back after the call. Letting the GIL go around every call would cost more than a call
 * served from gpumem's cache. Without it (never set), the GIL is let go around every call, as ctypes
 * does. */
extern gm_set_blocking_hook_function gmcupy_set_blocking_hook;

typedef struct {
    PyThreadState *saved;
} gmcupy_released_gil;

void gmcupy_release_gil(void *context);

/* Run `statement`, calls into libgpumem, without holding the GIL while gpumem waits. The hook is set
 * and cleared around each call, not once per thread: gpumem forgets it once it has called it (one-shot),
 * so a hook set once would be gone after the thread's first wait, and its later calls would wait holding
 * the GIL; and one left set would be called by another caller's gpumem call on this thread, with this
 * call's context gone. */
#define GPUMEM_CALL(statement)                                                                                  \
    do {                                                                                                        \
        if (gmcupy_set_blocking_hook) {                                                                         \
            gmcupy_released_gil released_ = {NULL};                                                             \
            gmcupy_set_blocking_hook(gmcupy_release_gil, &released_);                                           \
            statement;                                                                                          \
            gmcupy_set_blocking_hook(NULL, NULL);                                                               \
            if (released_.saved)                                                                                \
                PyEval_RestoreThread(released_.saved);                                                          \
        } else {                                                                                                \
            Py_BEGIN_ALLOW_THREADS statement;                                                                   \
            Py_END_ALLOW_THREADS                                                                                \
        }                                                                                                       \
    } while (0)

/* CuPy's own C functions, where its Cython modules export them (__pyx_capi__) with these signatures:
 * cupy.cuda.device.get_device_id, cupy.cuda.stream.get_current_stream_ptr,
 * cupy.cuda.memory_hook._has_memory_hooks and cupy.cuda.memory_hook.get_memory_hooks (a new reference
 * to the thread's dict of hooks, made empty at the thread's first call). Calling them costs no Python
 * call; a capsule of any other signature is not used, and the Python functions are called instead. An
 * error they raise is seen through PyErr_Occurred whatever they return (Cython may declare them
 * `except *`). */
#define CUPY_DEVICE_ID_SIGNATURE "int (int __pyx_skip_dispatch)"
#define CUPY_STREAM_POINTER_SIGNATURE "intptr_t (void)"
#define CUPY_HAS_HOOKS_SIGNATURE "int (int __pyx_skip_dispatch)"
#define CUPY_GET_HOOKS_SIGNATURE "PyObject *(int __pyx_skip_dispatch)"
typedef int (*cupy_device_id_function)(int skip_dispatch);
typedef intptr_t (*cupy_stream_pointer_function)(void);
typedef int (*cupy_has_hooks_function)(int skip_dispatch);
typedef PyObject *(*cupy_get_hooks_function)(int skip_dispatch);

/* Interned "handle_address" and "ptr", the int 0 and the empty tuple; made at the module's import. */
extern PyObject *gmcupy_name_handle_address, *gmcupy_name_ptr, *gmcupy_zero, *gmcupy_empty_tuple;

PyObject *gmcupy_call_nothing(PyObject *function);
int gmcupy_context_for_thread(PyObject *make_current, PyObject *device);
PyObject *gmcupy_call_with_status(PyObject *function, int status, PyObject *extra);
void gmcupy_report_failed_free(PyObject *free_failed, int status);
/* The current device as an int object, and as an int in *device_out: from CuPy's C function `device_id`
 * where there is one, else from `get_device`. */
PyObject *gmcupy_current_device(cupy_device_id_function device_id, PyObject *get_device, int *device_out);
void *gmcupy_capsule_function(PyObject *capsule, const char *signature);

/* Where each device's allocator handle is stored (a gpumem.cupy._Device's handle_address), remembered per
 * _Device object so that an allocation reads no Python attribute: the device is still looked up in
 * gpumem.cupy's dict at every call (the dict stays what decides), and the cell is reused only while the
 * dict answers with the very object it was read from (held here, so that its address is not reused). The
 * allocator itself is read from the cell at every call: NULL once it is closed, which gpumem refuses. */
#define GMCUPY_CACHED_DEVICES 16
typedef struct {
    PyObject *state[GMCUPY_CACHED_DEVICES]; /* the _Device the cell was read from, or NULL */
    void **cell[GMCUPY_CACHED_DEVICES];
} gmcupy_device_cells;

/* The _Device of `device` (an int object, `device_id` its value; borrowed from `devices`) and its handle's
 * cell; NULL with no exception where the device has none yet, NULL with an exception on an error. */
PyObject *gmcupy_device_state(PyObject *devices, gmcupy_device_cells *cells, PyObject *device, int device_id,
                              void ***cell_out);
void gmcupy_device_cells_clear(gmcupy_device_cells *cells);

/* CuPy's memory objects made without their constructors: a recipe says where tp_new's object gets each
 * field the constructor would set (cupy_objects.c says how it is found and checked). A recipe whose type
 * is NULL means: call the constructor. */
#define GMCUPY_RECIPE_FIELDS 4
typedef struct {
    PyTypeObject *type; /* a strong reference, or NULL */
    Py_ssize_t offset[GMCUPY_RECIPE_FIELDS];
} gmcupy_recipe;

/* The recipes for UnownedMemory(ptr, size, owner, device_id), MemoryPointer(memory, 0) and
 * PinnedMemoryPointer(memory, 0), where `type` passes the checks (MemoryPointer's are made with probe
 * memories of gpumem's own memory where `owned` has a type, else of `unowned_memory_type`); else
 * recipe->type stays NULL. Never fails and leaves no exception: a type that cannot be checked is made
 * through its constructor. */
void gmcupy_unowned_memory_recipe(gmcupy_recipe *recipe, PyObject *type);
void gmcupy_memory_pointer_recipe(gmcupy_recipe *recipe, PyObject *type, PyObject *unowned_memory_type,
                                  const gmcupy_recipe *owned);

/* gpumem's own memory object (cupy_objects.c says why and how it is checked): a subclass of CuPy's
 * BaseMemory `base` whose objects end with `fields_size` bytes of the caller's (zeroed by tp_new, then
 * the caller's to fill), freed by `dealloc`, which must end with the base's tp_dealloc and then drop the
 * reference to the object's type. Its recipe holds the subclass and where ptr, size and device_id are;
 * recipe->type stays NULL where `base` is NULL or fails the checks. Never fails and leaves no exception. */
void gmcupy_owned_memory_recipe(gmcupy_recipe *recipe, PyObject *base, Py_ssize_t fields_size, destructor dealloc);
/* One such object at `pointer`, `size` bytes on `device`; NULL with an exception on an error. */
PyObject *gmcupy_owned_memory(const gmcupy_recipe *recipe, void *pointer, size_t size, int device);

/* Where the caller's fields begin in an object of a subclass of `base`: after base's, aligned. */
static inline Py_ssize_t gmcupy_owned_fields_offset(PyTypeObject *base)
{
    Py_ssize_t alignment = (Py_ssize_t)sizeof(void *);
    return (base->tp_basicsize + alignment - 1) / alignment * alignment;
}
void gmcupy_pinned_pointer_recipe(gmcupy_recipe *recipe, PyObject *type);
void gmcupy_recipe_clear(gmcupy_recipe *recipe);

/* The objects, through the recipe or else the constructor `type`; NULL with an exception on an error. */
PyObject *gmcupy_unowned_memory(const gmcupy_recipe *recipe, PyObject *type, void *pointer, PyObject *size_object,
                                size_t size, PyObject *owner, PyObject *device_object, int device);
PyObject *gmcupy_memory_pointer(const gmcupy_recipe *recipe, PyObject *type, PyObject *memory, void *pointer,
                                int device);
PyObject *gmcupy_pinned_pointer(const gmcupy_recipe *recipe, PyObject *type, PyObject *memory, void *pointer);

/* cupy_pinned.c: its types made ready, make_pinned_allocate (the module's function), and the recipe of
 * a pinned allocator function's PinnedMemoryPointer (NULL if `allocate` is not its self). */
int gmcupy_pinned_ready(void);
PyObject *gmcupy_make_pinned_allocate(PyObject *module, PyObject *arguments);
const gmcupy_recipe *gmcupy_pinned_recipe(PyObject *allocate);

/* cupy_objects.c: its probe type made ready. */
int gmcupy_objects_ready(void);

#endif
