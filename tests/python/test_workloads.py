"""bench/workloads.py stays the anchors' script plus gpumem's additions, not a drifting fork; no GPU,
no PyTorch and no gpumem needed.

- bench/anchor_workloads.py is byte-identical to ../shared/anchors/workloads.py, and
  bench/anchor_replay.py to ../shared/anchors/replay.py (skipped where that checkout is not beside the
  repository);
- bench/workloads.py imports it, defines none of its functions except the ones it wraps, and its
  main() holds every line of the anchors' main() after the argument parsing, in order;
- every option bench/torch_workloads.py passes to bench/workloads.py is defined;
- under a stand-in torch (records the shapes the steps ask for), bench/workloads.py with no added
  option draws the same shapes and prints the same results as the anchors' script, and each addition
  does what it says.
"""
import ast
import contextlib
import importlib
import io
import json
import os
import random
import re
import sys
import tempfile
import types
import unittest
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")
ANCHOR = os.path.join(BENCH, "anchor_workloads.py")
WORKLOADS = os.path.join(BENCH, "workloads.py")
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "anchors", "workloads.py")
ANCHOR_REPLAY = os.path.join(BENCH, "anchor_replay.py")
SHARED_REPLAY = os.path.join(os.path.dirname(ROOT), "shared", "anchors", "replay.py")

# The anchors' functions bench/workloads.py defines again, on purpose: build() applies --batch and
# --seed to anchor_workloads.build(); main() mirrors anchor_workloads.main() with the additions.
WRAPPED = {"build", "main"}
# Lines of anchor_workloads.main() (after its parse_args) that bench/workloads.py's main() changes.
MIRROR_CHANGED = {"step = build(a.workload, dev)"}
# Result keys bench/workloads.py adds to the anchors'.
ADDED_KEYS = {"step_ms", "batch", "memory_fraction", "device_total_MiB"}


def source(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def functions(tree):
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def options_defined(tree):
    """The option strings of every add_argument(...) call."""
    return {arg.value for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
            for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)}


class SourceTest(unittest.TestCase):
    def test_anchor_copy_is_byte_identical(self):
        if not os.path.exists(SHARED):
            self.skipTest(f"{SHARED} is not there (no ../shared checkout beside the repository)")
        with open(SHARED, "rb") as shared, open(ANCHOR, "rb") as copy:
            self.assertEqual(copy.read(), shared.read(), "bench/anchor_workloads.py differs from " + SHARED)

    def test_anchor_replay_copy_is_byte_identical(self):
        if not os.path.exists(SHARED_REPLAY):
            self.skipTest(f"{SHARED_REPLAY} is not there (no ../shared checkout beside the repository)")
        with open(SHARED_REPLAY, "rb") as shared, open(ANCHOR_REPLAY, "rb") as copy:
            self.assertEqual(copy.read(), shared.read(), "bench/anchor_replay.py differs from " + SHARED_REPLAY)

    def test_imports_the_anchor_and_copies_none_of_its_functions(self):
        ours = ast.parse(source(WORKLOADS))
        imported = {alias.name for node in ours.body if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ours.body if isinstance(node, ast.ImportFrom)}
        self.assertIn("anchor_workloads", imported)
        anchor = functions(ast.parse(source(ANCHOR)))
        self.assertTrue(WRAPPED <= set(anchor), "WRAPPED names functions anchor_workloads.py lacks")
        copied = set(functions(ours)) & set(anchor) - WRAPPED
        self.assertFalse(copied, f"bench/workloads.py defines anchor_workloads.py's {sorted(copied)}: import them")

    def test_main_mirrors_every_line_of_the_anchors_main(self):
        def body_lines(path):
            text = source(path)
            node = functions(ast.parse(text))["main"]
            lines = text.splitlines()[node.lineno:node.end_lineno]
            return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        anchor = body_lines(ANCHOR)
        anchor = anchor[anchor.index("a = ap.parse_args()") + 1:]
        ours = iter(body_lines(WORKLOADS))
        for line in anchor:
            if line not in MIRROR_CHANGED:
                self.assertTrue(any(line == mine for mine in ours),
                                f"anchor_workloads.main's line {line!r} is not in workloads.main (in order)")

    def test_every_option_torch_workloads_passes_is_defined(self):
        caller = ast.parse(source(os.path.join(BENCH, "torch_workloads.py")))
        own = {id(arg) for node in ast.walk(caller) if isinstance(node, ast.Call)
               and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument" for arg in node.args}
        passed = {node.value for node in ast.walk(caller) if isinstance(node, ast.Constant) and id(node) not in own
                  and isinstance(node.value, str) and re.fullmatch(r"--[a-z][a-z-]*", node.value)}
        self.assertIn("--steps", passed)  # the extraction still finds what it passes
        # Ours, plus the anchors' (bench/workloads.py takes anchor_workloads.main's own parser).
        defined = options_defined(ast.parse(source(WORKLOADS)))
        defined |= options_defined(functions(ast.parse(source(ANCHOR)))["main"])
        self.assertFalse(passed - defined, "torch_workloads.py passes options workloads.py lacks")


class FakeTorch:
    """Stand-ins for torch, torchvision and transformers, enough for both scripts' main(): the models do
    nothing, and every torch.randint / torch.randn / generate call is logged with its shape."""

    def __init__(self, oom_batch=None):
        self.log = []
        log = self.log

        class OutOfMemoryError(RuntimeError):
            pass

        class Model:
            def to(self, *args, **kwargs):
                return self

            def eval(self):
                return self

            def parameters(self):
                return []

            def __call__(self, *args, **kwargs):
                return types.SimpleNamespace(loss=Loss())

            def generate(self, ids, **kwargs):
                log.append(("generate", ids.shape, kwargs["max_new_tokens"]))

        class Loss:
            def backward(self):
                pass

        class Optimizer:
            def __init__(self, *args, **kwargs):
                pass

            def step(self):
                pass

            def zero_grad(self, set_to_none=True):
                pass

        def tensor(kind, shape):
            if oom_batch is not None and shape[0] >= oom_batch:
                raise OutOfMemoryError(f"CUDA out of memory: batch {shape[0]}\nException raised from here")
            log.append((kind, tuple(shape)))
            return types.SimpleNamespace(shape=tuple(shape))

        snapshot = {"device_traces": [[{"action": "alloc", "addr": 16, "size": 512, "stream": 0},
                                       {"action": "alloc", "addr": 32, "size": 1024, "stream": 7},
                                       {"action": "free_requested", "addr": 16, "size": 512, "stream": 0}]]}
        stats = {"allocated_bytes.all.peak": 3 << 20, "reserved_bytes.all.peak": 4 << 20,
                 "num_device_alloc": 5, "num_alloc_retries": 0}
        cuda = types.SimpleNamespace(
            synchronize=lambda: None, memory_stats=lambda: dict(stats), mem_get_info=lambda: (1 << 30, 4 << 30),
            empty_cache=lambda: log.append(("empty_cache",)),
            set_per_process_memory_fraction=lambda fraction: log.append(("memory_fraction", fraction)),
            max_memory_allocated=lambda: 1 << 20, max_memory_reserved=lambda: 2 << 20, memory_reserved=lambda: 2 << 20,
            memory=types.SimpleNamespace(_record_memory_history=lambda **kwargs: log.append(("history", kwargs)),
                                         _snapshot=lambda: snapshot))
        torch = types.ModuleType("torch")
        torch.__dict__.update(
            OutOfMemoryError=OutOfMemoryError, bfloat16="bfloat16", device=lambda name: name, cuda=cuda,
            Generator=lambda device=None: types.SimpleNamespace(manual_seed=lambda seed: None),
            randint=lambda low, high, size, device=None: tensor("randint", size),
            randn=lambda *size, device=None: tensor("randn", size), ones_like=lambda x: x,
            autocast=lambda *args, **kwargs: contextlib.nullcontext(), no_grad=contextlib.nullcontext,
            nn=types.SimpleNamespace(functional=types.SimpleNamespace(cross_entropy=lambda out, y: Loss())),
            optim=types.SimpleNamespace(SGD=Optimizer, AdamW=Optimizer),
            backends=types.SimpleNamespace(cuda=types.SimpleNamespace(
                enable_cudnn_sdp=lambda on: log.append(("cudnn_sdp", on)))))
        torchvision = types.ModuleType("torchvision")
        torchvision.models = types.SimpleNamespace(resnet50=lambda weights=None: Model())
        transformers = types.ModuleType("transformers")
        transformers.__dict__.update(
            GPT2Config=lambda **kwargs: types.SimpleNamespace(vocab_size=50257, **kwargs),
            BertConfig=lambda: types.SimpleNamespace(vocab_size=30522),
            GPT2LMHeadModel=lambda cfg: Model(), BertForMaskedLM=lambda cfg: Model())
        self.modules = {"torch": torch, "torchvision": torchvision, "transformers": transformers}

    def run(self, script, argv):
        """Runs main() of bench/SCRIPT.py with argv; returns (its JSON result, exit status)."""
        path = list(sys.path)
        out = io.StringIO()
        status = 0
        with mock.patch.dict(sys.modules, self.modules), mock.patch.object(sys, "argv", [script + ".py", *argv]):
            for name in ("anchor_workloads", "workloads"):
                sys.modules.pop(name, None)
            sys.path.insert(0, BENCH)
            try:
                module = importlib.import_module(script)
                random.seed(12345)  # what is left of random's state must not matter
                with contextlib.redirect_stdout(out):
                    module.main()
            except SystemExit as exit:
                status = exit.code
            finally:
                sys.path[:] = path
        lines = [line for line in out.getvalue().splitlines() if line.startswith("{")]
        return (json.loads(lines[-1]) if lines else None), status


TIMES = {"step_ms_median", "total_s", "step_ms"}


def draws(seed, steps):
    """The (batch, length) shapes bert_varlen's step draws in anchor_workloads.py after random.seed(seed)."""
    r = random.Random(seed)
    shapes = []
    for _ in range(steps):
        length = r.randint(32, 512)
        shapes.append((r.choice([8, 16, 24, 32, 48, 64]), length))
    return shapes


class BehaviourTest(unittest.TestCase):
    def test_no_added_option_does_what_the_anchor_does(self):
        for workload in ("resnet50", "gpt2", "bert_varlen", "llm_generate"):
            with self.subTest(workload=workload), tempfile.TemporaryDirectory() as folder:
                runs = {}
                for script in ("anchor_workloads", "workloads"):
                    fake = FakeTorch()
                    trace = os.path.join(folder, script + ".csv")
                    result, status = fake.run(script, [workload, "--steps", "4", "--warmup", "2", "--trace", trace])
                    runs[script] = (result, status, fake.log, source(trace))
                (anchor, anchor_status, anchor_log, anchor_trace), (ours, status, log, trace) = runs.values()
                self.assertEqual((status, log, trace), (anchor_status, anchor_log, anchor_trace))
                self.assertEqual(set(ours) - set(anchor), ADDED_KEYS)
                self.assertEqual({k: v for k, v in ours.items() if k in anchor and k not in TIMES},
                                 {k: v for k, v in anchor.items() if k not in TIMES})
                self.assertEqual((ours["batch"], ours["memory_fraction"], len(ours["step_ms"])), (None, None, 4))
                self.assertEqual(ours["device_total_MiB"], 4096)

    def test_seed(self):
        fake = FakeTorch()
        fake.run("workloads", ["bert_varlen", "--steps", "3", "--warmup", "2", "--seed", "5"])
        self.assertEqual([shape for kind, shape in fake.log], draws(5, 5))
        fake = FakeTorch()
        fake.run("anchor_workloads", ["bert_varlen", "--steps", "3", "--warmup", "2"])
        self.assertEqual([shape for kind, shape in fake.log], draws(0, 5))

    def test_batch(self):
        for workload, shape in (("gpt2", (7, 1024)), ("bert_varlen", (7, 512))):
            with self.subTest(workload=workload):
                fake = FakeTorch()
                result, status = fake.run("workloads", [workload, "--steps", "3", "--warmup", "1", "--batch", "7"])
                self.assertEqual((status, result["batch"]), (0, 7))
                self.assertEqual(fake.log, [("randint", shape)] * 4)
        fake = FakeTorch()  # batch 16 as before once the batch is over
        fake.run("workloads", ["gpt2", "--steps", "1", "--warmup", "0"])
        self.assertEqual(fake.log, [("randint", (16, 1024))])

    def test_replay_shapes(self):
        fake = FakeTorch()
        fake.run("workloads", ["bert_varlen", "--steps", "3", "--warmup", "3", "--replay-shapes"])
        self.assertEqual([shape for kind, shape in fake.log], draws(0, 3) * 2)

    def test_memory_fraction_and_cudnn_attention(self):
        fake = FakeTorch()
        result, status = fake.run("workloads", ["gpt2", "--steps", "1", "--warmup", "0", "--memory-fraction", "0.25",
                                                "--no-cudnn-attention"])
        self.assertEqual((status, result["memory_fraction"]), (0, 0.25))
        self.assertEqual(fake.log[:2], [("cudnn_sdp", False), ("memory_fraction", 0.25)])

    def test_empty_cache(self):
        fake = FakeTorch()
        result, status = fake.run("workloads", ["resnet50", "--steps", "2", "--warmup", "1", "--empty-cache"])
        self.assertEqual((status, len(result["step_ms"])), (0, 2))
        self.assertEqual(fake.log, [("randn", (256, 3, 224, 224)), ("randint", (256,)), ("empty_cache",)] * 3)

    def test_out_of_memory(self):
        fake = FakeTorch(oom_batch=100)
        result, status = fake.run("workloads", ["gpt2", "--steps", "2", "--batch", "100", "--memory-fraction", "0.1"])
        self.assertEqual(status, 3)
        self.assertEqual(result, {"workload": "gpt2", "oom": True, "batch": 100, "memory_fraction": 0.1,
                                  "message": "CUDA out of memory: batch 100", "peak_alloc_MiB": 1.0,
                                  "peak_reserved_MiB": 2.0, "reserved_at_oom_MiB": 2.0})

    def test_lockstep(self):
        turn_read, turn_write = os.pipe()
        done_read, done_write = os.pipe()
        try:
            os.write(turn_write, b"s" * 5)
            result, status = FakeTorch().run("workloads", ["resnet50", "--steps", "3", "--warmup", "2", "--lockstep",
                                                           f"{turn_read},{done_write}"])
            self.assertEqual((status, len(result["step_ms"])), (0, 3))
            self.assertEqual(os.read(done_read, 100), b"d" * 5)
            os.close(turn_write)
            turn_write = None
            _, status = FakeTorch().run("workloads", ["resnet50", "--steps", "1", "--lockstep",
                                                      f"{turn_read},{done_write}"])
            self.assertEqual(status, "lockstep: the coordinator went away")
        finally:
            for fd in (turn_read, done_read, done_write) + ((turn_write,) if turn_write is not None else ()):
                os.close(fd)


if __name__ == "__main__":
    unittest.main()
