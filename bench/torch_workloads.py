"""Real PyTorch workloads under each allocator, side by side; prints markdown tables.

    python3 bench/torch_workloads.py [--workloads resnet50,gpt2,bert_varlen,llm_generate]
                                     [--repeats 2] [--cap-fraction 0.1] [--skip-cap] [--out results.jsonl]

Every run is a fresh process of bench/workloads.py (a copy of the anchors' workloads.py) under one
allocator: torch-native, torch-expandable (expandable_segments:True), cuda-async
(backend:cudaMallocAsync) or gpumem (GPUMEM_TORCH=1 with gpumem's python folder on PYTHONPATH, so the
unmodified script runs on gpumem). nvidia-smi is sampled every 20 ms during the run; its peak
includes the CUDA context (about 766 MiB), as in the anchors. Reported: peak reserved (torch's
memory_stats), nvidia-smi peak, median step time (median over repeats of each run's median).

Largest batch under a cap: for gpt2 and bert_varlen, set_per_process_memory_fraction(cap) and a
search over the batch size (fixed 1024 / 512 tokens), 3 steps each; the largest batch that runs.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOCATORS = {
    "torch-native": {},
    "torch-expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cuda-async": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    "gpumem": {"GPUMEM_TORCH": "1", "PYTHONPATH": os.path.join(ROOT, "python")},
}
STEPS = {"resnet50": 12, "gpt2": 12, "bert_varlen": 12, "llm_generate": 2}
WARMUP = {"resnet50": 3, "gpt2": 3, "bert_varlen": 3, "llm_generate": 1}  # a generate call takes ~9 s


class SmiSampler(threading.Thread):
    """Samples the GPU's used memory (MiB) with nvidia-smi every 20 ms until stopped."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak = 0
        self.running = True

    def run(self):
        command = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms", "20"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        while self.running:
            line = process.stdout.readline()
            if not line:
                break
            try:
                self.peak = max(self.peak, int(line.strip().split()[0]))
            except ValueError:
                pass
        process.terminate()

    def stop(self):
        self.running = False
        self.join(timeout=2)


def run_workload(name, allocator, steps, extra=(), sample=True):
    env = dict(os.environ, **ALLOCATORS[allocator])
    sampler = SmiSampler() if sample else None
    if sampler:
        sampler.start()
        time.sleep(0.2)
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "workloads.py"), name, "--steps", str(steps),
                          *extra], env=env, capture_output=True, text=True)
    if sampler:
        sampler.stop()
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"error": run.stderr[-2000:]}
    result["allocator"] = allocator
    result["exit"] = run.returncode
    if sampler:
        result["smi_peak_MiB"] = sampler.peak
    return result


def largest_batch(name, allocator, fraction, low, high):
    """The largest batch in [low, high] that trains 3 steps under the memory fraction."""
    fits = lambda batch: run_workload(name, allocator, 3, ["--warmup", "1", "--batch", str(batch),
                                                           "--memory-fraction", str(fraction)], False)["exit"] == 0
    if not fits(low):
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", default="resnet50,gpt2,bert_varlen,llm_generate")
    parser.add_argument("--allocators", default=",".join(ALLOCATORS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cap-fraction", type=float, default=0.1)
    parser.add_argument("--skip-cap", action="store_true")
    parser.add_argument("--skip-runs", action="store_true")
    parser.add_argument("--cap-ranges", default="gpt2:1:24,bert_varlen:8:96",
                        help="WORKLOAD:LOW:HIGH,... batch ranges searched under the cap")
    parser.add_argument("--out")
    args = parser.parse_args()
    results = []
    table = ["| workload | allocator | peak reserved MiB | nvidia-smi peak MiB | median step ms | step ms per repeat |",
             "|---|---|---|---|---|---|"]
    for name in ([] if args.skip_runs else args.workloads.split(",")):
        for allocator in args.allocators.split(","):
            runs = [run_workload(name, allocator, STEPS[name], ["--warmup", str(WARMUP[name])])
                    for _ in range(args.repeats)]
            results += runs
            good = [r for r in runs if "step_ms_median" in r]
            if not good:
                table.append(f"| {name} | {allocator} | failed: {runs[0].get('error', '')[-200:]!r} | | | |")
                continue
            per_repeat = ", ".join("%.1f" % r["step_ms_median"] for r in good)
            table.append(f"| {name} | {allocator} | {max(r['peak_reserved_MiB'] for r in good):.0f} | "
                         f"{max(r['smi_peak_MiB'] for r in good)} | "
                         f"{statistics.median(r['step_ms_median'] for r in good):.1f} | {per_repeat} |")
            print(table[-1], flush=True)
    print("\n".join(table))
    if not args.skip_cap:
        cap = [f"| workload | cap (fraction of the GPU) | " + " | ".join(args.allocators.split(",")) + " |",
               "|---|---|" + "---|" * len(args.allocators.split(","))]
        for entry in args.cap_ranges.split(","):
            name, low, high = entry.split(":")
            low, high = int(low), int(high)
            batches = [largest_batch(name, a, args.cap_fraction, low, high) for a in args.allocators.split(",")]
            results.append({"cap_workload": name, "fraction": args.cap_fraction,
                            "largest_batch": dict(zip(args.allocators.split(","), batches))})
            cap.append(f"| {name} | {args.cap_fraction} | " + " | ".join(str(b) for b in batches) + " |")
            print(cap[-1], flush=True)
        print("\n".join(cap))
    if args.out:
        with open(args.out, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
