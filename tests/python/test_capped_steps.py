"""bench/capped_steps.py without a GPU: run_workload is replaced by a stand-in whose torch-native
needs 1000 MiB and gpumem 900 MiB of a 10000 MiB device, and whose steps are slower under a cap that
leaves less than 5% of room. Checked: the caps are the margins times the reference allocator's
uncapped peak, as fractions of the device; every run gets its cap; the table has a row per workload,
cap and allocator, with the median over repeats, the ratio to torch-native under the same cap, and
"did not fit" where a run ran out of memory; --empty-cache reaches every run.
"""
import contextlib
import io
import os
import sys
import unittest
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import capped_steps  # noqa: E402

NEED = {"torch-native": 1000.0, "gpumem": 900.0}
TOTAL = 10000.0


def fake_run_workload(name, allocator, steps, extra=(), sample=True, cpus=None):
    fake_run_workload.extras.append(tuple(extra))
    fraction = float(extra[extra.index("--memory-fraction") + 1]) if "--memory-fraction" in extra else None
    cap = fraction * TOTAL if fraction else TOTAL
    need = NEED[allocator]
    if need > cap:
        return {"oom": True, "peak_reserved_MiB": cap * 0.95, "allocator": allocator, "exit": 3}
    slow = 10.0 if cap < need * 1.05 else 0.0
    fake_run_workload.calls.append((name, allocator, fraction))
    return {"step_ms_median": 100.0 + slow + len(fake_run_workload.calls) % 2, "peak_reserved_MiB": need,
            "device_total_MiB": TOTAL, "allocator": allocator, "exit": 0}


def run_main(*arguments):
    fake_run_workload.calls = []
    fake_run_workload.extras = []
    output = io.StringIO()
    with mock.patch.object(capped_steps, "run_workload", fake_run_workload), \
            mock.patch.object(sys, "argv", ["capped_steps.py", *arguments]), \
            contextlib.redirect_stdout(output), contextlib.redirect_stderr(io.StringIO()):
        capped_steps.main()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in output.getvalue().splitlines()
            if line.startswith("| ") and not line.startswith("| workload")]
    return rows, fake_run_workload.calls, output.getvalue()


class CappedStepsTest(unittest.TestCase):
    def test_caps_relative_to_gpumem(self):
        rows, calls, _ = run_main("--workloads", "gpt2", "--relative-to", "gpumem", "--margins", "1.01,1.2",
                               "--repeats", "2")
        fractions = sorted({fraction for _, allocator, fraction in calls if fraction})
        self.assertEqual([round(f, 6) for f in fractions], [round(1.01 * 900 / TOTAL, 6), round(1.2 * 900 / TOTAL, 6)])
        self.assertEqual([row[1:3] for row in rows],
                         [["none", "torch-native"], ["none", "gpumem"],
                          ["1.01 x gpumem's peak", "torch-native"], ["1.01 x gpumem's peak", "gpumem"],
                          ["1.2 x gpumem's peak", "torch-native"], ["1.2 x gpumem's peak", "gpumem"]])
        self.assertIn("did not fit (2 of 2 runs)", rows[2][3])  # 909 MiB: torch-native needs 1000
        self.assertTrue(rows[3][3].startswith("110."), rows[3])  # under 5% of room: the slow steps
        self.assertEqual(rows[3][5], "")  # no torch-native median to compare with
        self.assertEqual(rows[4][5], "1.000")
        self.assertEqual(rows[5][6], "900")

    def test_caps_relative_to_native_and_ratios(self):
        rows, _, _ = run_main("--workloads", "resnet50", "--margins", "1.5", "--repeats", "3")
        self.assertEqual(len(rows), 4)
        native, gpumem = rows[2], rows[3]
        self.assertEqual(native[1], "1.5 x torch-native's peak")
        self.assertEqual(native[5], "1.000")
        self.assertAlmostEqual(float(gpumem[5]), float(gpumem[3]) / float(native[3]), places=2)

    def test_empty_cache_alone(self):
        rows, calls, text = run_main("--workloads", "gpt2", "--margins", "none", "--repeats", "2", "--empty-cache")
        self.assertEqual(len(calls), 4)  # no uncapped probe: no cap to compute
        self.assertTrue(all("--empty-cache" in extra and "--memory-fraction" not in extra
                            for extra in fake_run_workload.extras))
        self.assertIn("empty_cache()", text)
        self.assertEqual([row[1:3] for row in rows], [["none", "torch-native"], ["none", "gpumem"]])


if __name__ == "__main__":
    unittest.main()
