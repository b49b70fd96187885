"""gpumem.cupy's installation and pinned host allocator, without CuPy or a GPU.

A stand-in `cupy` module records what gpumem.cupy.install() hands to CuPy and plays CuPy's part: its
current stream per device, PinnedMemoryPointer, CUDARuntimeError. The allocators run on the sim backend
(install's config "backend:sim" overrides the "backend:cuda" gpumem.cupy starts from), whose streams
finish queued work only when told (gm_sim_stream_enqueue / gm_sim_stream_complete), so the test can
see that a dropped pinned block waits for the streams it may still be used on. tests/gpu/test_cupy_pinned.py
checks the same against the real CuPy on a GPU.
"""
import collections
import ctypes
import sys
import threading
import time
import types
import unittest

import gpumem

MiB = 1 << 20


class _Stream:
    def __init__(self, pointer):
        self.ptr = pointer


class _CUDARuntimeError(RuntimeError):
    def __init__(self, status):
        self.status = status
        super().__init__(f"CUDA runtime error {status}")


class _OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):
        super().__init__(size, total, limit)


class _PinnedMemoryPointer:
    def __init__(self, mem, offset):
        self.mem = mem
        self.ptr = mem.ptr + offset


class _MemoryPointer:
    def __init__(self, mem, offset):
        self.mem = mem
        self.ptr = mem.ptr + offset


class _UnownedMemory:
    def __init__(self, ptr, size, owner, device_id=-1):
        self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id


def _fake_memory_hook_module():
    """cupy.cuda.memory_hook: hooks registered per thread by `with hook:`, as CuPy keeps them."""
    local = threading.local()

    def get_memory_hooks():
        if getattr(local, "hooks", None) is None:
            local.hooks = collections.OrderedDict()
        return local.hooks

    class MemoryHook:
        name = "MemoryHook"

        def __enter__(self):
            get_memory_hooks()[self.name] = self
            return self

        def __exit__(self, *_):
            del get_memory_hooks()[self.name]

    return types.SimpleNamespace(_has_memory_hooks=lambda: getattr(local, "hooks", None) is not None,
                                 get_memory_hooks=get_memory_hooks, MemoryHook=MemoryHook)


def fake_cupy(streams_by_device=True):
    """A module with the parts of cupy that gpumem.cupy uses. streams_by_device=False: an older CuPy whose
    get_current_stream takes no device."""
    state = types.SimpleNamespace(device=0, streams={0: _Stream(0)}, allocator=None, pinned_allocator=None,
                                  device_sets=[])

    def get_current_stream(*device):
        if device and not streams_by_device:
            raise TypeError("get_current_stream() takes no arguments")
        return state.streams[device[0] if device and device[0] >= 0 else state.device]

    runtime = types.SimpleNamespace(getDevice=lambda: state.device, CUDARuntimeError=_CUDARuntimeError,
                                    errorMemoryAllocation=2,
                                    setDevice=lambda device: state.device_sets.append((threading.get_ident(), device)))
    cuda = types.SimpleNamespace(
        runtime=runtime, memory=types.SimpleNamespace(OutOfMemoryError=_OutOfMemoryError),
        get_current_stream=get_current_stream, PinnedMemoryPointer=_PinnedMemoryPointer,
        MemoryPointer=_MemoryPointer, UnownedMemory=_UnownedMemory,
        set_allocator=lambda function: setattr(state, "allocator", function),
        set_pinned_memory_allocator=lambda function: setattr(state, "pinned_allocator", function),
        memory_hook=_fake_memory_hook_module())
    module = types.ModuleType("cupy")
    module.cuda = cuda
    module.state = state
    return module


def sim_streams(allocator):
    """enqueue(stream, units) and complete(stream) on a sim allocator's device."""
    library = ctypes.CDLL(gpumem.library_path())
    enqueue, complete = library.gm_sim_stream_enqueue, library.gm_sim_stream_complete
    enqueue.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64]
    complete.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    handle = ctypes.c_void_p(allocator.address)
    return (lambda stream, units: enqueue(handle, stream, units), lambda stream: complete(handle, stream))


class StandInCupyTest(unittest.TestCase):
    """The stand-in cupy as sys.modules["cupy"] for each test, and no gpumem.cupy allocator left behind.
    `compiled`: whether device allocations take the compiled path (cupy_allocate.c) or the Python one;
    each test class that allocates device memory runs under both (its PythonPath subclass)."""

    compiled = True

    def setUp(self):
        import gpumem.cupy
        self.module = gpumem.cupy
        self.cupy = fake_cupy()
        self.previous_cupy = sys.modules.get("cupy")
        sys.modules["cupy"] = self.cupy
        self.forget_allocators()
        self.module._settings["compiled"] = self.compiled

    def tearDown(self):
        self.module._settings["compiled"] = True
        self.forget_allocators()
        if self.previous_cupy is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = self.previous_cupy

    def forget_allocators(self):
        for allocator in self.module._allocators.values():
            allocator.close()
        self.module._allocators.clear()


class CupyInstallTest(StandInCupyTest):
    def setUp(self):
        super().setUp()
        self.unraisable = []
        self.kept = []
        self.previous_hook = sys.unraisablehook
        sys.unraisablehook = self.unraisable.append

    def tearDown(self):
        self.kept.clear()
        sys.unraisablehook = self.previous_hook
        super().tearDown()

    def install(self, config="backend:sim", **options):
        """Install, and make device 0's allocator (which the first allocation would make, in Python), so
        that the allocations of the test take the path under test."""
        self.module.install(config, **options)
        self.module.allocator(0)
        return self.cupy.state

    def test_streams_gpumem_let_go_are_not_kept_alive(self):
        state = self.install(pinned=False)
        self.module._streams.clear()
        state.streams[0] = _Stream(999)
        live = state.allocator(4096)  # a block that stays allocated: its stream must stay kept
        for i in range(700):  # a program that makes a stream per step, uses it once and drops it
            state.streams[0] = _Stream(1000 + i)
            block = state.allocator(4096)
            del block
        kept = {pointer for device, pointer in self.module._streams}
        self.assertIn(999, kept)
        self.assertIn(1699, kept)
        self.assertLess(len(kept), 600)  # without dropping: all 701
        self.assertFalse(self.module.allocator(0).holds_stream(1000))  # its heap was forgotten, and so was the stream
        self.assertNotIn(1000, kept)
        del live
        self.assertEqual(self.unraisable, [])

    def test_two_threads_first_allocations_make_one_allocator(self):
        # Without a lock both threads made an allocator for device 0, and one of them was dropped.
        made, barrier, real = [], threading.Barrier(2), gpumem.Allocator

        def slow_allocator(config):
            made.append(config)
            time.sleep(0.2)  # both threads are in here unless the first holds a lock
            return real(config)
        saved_config = self.module._settings["config"]
        self.module._settings["config"] = "backend:sim"
        gpumem.Allocator = slow_allocator
        try:
            states = [None, None]

            def first_allocation(index):
                barrier.wait()
                states[index] = self.module._device_state(0)
            threads = [threading.Thread(target=first_allocation, args=(index,)) for index in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            gpumem.Allocator = real
            self.module._settings["config"] = saved_config
        self.assertEqual(len(made), 1)
        self.assertIs(states[0], states[1])

    def test_installs_both_allocators_or_only_the_device_one(self):
        state = self.install(pinned=False)
        self.assertIsNotNone(state.allocator)
        self.assertIsNone(state.pinned_allocator)
        state = self.install()
        self.assertIsNotNone(state.pinned_allocator)

    def test_a_bad_configuration_is_refused_before_anything_is_swapped(self):
        with self.assertRaises(gpumem.GpumemError) as caught:
            self.module.install("backend:sim,max_chunk_size:8XB")
        self.assertIn("gpumem.cupy.install('backend:sim,max_chunk_size:8XB'): bad value for key 'max_chunk_size'",
                      str(caught.exception))
        self.assertIsNone(self.cupy.state.allocator)
        self.assertIsNone(self.cupy.state.pinned_allocator)

    def test_pinned_memory_comes_from_the_current_devices_host_cache(self):
        state = self.install()
        block = state.pinned_allocator(3000)
        stats = self.module.allocator().host_stats()
        self.assertIs(self.module.allocator(), self.module.allocator(0))
        self.assertEqual((stats["allocations"]["current"], stats["requested_bytes"]), (1, 3000))
        self.assertEqual((block.mem.size, block.ptr, int(block.mem)), (3000, block.mem.ptr, block.ptr))
        del block
        stats = self.module.allocator().host_stats()
        self.assertEqual((stats["allocations"]["current"], stats["reserved_bytes"]["current"]), (0, 4096))
        self.assertEqual(self.unraisable, [])

    def reuses_a_block(self, state, allocator):
        """Whether a new MiB request is served from the cache (a freed block whose streams are done); the
        block is kept, so that it is not freed again."""
        hits = allocator.host_stats()["cache_hits"]
        self.kept.append(state.pinned_allocator(MiB))
        return allocator.host_stats()["cache_hits"] == hits + 1

    def test_a_dropped_block_waits_for_the_current_stream(self):
        state = self.install()
        allocator = self.module.allocator()
        enqueue, complete = sim_streams(allocator)
        block = state.pinned_allocator(MiB)
        state.streams[0] = _Stream(7)  # a copy on stream 7, then the array is dropped
        enqueue(7, 1)
        del block
        self.assertFalse(self.reuses_a_block(state, allocator))
        complete(7)
        self.assertTrue(self.reuses_a_block(state, allocator))
        self.assertEqual(self.unraisable, [])

    def test_a_dropped_block_waits_for_the_stream_it_was_allocated_on(self):
        state = self.install()
        allocator = self.module.allocator()
        enqueue, complete = sim_streams(allocator)
        state.streams[0] = _Stream(5)
        block = state.pinned_allocator(MiB)
        enqueue(5, 1)
        state.streams[0] = _Stream(3)
        del block
        self.assertFalse(self.reuses_a_block(state, allocator))
        complete(5)
        self.assertTrue(self.reuses_a_block(state, allocator))

    def test_an_older_cupy_without_per_device_streams(self):
        self.cupy = fake_cupy(streams_by_device=False)
        sys.modules["cupy"] = self.cupy
        state = self.install()
        allocator = self.module.allocator()
        enqueue, complete = sim_streams(allocator)
        block = state.pinned_allocator(MiB)
        state.streams[0] = _Stream(9)
        enqueue(9, 1)
        del block
        self.assertFalse(self.reuses_a_block(state, allocator))
        complete(9)
        self.assertTrue(self.reuses_a_block(state, allocator))
        self.assertEqual(self.unraisable, [])

    def test_each_thread_makes_its_device_current_once(self):
        """A thread's first allocation, device or pinned, makes CuPy's current device current again
        (cudaSetDevice: the device's primary context current on the thread, so that the cudaGetDevice CuPy
        asks at every allocation finds one); its later allocations do not ask again."""
        state = self.install()
        threads = []

        def allocations(first):
            threads.append(threading.get_ident())
            blocks = [first(4096), state.allocator(512), state.pinned_allocator(4096), state.allocator(0)]
            del blocks

        for first in (state.allocator, state.pinned_allocator):
            state.device_sets.clear()
            thread = threading.Thread(target=allocations, args=(first,))
            thread.start()
            thread.join()
            self.assertEqual(state.device_sets, [(threads[-1], 0)])
        self.assertEqual(self.unraisable, [])

    def test_size_zero_is_a_null_pointer(self):
        state = self.install()
        block = state.pinned_allocator(0)
        self.assertEqual((block.ptr, block.mem.size), (0, 0))
        del block
        self.assertEqual(self.unraisable, [])

    def test_out_of_pinned_memory_is_the_runtime_error_cupy_falls_back_on(self):
        state = self.install("backend:sim,host_limit:1MiB")
        with self.assertRaises(_CUDARuntimeError) as raised:
            state.pinned_allocator(4 * MiB)
        self.assertEqual(raised.exception.status, 2)
        self.assertIn("host_limit", str(raised.exception))


class CupyInstallPythonPathTest(CupyInstallTest):
    compiled = False


if __name__ == "__main__":
    unittest.main()
