"""bench/more_models_gpu.py on a machine with no GPU and no PyTorch, over the stand-in stack in
fake_gpu_stack/ (its losses are all 0.0, its ratios those of its fake caching allocator): one row per
run with the ratio of peak reserved to peak allocated, an allocator named twice run twice and labelled
"(again)", every loss compared with the first torch-native run, the peaks after every step in the
--out lines, and a crashed run reported as failed with a non-zero exit status.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DRIVER = os.path.join(ROOT, "bench", "more_models_gpu.py")
FAKE_STACK = os.path.join(HERE, "fake_gpu_stack")


def run_driver(*arguments, **fake):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_TORCH", "PYTORCH_CUDA_ALLOC_CONF"))}
    env.update(PYTHONPATH=FAKE_STACK, **fake)
    return subprocess.run([sys.executable, DRIVER, *arguments], env=env, capture_output=True, text=True)


def rows(text):
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| model")]


class MoreModelsTest(unittest.TestCase):
    def test_runs_labels_and_losses(self):
        run = run_driver("--runs", "vit:0,convnext:1", "--allocators", "torch-native,torch-expandable,torch-native",
                         "--steps", "1", "--warmup", "1")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        table = rows(run.stdout)
        self.assertEqual([row[:3] for row in table],
                         [["vit", "0", "torch-native"], ["vit", "0", "torch-expandable"],
                          ["vit", "0", "torch-native (again)"], ["convnext", "1", "torch-native"],
                          ["convnext", "1", "torch-expandable"], ["convnext", "1", "torch-native (again)"]])
        for row in table:
            allocated, reserved, ratio = float(row[3]), float(row[4]), float(row[5])
            self.assertGreater(allocated, 0)
            self.assertAlmostEqual(ratio, reserved / allocated, places=3)
            self.assertEqual(row[7], "identical")

    def test_peaks_after_every_step_are_recorded(self):
        with tempfile.TemporaryDirectory() as folder:
            out = os.path.join(folder, "runs.jsonl")
            run = run_driver("--runs", "vit:0", "--allocators", "torch-native", "--steps", "3", "--warmup", "1",
                             "--out", out)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            with open(out) as lines:
                result = json.loads(lines.readline())
        peaks = result["peaks_so_far_MiB"]
        self.assertEqual(len(peaks), 4)  # warm-up and measured steps
        for earlier, later in zip(peaks, peaks[1:]):
            self.assertLessEqual(earlier[0], later[0])
            self.assertLessEqual(earlier[1], later[1])
        self.assertGreater(peaks[-1][0], 0)
        self.assertAlmostEqual(peaks[-1][0], result["peak_alloc_MiB"], places=1)
        self.assertAlmostEqual(peaks[-1][1], result["peak_reserved_MiB"], places=1)

    def test_a_crash_is_a_failed_row_and_a_failure(self):
        run = run_driver("--runs", "vit:0", "--allocators", "torch-native,torch-expandable", "--steps", "1",
                         "--warmup", "0", FAKE_TORCH_CRASH="vit")
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        table = rows(run.stdout)
        self.assertEqual(len(table), 2)
        for row in table:
            self.assertIn("failed", row[3])
            self.assertIn("fake crash in vit", row[3])


if __name__ == "__main__":
    unittest.main()
