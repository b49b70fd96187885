"""gpumem as CuPy's device memory allocator.

    import gpumem.cupy
    gpumem.cupy.install()        # CuPy arrays now live in gpumem's memory

One gpumem allocator per device (backend cuda; GPUMEM_CONF plus `config` apply). An allocation that
does not fit raises cupy.cuda.memory.OutOfMemoryError carrying gpumem's report. CuPy frees memory by
dropping its owner object, which gives the block back to gpumem on the stream it was allocated on.
"""
import gpumem

_allocators = {}


class _Block:
    """Owns one gpumem allocation for CuPy's UnownedMemory; freeing happens when CuPy drops it."""

    __slots__ = ("allocator", "pointer")

    def __init__(self, allocator, pointer):
        self.allocator = allocator
        self.pointer = pointer

    def __del__(self):
        self.allocator.free(self.pointer)


def _allocator(device):
    if device not in _allocators:
        _allocators[device] = gpumem.Allocator(f"backend:cuda,device:{device}" +
                                               (f",{_allocators['config']}" if _allocators.get("config") else ""))
    return _allocators[device]


def install(config=""):
    """Make gpumem CuPy's allocator for every device."""
    import cupy

    class OutOfMemoryError(cupy.cuda.memory.OutOfMemoryError):
        def __init__(self, size, report):
            super().__init__(size, -1)
            self.report = report

        def __str__(self):
            return self.report

    _allocators["config"] = config

    def allocate(size):
        device = cupy.cuda.runtime.getDevice()
        allocator = _allocator(device)
        try:
            pointer = allocator.malloc(size, cupy.cuda.get_current_stream().ptr)
        except gpumem.OutOfMemoryError as error:
            raise OutOfMemoryError(size, str(error)) from None
        memory = cupy.cuda.UnownedMemory(pointer, size, _Block(allocator, pointer), device)
        return cupy.cuda.MemoryPointer(memory, 0)

    cupy.cuda.set_allocator(allocate)


def allocator(device=0):
    """The gpumem.Allocator behind a CuPy device."""
    return _allocator(device)
