"""Real PyTorch workloads under each allocator, side by side; prints markdown tables.

    python3 bench/torch_workloads.py [--workloads resnet50,gpt2,bert_varlen,llm_generate]
                                     [--allocators torch-native,gpumem] [--repeats 3]
                                     [--skip-runs] [--skip-cap] [--cap-fraction 0.1]
                                     [--cap-ranges gpt2:4:12,bert_varlen:16:80] [--jobs 4]
                                     [--probe gpt2:8] [--no-smi] [--steps N] [--taskset CPUS] [--concurrent | --lockstep]
                                     [--replay-shapes]
                                     [--out results.jsonl]

Every run is a fresh process of bench/workloads.py (the anchors' workloads.py, imported from
bench/anchor_workloads.py, plus gpumem's options) under one allocator: torch-native, torch-expandable
(expandable_segments:True), cuda-async (backend:cudaMallocAsync), gpumem (GPUMEM_TORCH=1 with gpumem's
python folder on PYTHONPATH, so the unmodified script runs on gpumem) or gpumem-segments (the same
with engine:segments).

Step time: the repeats are interleaved (repeat 1 of every allocator, then repeat 2, ...; odd repeats
in reverse order) so that a drift of the machine hits every allocator alike. Each run reports the
median of its measured steps; the table gives per allocator the median over repeats of those
medians, their spread (min-max over repeats, and as % of the allocator's median) and the ratio to
torch-native's median; a second table pairs each repeat with torch-native's run of the same repeat
(adjacent in time) and gives the median and range of those ratios. nvidia-smi is sampled every 20 ms during each run; its peak includes the CUDA
context (about 766 MiB), as in the anchors.

--concurrent runs the allocators' step-time runs of a repeat at the same time instead, each pinned to
its own half (third, ...) of the CPUs, rotated every repeat: the host's speed drifts in phases of
seconds on the GPU machine (bert_varlen's steps are bound by host work), and runs side by side see
the same phases; they also share the GPU, which slows both alike.

--lockstep starts the allocators' runs of a repeat together but lets them take turns, one step
each (rotating who goes first), so only one uses the GPU at a time and steps of the same index run
within a second of each other, in the same phase of the host. A third table gives, per step, the
time under each allocator over torch-native's time of the same step: the median of these ratios
over all repeats, its bootstrapped 95% interval, and the ratio of the run medians per repeat.

--replay-shapes gives every run as many warm-up steps as measured ones and makes the measured steps
repeat the warm-up's shapes (bench/workloads.py --replay-shapes): bert_varlen draws a new shape
nearly every step, and the host work of a first-seen shape (cuDNN's attention plans) otherwise
dominates its step time and its noise.

Largest batch under a cap (--cap-fraction): for gpt2 and bert_varlen, set_per_process_memory_fraction
and a binary search over the batch size (fixed 1024 / 512 tokens), 3 steps each; the largest batch
that runs. Whether a batch fits does not depend on timing, so the searches of different allocators
run side by side (--jobs; each process stays under its cap, so they fit on the GPU together).

--probe WORKLOAD:BATCH runs one batch under every allocator without a cap (peak reserved and peak
allocated) and under the cap (fits or not; the allocator's out-of-memory message), for diagnosing
the cap search; with --probe nothing else runs.
"""
import argparse
import concurrent.futures
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOCATORS = {
    "torch-native": {},
    "torch-expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cuda-async": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    "gpumem": {"GPUMEM_TORCH": "1", "PYTHONPATH": os.path.join(ROOT, "python")},
    "gpumem-segments": {"GPUMEM_TORCH": "engine:segments", "PYTHONPATH": os.path.join(ROOT, "python")},
}
TASKSET = None  # --taskset: CPUs every workload process is pinned to
DEFAULT_ALLOCATORS = "torch-native,torch-expandable,cuda-async,gpumem"
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


def run_workload(name, allocator, steps, extra=(), sample=True, cpus=None):
    env = dict(os.environ, **ALLOCATORS[allocator])
    sampler = SmiSampler() if sample else None
    if sampler:
        sampler.start()
        time.sleep(0.2)
    cpus = cpus or TASKSET
    pin = ["taskset", "-c", cpus] if cpus else []
    run = subprocess.run([*pin, sys.executable, os.path.join(ROOT, "bench", "workloads.py"), name, "--steps", str(steps),
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


def capped(name, allocator, fraction, batch):
    return run_workload(name, allocator, 3, ["--warmup", "1", "--batch", str(batch), "--memory-fraction", str(fraction)],
                        False)


def largest_batch(name, allocator, fraction, low, high, log):
    """The largest batch in [low, high] that trains 3 steps under the memory fraction."""
    def fits(batch):
        result = capped(name, allocator, fraction, batch)
        log.append(dict(result, cap_search=name))
        print(f"  cap {name} {allocator} batch {batch}: {'fits' if result['exit'] == 0 else 'no'}", flush=True)
        return result["exit"] == 0
    if not fits(low):
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def step_time_table(args, allocators, results):
    table = ["| workload | allocator | peak reserved MiB | nvidia-smi peak MiB | median step ms | min-max over repeats ms | "
             "spread % | vs torch-native | per-repeat medians ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    paired = ["| workload | allocator | paired ratio to torch-native, median | min-max | per repeat |",
              "|---|---|---|---|---|"]
    lockstep = ["| workload | allocator | steps paired | per-step ratio to torch-native, median | 95% interval | "
                "ratio of run medians per repeat | their spread (points of %) |", "|---|---|---|---|---|---|---|"]
    for name in args.workloads.split(","):
        runs = {a: [] for a in allocators}
        steps = args.steps or STEPS[name]
        warmup = steps if args.replay_shapes else WARMUP[name]
        extra = ["--warmup", str(warmup), *(["--replay-shapes"] if args.replay_shapes else []),
                 *args.workload_args.split()]
        for repeat in range(args.repeats):
            if args.lockstep:
                done = lockstep_repeat(name, allocators, steps, warmup, extra)
            elif args.concurrent:
                # Every allocator's run at once, each on its own CPUs (rotated every repeat): what the
                # host does meanwhile (its speed drifts in phases of seconds) hits all of them alike.
                slices = cpu_slices(len(allocators), repeat)
                with concurrent.futures.ThreadPoolExecutor(max_workers=len(allocators)) as pool:
                    done = list(pool.map(lambda job: run_workload(name, job[0], steps, extra, False, job[1]),
                                         zip(allocators, slices)))
            else:
                order = allocators if repeat % 2 == 0 else allocators[::-1]
                done = [run_workload(name, a, steps, extra, not args.no_smi) for a in order]
            for result in done:
                result["repeat"] = repeat
                runs[result["allocator"]].append(result)
                results.append(result)
                print(f"  {name} {result['allocator']} repeat {repeat + 1}: "
                      f"{result.get('step_ms_median', float('nan')):.2f} ms", flush=True)
        medians = {}
        for allocator in allocators:
            good = [r for r in runs[allocator] if "step_ms_median" in r]
            if good:
                medians[allocator] = statistics.median(r["step_ms_median"] for r in good)
        for allocator in allocators:
            good = [r for r in runs[allocator] if "step_ms_median" in r]
            if not good:
                table.append(f"| {name} | {allocator} | failed: {runs[allocator][0].get('error', '')[-200:]!r} |"
                             " | | | | | |")
                continue
            per_run = [r["step_ms_median"] for r in good]
            median = medians[allocator]
            ratio = (f"{median / medians['torch-native']:.4f}" if "torch-native" in medians else "")
            smi = max(r["smi_peak_MiB"] for r in good) if "smi_peak_MiB" in good[0] else "-"
            table.append(f"| {name} | {allocator} | {max(r['peak_reserved_MiB'] for r in good):.0f} | "
                         f"{smi} | {median:.2f} | "
                         f"{min(per_run):.2f}-{max(per_run):.2f} | {100 * (max(per_run) - min(per_run)) / median:.2f} | "
                         f"{ratio} | {', '.join('%.2f' % t for t in per_run)} |")
        paired.extend(paired_rows(name, allocators, runs))
        lockstep.extend(lockstep_rows(name, allocators, runs) if args.lockstep else [])
    return table + [""] + paired + ([""] + lockstep if args.lockstep else [])


def lockstep_repeat(name, allocators, steps, warmup, extra):
    """One run per allocator, all alive at once but taking turns: each step of each process waits for
    the previous process's step to finish (the order rotates every step), so the GPU runs one step at
    a time and steps of the same index run within a second of each other, in the same phase of the
    host's speed. Returns the runs' results, each with its per-step times."""
    processes = []
    for allocator in allocators:
        child_reads, to_child = os.pipe()
        from_child, child_writes = os.pipe()
        output = tempfile.TemporaryFile("w+")
        errors = tempfile.TemporaryFile("w+")
        pin = ["taskset", "-c", TASKSET] if TASKSET else []
        command = [*pin, sys.executable, os.path.join(ROOT, "bench", "workloads.py"), name, "--steps", str(steps), *extra,
                   "--lockstep", f"{child_reads},{child_writes}"]
        process = subprocess.Popen(command, env=dict(os.environ, **ALLOCATORS[allocator]), stdout=output,
                                   stderr=errors, text=True, pass_fds=(child_reads, child_writes))
        os.close(child_reads)
        os.close(child_writes)
        processes.append({"allocator": allocator, "process": process, "to": to_child, "from": from_child,
                          "stdout": output, "stderr": errors, "alive": True})
    for step in range(warmup + steps):
        shift = step % len(processes)
        for entry in processes[shift:] + processes[:shift]:
            if not entry["alive"]:
                continue
            try:
                os.write(entry["to"], b"s")
                entry["alive"] = os.read(entry["from"], 1) == b"d"
            except OSError:
                entry["alive"] = False
    results = []
    for entry in processes:
        os.close(entry["to"])
        os.close(entry["from"])
        entry["process"].wait()
        entry["stdout"].seek(0)
        entry["stderr"].seek(0)
        lines = [line for line in entry["stdout"].read().splitlines() if line.startswith("{")]
        result = json.loads(lines[-1]) if lines else {"error": entry["stderr"].read()[-2000:]}
        result.update(allocator=entry["allocator"], exit=entry["process"].returncode)
        results.append(result)
    return results


def lockstep_rows(name, allocators, runs):
    """Per step, each allocator's time over torch-native's time of the same step (run a moment apart):
    the median of those ratios, its bootstrapped 95% interval, and the ratio of the runs' medians."""
    if "torch-native" not in runs:
        return []
    rows = []
    for allocator in allocators:
        if allocator == "torch-native":
            continue
        native = {r["repeat"]: r for r in runs["torch-native"] if "step_ms" in r}
        ratios = [a / b for r in runs[allocator] if "step_ms" in r and r["repeat"] in native
                  for a, b in zip(r["step_ms"], native[r["repeat"]]["step_ms"])]
        medians = median_ratios(runs, allocator)
        if not ratios:
            continue
        generator = random.Random(0)
        resampled = sorted(statistics.median(generator.choices(ratios, k=len(ratios))) for _ in range(2000))
        rows.append(f"| {name} | {allocator} | {len(ratios)} | {statistics.median(ratios):.4f} | "
                    f"{resampled[50]:.4f}-{resampled[1949]:.4f} | {', '.join('%.4f' % m for m in medians)} | "
                    f"{100 * (max(medians) - min(medians)):.2f} |")
    return rows


def cpu_slices(count, repeat):
    """`count` disjoint CPU ranges (taskset syntax) over this machine's CPUs, rotated by `repeat`."""
    width = max(1, (os.cpu_count() or count) // count)
    slices = [f"{i * width}-{i * width + width - 1}" for i in range(count)]
    shift = repeat % count
    return slices[shift:] + slices[:shift]


def median_ratios(runs, allocator):
    """Per repeat, the allocator's median step time over torch-native's of the same repeat."""
    native = {r["repeat"]: r["step_ms_median"] for r in runs["torch-native"] if "step_ms_median" in r}
    return [r["step_ms_median"] / native[r["repeat"]] for r in runs[allocator]
            if "step_ms_median" in r and r["repeat"] in native]


def paired_rows(name, allocators, runs):
    """Each repeat's run against torch-native's run of the same repeat (they ran next to each other,
    so a slow drift of the machine cancels): the median and range of those ratios."""
    if "torch-native" not in runs:
        return []
    rows = []
    for allocator in allocators:
        if allocator == "torch-native":
            continue
        ratios = median_ratios(runs, allocator)
        if ratios:
            rows.append(f"| {name} | {allocator} | {statistics.median(ratios):.4f} | {min(ratios):.4f}-{max(ratios):.4f} | "
                        f"{', '.join('%.4f' % x for x in ratios)} |")
    return rows


def probe(args, allocators, results):
    name, batch = args.probe.split(":")
    jobs = [(a, None) for a in allocators] + [(a, args.cap_fraction) for a in allocators]

    def one(job):
        allocator, fraction = job
        extra = ["--warmup", "1", "--batch", batch] + (["--memory-fraction", str(fraction)] if fraction else [])
        return dict(run_workload(name, allocator, 3, extra, False), probe=args.probe, fraction=fraction)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        done = list(pool.map(one, jobs))
    results += done
    table = [f"| allocator ({name}, batch {batch}) | cap | fits | peak allocated MiB | peak reserved MiB | device total MiB |",
             "|---|---|---|---|---|---|"]
    for r in done:
        table.append(f"| {r['allocator']} | {r['fraction'] or 'none'} | {'yes' if r['exit'] == 0 else 'no (exit %d)' % r['exit']} | "
                     f"{r.get('peak_alloc_MiB', float('nan')):.0f} | {r.get('peak_reserved_MiB', float('nan')):.0f} | "
                     f"{r.get('device_total_MiB', float('nan')):.0f} |")
    messages = [f"--- {r['allocator']} under cap {r['fraction']}:\n{r.get('message') or r.get('error', '')}"
                for r in done if r["exit"] != 0]
    return table, messages


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", default="resnet50,gpt2,bert_varlen,llm_generate")
    parser.add_argument("--allocators", default=DEFAULT_ALLOCATORS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cap-fraction", type=float, default=0.1)
    parser.add_argument("--skip-cap", action="store_true")
    parser.add_argument("--skip-runs", action="store_true")
    parser.add_argument("--cap-ranges", default="gpt2:4:12,bert_varlen:16:80",
                        help="WORKLOAD:LOW:HIGH,... batch ranges searched under the cap")
    parser.add_argument("--jobs", type=int, default=4, help="cap searches and probes run side by side")
    parser.add_argument("--probe", help="WORKLOAD:BATCH: peaks uncapped and OOM messages under the cap")
    parser.add_argument("--no-smi", action="store_true", help="no nvidia-smi sampling during step-time runs")
    parser.add_argument("--steps", type=int, help="measured steps per run (default: 12; llm_generate: 2 calls)")
    parser.add_argument("--workload-args", default="", help="more arguments for bench/workloads.py's step-time runs")
    parser.add_argument("--concurrent", action="store_true",
                        help="step-time runs of all allocators at the same time, on disjoint CPUs (no nvidia-smi)")
    parser.add_argument("--replay-shapes", action="store_true",
                        help="as many warm-up steps as measured ones, and the measured steps repeat their shapes "
                             "(bench/workloads.py --replay-shapes)")
    parser.add_argument("--lockstep", action="store_true",
                        help="step-time runs of all allocators alive at once, taking turns step by step")
    parser.add_argument("--taskset", help="pin every workload process to these CPUs (taskset -c), e.g. 0-3")
    parser.add_argument("--out")
    args = parser.parse_args()
    global TASKSET
    TASKSET = args.taskset
    allocators = args.allocators.split(",")
    results = []
    output = []
    try:
        if args.probe:  # a diagnosis only: no step-time runs, no cap search
            table, messages = probe(args, allocators, results)
            print("\n".join(table + [""] + messages), flush=True)
            output += table + [""]
            args.skip_runs = args.skip_cap = True
        if not args.skip_runs:
            table = step_time_table(args, allocators, results)
            print("\n".join(table), flush=True)
            output += table + [""]
        if not args.skip_cap:
            cap = ["| workload | cap (fraction of the GPU) | " + " | ".join(allocators) + " |",
                   "|---|---|" + "---|" * len(allocators)]
            searches = []
            for entry in args.cap_ranges.split(","):
                name, low, high = entry.split(":")
                searches += [(name, a, int(low), int(high)) for a in allocators]
            log = []
            with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
                found = list(pool.map(lambda s: largest_batch(s[0], s[1], args.cap_fraction, s[2], s[3], log), searches))
            results += log
            for entry in args.cap_ranges.split(","):
                name = entry.split(":")[0]
                batches = [b for (n, _, _, _), b in zip(searches, found) if n == name]
                results.append({"cap_workload": name, "fraction": args.cap_fraction,
                                "range": entry, "largest_batch": dict(zip(allocators, batches))})
                high = int(entry.split(":")[2])  # "+": the search's ceiling fits, the largest may be larger
                cap.append(f"| {name} | {args.cap_fraction} | " +
                           " | ".join(f"{b}{'+' if b == high else ''}" for b in batches) + " |")
            print("\n".join(cap), flush=True)
            output += cap
    finally:
        if args.out:
            with open(args.out, "w") as f:
                for r in results:
                    f.write(json.dumps(r) + "\n")
    print("\n".join(output))


if __name__ == "__main__":
    main()
