"""bench/near_capacity.py: a trace replayed on a simulated device a little larger than its live peak,
under the defaults and the remedies of gpumem's out-of-memory report; the cells and totals it prints."""
import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "near_capacity.py")
GPU_SCRIPT = os.path.join(ROOT, "bench", "near_capacity_gpu.py")
TRACE = os.path.join(ROOT, "data", "traces-more", "vit-seed1.csv.gz")


class NearCapacityTest(unittest.TestCase):
    def setUp(self):
        self.gpumem = os.environ.get("GPUMEM_CLI")
        if not self.gpumem:
            self.skipTest("GPUMEM_CLI (the gpumem command) is not set")

    def test_the_remedies_fit_where_one_chunk_per_growth_does_not(self):
        """ViT seed 1 on a device 1.01 times its live peak: 128 MiB chunks pinned by live blocks leave the
        engine short without the room share (chunk_room_share:0; docs/benchmarks.md, "Near the device's
        capacity"); the defaults, whose chunks shrink with the room left, fit, and so do the page-sized
        chunks the report offers first."""
        run = subprocess.run([sys.executable, SCRIPT, "--gpumem", self.gpumem, "--factors", "1.01", TRACE],
                             capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        rows = [line.strip("| ").split(" | ") for line in run.stdout.splitlines() if line.startswith("| vit-seed1")]
        self.assertEqual(len(rows), 1, run.stdout)
        trace, live, factor, defaults, whole, pages, compact, fine = rows[0]
        self.assertEqual((trace, live, factor), ("vit-seed1", "9724.0", "1.01"))
        failed = lambda cell: int(cell.split(" / ")[0])  # noqa: E731
        self.assertGreater(failed(whole), 0)
        self.assertEqual(failed(defaults), 0)
        self.assertEqual(failed(pages), 0)
        self.assertGreater(float(defaults.split(" / ")[1]), float(whole.split(" / ")[1]))  # smaller chunks cost
        self.assertGreater(float(pages.split(" / ")[1]), float(whole.split(" / ")[1]))  # page-sized ones too
        self.assertIn("defaults: fits 1 of 1 (trace, capacity) pairs", run.stdout)
        self.assertIn("chunk_room_share:0 (one chunk per growth up to max_chunk_size): fits 0 of 1", run.stdout)
        self.assertIn("max_chunk_size:2MiB (page-sized chunks): fits 1 of 1 (trace, capacity) pairs", run.stdout)

    def test_the_grid_shows_the_smallest_device_that_fits(self):
        """--grid: ViT seed 1 fits on a device 1.005 times its live peak under the defaults, and without the
        room share fails there and at 1.01 too."""
        run = subprocess.run([sys.executable, SCRIPT, "--gpumem", self.gpumem, "--factors", "1.005,1.01", "--grid",
                              TRACE], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("| trace | configuration | 1.005 | 1.01 |", run.stdout)
        self.assertIn("| vit-seed1 | defaults | fits | fits |", run.stdout)
        rows = [line for line in run.stdout.splitlines() if line.startswith("| vit-seed1 | chunk_room_share:0 |")]
        self.assertEqual(len(rows), 1, run.stdout)
        self.assertRegex(rows[0], r"^\| vit-seed1 \| chunk_room_share:0 \| [1-9][0-9]* failed \| [1-9][0-9]* failed \|$")

    def test_bad_factors_are_refused(self):
        for factors in ("x", "0.5", "1.02,,1.03"):
            run = subprocess.run([sys.executable, SCRIPT, "--gpumem", self.gpumem, "--factors", factors, TRACE],
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 2, factors)
            self.assertIn("argument --factors", run.stderr)

    def test_a_failed_replay_is_reported(self):
        run = subprocess.run([sys.executable, SCRIPT, "--gpumem", self.gpumem, os.path.join(ROOT, "missing.csv.gz")],
                             capture_output=True, text=True)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("cannot open", run.stderr)


class GpuDriverArgumentsTest(unittest.TestCase):
    """bench/near_capacity_gpu.py (the H200's counterpart) checks its arguments before any GPU work: an
    unknown allocator is refused with the list of known ones, and nothing runs."""

    def test_unknown_allocators_are_refused(self):
        for allocators in ("gpumem,bogus", "", "gpumem whole"):
            run = subprocess.run([sys.executable, GPU_SCRIPT, "--allocators", allocators, "--runs", "vit:0"],
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 2, allocators)
            self.assertIn("argument --allocators: not a comma-separated list of torch-native, torch-expandable, "
                          "gpumem, gpumem-whole, gpumem-pages", run.stderr)
            self.assertEqual(run.stdout, "")

    def test_the_table_names_the_out_of_memory_error(self):
        """A run's error as the table shows it: PyTorch's sentence where the tail holds it, else gpumem's
        cause, never the report's closing note about PYTORCH_CUDA_ALLOC_CONF."""
        sys.path.insert(0, os.path.dirname(GPU_SCRIPT))
        try:
            import near_capacity_gpu
        finally:
            sys.path.pop(0)
        note = "gpumem is PyTorch's allocator in this process: PYTORCH_CUDA_ALLOC_CONF's allocator settings"
        whole = {"error": "Traceback\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 MiB\n"
                          "Cause: fragmentation. 2 MiB is free\n" + note}
        self.assertTrue(near_capacity_gpu.first_error_line(whole).startswith("torch.OutOfMemoryError: CUDA out"))
        cut = {"error": "ee in total\nCause: fragmentation. 227 MiB is free\n  1. remedy\n" + note}
        self.assertEqual(near_capacity_gpu.first_error_line(cut), "Cause: fragmentation. 227 MiB is free")
        self.assertEqual(near_capacity_gpu.first_error_line({"error": "", "exit": 3}), "exit status 3")


if __name__ == "__main__":
    unittest.main()
