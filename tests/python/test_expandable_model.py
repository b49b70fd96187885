"""bench/expandable_model.py, the model of PyTorch's expandable segments: its rules on hand-made
requests (handles of 20 MiB and 2 MiB mapped at the segment's end, best fit that takes the end block
last, the split rule of each pool, merging on free), its replay of the recorded traces against what
expandable segments reserved on the H200 (data/traces-more/anchors.json), and a bad trace refused with
a message and exit status 1.
"""
import gzip
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import expandable_model as model  # noqa: E402
from trace_file import read_events  # noqa: E402

MIB = 1 << 20


class RulesTest(unittest.TestCase):
    def test_the_end_grows_by_whole_handles(self):
        segment = model.Segment("large")
        segment.allocate(30 * MIB)
        self.assertEqual(segment.mapped, 40 * MIB)
        small = model.Segment("small")
        small.allocate(300 * 1024)
        self.assertEqual(small.mapped, 2 * MIB)

    def test_a_freed_block_serves_a_smaller_request_without_growth(self):
        segment = model.Segment("large")
        block = segment.allocate(30 * MIB)
        segment.release(block)
        again = segment.allocate(10 * MIB)
        self.assertEqual(again.address, 0)
        self.assertEqual(segment.mapped, 40 * MIB)

    def test_the_end_block_is_taken_last(self):
        segment = model.Segment("large")
        first = segment.allocate(20 * MIB)
        segment.allocate(2 * MIB)
        segment.allocate(20 * MIB)  # mapped 60 MiB; 18 MiB free at the end
        segment.release(first)  # 20 MiB free at address 0
        # Plain best fit would take the 18 MiB at the end; expandable segments keep it to grow.
        self.assertEqual(segment.allocate(10 * MIB).address, 0)
        # With no other fit, the end block is taken (and grows).
        self.assertEqual(segment.allocate(15 * MIB).address, 42 * MIB)
        self.assertEqual(segment.mapped, 60 * MIB)

    def test_large_blocks_split_only_above_one_mib(self):
        segment = model.Segment("large")
        whole = segment.allocate(19 * MIB + 512 * 1024)  # 0.5 MiB left over: not split
        self.assertEqual(whole.size, 20 * MIB)
        segment.allocate(2 * MIB)
        self.assertEqual(segment.mapped, 40 * MIB)
        small = model.Segment("small")
        part = small.allocate(1024)  # 2 MiB handle split at 512 bytes' grain
        self.assertEqual(part.size, 1024)
        self.assertEqual(small.allocate(512).address, 1024)

    def test_freed_neighbours_merge(self):
        segment = model.Segment("large")
        blocks = [segment.allocate(4 * MIB) for _ in range(3)]
        for block in blocks[:2]:
            segment.release(block)
        merged = segment.allocate(8 * MIB)  # only the two freed blocks together hold it
        self.assertEqual(merged.address, 0)
        self.assertEqual(segment.mapped, 20 * MIB)


class AnchorsTest(unittest.TestCase):
    def test_the_recorded_traces_reserve_what_expandable_segments_did(self):
        folder = os.path.join(ROOT, "data", "traces-more")
        with open(os.path.join(folder, "anchors.json")) as file:
            anchors = json.load(file)["traces"]
        self.assertEqual(len(anchors), 8)
        for name, anchor in sorted(anchors.items()):
            events = read_events(os.path.join(folder, name + ".csv.gz"))
            first, second = model.replay(events, 2)
            measured = anchor["replay"]["torch-expandable"]["ratio"]
            self.assertAlmostEqual(first["ratio"], measured, delta=0.0025, msg=name)
            # Everything freed between passes: the segment is one free block and the pass repeats.
            self.assertEqual(second["peak_reserved_bytes"], first["peak_reserved_bytes"], name)


class CommandTest(unittest.TestCase):
    def run_model(self, *arguments):
        return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "expandable_model.py"), *arguments],
                              capture_output=True, text=True)

    def test_one_line_per_pass(self):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "t.csv.gz")
            with gzip.open(path, "wt") as trace:
                trace.write("# op,id,size,stream\na,0,31457280,0\nf,0,31457280,0\na,1,1048576,0\n")
            run = self.run_model(path, "--passes", "3")
        self.assertEqual(run.returncode, 0, run.stderr)
        passes = [json.loads(line) for line in run.stdout.splitlines()]
        self.assertEqual(len(passes), 3)
        self.assertEqual(passes[0]["peak_live_bytes"], 30 * MIB)
        # 30 MiB in two 20 MiB handles of the large pool; 1 MiB in one 2 MiB handle of the small pool
        self.assertEqual(passes[0]["peak_reserved_bytes"], 42 * MIB)
        self.assertEqual(passes[2]["peak_reserved_bytes"], 42 * MIB)

    def test_a_bad_trace_is_refused(self):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "bad.csv")
            with open(path, "w") as trace:
                trace.write("a,0,12\nnot a line\n")
            run = self.run_model(path)
            missing = self.run_model(os.path.join(folder, "missing.csv"))
        self.assertEqual(run.returncode, 1)
        self.assertIn("not a trace line", run.stderr)
        self.assertEqual(missing.returncode, 1)
        self.assertIn("missing.csv", missing.stderr)


if __name__ == "__main__":
    unittest.main()
