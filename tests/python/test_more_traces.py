"""bench/record_traces.py (with bench/more_workloads.py) and bench/more_traces_table.py, on a machine with
no GPU and no PyTorch.

- record_traces.py runs end to end as processes over the stand-in stack in fake_gpu_stack/ (a fake torch,
  numpy, torchvision), fake_diffusers/ (the unet's model) and fake_transformers/ (left out where the
  llama_varlen workload should be unavailable): each
  workload draws its shapes from random.Random(seed) and trains under bf16 autocast; the traces are
  gzipped in the shared format; each allocator's process loads the extension once and starts each trace
  from a fresh process's state, so the ratios are those of each trace alone; a crashed recording, an
  out-of-memory replay and an unavailable workload are reported as they are, with the right exit status;
- more_traces_table.py on synthetic traces and anchors: gpumem's ratio as `gpumem replay` gives it, the
  target min(1.02, torch-expandable's), pass or not, unavailable never a pass (needs GPUMEM_CLI, the
  gpumem command, as CTest sets it).
"""
import gzip
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RECORD = os.path.join(ROOT, "bench", "record_traces.py")
TABLE = os.path.join(ROOT, "bench", "more_traces_table.py")
FAKE_STACK = os.path.join(HERE, "fake_gpu_stack")
FAKE_DIFFUSERS = os.path.join(HERE, "fake_diffusers")
FAKE_TRANSFORMERS = os.path.join(HERE, "fake_transformers")
MiB = 2**20
ALLOCATORS = ["torch-native", "torch-expandable", "cuda-async"]
# The fake extension's allocators (fake_gpu_stack/torch/utils/cpp_extension.py): peak live rounded up to these.
MODEL_KIND = {"vit": "vit", "convnext": "convnext", "llama_varlen": "llama", "unet": "unet"}  # the fake models' names
UNIT = {"torch-native": 20 * MiB, "torch-expandable": 2 * MiB, "cuda-async": 32 * MiB}


def expected_inputs(workload, seed, steps):
    """The input shapes each step of WORKLOAD should draw with SEED (the forward pass's first input)."""
    draw = random.Random(seed)
    shapes = []
    for _ in range(steps):
        if workload == "vit":
            shapes.append([draw.choice([32, 64, 96, 128]), 3, 224, 224])
        elif workload == "convnext":
            side = draw.choice([160, 192, 224, 256, 288])
            shapes.append([64, 3, side, side])
        elif workload == "llama_varlen":
            length = draw.randint(128, 2048)
            shapes.append([max(1, 16384 // length), length])
        else:
            batch, side = draw.choice([16, 32, 48]), draw.choice([64, 128])
            shapes.append([batch, 3, side, side])
    return shapes


def read_trace(path):
    with gzip.open(path, "rt") as f:
        return f.read()


def peak_live(text):
    sizes, live, peak = {}, 0, 0
    for line in text.splitlines()[1:]:
        op, ident, size, _ = line.split(",")
        if op == "a":
            sizes[ident] = int(size)
            live += int(size)
            peak = max(peak, live)
        else:
            live -= sizes.pop(ident)
    return peak


class RecordTracesTest(unittest.TestCase):
    def run_driver(self, workloads, transformers=True, **fake):
        folder = tempfile.mkdtemp()
        self.addCleanup(subprocess.run, ["rm", "-rf", folder])
        log = os.path.join(folder, "calls.jsonl")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_TORCH", "PYTORCH_CUDA_ALLOC_CONF"))}
        env.update(PYTHONPATH=os.pathsep.join([FAKE_STACK, FAKE_DIFFUSERS] + ([FAKE_TRANSFORMERS] if transformers else [])),
                   FAKE_TORCH_LOG=log, **fake)
        out = os.path.join(folder, "out")
        run = subprocess.run([sys.executable, RECORD, "--out", out, "--workloads", ",".join(workloads),
                              "--seeds", "0,1", "--deadline", "120"], capture_output=True, text=True, env=env)
        with open(os.path.join(out, "anchors.json")) as f:
            document = json.load(f)
        with open(log) as f:
            calls = [json.loads(line) for line in f]
        return run, out, document, calls

    def check_recordings(self, out, document, calls, workloads):
        """Every trace recorded: its shapes, its training steps, its trace file and the entry's numbers."""
        seed_of = {pid: args[0] for pid, call, *args in calls if call == "manual_seed"}
        kind_of = {pid: args[0] for pid, call, *args in calls if call == "forward"}
        process = {(kind_of[pid], seed): pid for pid, seed in seed_of.items() if pid in kind_of}
        for workload in workloads:
            for seed in (0, 1):
                name = f"{workload}-seed{seed}"
                entry = document["traces"][name]
                pid = process[(MODEL_KIND[workload], seed)]
                mine = [call[1:] for call in calls if call[0] == pid]
                forwards = [c for c in mine if c[0] == "forward"]
                self.assertEqual([c[2] for c in forwards], expected_inputs(workload, seed, 6), name)
                self.assertTrue(all(c[3] == ["cuda", "bfloat16"] for c in forwards), name + ": forward not under autocast")
                self.assertEqual([c for c in mine if c[0] in ("forward", "backward", "optimizer_step", "zero_grad")],
                                 [c for f in forwards for c in (f, ["backward"], ["optimizer_step"], ["zero_grad", True])])
                self.assertEqual([c for c in mine if c[0] == "record_memory_history"],
                                 [["record_memory_history", "all", {"max_entries": 5000000, "context": None,
                                                                    "stacks": "python"}],
                                  ["record_memory_history", None, {}]])
                text = read_trace(os.path.join(out, name + ".csv.gz"))
                lines = text.splitlines()
                self.assertEqual(lines[0], "# op,id,size,stream")
                self.assertTrue(all(re.fullmatch(r"[af],\d+,\d+,0", line) for line in lines[1:]), name)
                self.assertIn(f"a,0,{1000000 + seed},0", lines, name + ": not this seed's run")
                self.assertEqual((entry["ops"], entry["recording"]["trace_events"]), (len(lines) - 1, len(lines) - 1))
                self.assertEqual(entry["peak_live_MiB"], round(peak_live(text) / MiB, 1))
            self.assertNotEqual(read_trace(os.path.join(out, f"{workload}-seed0.csv.gz")),
                                read_trace(os.path.join(out, f"{workload}-seed1.csv.gz")), "seeds give one trace")

    def check_replay(self, out, entry, name, allocator):
        """The allocator's numbers for the trace alone (as a fresh process would give them)."""
        live = peak_live(read_trace(os.path.join(out, name + ".csv.gz")))
        reserved = -(-live // UNIT[allocator]) * UNIT[allocator]
        self.assertEqual(entry["replay"][allocator], {"peak_reserved_MiB": round(reserved / MiB, 1),
                                                      "ratio": round(reserved / live, 4),
                                                      "ns_per_op": 150 if allocator == "cuda-async" else 100},
                         f"{name} under {allocator}")

    def test_failures_and_unavailable_are_reported(self):
        workloads = ["vit", "convnext", "llama_varlen", "unet"]
        if importlib.util.find_spec("transformers") is not None:
            self.skipTest("transformers is installed here: the llama_varlen workload would not be unavailable")
        run, out, document, calls = self.run_driver(
            workloads, transformers=False, FAKE_TORCH_CRASH="convnext", FAKE_TORCH_OOM_CONF="expandable_segments:True",
            FAKE_TORCH_OOM_SIZE="1000001")  # seed 1's traces run out of memory under expandable segments
        self.assertEqual(run.returncode, 1, run.stderr)
        traces = document["traces"]
        self.assertEqual(set(traces), {f"{w}-seed{s}" for w in workloads for s in (0, 1)})
        self.assertEqual(sorted(f for f in os.listdir(out) if f.endswith(".gz")),
                         ["unet-seed0.csv.gz", "unet-seed1.csv.gz", "vit-seed0.csv.gz", "vit-seed1.csv.gz"])
        self.check_recordings(out, document, calls, ["vit", "unet"])
        for seed in (0, 1):
            self.assertEqual(traces[f"convnext-seed{seed}"]["errors"],
                             {"record": "RuntimeError: fake crash in convnext's forward pass"})
            self.assertEqual(traces[f"llama_varlen-seed{seed}"]["unavailable"], "transformers not installed")
            self.assertNotIn("errors", traces[f"llama_varlen-seed{seed}"])
            for workload in ("vit", "unet"):
                name = f"{workload}-seed{seed}"
                for allocator in ALLOCATORS:
                    if seed == 1 and allocator == "torch-expandable":
                        self.assertEqual(traces[name]["errors"], {allocator: "OutOfMemoryError: CUDA out of memory. "
                                                                             "Tried to allocate 1000001 bytes."})
                        self.assertNotIn(allocator, traces[name]["replay"])
                    else:
                        self.check_replay(out, traces[name], name, allocator)
        self.assertEqual(document["allocators"]["torch-expandable"], "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
        # The table and its summary say the same.
        self.assertIn("| convnext-seed0 | failed: RuntimeError: fake crash in convnext's forward pass |", run.stdout)
        self.assertIn("| llama_varlen-seed1 | unavailable: transformers not installed |", run.stdout)
        self.assertIn("- vit-seed1, torch-expandable: OutOfMemoryError: CUDA out of memory.", run.stdout)
        self.assertIn("2 of 8 traces recorded and replayed under every allocator", run.stdout)
        with open(os.path.join(out, "table.md")) as f:
            self.assertEqual(f.read(), run.stdout)
        # One compiling process, then per allocator one process that loads the extension once and replays
        # its traces in turn; after an out-of-memory replay, a fresh one for the rest.
        loads = [call for call in calls if call[1] == "load_inline"]
        self.assertEqual(len(loads), 5)
        self.assertEqual(len({call[0] for call in loads}), 5)
        self.assertTrue(all(call[2:4] == ["more_traces_replay", ["replay", "trim_async_pool"]] for call in loads))
        self.assertEqual(len({call[-1] for call in loads}), 1, "the processes use different extension folders")
        replayers = {call[0] for call in loads} & {call[0] for call in calls if call[1] == "replay"}
        self.assertEqual(sum(1 for call in calls if call[1] == "replay"), 12)
        for pid in replayers:
            mine = [call[1] for call in calls if call[0] == pid and call[1] != "load_inline"]
            async_mode = "trim_async_pool" in mine
            each = (["trim_async_pool"] if async_mode else []) + ["empty_cache", "empty", "reset_peak_memory_stats",
                                                                   "replay"]
            self.assertEqual(mine[0], "cuda_init")
            self.assertEqual(mine[1:], each * (len(mine[1:]) // len(each)))

    def test_every_workload_recorded_and_replayed(self):
        workloads = ["vit", "convnext", "llama_varlen", "unet"]
        run, out, document, calls = self.run_driver(workloads)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.check_recordings(out, document, calls, workloads)
        for name, entry in document["traces"].items():
            self.assertNotIn("errors", entry)
            for allocator in ALLOCATORS:
                self.check_replay(out, entry, name, allocator)
        self.assertIn("8 of 8 traces recorded and replayed under every allocator", run.stdout)
        self.assertIn("unavailable (no pass): none; failures: none", run.stdout)


class TableTest(unittest.TestCase):
    def setUp(self):
        self.gpumem = os.environ.get("GPUMEM_CLI")
        if not self.gpumem:
            self.skipTest("GPUMEM_CLI (the gpumem command) is not set")
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        self.folder = folder.name
        # "fits": ten 2 MiB tensors, which gpumem reserves exactly; "small": sizes that leave pages part used.
        self.write_trace("fits", [f"a,{i},{2 * MiB},0" for i in range(10)] + [f"f,{i},{2 * MiB},0" for i in range(10)])
        self.write_trace("small", ["a,0,1048576,0", "a,1,3000000,0", "f,0,1048576,0", "a,2,500,0", "f,1,3000000,0"])

    def write_trace(self, name, lines):
        with gzip.open(os.path.join(self.folder, name + ".csv.gz"), "wt") as f:
            f.write("# op,id,size,stream\n" + "\n".join(lines) + "\n")

    def gpumem_replay(self, name):
        run = subprocess.run([self.gpumem, "replay", os.path.join(self.folder, name + ".csv.gz"), "--json"],
                             capture_output=True, text=True, check=True)
        return json.loads(run.stdout)

    def table(self, traces):
        anchors = os.path.join(self.folder, "anchors.json")
        with open(anchors, "w") as f:
            json.dump({"traces": traces}, f)
        run = subprocess.run([sys.executable, TABLE, anchors, "--gpumem", self.gpumem], capture_output=True, text=True)
        rows = {line.split(" | ")[0][2:]: line.strip("| ").split(" | ") for line in run.stdout.splitlines()
                if line.startswith("| ") and not line.startswith("| trace")}
        return run, rows

    def entry(self, name, expandable, live=None):
        live = live if live is not None else round(self.gpumem_replay(name)["peak_live_bytes"] / MiB, 1)
        ratios = {"torch-native": 1.25, "torch-expandable": expandable, "cuda-async": 1.5}
        return {"peak_live_MiB": live, "ops": 5,
                "replay": {a: {"peak_reserved_MiB": live * r, "ratio": r, "ns_per_op": 500} for a, r in ratios.items()}}

    def test_target_and_verdicts(self):
        small = self.gpumem_replay("small")
        self.assertGreater(small["ratio"], 1.02)  # what the verdicts below rest on
        self.assertEqual(self.gpumem_replay("fits")["ratio"], 1.0)
        run, rows = self.table({
            "fits": self.entry("fits", 1.0),  # target 1.0: met with equality
            "small": self.entry("small", 3.0),  # target 1.02 (the cap), missed
            "llama_varlen-seed0": {"unavailable": "transformers not installed"},
            "broken": {"workload": "vit", "errors": {"record": "RuntimeError: boom"}},
        })
        self.assertEqual(run.returncode, 1, run.stderr)
        self.assertEqual(rows["fits"], ["fits", "20.0", "1.0000", "1.2500", "1.0000", "1.5000", "1.0000", "yes"])
        self.assertEqual(rows["small"], ["small", f"{small['peak_live_bytes'] / MiB:.1f}", f"{small['ratio']:.4f}",
                                         "1.2500", "3.0000", "1.5000", "1.0200", "no"])
        self.assertEqual(rows["llama_varlen-seed0"][-1], "transformers not installed")
        self.assertEqual(rows["broken"][-1], "failed on the GPU (record): RuntimeError: boom")
        self.assertIn("gpumem meets the target on 1 of 3 traces; unavailable (no pass): llama_varlen-seed0 "
                      "(transformers not installed)", run.stdout)

    def test_all_met(self):
        os.remove(os.path.join(self.folder, "small.csv.gz"))
        run, rows = self.table({"fits": self.entry("fits", 1.5), "llama_varlen-seed0": {"unavailable": "transformers not installed"}})
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertEqual(rows["fits"][-2:], ["1.0200", "yes"])
        self.assertIn("gpumem meets the target on 1 of 1 traces", run.stdout)

    def test_what_cannot_be_checked_fails(self):
        os.remove(os.path.join(self.folder, "small.csv.gz"))
        self.write_trace("stranger", ["a,0,4096,0", "f,0,4096,0"])
        expandable_missing = self.entry("fits", 1.0)
        del expandable_missing["replay"]["torch-expandable"]
        run, rows = self.table({"fits": expandable_missing, "small": self.entry("small", 1.5, live=3.8),
                                "other": self.entry("fits", 1.5) | {"peak_live_MiB": 30.0}})
        self.assertEqual(run.returncode, 1)
        self.assertEqual(rows["fits"][-2:], ["-", "no torch-expandable ratio"])
        self.assertTrue(rows["small"][-1].startswith("no trace "), rows["small"])
        self.assertEqual(rows["stranger"][-1], "no anchors for this trace")
        self.assertTrue(rows["other"][-1].startswith("no trace "), rows["other"])
        self.assertIn("gpumem meets the target on 0 of 4 traces", run.stdout)

    def test_peak_live_must_match(self):
        run, rows = self.table({"fits": self.entry("fits", 1.5, live=30.0)})
        self.assertEqual(run.returncode, 1)
        self.assertEqual(rows["fits"][-1], "peak live differs from the anchors' 30.0 MiB")


if __name__ == "__main__":
    unittest.main()
