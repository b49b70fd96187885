"""bench/smaller_devices.py: a trace replayed several times on one allocator on a simulated device a few
times its live peak; the rows, the warm passes' device time and the count of settled rows it prints."""
import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "smaller_devices.py")
TRACE = os.path.join(ROOT, "data", "traces", "resnet50.csv.gz")


class SmallerDevicesTest(unittest.TestCase):
    def setUp(self):
        self.gpumem = os.environ.get("GPUMEM_CLI")
        if not self.gpumem:
            self.skipTest("GPUMEM_CLI (the gpumem command) is not set")

    def run_script(self, *arguments):
        return subprocess.run([sys.executable, SCRIPT, "--gpumem", self.gpumem, *arguments], capture_output=True,
                              text=True)

    def tables(self, output):
        """{title: [row cells]} of each table printed."""
        tables, title = {}, None
        for line in output.splitlines():
            if line.endswith(" passes"):
                title = line
                tables[title] = []
            elif line.startswith("| resnet50"):
                tables[title].append(line.strip("| ").split(" | "))
        return tables

    def test_a_row_per_trace_and_device_with_its_warm_passes(self):
        """resnet50 on a device twice its live peak, three passes: under chunk_room_share:0 (chunks of
        max_chunk_size whatever the room) its warm passes spend nothing and its ratio stays within a thousandth
        of the first pass's, so the row counts as settled; so does the defaults' row, whose small chunks get a slack there
        (docs/engine.md, "Limits known today"), and without it (move_slack:0.001) the warm passes move
        chunks."""
        run = self.run_script("--factors", "2", "--passes", "3", "--conf", "chunk_room_share:0", "--conf",
                              "move_slack:0.001", TRACE)
        self.assertEqual(run.returncode, 0, run.stderr)
        tables = self.tables(run.stdout)
        self.assertEqual(list(tables), ["defaults, 3 passes", "chunk_room_share:0, 3 passes",
                                        "move_slack:0.001, 3 passes"], run.stdout)
        for rows in tables.values():
            self.assertEqual(len(rows), 1, run.stdout)
            trace, factor, first, last, most, total, failed = rows[0]
            self.assertEqual((trace, factor, failed), ("resnet50", "2", "0"))
            self.assertGreaterEqual(float(last), float(first))  # each pass's ratio is the peak so far
            self.assertGreater(float(first), 1.0)
            self.assertLessEqual(float(most), float(total))
        for title in ("defaults, 3 passes", "chunk_room_share:0, 3 passes"):
            trace, factor, first, last, most, total, failed = tables[title][0]
            self.assertEqual((most, total), ("0.0", "0.0"), title)
            self.assertLess(float(last) - float(first), 0.001, title)
        trace, factor, first, last, most, total, failed = tables["move_slack:0.001, 3 passes"][0]
        self.assertGreater(float(most), 1.0)
        self.assertEqual(run.stdout.count("settled (every warm pass under 1 ms, nothing failed): 1 of 1"), 2,
                         run.stdout)
        self.assertEqual(run.stdout.count("settled (every warm pass under 1 ms, nothing failed): 0 of 1"), 1,
                         run.stdout)

    def test_a_pass_that_runs_out_of_memory_ends_the_row(self):
        """On a device barely above resnet50's live peak with one chunk per growth the replay runs out of
        memory: the row counts the failed allocations and says in which pass the replay stopped."""
        run = self.run_script("--factors", "1.001", "--passes", "3", "--conf", "chunk_room_share:0", TRACE)
        self.assertEqual(run.returncode, 0, run.stderr)
        trace, factor, first, last, most, total, failed = self.tables(run.stdout)["chunk_room_share:0, 3 passes"][0]
        self.assertGreater(int(failed), 0)
        self.assertRegex(last, r"^1\.\d{4} \(pass [12]\)$")
        self.assertIn("settled (every warm pass under 1 ms, nothing failed): 0 of 1", run.stdout)

    def test_bad_arguments_are_refused(self):
        run = self.run_script("--passes", "1", TRACE)
        self.assertEqual(run.returncode, 1)
        self.assertIn("--passes must be at least 2", run.stderr)
        run = self.run_script("--factors", "0.5", TRACE)
        self.assertEqual(run.returncode, 2)
        self.assertIn("argument --factors", run.stderr)
        run = subprocess.run([sys.executable, SCRIPT, "--gpumem", os.path.join(ROOT, "no-such-gpumem"), TRACE],
                             capture_output=True, text=True)
        self.assertEqual(run.returncode, 1)
        self.assertIn("no-such-gpumem is not the gpumem command", run.stderr)
        self.assertNotIn("Traceback", run.stderr)
        run = self.run_script("--conf", "no_such_key:1", TRACE)
        self.assertEqual(run.returncode, 1)
        self.assertIn("no_such_key", run.stderr)
        self.assertNotIn("Traceback", run.stderr)


if __name__ == "__main__":
    unittest.main()
