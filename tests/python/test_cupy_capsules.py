"""gpumem.cupy's compiled path calling CuPy's own C functions (cupy_allocate.c) and making CuPy's memory
objects as CuPy's pools do (cupy_objects.c), without CuPy or a GPU.

CuPy's Cython modules export their C functions in __pyx_capi__ (capsules named by the C signature); the
compiled path calls cupy.cuda.device.get_device_id, cupy.cuda.stream.get_current_stream_ptr and
cupy.cuda.memory_hook._has_memory_hooks and get_memory_hooks through them instead of through Python. fake_cupy_capi.c
exports such capsules, with values set from the test and its calls counted, and C memory types laid out
as CuPy's Cython types are (BaseMemory, UnownedMemory, MemoryPointer, PinnedMemoryPointer), on the
stand-in cupy of test_cupy_install.py. Pinned here:
- with the capsules, an allocation on the default stream calls no Python function of CuPy's, device
  memory or pinned memory (whose dropped blocks still wait for the streams CuPy's functions say);
- a stream other than the default one is still kept alive (its Stream object asked for once);
- an error raised by CuPy's C function is the allocation's error, whatever it returns with it, and
  nothing is allocated;
- a capsule of another signature is not used: the Python function is called instead;
- with hooks registered, the hooks see the allocation as on the Python path; with the thread's dict of
  hooks made but empty, the dict is asked through CuPy's C function, with no Python call;
- CuPy's memory objects are made through tp_new and their fields, with no constructor call, and equal
  what the constructors make; where a constructor sets more than those fields they are made through the
  constructors; tp_new failing after the allocation gives the block back;
- the device memory object is gpumem's own subclass of CuPy's BaseMemory, which owns the block (CuPy's
  hooks told its id at the free); a BaseMemory it cannot subclass safely, or whose setters do more than
  set the fields, leaves CuPy's UnownedMemory owning a Block.
"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import types
import unittest

from gpumem import compiled
from test_cupy_compiled import RecordsUnraisable, in_threads
from test_cupy_install import _Stream, sim_streams

CONFIG = "backend:sim,capacity:256MiB"
MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))


def build_fake_capi(folder):
    target = os.path.join(folder, "fake_cupy_capi" + importlib.machinery.EXTENSION_SUFFIXES[0])
    command = compiled.compile_command(os.path.join(HERE, "fake_cupy_capi.c"), target) + ["-Werror"]
    finished = subprocess.run(command, capture_output=True, text=True)
    if finished.returncode:
        raise RuntimeError(f"{' '.join(command)}:\n{finished.stderr}")
    spec = importlib.util.spec_from_file_location("fake_cupy_capi", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CapsulesTest(RecordsUnraisable):
    """The fake capsules as CuPy's __pyx_capi__, and CuPy's Python functions counted in python_calls."""

    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.TemporaryDirectory()
        cls.capi = build_fake_capi(cls.folder.name)

    @classmethod
    def tearDownClass(cls):
        cls.folder.cleanup()

    def setUp(self):
        super().setUp()
        self.python_calls = []
        cuda, state = self.cupy.cuda, self.cupy.state
        get_device, get_stream = cuda.runtime.getDevice, cuda.get_current_stream

        def counted_device():
            self.python_calls.append("getDevice")
            return get_device()

        def counted_stream(*device):
            self.python_calls.append("get_current_stream")
            return get_stream(*device)

        cuda.runtime.getDevice, cuda.get_current_stream = counted_device, counted_stream
        cuda.device = types.SimpleNamespace(__pyx_capi__=self.capi.device)
        cuda.stream = types.SimpleNamespace(__pyx_capi__=self.capi.stream)
        cuda.memory_hook.__pyx_capi__ = self.capi.memory_hook
        self.capi.set_hooks_source(cuda.memory_hook.get_memory_hooks)
        cuda.UnownedMemory, cuda.MemoryPointer = self.capi.UnownedMemory, self.capi.MemoryPointer
        cuda.PinnedMemoryPointer = self.capi.PinnedMemoryPointer
        cuda.memory.BaseMemory = self.capi.BaseMemory
        self.set(stream=0)
        self.state = state

    def tearDown(self):
        self.capi.set(0, 0, 0, 0)
        self.capi.set_objects(0, 0)
        super().tearDown()

    def set(self, stream, hooks=0, failing=0, only=""):
        """The current stream, for CuPy's C function and its Python one alike; `failing` (1: -1 returned, 2:
        the usual value) makes CuPy's C functions raise, or only the one named `only`."""
        self.capi.set(0, stream, hooks, failing, only)
        self.cupy.state.streams[0] = _Stream(stream)

    def assert_each_error_is_the_allocations(self, allocate, functions, current):
        """Each of CuPy's C functions raising, whatever it returns with it: -1 (Cython's `except? -1`) or its
        usual value (`except *`), is the allocation's error; nothing stays allocated."""
        for only in functions:
            for failing in (1, 2):
                self.set(stream=0, failing=failing, only=only)
                with self.assertRaisesRegex(RuntimeError, "CuPy's C function failed", msg=(only, failing)):
                    allocate(4096)
                self.set(stream=0)
                self.assertEqual(current(), 0)


class CupyCapsulesTest(CapsulesTest):
    def install(self):
        self.module.install(CONFIG, pinned=False)
        self.module.allocator(0)
        self.python_calls.clear()
        return self.cupy.state.allocator

    def current(self):
        return self.module.allocator().memory_stats()["allocation.all.current"]

    def test_the_default_stream_calls_no_python_function_of_cupys(self):
        allocate = self.install()
        before = self.capi.calls()
        block = allocate(4096)
        self.assertEqual(self.python_calls, [])
        self.assertEqual(self.capi.calls() - before, 3)  # hooks, device, stream
        self.assertEqual((block.mem.size, block.mem.device_id), (4096, 0))
        del block
        self.assertEqual(self.current(), 0)
        self.assertEqual(self.unraisable, [])

    def test_another_stream_is_kept_alive(self):
        allocate = self.install()
        self.set(stream=77)
        first = allocate(4096)
        self.assertEqual(self.python_calls, ["get_current_stream"])  # its Stream object, to keep
        self.assertIn((0, 77), self.module._streams)
        second = allocate(4096)
        self.assertEqual(self.python_calls, ["get_current_stream"])  # kept already
        self.assertTrue(self.module.allocator(0).holds_stream(77))
        del first, second

    def test_an_error_of_cupys_function_is_the_allocations(self):
        self.assert_each_error_is_the_allocations(
            self.install(), ("_has_memory_hooks", "get_device_id", "get_current_stream_ptr"), self.current)

    def test_a_capsule_of_another_signature_is_not_used(self):
        self.cupy.cuda.device = types.SimpleNamespace(__pyx_capi__=self.capi.wrong_device)
        allocate = self.install()
        block = allocate(4096)
        self.assertEqual(self.python_calls, ["getDevice"])
        del block

    def test_registered_hooks_see_the_allocation(self):
        allocate = self.install()
        allocate(4096)  # reserved and cached: no alloc hooks below
        calls = []

        class Recorder(self.cupy.cuda.memory_hook.MemoryHook):
            name = "recorder"

            def __getattr__(self, method):
                return lambda **arguments: calls.append(method)

        self.set(stream=0, hooks=1)
        with Recorder():
            block = allocate(4096)
            del block
        self.assertEqual(calls, ["malloc_preprocess", "malloc_postprocess", "free_preprocess", "free_postprocess"])
        self.set(stream=0, hooks=1)  # CuPy's check says maybe, but none is registered: no hook, no Python path
        block = allocate(4096)
        self.assertIs(type(block.mem), compiled.load("cupy_allocate").memory_type(allocate))  # the Python
        del block                                                                               # path's: UnownedMemory


    def test_an_empty_registry_of_hooks_is_asked_through_cupys_c_function(self):
        # Once a thread has used a hook, CuPy's _has_memory_hooks stays true with the thread's dict empty:
        # each allocation and free then asks the dict through CuPy's C get_memory_hooks, as CuPy's pool
        # does, not through gpumem.cupy's Python function (which makes a list of the hooks).
        hook_module = self.cupy.cuda.memory_hook
        asked_in_python = []
        get_hooks = hook_module.get_memory_hooks
        hook_module.get_memory_hooks = lambda: asked_in_python.append(1) or get_hooks()
        allocate = self.install()
        allocate(4096)  # reserved and cached
        get_hooks()  # the thread's dict made, empty
        self.set(stream=0, hooks=1)
        before = self.capi.calls()
        block = allocate(4096)
        self.assertIs(type(block.mem), compiled.load("cupy_allocate").memory_type(allocate))
        del block
        self.assertEqual(self.capi.calls() - before, 6)  # allocation: hooks, the dict, device, stream; free: 2
        self.assertEqual((asked_in_python, self.python_calls), ([], []))
        self.assertEqual(self.current(), 0)
        for failing in (1, 2):  # CuPy's get_memory_hooks raising is the allocation's error
            self.set(stream=0, hooks=1, failing=failing, only="get_memory_hooks")
            with self.assertRaisesRegex(RuntimeError, "CuPy's C function failed"):
                allocate(4096)
            self.assertEqual(self.current(), 0)
        self.set(stream=0)
        self.assertEqual(self.unraisable, [])


class PinnedCapsulesTest(CapsulesTest):
    """CuPy's pinned memory allocator on the compiled path with CuPy's C functions: the current device and
    stream without Python calls, the streams a dropped block waits for as on the Python path."""

    def setUp(self):
        super().setUp()
        self.kept = []

    def install(self):
        self.module.install(CONFIG)
        self.module.allocator(0)
        self.python_calls.clear()
        return self.cupy.state.pinned_allocator

    def reused(self, allocate):
        """Whether a new MiB request is served by a freed block (kept, so that it is not freed again)."""
        hits = self.module.allocator(0).host_stats()["cache_hits"]
        self.kept.append(allocate(MiB))
        return self.module.allocator(0).host_stats()["cache_hits"] == hits + 1

    def test_the_default_stream_calls_no_python_function_of_cupys(self):
        allocate = self.install()
        before = self.capi.calls()
        block = allocate(4096)
        self.assertEqual(self.capi.calls() - before, 2)  # device, stream
        del block
        self.assertEqual(self.python_calls, [])
        self.assertEqual(self.module.allocator().host_stats()["allocations"]["current"], 0)
        self.assertEqual(self.unraisable, [])

    def test_a_dropped_block_waits_for_the_streams_cupys_functions_say(self):
        allocate = self.install()
        enqueue, complete = sim_streams(self.module.allocator(0))
        block = allocate(MiB)  # on the default stream
        self.set(stream=7)     # a copy queued on stream 7, then the array dropped
        enqueue(7, 1)
        del block
        self.assertEqual(self.python_calls, [])
        self.assertFalse(self.reused(allocate))
        self.assertEqual(self.python_calls, ["get_current_stream"])  # stream 7's Stream, kept by the new block
        complete(7)
        self.assertTrue(self.reused(allocate))
        self.kept.clear()
        self.assertEqual(self.unraisable, [])

    def test_an_error_of_cupys_function_is_the_allocations(self):
        self.assert_each_error_is_the_allocations(
            self.install(), ("get_device_id", "get_current_stream_ptr"),
            lambda: self.module.allocator().host_stats()["allocations"]["current"])

    def test_another_device_asks_cupys_python_function(self):
        allocate = self.install()
        block = allocate(4096)
        self.capi.set(1, 0, 0, 0)  # device 1 current at the drop: the block's device's stream from Python
        del block
        self.assertEqual(self.python_calls, ["get_current_stream"])
        self.capi.set(0, 0, 0, 0)


class CupyObjectsTest(CapsulesTest):
    """CuPy's memory objects made as CuPy's own pools make them (cupy_objects.c), on C types laid out as
    CuPy's; capi.object_counts() is (constructor calls, tp_new calls)."""

    def install(self):
        self.module.install(CONFIG)
        self.module.allocator(0)
        return self.cupy.state.allocator, self.cupy.state.pinned_allocator

    def made_by_constructors(self, allocate):
        return compiled.load("cupy_allocate").made_by_constructors(allocate)

    def memory_type(self, allocate):
        return compiled.load("cupy_allocate").memory_type(allocate)

    def test_device_objects_come_from_tp_new_and_equal_the_constructors(self):
        """Two objects, as CuPy's pool makes: gpumem's memory, a BaseMemory that owns the block, and the
        MemoryPointer; each equal to what CuPy's own setters and constructor make."""
        allocate, _ = self.install()
        self.assertEqual(self.made_by_constructors(allocate), (False, False))
        before = self.capi.object_counts()
        block = allocate(4096)
        self.assertEqual(self.capi.object_counts(), (before[0], before[1] + 2))
        memory = block.mem
        self.assertEqual((type(block), type(memory), type(memory).__name__, type(memory).__base__),
                         (self.capi.MemoryPointer, self.memory_type(allocate), "Memory", self.capi.BaseMemory))
        self.assertFalse(hasattr(memory, "_owner") or hasattr(memory, "__dict__"))
        assigned = type(memory)()  # tp_new, then the fields through BaseMemory's setters; it owns nothing
        assigned.ptr, assigned.size, assigned.device_id = block.ptr, 4096, 0
        constructed = self.capi.MemoryPointer(assigned, 0)
        self.assertEqual((block.ptr, block.device_id, memory.ptr, memory.size, memory.device_id),
                         (constructed.ptr, constructed.device_id, assigned.ptr, assigned.size, assigned.device_id))
        self.assertEqual(self.module.allocator().memory_stats()["allocation.all.current"], 1)
        del block
        self.assertEqual(self.module.allocator().memory_stats()["allocation.all.current"], 1)  # memory holds it
        del memory
        self.assertEqual(self.module.allocator().memory_stats()["allocation.all.current"], 0)
        del constructed, assigned  # owned nothing: frees nothing
        self.assertEqual(self.module.allocator().memory_stats()["allocation.all.current"], 0)
        self.assertEqual(self.unraisable, [])

    def test_gpumems_memory_type_lives_as_long_as_its_objects(self):
        """Each memory object holds its (heap) type, and gives it back when dropped, as CPython's own
        subclasses do: no reference is lost or gained over many allocations."""
        allocate, _ = self.install()
        memory_type = self.memory_type(allocate)
        before = sys.getrefcount(memory_type)
        blocks = [allocate(4096) for _ in range(100)]
        self.assertEqual(sys.getrefcount(memory_type), before + 100)
        del blocks
        self.assertEqual(sys.getrefcount(memory_type), before)
        self.assertEqual(self.module.allocator().memory_stats()["allocation.all.current"], 0)
        self.assertEqual(self.unraisable, [])

    def test_threads_allocating_gpumems_memory_at_once_lose_nothing(self):
        allocate, _ = self.install()

        def work():
            for step in range(1000):
                block = allocate((step % 7 + 1) * 4096)
                self.assertEqual(block.mem.size, (step % 7 + 1) * 4096)
                del block

        self.assertEqual(in_threads(work), ([], 0))
        stats = self.module.allocator().memory_stats()
        self.assertEqual((stats["allocation.all.allocated"], stats["allocation.all.current"]), (4000, 0))
        self.assertEqual(self.unraisable, [])

    def test_a_hook_sees_gpumems_memory_id_at_the_free(self):
        allocate, _ = self.install()
        block = allocate(3 * MiB)
        memory_id, pointer = id(block.mem), block.ptr
        calls = []

        class Recorder(self.cupy.cuda.memory_hook.MemoryHook):
            name = "recorder"

            def __getattr__(self, method):
                return lambda **arguments: calls.append((method, arguments))

        self.set(stream=0, hooks=1)
        with Recorder():
            del block
        self.assertEqual([name for name, _ in calls], ["free_preprocess", "free_postprocess"])
        self.assertEqual([(arguments["pmem_id"], arguments["mem_ptr"]) for _, arguments in calls],
                         [(memory_id, pointer)] * 2)
        self.assertEqual(self.module.allocator().memory_stats()["allocation.all.current"], 0)
        self.assertEqual(self.unraisable, [])

    def test_a_base_memory_that_cannot_be_subclassed_safely_keeps_unowned_memory(self):
        """BaseMemory missing, a Python class (an instance dict), a C heap type, garbage-collected types (a
        Python class without a dict, a C type), a type that cannot be subclassed: CuPy's UnownedMemory
        owning a Block, as before."""
        class PythonBase:
            pass

        class SlotsBase(self.capi.BaseMemory):
            __slots__ = ()

        for base in (None, PythonBase, self.capi.heap_base_memory(), SlotsBase, self.capi.UnownedMemory, type(None)):
            self.cupy.cuda.memory.BaseMemory = base
            allocate, _ = self.install()
            self.assertIs(self.memory_type(allocate), self.capi.UnownedMemory, base)
            self.assertEqual(self.made_by_constructors(allocate), (False, False))
            block = allocate(4096)
            self.assertEqual((type(block.mem), type(block.mem._owner).__name__), (self.capi.UnownedMemory, "Block"))
            del block
            self.assertEqual(self.module.allocator().memory_stats()["allocation.all.current"], 0)
        self.assertEqual(self.unraisable, [])

    def test_pinned_objects_come_from_tp_new_and_equal_the_constructors(self):
        _, allocate = self.install()
        self.assertEqual(self.made_by_constructors(allocate), (False,))
        before = self.capi.object_counts()
        block = allocate(3000)
        self.assertEqual(self.capi.object_counts(), (before[0], before[1] + 1))
        self.assertEqual((type(block), type(block.mem).__name__), (self.capi.PinnedMemoryPointer, "PinnedBlock"))
        constructed = self.capi.PinnedMemoryPointer(block.mem, 0)
        self.assertEqual((block.ptr, block.mem.size), (constructed.ptr, 3000))
        del block, constructed
        self.assertEqual(self.module.allocator().host_stats()["allocations"]["current"], 0)
        self.assertEqual(self.unraisable, [])

    def test_a_constructor_that_sets_more_is_called(self):
        self.capi.set_objects(1, 0)  # each __init__ also sets a field that tp_new leaves 0
        allocate, pinned = self.install()
        self.assertEqual((self.made_by_constructors(allocate), self.made_by_constructors(pinned)),
                         ((True, True), (True,)))
        self.assertIs(self.memory_type(allocate), self.capi.UnownedMemory)  # BaseMemory's ptr setter stamps too
        before = self.capi.object_counts()
        blocks = [allocate(4096), pinned(4096)]
        self.assertEqual(self.capi.object_counts(), (before[0] + 3, before[1] + 3))
        self.assertEqual((blocks[0].mem.size, blocks[0].ptr, blocks[1].mem.size), (4096, blocks[0].mem.ptr, 4096))
        del blocks
        self.assertEqual(self.module.allocator().memory_stats()["allocation.all.current"], 0)
        self.assertEqual(self.module.allocator().host_stats()["allocations"]["current"], 0)

    def test_a_failing_tp_new_gives_the_block_back(self):
        allocate, pinned = self.install()
        self.capi.set_objects(0, 1)
        for function in (allocate, pinned):
            with self.assertRaisesRegex(RuntimeError, "tp_new failed"):
                function(5 * MiB)
        self.capi.set_objects(0, 0)
        self.assertEqual(self.module.allocator().memory_stats()["allocation.all.current"], 0)
        self.assertEqual(self.module.allocator().host_stats()["allocations"]["current"], 0)
        self.assertEqual(self.unraisable, [])


if __name__ == "__main__":
    unittest.main()
