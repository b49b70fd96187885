"""gpumem.cupy's compiled allocation path (python/gpumem/cupy_allocate.c, built by gpumem/compiled.py),
without CuPy or a GPU: the stand-in `cupy` of test_cupy_install.py, allocators on the sim backend.

The other stand-in tests (install, hooks, pools) run under both paths; these pin what is the compiled
path's own:
- install() takes it where it can be built (this test machine has a compiler and Python's headers);
- it hands out the same blocks and leaves the same statistics as the Python path, streams included;
- running out of memory raises CuPy's OutOfMemoryError with gpumem's report, and the allocator goes on;
- a failure after gm_malloc (CuPy's memory object raising) frees the block again; a free that gpumem
  refuses (its allocator closed) is reported as Python reports an error in __del__, not a crash;
- a hook registered after the allocation sees the free, with the memory object's id;
- threads allocating at once lose nothing, and Python pressure callbacks called during their allocations
  do not deadlock with the GIL the compiled path keeps through gpumem calls (let go only if gpumem waits);
- a device's handle address is read once per gpumem.cupy._Device, device memory and pinned alike, each
  device keeping its own: a replaced _Device (its allocator closed and made anew) is read again, and
  allocations go to the allocator of the device current at each;
- CuPy types that are Python classes (these stand-ins) are made through their constructors;
- the pinned allocator: the same blocks, cache reuse and statistics as the Python path; out of pinned
  memory is the runtime error CuPy falls back on; a failure after gm_host_malloc gives the block back;
- bad arguments are errors; a build that fails (no compiler, a cache that cannot be written) warns and
  leaves the Python path, which works; the source builds without a compiler warning.
"""
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import types
import unittest
from unittest import mock

import gpumem
from gpumem import compiled
from test_cupy_install import StandInCupyTest, _CUDARuntimeError, _PinnedMemoryPointer, _Stream, _UnownedMemory, sim_streams

MiB = 1 << 20
CONFIG = "backend:sim,capacity:256MiB"


def script(allocate, cupy):
    """A fixed mix of sizes, streams and frees; returns [(pointer, size)] of what it allocated."""
    seen, live = [], []
    for step in range(60):
        cupy.state.streams[0] = _Stream((0, 0, 11, 12)[step % 4])
        size = (0, 512, 3000, 2 * MiB + 5, 17 * MiB, 64)[step % 6]
        block = allocate(size)
        seen.append((block.ptr, block.mem.size))
        live.append(block)
        if step % 3 == 2:
            del live[step % len(live)]
    live.clear()
    return seen


def failing_on_demand(original, message):
    """(a stand-in for `original` that raises RuntimeError(message) once the list is not empty, the list)."""
    failing = []

    def function(*arguments):
        if failing:
            raise RuntimeError(message)
        return original(*arguments)

    return function, failing


def in_threads(work, count=4, timeout=60):
    """Run work() on `count` threads at once: (the exceptions they raised, how many still run after
    `timeout` seconds)."""
    errors = []

    def run():
        try:
            work()
        except Exception as error:  # returned to the caller, which asserts on it
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    return errors, sum(thread.is_alive() for thread in threads)


class RecordsUnraisable(StandInCupyTest):
    """Errors raised where Python cannot raise them (a memory object's free) kept in self.unraisable."""

    def setUp(self):
        super().setUp()
        self.unraisable, self.previous_hook = [], sys.unraisablehook
        sys.unraisablehook = self.unraisable.append

    def tearDown(self):
        sys.unraisablehook = self.previous_hook
        super().tearDown()

    def assert_free_after_close_is_reported(self, allocate, size):
        """A block dropped after its allocator was closed: gpumem refuses the free, which is reported as
        an error in __del__ is, not a crash."""
        block = allocate(size)
        self.module.allocator().close()
        del block
        self.assertEqual(len(self.unraisable), 1)
        self.assertIsInstance(self.unraisable[0].exc_value, gpumem.GpumemError)


class CompiledPathTest(RecordsUnraisable):
    def install(self, config=CONFIG):
        """Install, and make the device's allocator (the first allocation does, in Python): the compiled
        path's allocator function."""
        self.module.install(config, pinned=False)
        self.cupy.state.allocator(0)
        return self.cupy.state.allocator

    def stats(self):
        stats = self.module.allocator().memory_stats()
        return {key: stats[key] for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                                            "allocation.all.allocated", "allocation.all.current",
                                            "reserved_bytes.all.current", "requested_bytes.all.peak")}

    def test_install_takes_the_compiled_path(self):
        self.module.install(CONFIG, pinned=False)
        allocate = self.cupy.state.allocator
        self.assertEqual(type(allocate).__name__, "builtin_function_or_method")
        self.assertEqual(compiled.load("cupy_allocate").made_by_constructors(allocate), (True, True))
        first = allocate(10)  # the device's first allocation makes its allocator, in Python
        self.assertEqual(type(first.mem.owner).__name__, "_Block")
        del first
        block = allocate(1000)
        self.assertEqual(type(block.mem.owner).__name__, "Block")
        self.assertEqual((block.mem.size, block.mem.device_id, block.ptr), (1000, 0, block.mem.ptr))
        self.assertEqual(self.stats()["allocation.all.current"], 1)
        del block
        self.assertEqual(self.stats()["allocation.all.current"], 0)

    def test_same_blocks_and_statistics_as_the_python_path(self):
        results = []
        for path in (True, False):
            self.forget_allocators()
            self.module._settings["compiled"] = path
            self.module._streams.clear()
            seen = script(self.install(), self.cupy)
            results.append((seen, self.stats(), sorted(pointer for _, pointer in self.module._streams)))
        self.assertEqual(results[0], results[1])
        self.assertEqual(results[0][2], [11, 12])
        self.assertEqual(results[0][1]["allocation.all.current"], 0)
        self.assertEqual(self.unraisable, [])

    def test_out_of_memory_is_cupys_error_with_gpumems_report(self):
        allocate = self.install()
        kept = allocate(100 * MiB)
        with self.assertRaises(self.cupy.cuda.memory.OutOfMemoryError) as raised:
            allocate(200 * MiB)
        self.assertIn("out of memory", str(raised.exception).lower())
        self.assertEqual(self.module.allocator().memory_stats()["num_ooms"], 1)
        again = allocate(100 * MiB)  # the allocator goes on
        self.assertNotEqual(again.ptr, kept.ptr)
        del kept, again, raised  # the exception's traceback holds this frame

    def test_a_failing_memory_object_frees_the_block(self):
        self.cupy.cuda.UnownedMemory, failing = failing_on_demand(_UnownedMemory, "UnownedMemory failed")
        allocate = self.install()
        failing.append(True)
        with self.assertRaisesRegex(RuntimeError, "UnownedMemory failed"):
            allocate(5 * MiB)
        self.assertEqual(self.stats()["allocation.all.current"], 0)
        self.assertEqual(self.stats()["allocated_bytes.all.peak"], 5 * MiB)

    def test_a_free_gpumem_refuses_is_reported_not_a_crash(self):
        self.assert_free_after_close_is_reported(self.install(), MiB)

    def test_a_hook_registered_after_the_allocation_sees_the_free(self):
        allocate = self.install()
        block = allocate(3 * MiB)
        memory_id, pointer = id(block.mem), block.ptr
        calls = []

        class Recorder(self.cupy.cuda.memory_hook.MemoryHook):
            name = "recorder"

            def __getattr__(self, method):
                return lambda **arguments: calls.append((method, arguments))

        with Recorder():
            del block
        self.assertEqual([name for name, _ in calls], ["free_preprocess", "free_postprocess"])
        self.assertEqual((calls[0][1]["pmem_id"], calls[0][1]["mem_ptr"]), (memory_id, pointer))
        self.assertEqual(self.stats()["allocation.all.current"], 0)

    def counting_states(self, devices):
        """Each device's _Device in gpumem.cupy's dict behind a stand-in that counts the reads of its
        handle_address (and passes everything else on)."""
        class Counting:
            def __init__(self, state):
                self.state, self.reads = state, 0

            @property
            def handle_address(self):
                self.reads += 1
                return self.state.handle_address

            def __getattr__(self, name):
                return getattr(self.state, name)

        for device in devices:
            self.module._allocators[device] = Counting(self.module._allocators[device])
        return [self.module._allocators[device] for device in devices]

    def test_a_devices_handle_address_is_read_once(self):
        """Two devices (the sim has one: device 1's allocator is a second one on it), allocated on in turn,
        device memory and pinned: each _Device's handle address is read once; a _Device put in its place
        is read again, and its allocator serves from then on."""
        self.module.install(CONFIG + ",device:0")  # after the device's own setting: device 1 on sim device 0
        self.cupy.state.streams[1] = self.cupy.state.streams[0]
        for device in (0, 1):
            self.cupy.state.device = device
            self.module.allocator(device)
        states = self.counting_states((0, 1))
        blocks = []
        for step in range(8):
            self.cupy.state.device = step % 2
            blocks.append(self.cupy.state.allocator(4096))
            blocks.append(self.cupy.state.pinned_allocator(4096))
            self.assertEqual(blocks[-2].mem.device_id, step % 2)
        self.assertEqual([state.reads for state in states], [2, 2])  # device memory's cell, pinned memory's
        self.assertEqual([self.module.allocator(device).memory_stats()["allocation.all.current"] for device in (0, 1)],
                         [4, 4])
        self.assertEqual([self.module.allocator(device).host_stats()["allocations"]["current"] for device in (0, 1)],
                         [4, 4])
        del blocks
        self.cupy.state.device = 0
        self.module.allocator(0).close()  # device 0's allocator closed and made anew
        self.module._allocators.pop(0)
        kept = [self.cupy.state.allocator(4096), self.cupy.state.pinned_allocator(4096)]  # made in Python
        replaced = self.counting_states((0,))[0]
        kept += [self.cupy.state.allocator(4096), self.cupy.state.pinned_allocator(4096)]
        self.assertEqual(replaced.reads, 2)
        self.assertEqual(self.module.allocator(0).memory_stats()["allocation.all.current"], 2)
        self.assertEqual(self.module.allocator(0).host_stats()["allocations"]["current"], 2)
        del kept
        self.assertEqual(self.unraisable, [])

    def test_threads_allocating_at_once_lose_nothing(self):
        allocate = self.install()

        def work():
            for step in range(2000):
                block = allocate((step % 7 + 1) * 4096)
                del block

        self.assertEqual(in_threads(work), ([], 0))
        self.assertEqual((self.stats()["allocation.all.allocated"], self.stats()["allocation.all.current"]), (8000, 0))

    def test_python_callbacks_while_threads_allocate(self):
        """The GIL is kept through gpumem calls unless gpumem waits: a Python pressure callback, which
        gpumem calls during an allocation (on its thread or another), and threads contending for
        gpumem's lock must not deadlock with it."""
        allocate = self.install()
        allocator = self.module.allocator()
        allocator.set_pressure_policy(high=0.1, low=0.05, signals=("allocated",))  # 25.6 MiB
        seen = []
        allocator.on_pressure(lambda level, readings: seen.append(level))

        def work():
            for step in range(300):
                block = allocate(16 * MiB if step % 3 == 0 else 4096)  # 4 threads: at most 160 of 256 MiB
                held = [allocate(8 * MiB) for _ in range(step % 4)]
                del block, held

        self.assertEqual(in_threads(work), ([], 0))  # no error, and no thread left waiting (a deadlock)
        self.assertIn("high", seen)
        self.assertEqual(self.stats()["allocation.all.current"], 0)

    def test_without_the_blocking_hook_the_gil_is_let_go_around_each_call(self):
        module = compiled.load("cupy_allocate")
        module.use_blocking_hook(0)
        try:
            allocate = self.install()
            blocks = [allocate(size) for size in (512, 3 * MiB, 0)]
            self.assertEqual(self.stats()["allocation.all.current"], 2)
            del blocks
            self.assertEqual(self.stats()["allocation.all.current"], 0)
        finally:
            module.use_blocking_hook(gpumem.function_address("gm_set_blocking_hook"))

    def test_bad_arguments_are_errors(self):
        allocate = self.install()
        with self.assertRaises(OverflowError):
            allocate(-1)
        with self.assertRaises(TypeError):
            allocate("many")
        module = compiled.load("cupy_allocate")
        functions = [len] * 14
        with self.assertRaisesRegex(ValueError, "addresses"):
            module.make_allocate(0, 0, *functions[:4], {}, {}, *functions[6:])
        with self.assertRaises(TypeError):
            module.make_allocate(1, 1, *functions)  # devices and kept streams must be dicts
        self.assertEqual(self.stats()["allocation.all.current"], 0)


class CompiledPinnedPathTest(RecordsUnraisable):
    """CuPy's pinned memory allocator on the compiled path (the stream rules themselves are pinned by
    test_cupy_install.py's tests, which run under both paths)."""

    def install(self, config="backend:sim"):
        self.module.install(config)
        self.module.allocator(0)
        return self.cupy.state.pinned_allocator

    def current(self):
        return self.module.allocator().host_stats()["allocations"]["current"]

    def test_blocks_are_compiled_and_read_as_cupy_reads_them(self):
        allocate = self.install()
        self.assertEqual(type(allocate).__name__, "builtin_function_or_method")
        block = allocate(3000)
        self.assertEqual(type(block.mem).__name__, "PinnedBlock")
        self.assertEqual((block.mem.size, block.mem.device, int(block.mem)), (3000, 0, block.ptr))
        self.assertEqual(self.current(), 1)
        del block
        self.assertEqual(self.current(), 0)
        self.assertEqual(allocate(0).ptr, 0)
        self.assertEqual(self.unraisable, [])

    def test_same_blocks_and_host_statistics_as_the_python_path(self):
        results = []
        for path in (True, False):
            self.forget_allocators()
            self.module._settings["compiled"] = path
            allocate = self.install()
            enqueue, complete = sim_streams(self.module.allocator())
            seen, live = [], []
            for step in range(40):
                self.cupy.state.streams[0] = _Stream((0, 21, 22)[step % 3])
                enqueue((0, 21, 22)[step % 3], 1)
                block = allocate((512, 70000, 1 << 20, 5)[step % 4])
                seen.append(block.mem.size)  # host addresses differ from run to run: the cache's counts tell reuse
                live.append(block)
                if step % 2:
                    del live[0]
                if step % 5 == 4:
                    for stream in (0, 21, 22):
                        complete(stream)
            live.clear()
            stats = self.module.allocator().host_stats()
            results.append((seen, stats["cache_hits"], stats["cache_misses"], stats["allocations"]))
        self.assertEqual(results[0], results[1])
        self.assertGreater(results[0][1], 0)  # blocks were reused once their streams were done

    def test_out_of_pinned_memory_is_cupys_runtime_error(self):
        allocate = self.install("backend:sim,host_limit:1MiB")
        with self.assertRaises(_CUDARuntimeError) as raised:
            allocate(4 << 20)
        self.assertEqual(raised.exception.status, 2)
        self.assertIn("host_limit", str(raised.exception))
        del raised

    def test_a_failing_pointer_object_gives_the_block_back(self):
        self.cupy.cuda.PinnedMemoryPointer, failing = failing_on_demand(_PinnedMemoryPointer, "PinnedMemoryPointer failed")
        allocate = self.install()
        failing.append(True)
        with self.assertRaisesRegex(RuntimeError, "PinnedMemoryPointer failed"):
            allocate(5000)
        self.assertEqual(self.current(), 0)
        self.assertEqual(self.module.allocator().host_stats()["cache_misses"], 1)

    def test_a_free_gpumem_refuses_is_reported_not_a_crash(self):
        self.assert_free_after_close_is_reported(self.install(), 4096)

    def test_bad_arguments_are_errors(self):
        allocate = self.install()
        with self.assertRaises(OverflowError):
            allocate(-5)
        module = compiled.load("cupy_allocate")
        functions = [len] * 10
        with self.assertRaisesRegex(ValueError, "addresses"):
            module.make_pinned_allocate(1, 0, *functions[:4], {}, *functions[5:])
        with self.assertRaises(TypeError):
            module.make_pinned_allocate(1, 1, *functions)  # devices must be a dict


class BuildTest(StandInCupyTest):
    def test_a_failed_build_warns_and_keeps_the_python_path(self):
        with tempfile.TemporaryDirectory() as cache, \
                mock.patch.dict(os.environ, {"GPUMEM_CACHE_DIR": cache, "CC": "false"}), \
                mock.patch.dict(compiled._loaded, clear=True):
            with self.assertWarnsRegex(RuntimeWarning, "building cupy_allocate.c failed"):
                self.module.install(CONFIG, pinned=False)
            self.assertEqual(os.listdir(cache), [])  # no half-written build left
        allocate = self.cupy.state.allocator
        self.assertIsInstance(allocate, types.FunctionType)
        block = allocate(MiB)
        self.assertEqual(block.mem.size, MiB)

    def test_a_cache_that_cannot_be_written_is_a_clear_error(self):
        with tempfile.NamedTemporaryFile() as not_a_folder, \
                mock.patch.dict(os.environ, {"GPUMEM_CACHE_DIR": os.path.join(not_a_folder.name, "cache")}), \
                mock.patch.dict(compiled._loaded, clear=True):
            with self.assertRaisesRegex(compiled.BuildError, "GPUMEM_CACHE_DIR"):
                compiled.load("cupy_allocate")

    def test_a_home_that_cannot_be_written_builds_in_the_temporary_directory(self):
        environment = {key: value for key, value in os.environ.items() if key != "GPUMEM_CACHE_DIR"}
        with tempfile.NamedTemporaryFile() as not_a_folder, tempfile.TemporaryDirectory() as temporary:
            environment["XDG_CACHE_HOME"] = os.path.join(not_a_folder.name, "cache")
            with mock.patch.dict(os.environ, environment, clear=True), mock.patch.object(tempfile, "tempdir", temporary), \
                    mock.patch.dict(compiled._loaded, clear=True):
                module = compiled.load("cupy_allocate")
                self.assertTrue(module.__file__.startswith(os.path.join(temporary, f"gpumem-{os.getuid()}")))
                self.assertIsNotNone(module.make_allocate)

    def test_a_folder_others_may_write_in_is_refused(self):
        with tempfile.TemporaryDirectory() as shared, mock.patch.dict(compiled._loaded, clear=True):
            os.chmod(shared, 0o777)
            with mock.patch.dict(os.environ, {"GPUMEM_CACHE_DIR": shared}):
                with self.assertRaisesRegex(compiled.BuildError, "others may write in it"):
                    compiled.load("cupy_allocate")
            self.assertEqual(os.listdir(shared), [])

    def test_the_sources_build_without_warnings(self):
        sources, headers = compiled.source_files("cupy_allocate")
        self.assertEqual([os.path.basename(path) for path in sources + headers],
                         ["cupy_allocate.c", "cupy_pinned.c", "cupy_objects.c", "cupy_allocate.h"])
        with tempfile.TemporaryDirectory() as folder:
            target = os.path.join(folder, "_gpumem_cupy_allocate" + importlib.machinery.EXTENSION_SUFFIXES[0])
            command = compiled.compile_command(sources, target) + ["-Werror"]
            finished = subprocess.run(command, capture_output=True, text=True)
            self.assertEqual((finished.returncode, finished.stderr), (0, ""))
            spec = importlib.util.spec_from_file_location("_gpumem_cupy_allocate", target)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)  # loads: every file's symbols are there
            self.assertTrue(callable(module.made_by_constructors))

    def test_a_changed_file_of_the_module_builds_anew(self):
        """The build's name covers every file of the module, the header included."""
        sources, headers = compiled.source_files("cupy_allocate")
        with tempfile.TemporaryDirectory() as folder, mock.patch.object(compiled, "_HERE", folder):
            for path in sources + headers:
                shutil.copy(path, folder)
            names = {compiled.build_file_name("cupy_allocate")}
            for path in sources + headers:
                with open(os.path.join(folder, os.path.basename(path)), "ab") as copy:
                    copy.write(b"\n")
                names.add(compiled.build_file_name("cupy_allocate"))
        self.assertEqual(len(names), len(sources + headers) + 1)

if __name__ == "__main__":
    unittest.main()
