"""CuPy's memory hooks around gpumem.cupy's allocations (python/gpumem/cupy_hooks.py), without CuPy or a
GPU: the stand-in `cupy` of test_cupy_install.py (hooks registered per thread with `with hook:`),
allocators on the sim backend (1 GiB device).

- every allocation calls malloc_preprocess (the request rounded to 512 bytes) and malloc_postprocess
  (the block's size, its pointer, the id of the memory object CuPy holds), in that order;
- alloc_preprocess / alloc_postprocess come only when gpumem reserved more memory, with how much;
- dropping the memory calls free_preprocess / free_postprocess with the same size, pointer and id, so
  a hook that tracks the bytes in use (as programs that measure a function's peak do) ends at zero;
- a failed allocation still reaches malloc_postprocess (pointer 0) before CuPy's out-of-memory error;
- a hook that raises loses no memory: the block is freed whichever hook failed;
- hooks registered on another thread see nothing, and with none registered nothing is called.
"""
import sys
import threading
import unittest

from test_cupy_install import StandInCupyTest

MiB = 1 << 20
CONFIG = "backend:sim,capacity:1GiB"


class CupyHooksTest(StandInCupyTest):
    def recording_hook(self, name="recorder"):
        calls = []

        class Recorder(self.cupy.cuda.memory_hook.MemoryHook):
            def __getattr__(self, method):
                if method.endswith(("_preprocess", "_postprocess")):
                    return lambda **arguments: calls.append((method, arguments))
                raise AttributeError(method)

        hook = Recorder()
        hook.name = name
        return hook, calls

    def test_malloc_alloc_and_free_hooks_in_cupys_order(self):
        self.module.install(CONFIG, pinned=False)
        hook, calls = self.recording_hook()
        with hook:
            pointer = self.cupy.state.allocator(3 * MiB + 1)
            first = [name for name, _ in calls]
            self.assertEqual(first, ["malloc_preprocess", "alloc_preprocess", "alloc_postprocess", "malloc_postprocess"])
            pre, grown, _, post = (arguments for _, arguments in calls)
            self.assertEqual(pre, {"device_id": 0, "size": 3 * MiB + 1, "mem_size": 3 * MiB + 512})
            self.assertGreaterEqual(grown["mem_size"], 3 * MiB)
            self.assertEqual((post["mem_ptr"], post["pmem_id"]), (pointer.mem.ptr, id(pointer.mem)))
            self.assertEqual(post["mem_size"], self.module.allocator().allocation_size(pointer.mem.ptr))
            calls.clear()
            del pointer
            self.assertEqual([name for name, _ in calls], ["free_preprocess", "free_postprocess"])
            self.assertEqual(calls[0][1], calls[1][1])
            self.assertEqual((calls[0][1]["mem_size"], calls[0][1]["mem_ptr"], calls[0][1]["pmem_id"]),
                             (post["mem_size"], post["mem_ptr"], post["pmem_id"]))
            calls.clear()
            again = self.cupy.state.allocator(3 * MiB)  # the freed block, from gpumem's cache: no alloc hooks
            self.assertEqual([name for name, _ in calls], ["malloc_preprocess", "malloc_postprocess"])
            del again

    def test_a_peak_tracking_hook_ends_at_zero(self):
        self.module.install(CONFIG, pinned=False)

        class Peak(self.cupy.cuda.memory_hook.MemoryHook):
            name = "peak"
            current = peak = 0

            def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
                self.current += mem_size
                self.peak = max(self.peak, self.current)

            def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
                self.current -= mem_size

            def __getattr__(self, method):
                return lambda **arguments: None

        with Peak() as peak:
            blocks = [self.cupy.state.allocator(size) for size in (100, 5 * MiB, 70 * MiB + 3)]
            del blocks[1]
            blocks.append(self.cupy.state.allocator(2 * MiB))
            blocks.clear()
        self.assertEqual(peak.current, 0)
        self.assertGreaterEqual(peak.peak, 75 * MiB)

    def test_a_failed_allocation_is_seen_by_malloc_postprocess(self):
        self.module.install(CONFIG, pinned=False)
        hook, calls = self.recording_hook()
        with hook, self.assertRaises(self.cupy.cuda.memory.OutOfMemoryError):
            self.cupy.state.allocator(4 << 30)
        self.assertEqual([name for name, _ in calls], ["malloc_preprocess", "malloc_postprocess"])
        self.assertEqual((calls[1][1]["mem_ptr"], calls[1][1]["pmem_id"], calls[1][1]["mem_size"]), (0, 0, 0))

    def test_a_hook_that_raises_loses_no_memory(self):
        self.module.install(CONFIG, pinned=False)
        unraisable, previous = [], sys.unraisablehook
        sys.unraisablehook = unraisable.append
        try:
            for failing in ("malloc_preprocess", "alloc_preprocess", "alloc_postprocess", "malloc_postprocess",
                            "free_preprocess", "free_postprocess"):
                with self.subTest(failing=failing):
                    hook, _ = self.recording_hook(name=failing)

                    def fail(**arguments):
                        raise RuntimeError(f"hook {failing} failed")

                    setattr(hook, failing, fail)
                    raised = False
                    with hook:
                        try:
                            block = self.cupy.state.allocator(9 * MiB + 7)  # 9 MiB more reserved: alloc hooks
                            del block
                        except RuntimeError:
                            raised = True
                    self.assertEqual(raised, failing.startswith(("malloc", "alloc")))
                    self.assertEqual(self.module.allocator().memory_stats()["allocated_bytes.all.current"], 0)
                    self.module.allocator().empty_cache()
        finally:
            sys.unraisablehook = previous
        self.assertEqual(len(unraisable), 2)  # the two free hooks, raising inside the memory's __del__

    def test_hooks_of_another_thread_see_nothing(self):
        self.module.install(CONFIG, pinned=False)
        hook, calls = self.recording_hook()
        registered, release = threading.Event(), threading.Event()

        def other_thread():
            with hook:
                registered.set()
                release.wait(10)

        thread = threading.Thread(target=other_thread)
        thread.start()
        registered.wait(10)
        block = self.cupy.state.allocator(MiB)
        del block
        release.set()
        thread.join()
        self.assertEqual(calls, [])


class CupyHooksPythonPathTest(CupyHooksTest):
    compiled = False


if __name__ == "__main__":
    unittest.main()
