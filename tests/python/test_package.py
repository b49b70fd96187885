"""The gpumem Python package without a GPU and without PyTorch: the ctypes layer over libgpumem on the
sim backend, its errors, statistics under torch's names, and the summary table."""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import types
import unittest

import gpumem

PYTHON_FOLDER = os.path.dirname(os.path.dirname(os.path.abspath(gpumem.__file__)))  # gpumem's python/

# A stand-in torch package for child processes (python -m gpumem.torch, sitecustomize): no CUDA started, and
# torch.utils.cpp_extension.load gives an adapter that only records install(config).
FAKE_TORCH_FILES = {
    "torch/__init__.py": "import types\ncuda = types.SimpleNamespace(is_initialized=lambda: False)\n",
    "torch/utils/__init__.py": "",
    "torch/utils/cpp_extension.py": textwrap.dedent("""\
        import types
        installed = []
        def load(**options):
            return types.SimpleNamespace(install=installed.append, is_installed=lambda: bool(installed))
        """),
}


def fake_torch_module(device_count=2):
    """A stand-in torch module for gpumem.torch in this process: devices, torch.cuda's current device."""
    torch = types.ModuleType("torch")

    class device:
        def __init__(self, kind, index=None):
            if isinstance(kind, device):
                kind, index = kind.type, kind.index
            elif ":" in kind:
                kind, index = kind.split(":")[0], int(kind.split(":")[1])
            self.type, self.index = kind, index

    torch.device = device
    torch.cuda = types.SimpleNamespace(is_initialized=lambda: False, current_device=lambda: 0,
                                       device_count=lambda: device_count)
    return torch


class PackageTest(unittest.TestCase):
    def setUp(self):
        # chunk_room_share:0: each growth one chunk, as the tests below count them (on a device of 1 GiB the
        # room share would make every chunk a page)
        self.allocator = gpumem.Allocator("backend:sim,capacity:1GiB,chunk_room_share:0", from_environment=False)

    def tearDown(self):
        self.allocator.close()

    def test_malloc_free_and_statistics(self):
        a = self.allocator.malloc(1000)
        b = self.allocator.malloc(3 << 20, stream=7)
        self.assertNotEqual(a, b)
        self.assertEqual(self.allocator.allocation_size(a), 1024)
        stats = self.allocator.memory_stats()
        self.assertEqual(stats["allocation.all.current"], 2)
        self.assertEqual(stats["allocated_bytes.small_pool.current"], 1024)
        self.assertEqual(stats["allocated_bytes.large_pool.current"], 3 << 20)
        self.assertEqual(stats["requested_bytes.all.current"], 1000 + (3 << 20))
        self.assertGreaterEqual(stats["reserved_bytes.all.current"], stats["allocated_bytes.all.current"])
        self.assertEqual(self.allocator.reserved_bytes(), stats["reserved_bytes.all.current"])
        self.assertGreater(stats["device_calls.physical_create"], 0)
        self.allocator.free(a)
        self.allocator.free(b)
        stats = self.allocator.memory_stats()
        self.assertEqual(stats["allocated_bytes.all.current"], 0)
        self.assertEqual(stats["allocated_bytes.all.peak"], 1024 + (3 << 20))
        self.allocator.reset_peak_stats()
        self.assertEqual(self.allocator.memory_stats()["allocated_bytes.all.peak"], 0)
        self.allocator.empty_cache()
        self.assertEqual(self.allocator.memory_stats()["reserved_bytes.all.current"], 0)
        self.assertEqual(self.allocator.reserved_bytes(), 0)
        self.allocator.validate()

    def test_borrowed_stream_is_never_named(self):
        """Memory of a borrowed stream moves to another stream after a wait for the whole device, with no
        event recorded on the borrowed stream (a stream that gm_malloc names gets one to wait for)."""
        for borrowed, events_recorded in ((False, 1), (True, 0)):
            allocator = gpumem.Allocator("backend:sim,capacity:1GiB,chunk_room_share:0", from_environment=False)
            allocator.free(allocator.malloc(600 << 20, stream=9, borrowed=borrowed))
            moved = allocator.malloc(700 << 20, stream=0)  # needs the first stream's memory
            stats = allocator.memory_stats()
            self.assertEqual(stats["device_calls.event_record"], events_recorded)
            self.assertEqual(stats["device_calls.event_synchronize"], 1)
            self.assertEqual(stats["reserved_bytes.all.current"], 700 << 20)
            allocator.free(moved)
            allocator.validate()
            allocator.close()

    def test_defragment_gives_back_pinned_pages(self):
        big = self.allocator.malloc(64 << 20)
        fence = self.allocator.malloc(2 << 20)
        self.allocator.free(big)
        pin = self.allocator.malloc((1 << 20) + 1)  # the chunk's first page: it pins all 64 MiB
        self.assertEqual(pin, big)
        self.allocator.empty_cache()
        self.assertEqual(self.allocator.reserved_bytes(), 66 << 20)
        self.assertEqual(self.allocator.defragment(min_free_bytes=64 << 20), 0)
        self.assertEqual(self.allocator.defragment(), 62 << 20)
        self.assertEqual(self.allocator.reserved_bytes(), 4 << 20)
        self.assertEqual(self.allocator.allocation_size(pin), (1 << 20) + 512)
        self.allocator.validate()
        for pointer in (pin, fence):
            self.allocator.free(pointer)
        with self.assertRaises(ValueError) as caught:
            self.allocator.defragment(-1)
        self.assertIn("min_free_bytes", str(caught.exception))
        segments = gpumem.Allocator("backend:sim,engine:segments", from_environment=False)
        with self.assertRaises(gpumem.GpumemError) as caught:
            segments.defragment()
        self.assertIn("segments engine cannot split", str(caught.exception))
        segments.close()

    def test_peer_access(self):
        block = self.allocator.malloc(64 << 20)
        calls = self.allocator.memory_stats()["device_calls.set_access"]
        self.allocator.enable_peer_access(1)  # the 64 MiB chunk is granted to device 1
        self.assertEqual(self.allocator.memory_stats()["device_calls.set_access"], calls + 1)
        with self.assertRaisesRegex(gpumem.GpumemError, "device -1 does not exist"):
            self.allocator.enable_peer_access(-1)
        with self.assertRaises(TypeError):
            self.allocator.enable_peer_access("1")
        self.allocator.free(block)

    def test_statistics_follow_the_library_list(self):
        stats = self.allocator.memory_stats()
        for name in gpumem._STAT_ARRAYS:
            for pool in ("all", "small_pool", "large_pool"):
                for reading in ("current", "peak", "allocated", "freed"):
                    self.assertIn(f"{name}.{pool}.{reading}", stats)
        for name in gpumem._COUNTERS:
            self.assertIn(name, stats)
        self.assertIn("allocated_bytes", gpumem._STAT_ARRAYS)
        self.assertIn("num_page_maps", gpumem._COUNTERS)
        self.assertEqual(len(gpumem._CALL_KINDS), 13)
        # The fields after the listed ones land where the library writes them: the device's size.
        raw = gpumem._Stats()
        gpumem._check(gpumem._library.gm_get_stats(self.allocator._handle, gpumem.ctypes.byref(raw)))
        self.assertEqual(raw.device_total_bytes, 1 << 30)
        self.assertEqual(raw.page_size, 2 << 20)

    def test_snapshot_and_history(self):
        with gpumem.Allocator("backend:sim,capacity:1GiB,history:100", from_environment=False) as allocator:
            a = allocator.malloc(3 << 20)
            b = allocator.malloc(1000, stream=5)
            allocator.free(a)
            snapshot = allocator.snapshot()
            self.assertEqual(snapshot["format"], "gpumem-snapshot")
            blocks = [block for region in snapshot["regions"] for block in region["blocks"]]
            live = [block for block in blocks if block["state"] == "allocated"]
            self.assertEqual([(block["address"], block["requested"]) for block in live], [(b, 1000)])
            self.assertEqual(snapshot["stats"]["allocated_bytes.all.current"], 1024)
            self.assertEqual(sum(region["mapped_bytes"] for region in snapshot["regions"]),
                             snapshot["stats"]["reserved_bytes.all.current"])
            actions = [(event["action"], event["address"]) for event in allocator.history()["events"]
                       if event["action"] != "segment_map"]
            self.assertEqual(actions, [("alloc", a), ("alloc", b), ("free_requested", a), ("free_completed", a)])
            allocator.free(b)
        with self.assertRaises(gpumem.GpumemError) as caught:
            self.allocator.history()
        self.assertIn("keeps no history", str(caught.exception))

    def test_oom_causes_are_the_librarys(self):
        import ctypes
        name = gpumem._library.gm_oom_cause_name
        name.restype = ctypes.c_char_p
        name.argtypes = [ctypes.c_int]
        self.assertEqual(gpumem.OOM_CAUSES, tuple(name(cause).decode() for cause in range(len(gpumem.OOM_CAUSES))))
        self.assertEqual(name(len(gpumem.OOM_CAUSES)), b"unknown")  # none left out

    def test_errors_say_why(self):
        with self.assertRaises(gpumem.OutOfMemoryError) as caught:
            self.allocator.malloc(2 << 30)
        self.assertIn("Tried to allocate 2.00 GiB", str(caught.exception))
        self.assertEqual(caught.exception.status, 2)
        with self.assertRaises(gpumem.GpumemError) as caught:
            self.allocator.free(12345)
        self.assertIn("not a live allocation", str(caught.exception))
        with self.assertRaises(gpumem.GpumemError) as caught:
            gpumem.Allocator("engine:warp", from_environment=False)
        self.assertIn("bad value 'warp' for key 'engine'", str(caught.exception))
        self.assertEqual(caught.exception.status, 4)
        closed = gpumem.Allocator("backend:sim,capacity:1GiB", from_environment=False)
        closed.close()
        for call in (lambda: closed.malloc(4096), lambda: closed.memory_stats(), lambda: closed.empty_cache()):
            with self.assertRaises(gpumem.GpumemError) as caught:
                call()
            self.assertIn("allocator is NULL (this gpumem.Allocator was closed)", str(caught.exception))

    def test_pointers_and_peers_out_of_range_are_refused(self):
        # ctypes wrapped them: free(p + 2**64) freed p, allocation_size(p + 2**64) was p's, peer 2**40 was 0.
        pointer = self.allocator.malloc(1 << 20)
        for call in (self.allocator.free, self.allocator.allocation_size, self.allocator.host_free,
                     lambda wrapped: self.allocator.record_stream(wrapped, 0),
                     lambda wrapped: self.allocator.host_record_stream(wrapped, 0)):
            with self.assertRaises(OverflowError) as caught:
                call(pointer + 2**64)
            self.assertIn("pointer must be at most 2**64 - 1", str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            self.allocator.free(-1)
        self.assertIn("pointer must not be negative", str(caught.exception))
        with self.assertRaises(TypeError):
            self.allocator.free(1.5)
        self.assertEqual(self.allocator.memory_stats()["allocated_bytes.all.current"], 1 << 20)  # still live
        self.assertEqual(self.allocator.allocation_size(pointer), 1 << 20)
        self.allocator.free(None)  # NULL, as free(NULL)
        self.allocator.free(pointer)
        with self.assertRaises(OverflowError) as caught:
            self.allocator.enable_peer_access(2**40)
        self.assertIn("peer must be a device number, not 1099511627776", str(caught.exception))

    def test_running_a_missing_script_says_so(self):
        """python -m gpumem.torch of a file that is not there: python's message and status, not a traceback
        from runpy after gpumem was installed (no torch needed to see it)."""
        run = subprocess.run([sys.executable, "-m", "gpumem.torch", "no-such-script.py"], capture_output=True,
                             text=True, env=dict(os.environ, PYTHONPATH=PYTHON_FOLDER))
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertIn("can't open file 'no-such-script.py': no such file or directory", run.stderr)
        self.assertNotIn("Traceback", run.stderr)

    def test_configurations_that_are_not_strings_are_type_errors(self):
        # Allocator(None) and check_configuration(5) were AttributeErrors ('NoneType' object has no attribute
        # 'encode'); bytes too.
        for config in (None, 5, b"backend:sim"):
            with self.assertRaises(TypeError) as caught:
                gpumem.Allocator(config)
            self.assertIn(f"config must be a str (GPUMEM_CONF-style KEY:VALUE,...), not {type(config).__name__}",
                          str(caught.exception))
        for config in (5, b"x"):
            with self.assertRaises(TypeError):
                gpumem.check_configuration(config)
        gpumem.check_configuration(None)  # no configuration: GPUMEM_CONF alone
        # The library reads a string up to a NUL: what follows it was never checked.
        for call in (lambda: gpumem.check_configuration("capacity:1GiB\0,bogus:1"),
                     lambda: gpumem.Allocator("backend:sim,capacity:1GiB\0,bogus", from_environment=False)):
            with self.assertRaises(ValueError) as caught:
                call()
            self.assertIn("holds a NUL character", str(caught.exception))

    def test_sizes_and_streams_out_of_range_are_refused(self):
        # ctypes wrapped them: malloc(2**64 + 4096) gave a 4096-byte block, stream -1 became 2**64 - 1.
        for call in (lambda: self.allocator.malloc(2**64 + 4096), lambda: self.allocator.malloc(2**64),
                     lambda: self.allocator.host_malloc(2**70), lambda: self.allocator.set_memory_limit(2**64)):
            with self.assertRaises(OverflowError) as caught:
                call()
            self.assertIn("at most 2**64 - 1", str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            self.allocator.malloc(-4096)
        self.assertIn("size must not be negative", str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            self.allocator.malloc(4096, stream=-1)
        self.assertIn("stream must not be negative", str(caught.exception))
        with self.assertRaises(OverflowError):
            self.allocator.malloc(4096, stream=2**64)
        pointer = self.allocator.malloc(4096)
        with self.assertRaises(ValueError):
            self.allocator.record_stream(pointer, -2)
        with self.assertRaises(TypeError):
            self.allocator.malloc(4096.0)
        self.allocator.free(pointer)
        self.assertEqual(self.allocator.memory_stats()["allocation.all.allocated"], 1)  # nothing else was made
        with self.assertRaises(gpumem.OutOfMemoryError):
            self.allocator.malloc(2**64 - 1)  # representable: the library's answer

    def test_pinned_host_cache(self):
        pointer = self.allocator.host_malloc(1000)
        self.assertNotEqual(pointer, 0)
        self.allocator.host_record_stream(pointer, 1)  # the legacy default stream: asked later
        self.allocator.host_free(pointer)
        with self.assertRaises(gpumem.GpumemError) as caught:
            self.allocator.host_free(pointer)
        self.assertIn("not a live pinned host allocation", str(caught.exception))
        stats = self.allocator.host_stats()
        self.assertEqual(stats["allocated_bytes"]["peak"], 1024)
        self.assertEqual(stats["reserved_bytes"]["current"], 1024)
        self.assertEqual(stats["pending_blocks"], 1)  # stream 1 is asked later, by the next look
        self.assertEqual((stats["cache_hits"], stats["cache_misses"], stats["host_allocations"]), (0, 1, 1))
        self.allocator.host_empty_cache()  # the look finds stream 1 idle: the block goes back
        stats = self.allocator.host_stats()
        self.assertEqual((stats["reserved_bytes"]["current"], stats["host_frees"], stats["pending_blocks"]), (0, 1, 0))
        pointer = self.allocator.host_malloc(1000)
        self.allocator.host_free(pointer, {3, 4})  # gm_host_free_with_streams; streams of their own: asked now
        self.assertEqual(self.allocator.host_stats()["pending_blocks"], 0)  # both idle: reusable at once
        pointer = self.allocator.host_malloc(1000)
        self.allocator.host_free(pointer, [0, 1])  # the legacy default stream: asked later
        with self.assertRaises(gpumem.GpumemError):
            self.allocator.host_free(pointer, [3])
        with self.assertRaises(ValueError):
            self.allocator.host_free(self.allocator.host_malloc(1000), [-1])
        self.assertEqual(self.allocator.host_stats()["pending_blocks"], 1)

    def test_memory_limit(self):
        self.allocator.set_memory_limit(64 << 20)
        self.assertEqual(self.allocator.memory_limit(), 64 << 20)
        with self.assertRaises(gpumem.OutOfMemoryError) as caught:
            self.allocator.malloc(100 << 20)
        self.assertIn("memory limit", str(caught.exception))

    def test_summary_and_device_info(self):
        pointer = self.allocator.malloc(5 << 20)
        table = self.allocator.summary()
        self.assertIn("gpumem memory summary, sim device ID 0", table)
        self.assertIn("| Allocated memory      |   5120 KiB |", table)
        self.allocator.free(pointer)
        info = self.allocator.device_info()
        self.assertEqual(info["backend"], "sim")
        self.assertEqual(info["total_bytes"], 1 << 30)
        self.assertEqual(info["engine"], "pages")
        self.assertIn("memory_limit", gpumem.config_help())

    def test_environment_configuration(self):
        os.environ["GPUMEM_CONF"] = "engine:segments,capacity:2GiB"
        try:
            with gpumem.Allocator("") as allocator:
                self.assertEqual(allocator.device_info()["engine"], "segments")
        finally:
            del os.environ["GPUMEM_CONF"]

    def test_a_configuration_is_checked_without_an_allocator(self):
        saved = os.environ.pop("GPUMEM_CONF", None)
        try:
            gpumem.check_configuration()
            gpumem.check_configuration("backend:cuda,device:3,max_chunk_size:8MiB")  # no GPU needed
            with self.assertRaises(gpumem.GpumemError) as caught:
                gpumem.check_configuration("max_chunk_size:8XB")
            self.assertEqual(caught.exception.status, 4)
            self.assertIn("size '8XB' has an unknown suffix", caught.exception.reason)
            os.environ["GPUMEM_CONF"] = "bogus:1"
            with self.assertRaises(gpumem.GpumemError) as caught:
                gpumem.check_configuration("history:10")
            self.assertTrue(caught.exception.reason.startswith("GPUMEM_CONF: unknown key 'bogus'"))
        finally:
            os.environ.pop("GPUMEM_CONF", None)
            if saved is not None:
                os.environ["GPUMEM_CONF"] = saved

    def test_torch_install_refuses_a_bad_configuration_first(self):
        # Before anything is compiled or swapped: PyTorch keeps its own allocator, and the error names
        # GPUMEM_TORCH when the string came from there (sitecustomize installs with it on import torch).
        import types
        import gpumem.torch
        fake = types.ModuleType("torch")
        fake.cuda = types.SimpleNamespace(is_initialized=lambda: False)
        saved_torch, saved_setting = sys.modules.get("torch"), os.environ.get("GPUMEM_TORCH")
        sys.modules["torch"] = fake
        os.environ["GPUMEM_TORCH"] = "compact_min:2XB"
        try:
            with self.assertRaises(gpumem.GpumemError) as caught:
                gpumem.torch.install("compact_min:2XB")
            self.assertEqual(str(caught.exception), "bad configuration: gpumem.torch.install('compact_min:2XB') "
                             "(GPUMEM_TORCH): bad value for key 'compact_min': size '2XB' has an unknown suffix "
                             "'XB' (use B, KiB, MiB, GiB or TiB; K, KB, M, MB, G, GB, T and TB mean the same powers of "
                             "1024, as in PyTorch's *_mb settings)")
            with self.assertRaises(gpumem.GpumemError) as caught:
                gpumem.torch.install("engine:warp")
            self.assertNotIn("GPUMEM_TORCH", str(caught.exception))
            self.assertIsNone(gpumem.torch._extension)
            self.assertFalse(gpumem.torch.is_installed())
        finally:
            if saved_torch is None:
                sys.modules.pop("torch", None)
            else:
                sys.modules["torch"] = saved_torch
            if saved_setting is None:
                os.environ.pop("GPUMEM_TORCH", None)
            else:
                os.environ["GPUMEM_TORCH"] = saved_setting

    def test_torch_devices_are_named_as_torch_cuda_names_them(self):
        # allocator("cuda:1") and allocator(torch.device("cuda", 1)) failed; so did defragment and
        # pressure_is_high, which go through it.
        import gpumem.torch
        allocators = [gpumem.Allocator("backend:sim,capacity:1GiB", from_environment=False) for _ in range(2)]
        torch = fake_torch_module()
        extension = types.SimpleNamespace(is_installed=lambda: True, handle=lambda index: allocators[index].address)
        saved = sys.modules.get("torch"), gpumem.torch._extension
        sys.modules["torch"], gpumem.torch._extension = torch, extension
        try:
            for device, index in ((None, 0), (1, 1), ("cuda", 0), ("cuda:1", 1), (torch.device("cuda", 1), 1),
                                  (torch.device("cuda"), 0)):
                self.assertEqual(gpumem.torch.allocator(device).address, allocators[index].address, device)
            for device, error in (("cpu", ValueError), (2, ValueError), (-1, ValueError), (1.0, TypeError)):
                with self.assertRaises(error, msg=device):
                    gpumem.torch.allocator(device)
            allocators[1].set_pressure_policy(high=0.5, low=0.25, signals="allocated")
            pointer = allocators[1].malloc(600 << 20)
            devices = (0, "cuda:1", torch.device("cuda", 1))
            self.assertEqual([gpumem.torch.pressure_is_high(device) for device in devices], [False, True, True])
            self.assertEqual(gpumem.torch.defragment("cuda:1"), 0)
            allocators[1].free(pointer)
        finally:
            gpumem.torch._extension = saved[1]
            if saved[0] is None:
                sys.modules.pop("torch", None)
            else:
                sys.modules["torch"] = saved[0]
            for allocator in allocators:
                allocator.close()

    def test_torch_install_twice_warns_of_another_configuration(self):
        import gpumem.torch
        installed = []
        extension = types.SimpleNamespace(install=installed.append, is_installed=lambda: bool(installed))
        saved = sys.modules.get("torch"), gpumem.torch._extension, gpumem.torch._installed_config
        sys.modules["torch"], gpumem.torch._extension = fake_torch_module(), extension
        try:
            gpumem.torch.install("engine:segments")
            gpumem.torch.install("engine:segments")  # the same: nothing to do
            gpumem.torch.install()  # none asked for: a script calling install() under GPUMEM_TORCH=KEYS
            with self.assertWarns(RuntimeWarning) as caught:  # was silently ignored
                gpumem.torch.install("engine:pages")
            self.assertIn("gpumem.torch.install('engine:pages'): gpumem is installed already, with "
                          "'engine:segments', which stays", str(caught.warning))
            self.assertEqual(installed, ["engine:segments"])
        finally:
            gpumem.torch._extension, gpumem.torch._installed_config = saved[1], saved[2]
            if saved[0] is None:
                sys.modules.pop("torch", None)
            else:
                sys.modules["torch"] = saved[0]

    def run_with_fake_torch(self, arguments, code, **environment):
        """Run python ARGUMENTS in a fresh folder (cwd) holding a stand-in torch and dir/train.py (code),
        with gpumem's python folder on PYTHONPATH (so its sitecustomize runs); (exit status, output)."""
        with tempfile.TemporaryDirectory() as folder:
            files = dict(FAKE_TORCH_FILES, **{"dir/train.py": textwrap.dedent(code),
                                              "dir/helper.py": "NAME = 'helper'\n"})
            for name, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
                with open(os.path.join(folder, name), "w") as file:
                    file.write(text)
            python = os.path.dirname(os.path.dirname(os.path.abspath(gpumem.__file__)))
            environment = dict(os.environ, PYTHONPATH=f"{python}{os.pathsep}{folder}", **environment)
            run = subprocess.run([sys.executable, *arguments], cwd=folder, env=environment, capture_output=True,
                                 text=True, timeout=120)
            return run.returncode, (run.stdout + run.stderr).replace(folder, "FOLDER")

    def test_python_m_gpumem_torch_runs_a_script_as_python_does(self):
        # sys.path[0] was the current folder, not the script's: `import helper` beside train.py failed.
        code = """
            import sys, helper, gpumem.torch
            print(helper.NAME, sys.path[0], sys.argv, gpumem.torch.is_installed())
        """
        status, out = self.run_with_fake_torch(["-m", "gpumem.torch", "dir/train.py", "a"], code)
        self.assertEqual((status, out), (0, "helper FOLDER/dir ['dir/train.py', 'a'] True\n"))
        status, out = self.run_with_fake_torch(["-m", "gpumem.torch", "dir/train.py"], code, GPUMEM_TORCH="off")
        self.assertEqual((status, out), (0, "helper FOLDER/dir ['dir/train.py'] True\n"))  # not a configuration

    def test_gpumem_torch_off_values_mean_off(self):
        # GPUMEM_TORCH=0 (false, no, off) was taken for a configuration: a parse error at `import torch`.
        code = "import torch, gpumem.torch; print(gpumem.torch.is_installed())\n"
        for setting in ("0", "false", "No", "off", ""):
            self.assertEqual(self.run_with_fake_torch(["dir/train.py"], code, GPUMEM_TORCH=setting), (0, "False\n"),
                             setting)
        self.assertEqual(self.run_with_fake_torch(["dir/train.py"], code, GPUMEM_TORCH="1"), (0, "True\n"))

    def test_no_gpu_is_a_clear_error(self):
        try:
            gpumem.Allocator("backend:cuda", from_environment=False).close()
        except gpumem.GpumemError as error:
            self.assertEqual(error.status, 5)
            self.assertIn("cuda backend", str(error))

    def test_library_is_found_from_the_environment(self):
        code = "import gpumem; print(gpumem.library_path())"
        environment = dict(os.environ, GPUMEM_LIBRARY="/nonexistent/libgpumem.so")
        run = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("libgpumem.so not found", run.stderr)

    def test_library_that_is_not_gpumem_is_a_clear_error(self):
        # A GPUMEM_LIBRARY that is not libgpumem gave a raw OSError or AttributeError.
        import _ctypes  # a shared library that loads but is not gpumem (unless built into the interpreter)
        with tempfile.TemporaryDirectory() as folder:
            text_file = os.path.join(folder, "libgpumem.so")
            with open(text_file, "w") as file:
                file.write("not a library\n")
            cases = [(text_file, "cannot be loaded")]
            if getattr(_ctypes, "__file__", None):
                cases.append((_ctypes.__file__, "is not libgpumem: it lacks gm_strerror"))
            for path, reason in cases:
                run = subprocess.run([sys.executable, "-c", "import gpumem"], capture_output=True, text=True,
                                     env=dict(os.environ, GPUMEM_LIBRARY=path))
                self.assertNotEqual(run.returncode, 0)
                self.assertIn(f"ImportError: gpumem: GPUMEM_LIBRARY={path} {reason}", run.stderr)
                self.assertNotIn("AttributeError", run.stderr)

    def _run_copy(self, code, install_paths=None, **environment):
        """Run `code` with a copy of the package outside the repository (no GPUMEM_LIBRARY), with an
        _install_paths.py as `cmake --install` writes it if given."""
        with tempfile.TemporaryDirectory() as folder:
            shutil.copytree(os.path.dirname(gpumem.__file__), os.path.join(folder, "gpumem"),
                            ignore=shutil.ignore_patterns("__pycache__", "_install_paths.py"))
            if install_paths is not None:
                library, include = install_paths
                with open(os.path.join(folder, "gpumem", "_install_paths.py"), "w") as paths:
                    paths.write(f"library = {library!r}\ninclude_directory = {include!r}\n")
            environment = dict(os.environ, PYTHONPATH=folder, **environment)
            environment.pop("GPUMEM_LIBRARY", None)
            return subprocess.run([sys.executable, "-c", code], env=environment, cwd=folder, capture_output=True,
                                  text=True)

    def test_library_is_found_where_cmake_install_recorded_it(self):
        library = gpumem.library_path()
        include = gpumem.include_path()
        run = self._run_copy("import gpumem; print(gpumem.library_path()); print(gpumem.include_path())",
                             install_paths=(library, include), LD_LIBRARY_PATH="")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stdout.split(), [library, include])

    def test_library_is_found_by_the_dynamic_linker_last(self):
        folder = os.path.dirname(gpumem.library_path())
        run = self._run_copy("import gpumem; print(gpumem.library_path())", LD_LIBRARY_PATH=folder)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stdout.strip(), os.path.join(folder, "libgpumem.so.0"))

    def test_library_not_found_lists_what_was_tried(self):
        run = self._run_copy("import gpumem; print(gpumem.library_path())", LD_LIBRARY_PATH="")
        if run.returncode == 0:
            self.skipTest(f"this system's dynamic linker finds a libgpumem.so.0: {run.stdout.strip()}")
        for tried in ("GPUMEM_LIBRARY: not set", "next to the package:", "the repository's build folders: this "
                      "package is not in a gpumem checkout", "installed by cmake --install: no record",
                      "the dynamic linker's search path: libgpumem.so.0"):
            self.assertIn(tried, run.stderr)

    def test_torch_module_imports_without_torch(self):
        import gpumem.torch  # importable; install() then needs torch
        self.assertFalse(gpumem.torch.is_installed())

    def test_adaptive_defragments_only_where_it_can(self):
        # What gpumem.torch.adaptive calls after an out-of-memory error: defragment's bytes, or 0 (the
        # step then splits) where defragment is refused, as under engine:segments.
        import gpumem.torch
        def refused(device=None, min_free_bytes=0):
            raise gpumem.GpumemError(7, "gm_defragment: the segments engine cannot split its memory")
        saved = gpumem.torch.defragment
        try:
            gpumem.torch.defragment = refused
            self.assertEqual(gpumem.torch._defragment_if_possible(), 0)
            gpumem.torch.defragment = lambda device=None, min_free_bytes=0: 8 << 20
            self.assertEqual(gpumem.torch._defragment_if_possible(), 8 << 20)
        finally:
            gpumem.torch.defragment = saved


if __name__ == "__main__":
    unittest.main()
