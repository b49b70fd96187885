/* cupy_objects.c -- CuPy's memory objects made as CuPy's own pools make them: tp_new, then the fields.
 *
 * Every block gpumem.cupy hands to CuPy comes as two CuPy objects, UnownedMemory(ptr, size, owner,
 * device_id) and MemoryPointer(memory, 0) (a pinned block as PinnedMemoryPointer(memory, 0)). Their
 * constructors parse their arguments from a tuple, which costs more than the rest of making them. CuPy's
 * own pools skip that: Cython lets them call tp_new (MemoryPointer.__new__) and set the C fields
 * directly. From outside Cython the fields have no public setter (UnownedMemory's _owner, all of
 * MemoryPointer's and PinnedMemoryPointer's are read-only), so this file finds where the constructor
 * puts each of them, once per type, and then writes them there itself:
 *   1. the type must be a plain C type: no instance dict, no weak reference list, no variable size
 *      (a Python class, such as the stand-ins of the tests, is always made through its constructor);
 *   2. one object made by the constructor from probe values (addresses and sizes no real call gives, a
 *      fresh owner object) must hold each value at exactly one place: that place is the field's offset;
 *   3. one object made by the constructor and one made here (tp_new, then the fields written), both from
 *      other probe values, must be equal byte for byte past the object header: the constructor sets
 *      nothing else, and tp_new sets the rest (CuPy's vtable, None in its object fields) as it does.
 * A type that fails any check, or an error while checking, leaves the constructor in use; nothing is
 * raised. What the checks cannot see is a constructor's effect outside the object; CuPy's constructors of
 * these types (cupy/cuda/memory.pyx, pinned_memory.pyx) only assign their fields.
 *
 * gpumem's own memory object. CuPy's pool hands out one memory object per block, a PooledMemory: a
 * subclass of BaseMemory made by BaseMemory's tp_new with its public ptr, size and device_id assigned.
 * The device path does the same where it can: a C subclass of CuPy's BaseMemory that is itself the owner
 * of the gpumem block (the caller's fields follow BaseMemory's), instead of a Block under an
 * UnownedMemory. The subclass is made only where BaseMemory is a plain static C type (check 1, not
 * garbage collected, subclassable), and used only where the checks above pass for it with
 * "the constructor" being tp_new and then the public attributes assigned (CuPy's own setters, what
 * PooledMemory's fields go through): each probe value found at exactly one place, and an object whose
 * fields were written at those places equal byte for byte to one whose attributes were assigned.
 * Else the caller keeps its Block and UnownedMemory.
 */
#include "cupy_allocate.h"

#if UINTPTR_MAX > 0xFFFFFFFFu
#define PROBE_WORD(tag) ((intptr_t)(((uintptr_t)0x5EC0DEu << 40) | ((uintptr_t)(tag) << 12)))
#define PROBE_INT(tag) ((int)(0x1EC0DE00 | (tag)))
#define OBJECTS_HAVE_RECIPES 1
#else
#define OBJECTS_HAVE_RECIPES 0 /* CuPy is 64-bit only */
#endif

enum field_kind { FIELD_WORD, FIELD_INT, FIELD_OBJECT };

/* One field's value in a probe (or in a real object): its kind, and the value of that kind. */
typedef struct {
    enum field_kind kind;
    intptr_t word;
    int integer;
    PyObject *object;
} field_value;

static size_t field_width(enum field_kind kind)
{
    return kind == FIELD_INT ? sizeof(int) : sizeof(void *);
}

static const void *field_bytes(const field_value *value)
{
    if (value->kind == FIELD_INT)
        return &value->integer;
    return value->kind == FIELD_WORD ? (const void *)&value->word : (const void *)&value->object;
}

/* 1 if objects of `type` may be made by a recipe: see the top of this file, check 1. */
static int plain_type(PyObject *type_object)
{
    if (type_object == NULL || !PyType_Check(type_object))
        return 0;
    PyTypeObject *type = (PyTypeObject *)type_object;
    unsigned long managed = 0;
#ifdef Py_TPFLAGS_MANAGED_DICT
    managed |= Py_TPFLAGS_MANAGED_DICT;
#endif
#ifdef Py_TPFLAGS_MANAGED_WEAKREF
    managed |= Py_TPFLAGS_MANAGED_WEAKREF;
#endif
    return type->tp_new != NULL && type->tp_itemsize == 0 && type->tp_dictoffset == 0 &&
           type->tp_weaklistoffset == 0 && !(PyType_GetFlags(type) & managed) &&
           type->tp_basicsize >= (Py_ssize_t)sizeof(PyObject) && type->tp_basicsize <= 1024;
}

/* Where in `object` (of `size` bytes) `value` lies, if at exactly one aligned place that no field found
 * before (`found`, `count` of them) covers; else -1. */
static Py_ssize_t only_place(PyObject *object, Py_ssize_t size, const field_value *value, const Py_ssize_t *found,
                             const field_value *found_values, int count)
{
    size_t width = field_width(value->kind);
    Py_ssize_t place = -1;
    for (Py_ssize_t offset = sizeof(PyObject); offset + (Py_ssize_t)width <= size; offset += width) {
        if (memcmp((const char *)object + offset, field_bytes(value), width) != 0)
            continue;
        if (place >= 0)
            return -1;
        place = offset;
    }
    for (int other = 0; other < count && place >= 0; other++) {
        Py_ssize_t end = found[other] + (Py_ssize_t)field_width(found_values[other].kind);
        if (place < end && found[other] < place + (Py_ssize_t)width)
            return -1;
    }
    return place;
}

/* An object of the recipe's type with `values` written at its offsets; NULL with an exception. */
static PyObject *made_by_recipe(const gmcupy_recipe *recipe, const field_value *values, int count)
{
    PyObject *object = recipe->type->tp_new(recipe->type, gmcupy_empty_tuple, NULL);
    if (object == NULL)
        return NULL;
    for (int field = 0; field < count; field++) {
        char *place = (char *)object + recipe->offset[field];
        if (values[field].kind == FIELD_OBJECT) {
            PyObject *old;
            memcpy(&old, place, sizeof old);
            Py_INCREF(values[field].object);
            memcpy(place, &values[field].object, sizeof(PyObject *));
            Py_XDECREF(old);
        } else {
            memcpy(place, field_bytes(&values[field]), field_width(values[field].kind));
        }
    }
    return object;
}

/* Checks 2 and 3 for `type`: make(type, probe values) -> the constructor's object. On success the
 * recipe holds the type and the offsets. */
static void find_recipe(gmcupy_recipe *recipe, PyObject *type, PyObject *(*make)(PyObject *, const field_value *),
                        const field_value *first, const field_value *second, int count)
{
    recipe->type = NULL;
    if (!OBJECTS_HAVE_RECIPES || !plain_type(type) || count > GMCUPY_RECIPE_FIELDS)
        return;
    Py_ssize_t size = ((PyTypeObject *)type)->tp_basicsize;
    PyObject *probe = make(type, first), *constructed = NULL, *recipe_made = NULL;
    int usable = probe != NULL && Py_TYPE(probe) == (PyTypeObject *)type;
    for (int field = 0; field < count && usable; field++) {
        recipe->offset[field] = only_place(probe, size, &first[field], recipe->offset, first, field);
        usable = recipe->offset[field] >= 0;
    }
    if (usable) {
        recipe->type = (PyTypeObject *)type;
        constructed = make(type, second);
        recipe_made = constructed ? made_by_recipe(recipe, second, count) : NULL;
        usable = recipe_made != NULL && Py_TYPE(constructed) == Py_TYPE(recipe_made) &&
                 memcmp((const char *)constructed + sizeof(PyObject), (const char *)recipe_made + sizeof(PyObject),
                        size - sizeof(PyObject)) == 0;
    }
    PyErr_Clear(); /* an error while checking leaves the constructor in use */
    Py_XDECREF(probe);
    Py_XDECREF(constructed);
    Py_XDECREF(recipe_made);
    recipe->type = usable ? (PyTypeObject *)type : NULL;
    Py_XINCREF(recipe->type);
}

void gmcupy_recipe_clear(gmcupy_recipe *recipe)
{
    Py_CLEAR(recipe->type);
}

/* ---- UnownedMemory(ptr, size, owner, device_id) ---- */

static PyObject *call_type(PyObject *type, PyObject **arguments, size_t count)
{
    return PyObject_Vectorcall(type, arguments, count, NULL);
}

static PyObject *unowned_memory_constructed(PyObject *type, const field_value *values)
{
    PyObject *pointer = PyLong_FromSsize_t(values[0].word), *size = PyLong_FromSsize_t(values[1].word);
    PyObject *device = PyLong_FromLong(values[3].integer), *result = NULL;
    if (pointer != NULL && size != NULL && device != NULL) {
        PyObject *arguments[4] = {pointer, size, values[2].object, device};
        result = call_type(type, arguments, 4);
    }
    Py_XDECREF(pointer);
    Py_XDECREF(size);
    Py_XDECREF(device);
    return result;
}

static void unowned_values(field_value *values, intptr_t pointer, size_t size, PyObject *owner, int device)
{
    values[0] = (field_value){FIELD_WORD, pointer, 0, NULL};
    values[1] = (field_value){FIELD_WORD, (intptr_t)size, 0, NULL};
    values[2] = (field_value){FIELD_OBJECT, 0, 0, owner};
    values[3] = (field_value){FIELD_INT, 0, device, NULL};
}

void gmcupy_unowned_memory_recipe(gmcupy_recipe *recipe, PyObject *type)
{
    recipe->type = NULL;
#if OBJECTS_HAVE_RECIPES
    PyObject *first_owner = PyList_New(0), *second_owner = PyList_New(0);
    if (first_owner != NULL && second_owner != NULL) {
        field_value first[4], second[4];
        unowned_values(first, PROBE_WORD(1), (size_t)PROBE_WORD(2), first_owner, PROBE_INT(1));
        unowned_values(second, PROBE_WORD(3), (size_t)PROBE_WORD(4), second_owner, PROBE_INT(2));
        find_recipe(recipe, type, unowned_memory_constructed, first, second, 4);
    }
    Py_XDECREF(first_owner);
    Py_XDECREF(second_owner);
    PyErr_Clear();
#else
    (void)type;
#endif
}

PyObject *gmcupy_unowned_memory(const gmcupy_recipe *recipe, PyObject *type, void *pointer, PyObject *size_object,
                                size_t size, PyObject *owner, PyObject *device_object, int device)
{
    if (recipe->type != NULL) {
        field_value values[4];
        unowned_values(values, (intptr_t)pointer, size, owner, device);
        return made_by_recipe(recipe, values, 4);
    }
    PyObject *pointer_object = PyLong_FromVoidPtr(pointer);
    if (pointer_object == NULL)
        return NULL;
    PyObject *arguments[4] = {pointer_object, size_object, owner, device_object};
    PyObject *memory = call_type(type, arguments, 4);
    Py_DECREF(pointer_object);
    return memory;
}

/* ---- gpumem's memory: a subclass of CuPy's BaseMemory, its ptr, size and device_id assigned ---- */

static void owned_values(field_value *values, intptr_t pointer, size_t size, int device)
{
    values[0] = (field_value){FIELD_WORD, pointer, 0, NULL};
    values[1] = (field_value){FIELD_WORD, (intptr_t)size, 0, NULL};
    values[2] = (field_value){FIELD_INT, 0, device, NULL};
}

/* "The constructor" of gpumem's memory: tp_new, then ptr, size and device_id assigned through the
 * attributes BaseMemory makes public (the setters CuPy's own code writes them through). */
static PyObject *owned_memory_assigned(PyObject *type, const field_value *values)
{
    static const char *const names[3] = {"ptr", "size", "device_id"};
    PyObject *memory = ((PyTypeObject *)type)->tp_new((PyTypeObject *)type, gmcupy_empty_tuple, NULL);
    for (int field = 0; field < 3 && memory != NULL; field++) {
        PyObject *value = values[field].kind == FIELD_INT ? PyLong_FromLong(values[field].integer)
                                                          : PyLong_FromSsize_t(values[field].word);
        if (value == NULL || PyObject_SetAttrString(memory, names[field], value) < 0)
            Py_CLEAR(memory);
        Py_XDECREF(value);
    }
    return memory;
}

/* 1 if gpumem's memory may subclass `base`: check 1, and a static type (whose dealloc leaves the
 * subclass's type reference to the subclass, as CPython's own subclasses assume), subclassable, not
 * garbage collected (the subclass adds no traversal of its own). */
static int plain_base(PyObject *base)
{
    if (!plain_type(base))
        return 0;
    unsigned long flags = PyType_GetFlags((PyTypeObject *)base);
    return (flags & Py_TPFLAGS_BASETYPE) && !(flags & (Py_TPFLAGS_HEAPTYPE | Py_TPFLAGS_HAVE_GC));
}

void gmcupy_owned_memory_recipe(gmcupy_recipe *recipe, PyObject *base, Py_ssize_t fields_size, destructor dealloc)
{
    recipe->type = NULL;
#if OBJECTS_HAVE_RECIPES
    if (base == NULL || !plain_base(base))
        return;
    PyType_Slot slots[] = {
        {Py_tp_dealloc, (void *)dealloc},
        {Py_tp_doc, (void *)"CuPy's memory object of one gpumem block, which it gives back when dropped."},
        {0, NULL},
    };
    Py_ssize_t size = gmcupy_owned_fields_offset((PyTypeObject *)base) + fields_size;
    PyType_Spec spec = {"_gpumem_cupy_allocate.Memory", (int)size, 0, Py_TPFLAGS_DEFAULT, slots};
    PyObject *bases = PyTuple_Pack(1, base);
    PyObject *type = bases ? PyType_FromSpecWithBases(&spec, bases) : NULL;
    Py_XDECREF(bases);
    if (type != NULL) {
        field_value first[3], second[3];
        owned_values(first, PROBE_WORD(9), (size_t)PROBE_WORD(10), PROBE_INT(5));
        owned_values(second, PROBE_WORD(11), (size_t)PROBE_WORD(12), PROBE_INT(6));
        find_recipe(recipe, type, owned_memory_assigned, first, second, 3);
    }
    Py_XDECREF(type); /* the recipe holds its own reference where the type is usable */
    PyErr_Clear();
#else
    (void)base, (void)fields_size, (void)dealloc;
#endif
}

PyObject *gmcupy_owned_memory(const gmcupy_recipe *recipe, void *pointer, size_t size, int device)
{
    field_value values[3];
    owned_values(values, (intptr_t)pointer, size, device);
    return made_by_recipe(recipe, values, 3);
}

/* ---- MemoryPointer(memory, 0): its ptr (memory.ptr), device_id (memory.device_id) and mem ---- */

static PyObject *memory_pointer_constructed(PyObject *type, const field_value *values)
{
    PyObject *memory = values[2].object;
    PyObject *arguments[2] = {memory, gmcupy_zero};
    return call_type(type, arguments, 2);
}

/* A probe memory for MemoryPointer at `pointer` on `device`, of the kind the allocations will hand it:
 * gpumem's memory (`owned`, whose fields are left empty: it owns no block) where its recipe is usable,
 * else an UnownedMemory (`type`) owned by nothing. */
static PyObject *probe_memory(PyObject *type, const gmcupy_recipe *owned, intptr_t pointer, int device)
{
    if (owned->type != NULL)
        return gmcupy_owned_memory(owned, (void *)pointer, 1, device);
    field_value values[4];
    unowned_values(values, pointer, 1, Py_None, device);
    return unowned_memory_constructed(type, values);
}

static void pointer_values(field_value *values, intptr_t pointer, int device, PyObject *memory)
{
    values[0] = (field_value){FIELD_WORD, pointer, 0, NULL};
    values[1] = (field_value){FIELD_INT, 0, device, NULL};
    values[2] = (field_value){FIELD_OBJECT, 0, 0, memory};
}

void gmcupy_memory_pointer_recipe(gmcupy_recipe *recipe, PyObject *type, PyObject *unowned_memory_type,
                                  const gmcupy_recipe *owned)
{
    recipe->type = NULL;
#if OBJECTS_HAVE_RECIPES
    PyObject *first_memory = probe_memory(unowned_memory_type, owned, PROBE_WORD(5), PROBE_INT(3));
    PyObject *second_memory =
        first_memory ? probe_memory(unowned_memory_type, owned, PROBE_WORD(6), PROBE_INT(4)) : NULL;
    if (second_memory != NULL) {
        field_value first[3], second[3];
        pointer_values(first, PROBE_WORD(5), PROBE_INT(3), first_memory);
        pointer_values(second, PROBE_WORD(6), PROBE_INT(4), second_memory);
        find_recipe(recipe, type, memory_pointer_constructed, first, second, 3);
    }
    Py_XDECREF(first_memory);
    Py_XDECREF(second_memory);
    PyErr_Clear();
#else
    (void)type, (void)unowned_memory_type, (void)owned;
#endif
}

PyObject *gmcupy_memory_pointer(const gmcupy_recipe *recipe, PyObject *type, PyObject *memory, void *pointer,
                                int device)
{
    if (recipe->type != NULL) {
        field_value values[3];
        pointer_values(values, (intptr_t)pointer, device, memory);
        return made_by_recipe(recipe, values, 3);
    }
    PyObject *arguments[2] = {memory, gmcupy_zero};
    return call_type(type, arguments, 2);
}

/* ---- PinnedMemoryPointer(memory, 0): its mem and ptr (memory.ptr) ---- */

/* What PinnedMemoryPointer's probes point into: an object with a `ptr`. */
typedef struct {
    PyObject_HEAD
    PyObject *ptr;
} ProbeMemory;

static void probe_memory_dealloc(ProbeMemory *self)
{
    Py_XDECREF(self->ptr);
    PyObject_Free(self);
}

static PyMemberDef probe_memory_members[] = {
    {"ptr", T_OBJECT_EX, offsetof(ProbeMemory, ptr), READONLY, "the probe's address"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject ProbeMemoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_gpumem_cupy_allocate.ProbeMemory",
    .tp_basicsize = sizeof(ProbeMemory),
    .tp_dealloc = (destructor)probe_memory_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A memory with an address and nothing else: what the PinnedMemoryPointer checks point into.",
    .tp_members = probe_memory_members,
};

int gmcupy_objects_ready(void)
{
    return PyType_Ready(&ProbeMemoryType);
}

static PyObject *pinned_pointer_constructed(PyObject *type, const field_value *values)
{
    PyObject *arguments[2] = {values[0].object, gmcupy_zero};
    return call_type(type, arguments, 2);
}

static void pinned_values(field_value *values, PyObject *memory, intptr_t pointer)
{
    values[0] = (field_value){FIELD_OBJECT, 0, 0, memory};
    values[1] = (field_value){FIELD_WORD, pointer, 0, NULL};
}

static PyObject *new_probe_memory(intptr_t pointer)
{
    ProbeMemory *memory = PyObject_New(ProbeMemory, &ProbeMemoryType);
    if (memory != NULL && (memory->ptr = PyLong_FromSsize_t(pointer)) == NULL)
        Py_CLEAR(memory);
    return (PyObject *)memory;
}

void gmcupy_pinned_pointer_recipe(gmcupy_recipe *recipe, PyObject *type)
{
    recipe->type = NULL;
#if OBJECTS_HAVE_RECIPES
    PyObject *first_memory = new_probe_memory(PROBE_WORD(7));
    PyObject *second_memory = first_memory ? new_probe_memory(PROBE_WORD(8)) : NULL;
    if (second_memory != NULL) {
        field_value first[2], second[2];
        pinned_values(first, first_memory, PROBE_WORD(7));
        pinned_values(second, second_memory, PROBE_WORD(8));
        find_recipe(recipe, type, pinned_pointer_constructed, first, second, 2);
    }
    Py_XDECREF(first_memory);
    Py_XDECREF(second_memory);
    PyErr_Clear();
#else
    (void)type;
#endif
}

PyObject *gmcupy_pinned_pointer(const gmcupy_recipe *recipe, PyObject *type, PyObject *memory, void *pointer)
{
    if (recipe->type != NULL) {
        field_value values[2];
        pinned_values(values, memory, (intptr_t)pointer);
        return made_by_recipe(recipe, values, 2);
    }
    PyObject *arguments[2] = {memory, gmcupy_zero};
    return call_type(type, arguments, 2);
}
