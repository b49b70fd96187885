"""The new models of bench/more_workloads.py trained on the GPU under several allocators: what each
reserves against its live peak, its step time and its losses. Prints a markdown table.

    python3 bench/more_models_gpu.py [--runs vit:0,vit:1,llama_varlen:0,llama_varlen:1,unet:0,unet:1]
                                     [--allocators torch-native,torch-expandable,gpumem,gpumem-compact,gpumem-fine,torch-native]
                                     [--steps 4] [--warmup 2] [--out results.jsonl]

Every run is a fresh process of bench/more_workloads.py (6 steps by default, as the recorded traces),
with the allocators of a workload and seed run one after another. torch-native, torch-expandable:
PyTorch's allocator without and with expandable_segments:True; gpumem: GPUMEM_TORCH=1 (defaults);
gpumem-compact: GPUMEM_TORCH=compact_min:2MiB (docs/engine.md, "Compaction"); gpumem-fine:
GPUMEM_TORCH=max_chunk_size:8MiB,move_slack:0.01 (small chunks that settle); gpumem-stitch:
GPUMEM_TORCH=stitch:true (docs/engine.md, "Stitching"). The ratio is peak
reserved over peak allocated, as torch.cuda.memory_stats reports them; step time is the median of the
measured steps; "losses" says whether every step's loss equals the first torch-native run's bit for
bit. An allocator named twice runs twice: the default list ends with a second torch-native run, the
control that shows whether the workload itself gives the same losses twice (the decoder's backward
uses atomic additions, so it does not).
"""
import argparse
import json
import os
import subprocess
import sys

from torch_allocators import SETTINGS as ALLOCATORS, environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(workload, seed, allocator, steps, warmup, extra_arguments=(), env=None, error_tail=1500):
    """One fresh process of more_workloads.py under ALLOCATOR (or `env`, when given): its JSON line, or
    {"error": the last `error_tail` characters of its stderr}, with the run's names and exit status."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "more_workloads.py"), workload,
                           "--seed", str(seed), "--steps", str(steps), "--warmup", str(warmup), *extra_arguments],
                          env=env or environment(allocator), capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines and done.returncode == 0 else {"error": done.stderr[-error_tail:]}
    result.update(allocator=allocator, workload=workload, seed=seed, exit=done.returncode)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="vit:0,vit:1,llama_varlen:0,llama_varlen:1,unet:0,unet:1")
    parser.add_argument("--allocators", default=",".join(ALLOCATORS) + ",torch-native")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out")
    a = parser.parse_args()
    allocators = a.allocators.split(",")
    print("| model | seed | allocator | peak allocated MiB | peak reserved MiB | ratio | step ms (median) | losses |")
    print("|---|---|---|---|---|---|---|---|")
    failed = False
    for item in a.runs.split(","):
        workload, seed = item.split(":")
        reference = None
        for index, allocator in enumerate(allocators):
            label = allocator + (" (again)" if allocator in allocators[:index] else "")
            r = run(workload, int(seed), allocator, a.steps, a.warmup)
            if a.out:
                with open(a.out, "a") as out:
                    out.write(json.dumps(r) + "\n")
            if r["exit"] != 0:
                failed = True
                print(f"| {workload} | {seed} | {label} | failed: {r['error'].splitlines()[-1] if r['error'] else ''} |||||")
                continue
            if allocator == "torch-native" and reference is None:
                reference = r["losses"]
            same = "no reference" if reference is None else ("identical" if r["losses"] == reference else "DIFFER")
            ratio = r["peak_reserved_MiB"] / r["peak_alloc_MiB"]
            print(f"| {workload} | {seed} | {label} | {r['peak_alloc_MiB']:.1f} | {r['peak_reserved_MiB']:.1f} | "
                  f"{ratio:.4f} | {r['step_ms_median']:.1f} | {same} |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
