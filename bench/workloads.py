"""Real PyTorch workloads for measuring GPU allocators side by side.

The anchors' script (bench/anchor_workloads.py, a byte-identical copy of ../shared/anchors/workloads.py,
kept so by tests/python/test_workloads.py) with gpumem's additions layered on top: the models, their
steps and the trace export are the anchors' own functions, imported, not copied. With none of the
options below, a run does what `python3 bench/anchor_workloads.py ARGS` does (same models, seeds and
shapes, same result keys and values), and adds four keys to the result: step_ms (every measured step),
batch and memory_fraction (null) and device_total_MiB. The additions:

  --batch N              gpt2: a batch of N 1024-token sequences (instead of 16); bert_varlen: every
                         step a batch of N sequences of 512 tokens, the longest it draws (instead of
                         a random shape). resnet50 and llm_generate ignore it.
  --memory-fraction F    torch.cuda.set_per_process_memory_fraction(F) before the model is built.
  --empty-cache          torch.cuda.empty_cache() at the end of every step, inside its timed part (scripts
                         that call it every iteration give the cache back to the driver at every step).
  --no-cudnn-attention   scaled-dot-product attention without cuDNN's backend, whose plan building on
                         the host for every new shape dominates bert_varlen's step time and its noise.
  --lockstep R,W         take turns with another process, one step each, through two pipes.
  --seed S               seed of the random shapes (default 0, the anchors' runs).
  --replay-shapes        the measured steps repeat the warm-up steps' shapes: with as many warm-up as
                         measured steps, every measured shape has been seen once, so per-shape setup
                         such as cuDNN's plans is not timed.
  out of memory          prints {"oom": true, "message": ..., peaks} and exits 3 (the anchors' script
                         dies with a traceback).

Usage: python3 workloads.py WORKLOAD [--steps N] [--warmup N] [--trace OUT.csv] [--pluggable LIB.so] ...
The allocator is chosen by PYTORCH_CUDA_ALLOC_CONF (native, expandable_segments,
backend:cudaMallocAsync) or by --pluggable LIB.so (a CUDAPluggableAllocator).
Prints one JSON line: peak allocated / reserved, median step time.
"""
import argparse, json, os, sys, time, statistics, random, types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run or imported from any directory
import anchor_workloads as anchor  # noqa: E402  (bench/anchor_workloads.py)
from anchor_workloads import export_trace  # noqa: E402

import torch  # noqa: E402


class _Reseeding:
    """Stands in for the module `random` inside anchor_workloads while its build() runs, so that the
    build's `random.seed(0)` seeds `seed` instead, at the same point; everything else is the module's.
    (The build's torch.Generator seeded with 0 is never used: the shapes come from `random` alone.)"""

    def __init__(self, seed):
        self._seed = seed

    def seed(self, _anchors_seed):
        random.seed(self._seed)

    def __getattr__(self, name):
        return getattr(random, name)


class _LongestShape:
    """Stands in for the module `random` inside bert_varlen's step (anchor_workloads.build: `L =
    random.randint(32, 512)`, `b = random.choice([8, 16, ...])`): the longest length it can draw and
    the batch asked for; nothing is drawn from `random`."""

    def __init__(self, batch):
        self._batch = batch

    def randint(self, _low, high):
        return high

    def choice(self, _options):
        return self._batch


def build(name, dev, batch=None, seed=0):
    """anchor_workloads.build(name, dev), with --seed and --batch applied without copying it: the seed
    through _Reseeding during the build; the batch by giving the returned step, the same code and
    closure, other bindings -- gpt2's `bs = 16` (a free variable of its step) becomes `batch`, and
    bert_varlen's step sees _LongestShape as `random`."""
    if seed != 0:
        anchor.random = _Reseeding(seed)
    try:
        step = anchor.build(name, dev)
    finally:
        anchor.random = random
    if not batch:
        return step
    code = step.__code__
    if name == "gpt2":
        if "bs" not in code.co_freevars:
            raise SystemExit("workloads.py: anchor_workloads.build's gpt2 step no longer reads `bs`")
        cells = tuple(types.CellType(batch) if var == "bs" else cell
                      for var, cell in zip(code.co_freevars, step.__closure__))
        return types.FunctionType(code, step.__globals__, step.__name__, step.__defaults__, cells)
    if name == "bert_varlen":
        if "random" not in code.co_names:
            raise SystemExit("workloads.py: anchor_workloads.build's bert_varlen step no longer draws from `random`")
        return types.FunctionType(code, dict(step.__globals__, random=_LongestShape(batch)), step.__name__,
                                  step.__defaults__, step.__closure__)
    return step


def parser():
    """anchor_workloads.main's own argument parser (taken from it: main runs until its parse_args(),
    which hands the parser over instead of parsing) with the additions."""
    class Taken(Exception):
        pass

    class Handing(argparse.ArgumentParser):
        def parse_args(self, *args, **kwargs):
            raise Taken(self)

    anchor.argparse = types.SimpleNamespace(ArgumentParser=Handing)
    try:
        anchor.main()
        raise SystemExit("workloads.py: anchor_workloads.main parsed no arguments")
    except Taken as taken:
        ap = taken.args[0]
        ap.__class__ = argparse.ArgumentParser  # parses from here on
    finally:
        anchor.argparse = argparse
    ap.add_argument("--batch", type=int)
    ap.add_argument("--memory-fraction", type=float)
    ap.add_argument("--lockstep", metavar="READ_FD,WRITE_FD",
                    help="take turns with another process: before each step read one byte from READ_FD, after "
                         "it write one to WRITE_FD (bench/torch_workloads.py --lockstep)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the random shapes (default 0, the anchors' runs); another seed records "
                         "another trace of the same workload")
    ap.add_argument("--replay-shapes", action="store_true",
                    help="the measured steps draw the same shapes as the warm-up steps (random's state is put "
                         "back after warm-up), so no measured step pays for a shape seen the first time")
    ap.add_argument("--empty-cache", action="store_true",
                    help="torch.cuda.empty_cache() at the end of every step, timed with it (as scripts that call "
                         "it every iteration do)")
    ap.add_argument("--no-cudnn-attention", action="store_true",
                    help="scaled-dot-product attention without cuDNN's backend (which builds a plan on the host "
                         "for every new shape)")
    return ap


def main():
    # Mirrors anchor_workloads.main after its `a = ap.parse_args()`: every line of it, in order, with
    # the additions between them (tests/python/test_workloads.py checks this). It cannot be called with
    # them: they sit inside its step loop (--lockstep waits outside the timed part of a step,
    # --replay-shapes acts between two steps), around it (out of memory) and in its result.
    # The one line changed: `step = build(a.workload, dev)` passes --batch and --seed.
    a = parser().parse_args()
    if a.pluggable:
        alloc = torch.cuda.memory.CUDAPluggableAllocator(a.pluggable, "gm_torch_malloc", "gm_torch_free")
        torch.cuda.memory.change_current_allocator(alloc)
    dev = torch.device("cuda")
    if a.no_cudnn_attention:
        torch.backends.cuda.enable_cudnn_sdp(False)
    if a.trace:
        torch.cuda.memory._record_memory_history(max_entries=5_000_000, context=None, stacks="python")
    if a.memory_fraction:
        torch.cuda.set_per_process_memory_fraction(a.memory_fraction)
    t0 = time.perf_counter()
    try:
        step = build(a.workload, dev, a.batch, a.seed)
        times = []
        turn_in, turn_out = map(int, a.lockstep.split(",")) if a.lockstep else (None, None)
        shapes = random.getstate()
        for i in range(a.warmup + a.steps):
            if a.replay_shapes and i == a.warmup:
                random.setstate(shapes)
            torch.cuda.synchronize()
            if turn_in is not None and os.read(turn_in, 1) != b"s":
                sys.exit("lockstep: the coordinator went away")
            s = time.perf_counter()
            step(i)
            if a.empty_cache:
                torch.cuda.empty_cache()
            torch.cuda.synchronize()
            if i >= a.warmup:
                times.append(time.perf_counter() - s)
            if turn_out is not None:
                os.write(turn_out, b"d")
    except torch.OutOfMemoryError as error:
        # The allocator's own message (gpumem's explains the request, reserved vs allocated and what it
        # tried) and the peaks reached before the failure.
        res = {"workload": a.workload, "oom": True, "batch": a.batch, "memory_fraction": a.memory_fraction,
               "message": str(error).split("\nException raised from")[0][:4000]}
        try:
            res["peak_alloc_MiB"] = torch.cuda.max_memory_allocated() / 2**20
            res["peak_reserved_MiB"] = torch.cuda.max_memory_reserved() / 2**20
            res["reserved_at_oom_MiB"] = torch.cuda.memory_reserved() / 2**20
        except Exception as e:
            res["stats_error"] = str(e)[:100]
        print(json.dumps(res), flush=True)
        sys.exit(3)
    res = {"workload": a.workload,
           "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "native") if not a.pluggable else "pluggable",
           "steps": a.steps, "step_ms_median": 1e3 * statistics.median(times),
           "step_ms": [round(1e3 * t, 3) for t in times], "batch": a.batch, "memory_fraction": a.memory_fraction,
           "total_s": time.perf_counter() - t0}
    try:
        st = torch.cuda.memory_stats()
        res["peak_alloc_MiB"] = st.get("allocated_bytes.all.peak", 0) / 2**20
        res["peak_reserved_MiB"] = st.get("reserved_bytes.all.peak", 0) / 2**20
        res["num_device_alloc"] = st.get("num_device_alloc")
        res["num_alloc_retries"] = st.get("num_alloc_retries")
    except Exception as e:  # pluggable allocators have no stats
        res["stats_error"] = str(e)[:100]
    free, total = torch.cuda.mem_get_info()
    res["driver_used_end_MiB"] = (total - free) / 2**20
    res["device_total_MiB"] = total / 2**20
    if a.trace:
        snap = torch.cuda.memory._snapshot()
        res["trace_events"] = export_trace(snap, a.trace)
        torch.cuda.memory._record_memory_history(enabled=None)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
