"""CuPy's memory pool interface over gpumem, so that CuPy code that manages its pools keeps working.

Once gpumem.cupy.install() has made gpumem CuPy's allocator, CuPy's own default pools hold nothing:
code that calls ``cupy.get_default_memory_pool().free_all_blocks()`` to give memory back to the
driver, reads ``used_bytes()`` / ``total_bytes()`` to watch memory, or caps it with ``set_limit``
would silently do nothing. So install() makes cupy.get_default_memory_pool() and
cupy.get_default_pinned_memory_pool() return the objects below, which answer with gpumem's current
device's allocator, in CuPy's meanings:

  MemoryPool.malloc(size)            an allocation from gpumem (what CuPy's allocator now does)
  free_all_blocks(stream=None)       gm_empty_cache: idle memory of every stream back to the driver
  used_bytes / free_bytes / total_bytes
                                     allocated, reserved - allocated and reserved bytes
  n_free_blocks()                    cached free blocks (gpumem's snapshot)
  set_limit(size=None, fraction=None) / get_limit()
                                     gpumem's memory limit (reserved bytes; 0: none), with CuPy's
                                     argument checks; a fraction is of the device's total memory
  PinnedMemoryPool.malloc / free_all_blocks / n_free_blocks
                                     gpumem's pinned host cache (gm_host_malloc, gm_host_empty_cache)

CUPY_GPU_MEMORY_LIMIT (bytes, or a percentage such as "50%"), which CuPy applies to each device's
default pool, is applied to each device's gpumem allocator when it is made (memory_limit_from_environment).
A pool object that the program took before install() is CuPy's own and keeps CuPy's behaviour.
"""
import os
import warnings


def memory_limit_from_environment(total_bytes, value=None):
    """The limit in bytes that CUPY_GPU_MEMORY_LIMIT (or `value`) asks for, or None when it is unset;
    ValueError for a malformed one."""
    value = os.environ.get("CUPY_GPU_MEMORY_LIMIT") if value is None else value
    if value is None or value.strip() == "":
        return None
    text = value.strip()
    try:
        if text.endswith("%"):
            fraction = float(text[:-1]) / 100
            if not 0 <= fraction <= 1:
                raise ValueError
            return int(fraction * total_bytes)
        size = int(text)
        if size < 0:
            raise ValueError
        return size
    except ValueError:
        raise ValueError(f"CUPY_GPU_MEMORY_LIMIT={value!r}: expected a number of bytes or a percentage "
                         "from 0% to 100%") from None


class MemoryPool:
    """cupy.get_default_memory_pool() under gpumem: the current device's gpumem allocator."""

    def __init__(self, current_allocator, allocate):
        self._current_allocator = current_allocator  # () -> gpumem.Allocator of the current device
        self._allocate = allocate  # size -> cupy.cuda.MemoryPointer
        self._requested = {}  # id(allocator) -> the size set_limit was given (gpumem caps it at the device)

    def malloc(self, size):
        return self._allocate(size)

    def free_all_blocks(self, stream=None):
        """Every idle block back to the driver (gpumem's cache is per stream; all streams are emptied)."""
        self._current_allocator().empty_cache()

    def free_all_free(self):
        warnings.warn("free_all_free is deprecated. Use free_all_blocks instead.", DeprecationWarning)
        self.free_all_blocks()

    def n_free_blocks(self):
        snapshot = self._current_allocator().snapshot()
        return sum(block["state"] == "free" for region in snapshot["regions"] for block in region["blocks"])

    def used_bytes(self):
        return self._stat("allocated_bytes.all.current")

    def free_bytes(self):
        return self._stat("reserved_bytes.all.current") - self._stat("allocated_bytes.all.current")

    def total_bytes(self):
        return self._stat("reserved_bytes.all.current")

    def set_limit(self, size=None, fraction=None):
        """CuPy's checks and meaning: neither (or 0) removes the limit; a fraction is of the device's memory."""
        allocator = self._current_allocator()
        if size is None:
            if fraction is None:
                size = 0
            else:
                if not 0 <= fraction <= 1:
                    raise ValueError(f"memory limit fraction out of range: {fraction}")
                size = fraction * allocator.device_info()["total_bytes"]
        elif fraction is not None:
            raise ValueError("size and fraction cannot be specified at one time")
        if size < 0:
            raise ValueError(f"memory limit size out of range: {size}")
        allocator.set_memory_limit(int(size))  # 0: none, the whole device
        self._requested[id(allocator)] = int(size)

    def get_limit(self):
        """The limit in bytes as set_limit was given it, 0 when there is none (gpumem's limit is then the
        whole device); a limit set another way (CUPY_GPU_MEMORY_LIMIT, gpumem's own) as gpumem keeps it."""
        allocator = self._current_allocator()
        limit, total = allocator.memory_limit(), allocator.device_info()["total_bytes"]
        requested = self._requested.get(id(allocator))
        if requested is not None and min(requested or total, total) == limit:
            return requested
        return 0 if limit >= total else limit

    def _stat(self, name):
        return self._current_allocator().memory_stats()[name]


class PinnedMemoryPool:
    """cupy.get_default_pinned_memory_pool() under gpumem: the current device's pinned host cache."""

    def __init__(self, current_allocator, allocate):
        self._current_allocator = current_allocator
        self._allocate = allocate  # size -> cupy.cuda.PinnedMemoryPointer

    def malloc(self, size):
        return self._allocate(size)

    def free_all_blocks(self):
        self._current_allocator().host_empty_cache()

    def free_all_free(self):
        warnings.warn("free_all_free is deprecated. Use free_all_blocks instead.", DeprecationWarning)
        self.free_all_blocks()

    def n_free_blocks(self):
        """Cached blocks: those made, less those given back and those in use (a dropped block whose streams
        may still use it counts: it is cached, and reused once they are done)."""
        stats = self._current_allocator().host_stats()
        return stats["host_allocations"] - stats["host_frees"] - stats["allocations"]["current"]
