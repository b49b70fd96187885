"""gpumem's pinned host cache as CuPy's pinned memory allocator, on a GPU: run with
    PYTHONPATH=python GPUMEM_LIBRARY=build-gpu/libgpumem.so python3 -m pytest tests/gpu/test_cupy_pinned.py
(scripts/gpu-check.sh host). gpumem.cupy.install() runs when this module is imported. Without CuPy or
without a CUDA device every test skips, saying which; on the GPU machine, which has both, every test must
pass. tests/python/test_cupy_install.py checks the same logic without a GPU, against a stand-in cupy.
"""
import numpy

from cupy_on_gpu import cupy_with_gpumem

cupy = cupy_with_gpumem()
import cupyx  # noqa: E402
import gpumem.cupy  # noqa: E402

MiB = 1 << 20
CUDA_MEMORY_TYPE_HOST = 1  # cudaMemoryTypeHost: page-locked host memory

# One thread that spins for `cycles` clock ticks: keeps a stream busy while the test frees a block.
_SPIN = cupy.RawKernel(r"""
extern "C" __global__ void spin(long long cycles)
{
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
""", "spin")


def host_stats():
    return gpumem.cupy.allocator().host_stats()


def is_page_locked(address):
    attributes = cupy.cuda.runtime.pointerGetAttributes(address)
    memory_type = getattr(attributes, "type", getattr(attributes, "memoryType", None))
    return memory_type == CUDA_MEMORY_TYPE_HOST


def fresh_cache():
    """No idle blocks left: the next request of any size is a miss, a hit can only be a block freed after."""
    cupy.cuda.Device().synchronize()
    gpumem.cupy.allocator().host_empty_cache()


def test_empty_pinned_comes_from_gpumem():
    before = host_stats()
    array = cupyx.empty_pinned((3 * MiB,), dtype=numpy.uint8)
    after = host_stats()
    assert after["allocations"]["current"] == before["allocations"]["current"] + 1
    assert after["requested_bytes"] == before["requested_bytes"] + 3 * MiB
    assert after["allocated_bytes"]["current"] == before["allocated_bytes"]["current"] + 4 * MiB  # a power of two
    assert is_page_locked(array.ctypes.data)
    del array
    assert host_stats()["allocations"]["current"] == before["allocations"]["current"]


def test_alloc_pinned_memory_comes_from_gpumem():
    before = host_stats()["requested_bytes"]
    memory = cupy.cuda.alloc_pinned_memory(12345)
    assert host_stats()["requested_bytes"] == before + 12345
    assert memory.size() == 12345
    assert is_page_locked(memory.ptr)
    del memory
    assert host_stats()["requested_bytes"] == before


def test_round_trip_through_the_device_on_a_stream():
    stream = cupy.cuda.Stream(non_blocking=True)
    source = cupyx.empty_pinned((8 * MiB,), dtype=numpy.uint8)
    source[:] = numpy.random.default_rng(17).integers(0, 256, source.size, dtype=numpy.uint8)
    back = cupyx.empty_pinned(source.shape, dtype=numpy.uint8)
    with stream:
        on_device = cupy.empty(source.shape, dtype=numpy.uint8)
        on_device.set(source, stream=stream)
        on_device += 1
        on_device.get(stream=stream, out=back)
    stream.synchronize()
    assert numpy.array_equal(back, source + numpy.uint8(1))


def test_cupy_array_from_numpy_stages_correctly():
    """cupy.array stages NumPy data in pinned memory it keeps until its copy's event is done."""
    data = numpy.random.default_rng(3).standard_normal(MiB, dtype=numpy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        copies = [cupy.array(data * i) for i in range(4)]
    stream.synchronize()
    for i, copy in enumerate(copies):
        assert numpy.array_equal(copy.get(), data * i)


def test_a_freed_block_waits_for_its_stream_then_is_reused():
    fresh_cache()
    stream = cupy.cuda.Stream(non_blocking=True)
    on_device = cupy.empty(32 * MiB, dtype=numpy.uint8)
    with stream:
        block = cupyx.empty_pinned((32 * MiB,), dtype=numpy.uint8)
        address = block.ctypes.data
        _SPIN((1,), (1,), (numpy.int64(500_000_000),))  # the copy below waits behind this
        on_device.set(block, stream=stream)
        del block  # freed with the copy still queued
    hits = host_stats()["cache_hits"]
    second = cupyx.empty_pinned((32 * MiB,), dtype=numpy.uint8)
    second_address = second.ctypes.data
    assert second_address != address, "a block was handed out again while a copy from it was queued"
    assert host_stats()["cache_hits"] == hits
    stream.synchronize()
    del second
    third = cupyx.empty_pinned((32 * MiB,), dtype=numpy.uint8)
    assert host_stats()["cache_hits"] == hits + 1
    assert third.ctypes.data in (address, second_address)


def test_empty_cache_gives_the_memory_back():
    block = cupyx.empty_pinned((16 * MiB,), dtype=numpy.uint8)
    del block
    cupy.cuda.Device().synchronize()
    stats = host_stats()
    assert stats["reserved_bytes"]["current"] >= stats["allocated_bytes"]["current"] + 16 * MiB
    gpumem.cupy.allocator().host_empty_cache()
    emptied = host_stats()
    assert emptied["reserved_bytes"]["current"] == emptied["allocated_bytes"]["current"]
    assert emptied["host_frees"] > stats["host_frees"]
