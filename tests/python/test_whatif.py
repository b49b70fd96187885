"""python -m gpumem.whatif on snapshots shaped as PyTorch's _dump_snapshot writes them (plain dicts in a
pickle; no torch needed): the trace it derives (with the blocks live throughout the history, which no
event names), PyTorch's reserved peak followed through the segment events, gpumem's peak matching
`gpumem replay` on the written trace, and clear errors for bad input."""
import io
import json
import os
import pickle
import subprocess
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

import gpumem.whatif as whatif

MiB = 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# torch.cuda.memory._dump_snapshot under gpumem on an H200 (tests/gpu/gpumem_snapshot.py), and the peak
# torch.cuda.max_memory_reserved() gave in that process.
GPUMEM_SNAPSHOT = os.path.join(ROOT, "data", "snapshots", "gpumem-mlp.pickle")
GPUMEM_SNAPSHOT_MAX_RESERVED = 358612992


def snapshot_of(entries, segments):
    return {"segments": segments, "device_traces": [entries]}


class WhatIfTest(unittest.TestCase):
    def setUp(self):
        self.directory = tempfile.TemporaryDirectory()
        self.addCleanup(self.directory.cleanup)
        # A tensor live before recording began (freed at 0x1000), a 20 MiB segment made, two tensors,
        # one freed on another stream, then the segment given back.
        self.entries = [
            {"action": "segment_alloc", "addr": 0x9000, "size": 20 * MiB, "stream": 7},
            {"action": "alloc", "addr": 0x9000, "size": 8 * MiB, "stream": 7},
            {"action": "alloc", "addr": 0x9000 + 8 * MiB, "size": 4 * MiB, "stream": 7},
            {"action": "free_requested", "addr": 0x1000, "size": 2 * MiB, "stream": 7},
            {"action": "free_completed", "addr": 0x1000, "size": 2 * MiB, "stream": 7},
            {"action": "free_requested", "addr": 0x9000, "size": 8 * MiB, "stream": 7},
            {"action": "alloc", "addr": 0xA000, "size": 512, "stream": 99},
            {"action": "free_requested", "addr": 0xA000, "size": 512, "stream": 99},
            {"action": "free_requested", "addr": 0x9000 + 8 * MiB, "size": 4 * MiB, "stream": 7},
            {"action": "segment_free", "addr": 0x9000, "size": 20 * MiB, "stream": 7},
        ]
        # At the snapshot only the first 2 MiB segment (where the early tensor lived) is left.
        self.segments = [{"device": 0, "address": 0x1000, "total_size": 2 * MiB, "stream": 7, "blocks": []}]

    def write(self, value, name="snap.pickle"):
        path = os.path.join(self.directory.name, name)
        with open(path, "wb") as file:
            pickle.dump(value, file)
        return path

    def test_trace_and_native_peak(self):
        operations, native_peak = whatif.to_trace(snapshot_of(self.entries, self.segments))
        self.assertEqual(operations[0], ("a", 2, 2 * MiB, 0))  # the early tensor comes first
        self.assertEqual([kind for kind, *_ in operations], ["a", "a", "a", "f", "f", "a", "f", "f"])
        self.assertEqual(operations[5], ("a", 3, 512, 1))      # the second stream is stream 1
        self.assertEqual(native_peak, 22 * MiB)                # 2 MiB held before, 20 MiB made

    def test_gpumem_peak_matches_gpumem_replay(self):
        path = self.write(snapshot_of(self.entries, self.segments))
        trace = os.path.join(self.directory.name, "trace.csv")
        output = io.StringIO()
        with redirect_stdout(output):
            self.assertEqual(whatif.main([path, "--json", "--trace", trace]), 0)
        result = json.loads(output.getvalue())
        self.assertEqual(result["native_peak_reserved_bytes"], 22 * MiB)
        self.assertEqual(result["peak_live_bytes"], 14 * MiB)
        self.assertGreaterEqual(result["gpumem_peak_reserved_bytes"], 14 * MiB)
        cli = os.environ.get("GPUMEM_CLI")
        if not cli:
            self.skipTest("GPUMEM_CLI (the gpumem command) is not set")
        replayed = subprocess.run([cli, "replay", trace, "--json"], capture_output=True, text=True, check=True,
                                  env={**os.environ, "GPUMEM_CONF": ""})
        replay = json.loads(replayed.stdout.splitlines()[0])
        self.assertEqual(replay["peak_reserved_bytes"], result["gpumem_peak_reserved_bytes"])
        self.assertEqual(replay["peak_live_bytes"], result["peak_live_bytes"])

    def test_a_snapshot_dumped_under_gpumem_becomes_a_trace_for_gpumem_tune(self):
        operations, reserved_peak = whatif.to_trace(whatif.load(GPUMEM_SNAPSHOT))
        kinds = [kind for kind, *_ in operations]
        # Five steps: 104 allocations and 101 frees, and first the 4 blocks made before recording began and
        # live to the end (the weights and biases: 2 x 16 MiB, 16 KiB, 4 KiB), which no event names.
        self.assertEqual((kinds.count("a"), kinds.count("f")), (108, 101))
        self.assertEqual([size for _, _, size, _ in operations[:4]], [16384, 4096, 16 * MiB, 16 * MiB])
        self.assertEqual(reserved_peak, GPUMEM_SNAPSHOT_MAX_RESERVED)
        trace = os.path.join(self.directory.name, "trace.csv")
        output = io.StringIO()
        with redirect_stdout(output):
            self.assertEqual(whatif.main([GPUMEM_SNAPSHOT, "--json", "--trace", trace]), 0)
        replayed = json.loads(output.getvalue())
        self.assertEqual(replayed["peak_live_bytes"], 353411208)  # without the weights: 32 MiB less
        self.assertGreaterEqual(replayed["gpumem_peak_reserved_bytes"], replayed["peak_live_bytes"])
        tuned = subprocess.run([os.environ["GPUMEM_CLI"], "tune", trace, "--json"], capture_output=True, text=True,
                               env={**os.environ, "GPUMEM_CONF": ""})
        self.assertEqual(tuned.returncode, 0, tuned.stderr)
        result = json.loads(tuned.stdout)
        self.assertEqual(result["peak_live_bytes"], replayed["peak_live_bytes"])
        first_pass = replayed["gpumem_peak_reserved_bytes"] / replayed["peak_live_bytes"]
        for candidate in result["candidates"]:
            self.assertTrue(candidate["ran"] and candidate["failed_allocations"] == 0, candidate)
        self.assertAlmostEqual(result["candidates"][0]["ratios"][0], first_pass, places=6)

    def test_blocks_live_throughout_the_history_are_allocated_first(self):
        """Blocks the segments hold allocated at the end that no event names were live all along: allocated
        at the start, with the segment's stream. Not the block whose free the history holds (pending, for a
        stream), nor inactive blocks, nor another device's."""
        entries = [{"action": "alloc", "addr": 0x100000, "size": MiB, "stream": 7},
                   {"action": "free_requested", "addr": 0x100000, "size": MiB, "stream": 7},
                   {"action": "alloc", "addr": 0x300000, "size": 3 * MiB, "stream": 7}]
        weights = {"address": 0x400000, "size": 4 * MiB, "requested_size": 4 * MiB - 100, "state": "active_allocated"}
        segments = [
            {"device": 0, "address": 0x100000, "total_size": 12 * MiB, "stream": 5, "blocks": [
                {"size": MiB, "state": "active_pending_free"},   # freed in the history, waiting for a stream
                {"size": MiB, "state": "inactive"},
                {"size": 3 * MiB, "state": "active_allocated"},  # allocated in the history
                weights,
                {"address": 0x800000, "size": 2 * MiB, "requested_size": 2 * MiB, "state": "active_pending_free"},
                {"address": 0xA00000, "size": MiB, "state": "inactive"}]},
            {"device": 1, "address": 0xF00000, "total_size": 2 * MiB, "stream": 5,
             "blocks": [{"size": 2 * MiB, "state": "active_allocated"}]}]
        operations, _ = whatif.to_trace(snapshot_of(entries, segments))
        self.assertEqual(operations[:2], [("a", 2, 4 * MiB - 100, 1), ("a", 3, 2 * MiB, 1)])
        self.assertEqual([kind for kind, *_ in operations[2:]], ["a", "f", "a"])
        self.assertEqual(whatif.replay(operations)[0], 9 * MiB - 100)  # the peak live: 6 MiB held throughout

    def test_text_output(self):
        output = io.StringIO()
        with redirect_stdout(output):
            self.assertEqual(whatif.main([self.write(snapshot_of(self.entries, self.segments))]), 0)
        self.assertIn("your peak reserved was 22.0 MiB", output.getvalue())
        self.assertIn("under gpumem it would be ", output.getvalue())

    def test_the_simulated_device_takes_the_capacity_given(self):
        """--conf capacity:SIZE is the simulated device's memory (a snapshot does not say its GPU's): on a
        device smaller than the live peak (14 MiB) the replay fails with out of memory; on one just
        large enough it fits."""
        path = self.write(snapshot_of(self.entries, self.segments))
        errors = io.StringIO()
        with redirect_stderr(errors):
            self.assertEqual(whatif.main([path, "--conf", "capacity:8MiB"]), 1)
        self.assertIn("the replay failed", errors.getvalue())
        self.assertIn("out of memory", errors.getvalue())
        output = io.StringIO()
        with redirect_stdout(output):
            self.assertEqual(whatif.main([path, "--json", "--conf", "capacity:64MiB"]), 0)
        self.assertLessEqual(json.loads(output.getvalue())["gpumem_peak_reserved_bytes"], 64 * MiB)

    def test_bad_input_is_a_clear_error(self):
        class Evil:
            def __reduce__(self):
                return (os.system, ("true",))

        cases = {
            self.write({"segments": []}, "no_history.pickle"): "no 'device_traces'",
            self.write(snapshot_of([], []), "empty.pickle"): "no history for device 0",
            self.write(Evil(), "evil.pickle"): "it pickles",
            os.path.join(self.directory.name, "missing.pickle"): "cannot read",
        }
        with open(os.path.join(self.directory.name, "text.pickle"), "w") as file:
            file.write("not a pickle")
        cases[os.path.join(self.directory.name, "text.pickle")] = "not a memory snapshot"
        for path, message in cases.items():
            errors = io.StringIO()
            with redirect_stderr(errors):
                self.assertEqual(whatif.main([path]), 1)
            self.assertIn(message, errors.getvalue())
            self.assertLessEqual(errors.getvalue().count("not a memory snapshot"), 1)  # evil.pickle's said it twice

    def assert_refused(self, arguments, message):
        errors = io.StringIO()
        with redirect_stderr(errors), redirect_stdout(io.StringIO()):
            self.assertEqual(whatif.main(arguments), 1, arguments)
        self.assertTrue(errors.getvalue().startswith("gpumem.whatif: "), errors.getvalue())
        self.assertIn(message, errors.getvalue())

    def test_malformed_snapshots_are_clear_errors(self):
        """Each was a Python traceback, a wrapped number passed on, or a wrong peak."""
        def alloc(**fields):
            return {"action": "alloc", "addr": 1, "size": 512, "stream": 0, **fields}
        cases = [
            ({"device_traces": [[1, 2, 3]]}, "device_traces[0][0] must be a dict, not int"),
            ({"device_traces": [5]}, "device_traces[0] must be a list, not int"),
            ({"device_traces": [{"a": 1}]}, "device_traces[0] must be a list, not dict"),
            ({"device_traces": [[alloc()]], "segments": 5}, "segments must be a list, not int"),
            ({"device_traces": [[alloc()]], "segments": [None]}, "segments[0] must be a dict, not NoneType"),
            ({"device_traces": [[alloc(size=None)]]}, "'size' must be an integer, not None"),
            ({"device_traces": [[alloc(size="512")]]}, "'size' must be an integer, not '512'"),
            ({"device_traces": [[alloc(size=512.0)]]}, "'size' must be an integer, not 512.0"),
            ({"device_traces": [[alloc(size=-512)]]}, "'size' must be a size in 0 .. 2**64 - 1, not -512"),
            ({"device_traces": [[alloc(size=2**70)]]}, "'size' must be a size in 0 .. 2**64 - 1"),
            ({"device_traces": [[alloc(stream=[1])]]}, "'stream' must be an integer, not [1]"),
            ({"device_traces": [[alloc()]], "segments": [{"device": 0, "address": 1, "total_size": MiB,
                                                           "blocks": [{"size": "x", "state": "inactive"}]}]},
             "'size' must be an integer, not 'x'"),
            # A segment_alloc of 20 MiB, and no segment at the end to have held it: the reservation at the
            # start would be -20 MiB (its peak was reported as 0).
            ({"device_traces": [[{"action": "segment_alloc", "addr": 1, "size": 20 * MiB}, alloc()]]},
             "segment events reserve 20971520 bytes more than its segments hold at the end"),
            # Histories that contradict themselves: two allocations at one live address (the first never
            # freed in the trace), and one address freed twice (the second taken for an early block).
            ({"device_traces": [[alloc(), alloc()]]}, "allocates at 0x1, which it has not freed"),
            ({"device_traces": [[alloc(), alloc(action="free_requested"), alloc(action="free_requested")]]},
             "frees 0x1 twice without an allocation between"),
            ({"device_traces": [[alloc(action=["alloc"])]]}, "its action is ['alloc'], not a name"),
        ]
        for index, (snapshot, message) in enumerate(cases):
            path = self.write(snapshot, f"bad{index}.pickle")
            self.assert_refused([path], f"{path}: ")
            self.assert_refused([path], message)

    def test_devices_out_of_range_and_damaged_pickles_are_clear_errors(self):
        two = self.write({"device_traces": [[{"action": "alloc", "addr": 1, "size": 512}],
                                            [{"action": "alloc", "addr": 1, "size": 1024}]]}, "two.pickle")
        for device in ("-1", "-3"):  # -1 took the last device, -3 was an IndexError
            self.assert_refused([two, "--device", device],
                                f"--device must be a device number (0 or more), not {device}")
        self.assert_refused([two, "--device", "2"], "no history for device 2")
        damaged = {"overflow.pickle": (b"\x80\x04\x8d" + (2**63 + 5).to_bytes(8, "little"), "BINUNICODE exceeds"),
                   "memory.pickle": (b"\x80\x04\x8d" + (2**50).to_bytes(8, "little") + b"abc", "(MemoryError)")}
        for name, (data, message) in damaged.items():
            path = os.path.join(self.directory.name, name)
            with open(path, "wb") as file:
                file.write(data)
            self.assert_refused([path], f"{name}: not a memory snapshot")
            self.assert_refused([path], message)


if __name__ == "__main__":
    unittest.main()
