"""Step time under a memory cap: torch.cuda.set_per_process_memory_fraction near a workload's need.

    python3 bench/capped_steps.py [--workloads gpt2,resnet50] [--allocators torch-native,gpumem]
                                  [--margins 1.03,1.5] [--relative-to torch-native] [--repeats 3]
                                  [--steps 10] [--empty-cache] [--out capped.jsonl]

Under a memory limit below the device's capacity the pages engine works as on a device of the limit's size
(docs/engine.md): its chunks shrink as the limit nears, so a training step near its cap may move chunks
that it would not move without one. This measures what that costs a real step. For each
workload, an uncapped run under --relative-to (torch-native by default; gpumem puts the cap near gpumem's
own need, where PyTorch's allocator does not fit) gives its peak reserved memory P; each margin M then
caps every allocator at M * P (as a fraction of the device's memory), and the workload trains under it
in a fresh process (bench/workloads.py --memory-fraction). Runs are interleaved (repeat 1 of every
allocator and cap, then repeat 2, ...; odd repeats in reverse order) so that a drift of the machine
hits all alike. The table gives per workload, cap and allocator the median over repeats of each run's
median step time, the spread over repeats, the ratio to torch-native's median under the same cap,
and the largest peak reserved; a run that does not fit says so. Results go to --out as JSON lines.
--empty-cache makes every run call torch.cuda.empty_cache() at the end of every step, timed with it
(bench/workloads.py --empty-cache), as scripts that call it every iteration do: the cache goes back to
the driver and is made again at every step; margins "none" alone (--margins none) measures only that.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_workloads import run_workload  # noqa: E402


def cap_label(margin, reference):
    return "none" if margin is None else f"{margin:g} x {reference}'s peak"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="gpt2,resnet50")
    parser.add_argument("--allocators", default="torch-native,gpumem")
    parser.add_argument("--margins", default="1.03,1.5")
    parser.add_argument("--relative-to", default="torch-native")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--empty-cache", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    allocators = args.allocators.split(",")
    margins = [None] + [float(margin) for margin in args.margins.split(",") if margin != "none"]
    out = open(args.out, "a") if args.out else None

    def run(workload, allocator, fraction):
        extra = ["--warmup", str(args.warmup)] + (["--memory-fraction", f"{fraction:.6f}"] if fraction else []) + \
            (["--empty-cache"] if args.empty_cache else [])
        result = run_workload(workload, allocator, args.steps, extra, sample=False)
        if out:
            out.write(json.dumps(dict(result, workload=workload, fraction=fraction, empty_cache=args.empty_cache)) + "\n")
            out.flush()
        return result

    fractions = {}
    for workload in workloads if len(margins) > 1 else []:
        probe = run(workload, args.relative_to, None)
        if "peak_reserved_MiB" not in probe or not probe.get("device_total_MiB"):
            sys.exit(f"capped_steps: the uncapped {args.relative_to} run of {workload} failed: {probe}")
        fractions[workload] = {margin: None if margin is None else
                               min(1.0, margin * probe["peak_reserved_MiB"] / probe["device_total_MiB"])
                               for margin in margins}
        print(f"{workload}: {args.relative_to} peak reserved {probe['peak_reserved_MiB']:.0f} MiB of "
              f"{probe['device_total_MiB']:.0f}", file=sys.stderr, flush=True)

    runs = {}
    jobs = [(workload, margin, allocator) for workload in workloads for margin in margins for allocator in allocators]
    for repeat in range(args.repeats):
        for workload, margin, allocator in (jobs if repeat % 2 == 0 else jobs[::-1]):
            result = run(workload, allocator, fractions[workload][margin] if margin else None)
            runs.setdefault((workload, margin, allocator), []).append(result)
            print(f"repeat {repeat + 1}: {workload} cap {cap_label(margin, args.relative_to)} {allocator}: "
                  f"{result.get('step_ms_median', result.get('error', 'no result'))}", file=sys.stderr, flush=True)

    if args.empty_cache:
        print("Every step ends with torch.cuda.empty_cache().\n")
    print("| workload | cap | allocator | step ms (median) | spread over repeats | vs torch-native | peak reserved MiB |")
    print("|---|---|---|---|---|---|---|")
    for workload in workloads:
        for margin in margins:
            medians = {}
            for allocator in allocators:
                results = runs[(workload, margin, allocator)]
                steps = [result["step_ms_median"] for result in results if result.get("exit") == 0]
                medians[allocator] = statistics.median(steps) if len(steps) == len(results) else None
            native = medians.get("torch-native")
            for allocator in allocators:
                results = runs[(workload, margin, allocator)]
                median = medians[allocator]
                if median is None:
                    failures = sum(result.get("exit") != 0 for result in results)
                    row = f"did not fit ({failures} of {len(results)} runs) | | |"
                else:
                    steps = [result["step_ms_median"] for result in results]
                    spread = f"{min(steps):.1f}-{max(steps):.1f} ({(max(steps) - min(steps)) / median * 100:.1f}%)"
                    ratio = f"{median / native:.3f}" if native else ""
                    row = f"{median:.1f} | {spread} | {ratio} |"
                peak = max((result.get("peak_reserved_MiB", 0) for result in results), default=0)
                print(f"| {workload} | {cap_label(margin, args.relative_to)} | {allocator} | {row} {peak:.0f} |")


if __name__ == "__main__":
    main()
