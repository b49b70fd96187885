"""gpumem as CuPy's device memory allocator and as its pinned host memory allocator.

    import gpumem.cupy
    gpumem.cupy.install()              # CuPy arrays live in gpumem's memory, pinned buffers in its host cache
    gpumem.cupy.install(pinned=False)  # device memory only: CuPy keeps its own pinned memory pool
    gpumem.cupy.allocator().host_stats()   # the current device's gpumem.Allocator

One gpumem allocator per device (backend cuda; GPUMEM_CONF plus `config` apply), made on first use.
CuPy's pool calls keep working: cupy.get_default_memory_pool() and get_default_pinned_memory_pool()
return gpumem's stand-ins (free_all_blocks, used_bytes, total_bytes, set_limit, ...: cupy_pools.py), and
CUPY_GPU_MEMORY_LIMIT caps each device's allocator as it caps CuPy's pools. CuPy's memory hooks
(cupy.cuda.MemoryHook) see gpumem's allocations and frees as they saw the pool's (cupy_hooks.py).

Both allocator functions are compiled (cupy_allocate.c, cupy_pinned.c and cupy_objects.c, built on first
install by gpumem/compiled.py and cached), so that an allocation and its free pay for no Python frame and
no ctypes call, as in CuPy's own compiled pools. They do what the Python functions below do (allocate()
and _Block, the pinned allocate() and _PinnedBlock) and call them for the rare cases: a memory hook
registered, a device's first allocation, a failure. They make CuPy's objects as CuPy's own pools do,
through tp_new and their fields, where a check at install shows that this makes what the constructors
make (cupy_objects.c), and else through the constructors; where CuPy's BaseMemory allows it, the
compiled device path's memory object is, as the pool's PooledMemory is, a subclass of BaseMemory that
owns the block itself, instead of an UnownedMemory owning a block object.
Where they cannot be built (no C compiler or no Python headers) install() warns and the Python functions
serve every allocation.

Device memory: an allocation that does not fit raises cupy.cuda.memory.OutOfMemoryError carrying
gpumem's report. CuPy frees memory by dropping its owner object, which gives the block back to gpumem on
the stream it was allocated on. The streams gpumem has allocated on are kept alive while gpumem holds
memory for them (it may record events on them later); those it has let go (it forgets the heaps of
idle streams once it has more than 128) are dropped, so a program that makes streams without end does
not keep them all.

Pinned host memory (cupy.cuda.alloc_pinned_memory, cupyx.empty_pinned, and the staging buffers that
cupy.asarray / cupy.array fill from NumPy arrays) comes from the pinned host cache of the current
device's allocator: gm_host_malloc, page-locked with cuMemHostAlloc (portable to every device), sizes
rounded up to powers of two, freed blocks kept for reuse. CuPy's callers get a PinnedMemoryPointer whose
memory object gives the block back when CuPy drops it.

When may a dropped pinned block be reused? CuPy's own transfers keep the PinnedMemoryPointer alive until
an event recorded after their asynchronous copy has completed (cupy.cuda.pinned_memory._add_to_watch_list),
but a user may drop an array of cupyx.empty_pinned while a copy from it is still queued, and CuPy's
PinnedMemoryPool reuses a freed block at once. gpumem does better: on the drop it gives the block back
with the device's stream current then and the stream that was current at the allocation (kept alive by
the block until then) recorded for it, in one call (gm_host_free_with_streams); the cache hands the block
out again only once each of those streams was seen idle after the drop, or an event recorded on it then
has completed (the legacy default stream it asks later, once for several freed blocks; any other at the
drop, since CuPy may destroy it right after or be capturing it into a graph, in which case the block is
never reused), so a copy queued on either stream before the drop finishes first. Work queued on any other stream is the caller's to order.

A pinned request the cache cannot serve (host_limit, or cuMemHostAlloc failing) raises
cupy.cuda.runtime.CUDARuntimeError with status cudaErrorMemoryAllocation, what CuPy's transfer code
expects (it then copies synchronously), with gpumem's message as its text.
"""
import ctypes
import sys
import threading
import warnings

import gpumem
from gpumem import compiled, cupy_hooks, cupy_pools

_allocators = {}
_allocators_lock = threading.Lock()  # held while a device's allocator is made (_device_state)
# The CuPy streams gpumem has allocated on and still holds memory for, kept alive: gpumem keeps cached
# memory per stream and may record an event on the stream later (to move its idle memory to another
# stream), which a destroyed stream's handle must not receive. (CuPy destroys a Stream when its last
# reference goes.) Streams gpumem has let go are dropped whenever the list has doubled since the last
# look (_keep_stream), so the looks cost O(1) per new stream.
_streams = {}
_streams_lock = threading.Lock()
_STREAMS_BEFORE_LOOKING = 256
_look_above = [_STREAMS_BEFORE_LOOKING]
_settings = {"config": "", "compiled": True}  # compiled: False for the Python path alone (tests)
# Whether the calling thread's device context was made current (_context_maker) by the Python paths; the
# compiled ones keep a flag of their own.
_thread_state = threading.local()


def _keep_stream(device, stream):
    """Keep `stream` (about to be allocated on) alive; drop the kept streams gpumem no longer holds."""
    key = (device, stream.ptr)
    if key in _streams:
        return
    with _streams_lock:
        if len(_streams) >= _look_above[0]:
            for other in [other for other in _streams if not _allocator(other[0]).holds_stream(other[1])]:
                del _streams[other]
            _look_above[0] = max(_STREAMS_BEFORE_LOOKING, 2 * len(_streams))
        _streams.setdefault(key, stream)


class _Device:
    """One device's gpumem allocator, with the unchecked malloc and free of the allocation hot path, and
    for the compiled path the address where the allocator's handle is stored (NULL once it is closed;
    the handle object kept here keeps that storage)."""

    __slots__ = ("allocator", "malloc", "free", "handle", "handle_address")

    def __init__(self, allocator):
        self.allocator = allocator
        self.malloc, self.free = allocator.unchecked_functions()
        self.handle = allocator._handle
        self.handle_address = ctypes.addressof(self.handle)

    def close(self):
        return self.allocator.close()


class _Block:
    """Owns one gpumem allocation for CuPy's UnownedMemory; freeing happens when CuPy drops it, under
    CuPy's memory hooks if the dropping thread has any (cupy_hooks.py)."""

    __slots__ = ("device_state", "pointer", "device", "pmem_id", "hooks")

    def __init__(self, device_state, pointer, device, hooks):
        self.device_state = device_state
        self.pointer = pointer
        self.device = device
        self.pmem_id = 0  # the id of CuPy's memory object, which its hooks are told
        self.hooks = hooks  # cupy_hooks.lookup's (has_hooks, registered)

    def __del__(self):
        _free_block(self.device_state, self.pointer, self.device, self.pmem_id, self.hooks)


def _free_block(device_state, pointer, device, memory_id, hooks):
    """Give a block back to gpumem, under CuPy's memory hooks if the calling thread has any (`hooks`:
    cupy_hooks.lookup's pair); `memory_id` is the id of CuPy's memory object, which the hooks are told."""
    try:
        registered = hooks[0]() and hooks[1]()
    except Exception:  # at interpreter exit CuPy's modules may be gone already
        registered = None
    if not registered:
        device_state.free(pointer)
        return
    size = device_state.allocator.allocation_size(pointer) if pointer else 0
    cupy_hooks.free_with_hooks(registered, device, size, pointer, memory_id, lambda: device_state.free(pointer))


class _PinnedBlock:
    """One block of gpumem's pinned host cache as the memory of a cupy.cuda.PinnedMemoryPointer (which
    reads `ptr` and `size`); dropping it gives the block back once the streams it may be used on are done."""

    __slots__ = ("allocator", "ptr", "size", "device", "stream", "current_stream")

    def __init__(self, allocator, pointer, size, device, stream, current_stream):
        self.allocator = allocator
        self.ptr = pointer
        self.size = size
        self.device = device
        self.stream = stream  # the cupy Stream current at the allocation, alive until the free
        self.current_stream = current_stream  # how to ask CuPy for a device's current stream

    def __int__(self):
        return self.ptr

    def __del__(self):
        if not self.ptr or sys.is_finalizing():  # size 0, or CUDA may be gone already
            return
        streams = {self.stream.ptr, self._stream_at_free()}
        streams.discard(None)
        self.allocator.host_free(self.ptr, streams)

    def _stream_at_free(self):
        """The pointer of the block's device's current stream, or None if CuPy cannot say it."""
        try:
            return self.current_stream(self.device).ptr
        except Exception:
            return None


def _device_state(device):
    """The device's _Device, its gpumem allocator made on first use (by one thread: two threads' first
    allocations on a device would otherwise make two allocators, the loser's memory stranded)."""
    state = _allocators.get(device)
    if state is not None:
        return state
    with _allocators_lock:
        state = _allocators.get(device)
        if state is None:
            config = f"backend:cuda,device:{device}" + (f",{_settings['config']}" if _settings["config"] else "")
            allocator = gpumem.Allocator(config)
            limit = cupy_pools.memory_limit_from_environment(allocator.device_info()["total_bytes"])
            if limit is not None:  # CuPy's default pool would apply it to every device
                allocator.set_memory_limit(limit)
            state = _allocators[device] = _Device(allocator)
    return state


def _allocator(device):
    return _device_state(device).allocator


def _context_maker(cupy):
    """device -> None, called at each thread's first allocation: makes `device`, CuPy's current device,
    current again through CuPy's runtime (cudaSetDevice, which since CUDA 12 also makes the device's
    primary context current on the thread). gpumem drives the device through the driver API and leaves a
    thread's context as it found it, so a thread whose only CUDA work is allocating would have no current
    context, and CuPy asks cudaGetDevice at every allocation (the device, the current stream), which takes
    the runtime's slow path on a thread without one. CuPy's own pool escapes that because its first
    cudaMalloc makes the context current. The device is the current one already: nothing else changes."""
    set_device = getattr(cupy.cuda.runtime, "setDevice", None)

    def make_current(device):
        if set_device is not None:
            set_device(device)
    return make_current


def _context_for_thread(make_current, device):
    if not getattr(_thread_state, "has_context", False):
        make_current(device)
        _thread_state.has_context = True


def _current_stream_getter(cupy):
    """A function device -> that device's current cupy Stream. CuPy's get_current_stream takes a
    device_id in the versions that have it; in older ones only the current device's stream is known."""
    def current_stream(device):
        try:
            return cupy.cuda.get_current_stream(device)
        except TypeError:
            if cupy.cuda.runtime.getDevice() != device:
                raise LookupError("this CuPy reads the current device's stream only") from None
            return cupy.cuda.get_current_stream()
    return current_stream


def _device_allocate(cupy):
    """CuPy's device allocator: size -> cupy.cuda.MemoryPointer."""

    class OutOfMemoryError(cupy.cuda.memory.OutOfMemoryError):
        def __init__(self, size, report):
            super().__init__(size, -1)
            self.report = report

        def __str__(self):
            return self.report

    # Bound once: the hot path below runs at every CuPy allocation.
    get_device, get_stream = cupy.cuda.runtime.getDevice, cupy.cuda.get_current_stream
    unowned_memory, memory_pointer = cupy.cuda.UnownedMemory, cupy.cuda.MemoryPointer
    hooks = cupy_hooks.lookup(cupy)
    has_hooks, registered_hooks = hooks
    devices = _allocators
    make_current = _context_maker(cupy)

    def wrap(state, pointer, size, device):
        """CuPy's pointer to a new gpumem block (its `mem`, the memory object, owns the block)."""
        block = _Block(state, pointer, device, hooks)
        memory = unowned_memory(pointer, size, block, device)
        block.pmem_id = id(memory)
        return memory_pointer(memory, 0)

    def wrap_with_memory(state, pointer, size, device):
        result = wrap(state, pointer, size, device)
        return result, result.mem

    def allocate_with_hooks(registered, state, device, size, stream_pointer):
        try:
            return cupy_hooks.allocate_with_hooks(registered, state.allocator, device, size,
                                                  lambda: state.malloc(size, stream_pointer),
                                                  lambda pointer, _: wrap_with_memory(state, pointer, size, device))
        except gpumem.OutOfMemoryError as error:
            raise OutOfMemoryError(size, str(error)) from None

    def allocate(size):
        device = get_device()
        _context_for_thread(make_current, device)
        state = devices.get(device) or _device_state(device)
        stream = get_stream()
        stream_pointer = stream.ptr
        if stream_pointer:
            _keep_stream(device, stream)
        if has_hooks():
            registered = registered_hooks()
            if registered:
                return allocate_with_hooks(registered, state, device, size, stream_pointer)
        try:
            pointer = state.malloc(size, stream_pointer)
        except gpumem.OutOfMemoryError as error:
            raise OutOfMemoryError(size, str(error)) from None
        return wrap(state, pointer, size, device)

    def malloc_failed(status, size):
        try:
            gpumem.check_status(status)
        except gpumem.OutOfMemoryError as error:
            raise OutOfMemoryError(size, str(error)) from None

    return _compiled_allocate(cupy, allocate, hooks, malloc_failed, make_current) or allocate


def _compiled_module():
    """The compiled allocation paths (cupy_allocate.c and the files compiled with it); None, with a warning,
    where they cannot be built."""
    if not _settings["compiled"]:
        return None
    try:
        module = compiled.load("cupy_allocate")
        module.use_blocking_hook(gpumem.function_address("gm_set_blocking_hook"))
        return module
    except ImportError as error:
        warnings.warn(f"{error}\ngpumem.cupy: CuPy's allocations go through Python instead, which is slower "
                      "(a C compiler and Python's headers, Debian's python3-dev, give the compiled path)",
                      RuntimeWarning, stacklevel=4)
        return None


def _compiled_allocate(cupy, slow_allocate, hooks, malloc_failed, make_current):
    """CuPy's allocator function from cupy_allocate.c, which does what `slow_allocate` does in compiled
    code and calls it for the rare cases; None where it cannot be built."""
    module = _compiled_module()
    if module is None:
        return None
    return module.make_allocate(
        gpumem.function_address("gm_malloc"), gpumem.function_address("gm_free"), cupy.cuda.runtime.getDevice,
        cupy.cuda.get_current_stream, hooks[0], hooks[1], _allocators, _streams, _keep_stream, slow_allocate,
        malloc_failed, lambda state, pointer, device, memory_id: _free_block(state, pointer, device, memory_id, hooks),
        gpumem.check_status, cupy.cuda.UnownedMemory, cupy.cuda.MemoryPointer, make_current,
        _cupy_capsule(cupy, "device", "get_device_id"), _cupy_capsule(cupy, "stream", "get_current_stream_ptr"),
        _cupy_capsule(cupy, "memory_hook", "_has_memory_hooks"), getattr(cupy.cuda.memory, "BaseMemory", None),
        _cupy_capsule(cupy, "memory_hook", "get_memory_hooks"))


def _cupy_capsule(cupy, module, function):
    """The capsule of one of CuPy's C functions (cupy.cuda.`module`.`function`, exported by Cython in
    __pyx_capi__), or None; cupy_allocate.c uses it only if its signature is the one it expects."""
    return getattr(getattr(cupy.cuda, module, None), "__pyx_capi__", {}).get(function)


def _pinned_allocate(cupy):
    """CuPy's pinned memory allocator: size -> cupy.cuda.PinnedMemoryPointer."""
    runtime = cupy.cuda.runtime
    memory_allocation_error = getattr(runtime, "errorMemoryAllocation", 2)  # cudaErrorMemoryAllocation

    class PinnedOutOfMemoryError(runtime.CUDARuntimeError):
        def __init__(self, report):
            super().__init__(memory_allocation_error)
            self.report = report

        def __str__(self):
            return self.report

    current_stream = _current_stream_getter(cupy)
    make_current = _context_maker(cupy)

    def allocate(size):
        device = runtime.getDevice()
        _context_for_thread(make_current, device)
        allocator = _allocator(device)
        try:
            pointer = allocator.host_malloc(size)
        except gpumem.OutOfMemoryError as error:
            raise PinnedOutOfMemoryError(str(error)) from None
        block = _PinnedBlock(allocator, pointer, size, device, cupy.cuda.get_current_stream(), current_stream)
        return cupy.cuda.PinnedMemoryPointer(block, 0)

    def malloc_failed(status):
        try:
            gpumem.check_status(status)
        except gpumem.OutOfMemoryError as error:
            raise PinnedOutOfMemoryError(str(error)) from None

    module = _compiled_module()
    if module is None:
        return allocate
    return module.make_pinned_allocate(
        gpumem.function_address("gm_host_malloc"), gpumem.function_address("gm_host_free_with_streams"),
        runtime.getDevice, cupy.cuda.get_current_stream,
        cupy.cuda.get_current_stream, current_stream, _allocators, allocate, malloc_failed, gpumem.check_status,
        cupy.cuda.PinnedMemoryPointer, make_current, _cupy_capsule(cupy, "device", "get_device_id"),
        _cupy_capsule(cupy, "stream", "get_current_stream_ptr"))


def install(config="", pinned=True):
    """Make gpumem CuPy's device memory allocator for every device and, with `pinned`, its pinned host
    memory allocator too (with pinned=False CuPy's pinned allocator is left as it is). `config` applies to
    allocators made from now on. cupy.get_default_memory_pool() (and, with `pinned`,
    get_default_pinned_memory_pool()) then answer for gpumem (cupy_pools.py). A bad `config` (or
    GPUMEM_CONF) raises gpumem.GpumemError here, with CuPy's allocators left as they were."""
    import cupy

    gpumem.check_configuration(config, f"gpumem.cupy.install({config!r})")
    _settings["config"] = config
    current = lambda: _allocator(cupy.cuda.runtime.getDevice())  # noqa: E731
    device_allocate = _device_allocate(cupy)
    cupy.cuda.set_allocator(device_allocate)
    device_pool = cupy_pools.MemoryPool(current, device_allocate)
    cupy.get_default_memory_pool = lambda: device_pool
    if pinned:
        pinned_allocate = _pinned_allocate(cupy)
        cupy.cuda.set_pinned_memory_allocator(pinned_allocate)
        pinned_pool = cupy_pools.PinnedMemoryPool(current, pinned_allocate)
        cupy.get_default_pinned_memory_pool = lambda: pinned_pool


def allocator(device=None):
    """The gpumem.Allocator behind a CuPy device (None: the current device): memory_stats() for device
    memory, host_stats() for the pinned host cache."""
    if device is None:
        import cupy
        device = cupy.cuda.runtime.getDevice()
    return _allocator(device)
