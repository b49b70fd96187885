"""bench/repeat_steps.py: a trace's steps repeated with the allocations it never frees made once --
the copies' ids distinct, the kept allocations only in the first copy, every freed allocation in every
copy -- and a bad trace or a bad count refused with a message and a non-zero exit status.
"""
import gzip
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(ROOT, "bench", "repeat_steps.py")

TRACE = """# op,id,size,stream
a,0,4096,0
a,1,1048576,0
a,2,2048,1
f,1,1048576,0
f,2,2048,1
a,3,512,0
"""


class RepeatStepsTest(unittest.TestCase):
    def run_script(self, *arguments):
        return subprocess.run([sys.executable, SCRIPT, *arguments], capture_output=True, text=True)

    def test_kept_allocations_are_made_once_and_the_steps_repeat(self):
        with tempfile.TemporaryDirectory() as folder:
            source, out = os.path.join(folder, "t.csv"), os.path.join(folder, "out.csv.gz")
            with open(source, "w") as trace:
                trace.write(TRACE)
            run = self.run_script(source, "3", out)
            self.assertEqual(run.returncode, 0, run.stderr)
            with gzip.open(out, "rt") as lines:
                events = [line.strip().split(",") for line in lines if not line.startswith("#")]
        allocations = [e for e in events if e[0] == "a"]
        # ids 0 and 3 are never freed: once; 1 and 2 in each of the three copies.
        self.assertEqual(len(allocations), 2 + 2 * 3)
        self.assertEqual(len({e[1] for e in allocations}), len(allocations))
        self.assertEqual(sum(e[2] == "4096" for e in allocations), 1)
        self.assertEqual(sum(e[2] == "512" for e in allocations), 1)
        self.assertEqual(sum(e[2] == "1048576" for e in allocations), 3)
        frees = [e for e in events if e[0] == "f"]
        self.assertEqual(len(frees), 6)
        live = set()
        for kind, ident, size, stream in events:  # every free names a live allocation of its copy
            if kind == "a":
                live.add(ident)
            else:
                self.assertIn(ident, live)
                live.remove(ident)
        self.assertEqual(sorted(e[3] for e in allocations if e[2] == "2048"), ["1", "1", "1"])

    def test_bad_inputs_are_refused(self):
        with tempfile.TemporaryDirectory() as folder:
            bad, out = os.path.join(folder, "bad.csv"), os.path.join(folder, "out.csv.gz")
            with open(bad, "w") as trace:
                trace.write("a,0,12\n")
            malformed = self.run_script(bad, "2", out)
            missing = self.run_script(os.path.join(folder, "missing.csv"), "2", out)
            zero = self.run_script(bad, "0", out)
        self.assertEqual(malformed.returncode, 1)
        self.assertIn("not a trace line", malformed.stderr)
        self.assertEqual(missing.returncode, 1)
        self.assertIn("missing.csv", missing.stderr)
        self.assertNotEqual(zero.returncode, 0)
        self.assertIn("REPEATS", zero.stderr)


if __name__ == "__main__":
    unittest.main()
