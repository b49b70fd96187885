"""CuPy's pool calls under gpumem.cupy, on a GPU with the real CuPy: run with
    PYTHONPATH=python GPUMEM_LIBRARY=build-gpu/libgpumem.so python3 -m pytest tests/gpu/test_cupy_pools.py
(scripts/gpu-check.sh host). cupy.get_default_memory_pool() and get_default_pinned_memory_pool() answer
for gpumem once it is installed: the bytes CuPy's arrays use, free_all_blocks giving memory back to the
driver (cudaMemGetInfo sees it), set_limit refusing an array above it with CuPy's OutOfMemoryError.
CuPy's memory hooks see the allocations and frees.
tests/python/test_cupy_pools.py and test_cupy_hooks.py check the same without a GPU.
"""
import io

import pytest

from cupy_on_gpu import cupy_with_gpumem

cupy = cupy_with_gpumem()
import gpumem.cupy  # noqa: E402

MiB = 1 << 20


def test_the_default_pool_sees_arrays_and_gives_memory_back():
    pool = cupy.get_default_memory_pool()
    array = cupy.ones(64 * MiB, dtype=cupy.uint8)
    assert pool.used_bytes() >= 64 * MiB
    assert int(array.sum()) == 64 * MiB
    del array
    cupy.cuda.Device().synchronize()
    total_before = pool.total_bytes()
    assert total_before >= 64 * MiB and pool.n_free_blocks() >= 1
    free_before, _ = cupy.cuda.runtime.memGetInfo()
    pool.free_all_blocks()
    free_after, _ = cupy.cuda.runtime.memGetInfo()
    # Arrays other tests of this process keep alive may hold memory still: what was idle is gone.
    assert pool.total_bytes() <= total_before - 60 * MiB, (total_before, pool.total_bytes())
    assert free_after >= free_before + 60 * MiB, (free_before, free_after)


def test_set_limit_refuses_what_does_not_fit():
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    pool.set_limit(size=256 * MiB)
    try:
        assert pool.get_limit() == 256 * MiB
        kept = cupy.zeros(128 * MiB, dtype=cupy.uint8)
        with pytest.raises(cupy.cuda.memory.OutOfMemoryError):
            cupy.zeros(512 * MiB, dtype=cupy.uint8)
        assert int(kept.sum()) == 0
    finally:
        pool.set_limit()
    assert pool.get_limit() == 0


def test_the_pinned_pool_is_gpumems_host_cache():
    pinned = cupy.get_default_pinned_memory_pool()
    host = cupy.cuda.alloc_pinned_memory(8 * MiB)
    del host
    cupy.cuda.Device().synchronize()
    assert pinned.n_free_blocks() >= 1
    reserved_before = gpumem.cupy.allocator().host_stats()["reserved_bytes"]["current"]
    pinned.free_all_blocks()
    reserved_after = gpumem.cupy.allocator().host_stats()["reserved_bytes"]["current"]
    assert reserved_after <= reserved_before - 8 * MiB, (reserved_before, reserved_after)


def test_memory_hooks_see_gpumem_allocations():
    """A hook that tracks the bytes in use, as programs measuring a function's peak do, and CuPy's own
    LineProfileHook, which attributes the bytes to the lines that asked for them."""
    from cupy.cuda import memory_hooks

    class Peak(cupy.cuda.MemoryHook):
        name = "gpumem-test-peak"

        def __init__(self):
            self.current = self.peak = self.mallocs = 0

        def malloc_postprocess(self, **arguments):
            self.current += arguments["mem_size"]
            self.peak = max(self.peak, self.current)
            self.mallocs += 1

        def free_postprocess(self, **arguments):
            self.current -= arguments["mem_size"]

    with Peak() as peak, memory_hooks.LineProfileHook() as profile:
        first = cupy.ones(32 * MiB, dtype=cupy.uint8)
        second = first + 1
        del first, second
    assert peak.mallocs >= 2 and peak.peak >= 64 * MiB and peak.current == 0, vars(peak)
    report = io.StringIO()
    profile.print_report(file=report)
    assert "test_cupy_pools.py" in report.getvalue(), report.getvalue()
