#!/usr/bin/env python3
"""bench/empty_cache_steps.py -- training traces replayed on the sim with empty_cache() at every step.

    python3 bench/empty_cache_steps.py [--traces data/traces/gpt2.csv.gz,...] [--confs -,engine:segments]
                                       [--repeat-step K [--repeats N]]

Scripts that call torch.cuda.empty_cache() at the end of every training step give the whole cache back
to the driver and make it again in the next step, so each step pays a growth's device calls. This
replays a trace through the Python binding on the sim backend and calls gm_empty_cache at each step's
end, and prints, per trace and configuration ("-": the defaults; engine:segments: plain segments, one
device allocation per growth, as PyTorch's allocator makes them), the modelled device time of a step
(the median over the steps after the first two), the device allocations of such a step and the peak
reserved memory, with and without the empty_cache calls.

A step's end is found in the trace: the points where live memory comes back down to the level it keeps
between steps (the minimum over the trace's second half, plus 2% and 1 MiB) after it has been more than
halfway up to its peak. Traces whose steps do not come back to one level (variable lengths) show few.

--repeat-step K replays the trace up to the start of its step K (counted from 0, at least 1), then
step K N times (--repeats, default 8): a loop of fixed shapes made from one whose steps differ (a
decoder trained at one sequence length). A block the step frees that an earlier step made stands for
the block of the same size (else the nearest) that the last repetition left live.
"""
import argparse
import gzip
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import gpumem  # noqa: E402

DEFAULT_TRACES = ["data/traces/gpt2.csv.gz", "data/traces-extra/gpt2_batch8.csv.gz", "data/traces/resnet50.csv.gz", "data/traces-more/vit-seed0.csv.gz",
                  "data/traces-more/llama_varlen-seed0.csv.gz"]


def load(path):
    """The trace's operations; exits with a message if it cannot be read or a line is not an operation."""
    operations = []
    try:
        with gzip.open(path, "rt") as lines:
            for number, line in enumerate(lines, 1):
                if line.startswith("#"):
                    continue
                kind, identifier, size, stream = line.strip().split(",")
                if kind not in ("a", "f"):
                    raise ValueError(f"line {number}: operation {kind!r} is neither 'a' nor 'f'")
                operations.append((kind, int(identifier), int(size), int(stream)))
    except (OSError, EOFError, ValueError) as error:
        sys.exit(f"bench/empty_cache_steps.py: cannot read the trace {path}: {error}")
    return operations


def step_ends(operations):
    """The operation indices after which a step ends (module docstring)."""
    live, series, sizes = 0, [], {}
    for kind, identifier, size, _ in operations:
        if kind == "a":
            sizes[identifier] = size
            live += size
        else:
            live -= sizes.pop(identifier)
        series.append(live)
    peak, floor = max(series), min(series[len(series) // 2:])
    ends, armed = [], False
    for index, value in enumerate(series):
        if value > floor + (peak - floor) / 2:
            armed = True
        elif armed and value <= floor * 1.02 + (1 << 20):
            ends.append(index)
            armed = False
    return ends


def repeated(operations, ends, step, repeats):
    """The operations before step `step`, then that step `repeats` times, each identifier renamed per
    repetition (see the module docstring), and the new step ends."""
    sizes, live = {}, {}
    prologue = operations[:ends[step - 1] + 1]
    for kind, identifier, size, _ in prologue:
        if kind == "a":
            live[identifier] = size
        else:
            del live[identifier]
    body = operations[ends[step - 1] + 1:ends[step] + 1]
    for kind, identifier, size, _ in operations:
        if kind == "a":
            sizes[identifier] = size
    result, new_ends, carried = list(prologue), list(ends[:step]), {}
    for identifier, size in live.items():
        carried.setdefault(size, []).append(identifier)
    fresh = max(sizes) + 1
    for _ in range(repeats):
        renamed = {}
        for kind, identifier, size, stream in body:
            if kind == "a":
                renamed[identifier] = fresh
                fresh += 1
                result.append((kind, renamed[identifier], size, stream))
                continue
            if identifier in renamed:
                result.append((kind, renamed.pop(identifier), size, stream))
                continue
            want = sizes[identifier]
            key = want if carried.get(want) else min((k for k in carried if carried[k]), key=lambda k: abs(k - want))
            result.append((kind, carried[key].pop(0), key, stream))
        for identifier, new in renamed.items():
            carried.setdefault(sizes[identifier], []).append(new)
        new_ends.append(len(result) - 1)
    return result, new_ends


def replay(operations, ends, conf, empty_cache):
    """(device ms of each step, device allocations of each step, peak reserved bytes)."""
    allocator = gpumem.Allocator("backend:sim,capacity:140GiB" + (f",{conf}" if conf else ""))
    pointers, ends, steps, allocations = {}, set(ends), [], []
    last_ns = last_allocations = 0
    try:
        for index, (kind, identifier, size, stream) in enumerate(operations):
            if kind == "a":
                pointers[identifier] = allocator.malloc(size, stream)
            else:
                allocator.free(pointers.pop(identifier))
            if index in ends:
                if empty_cache:
                    allocator.empty_cache()
                stats = allocator.memory_stats()
                made = stats["device_calls.physical_create"] + stats["device_calls.segment_allocate"]
                steps.append((stats["device_call_ns"] - last_ns) / 1e6)
                allocations.append(made - last_allocations)
                last_ns, last_allocations = stats["device_call_ns"], made
        return steps, allocations, allocator.memory_stats()["reserved_bytes.all.peak"]
    finally:
        allocator.close()


def median_after_two(values):
    later = sorted(values[2:]) or sorted(values)
    return later[len(later) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=",".join(DEFAULT_TRACES))
    parser.add_argument("--confs", default="-,engine:segments")
    parser.add_argument("--repeat-step", type=int, help="replay this step (from 0) again and again")
    parser.add_argument("--repeats", type=int, default=8)
    arguments = parser.parse_args()
    print("| trace | conf | steps found | device ms a step, no empty_cache | device ms a step, empty_cache "
          "every step | device allocations a step | peak reserved MiB, without / with |")
    print("|---|---|---|---|---|---|---|")
    for path in arguments.traces.split(","):
        operations = load(os.path.join(ROOT, path) if not os.path.isabs(path) else path)
        ends = step_ends(operations)
        if not ends:
            print(f"| {os.path.basename(path)} | - | 0 | no step ends found | | | |")
            continue
        if arguments.repeat_step is not None:
            if not 1 <= arguments.repeat_step < len(ends):
                sys.exit(f"bench/empty_cache_steps.py: {os.path.basename(path)} has steps 1 to {len(ends) - 1} "
                         "to repeat")
            operations, ends = repeated(operations, ends, arguments.repeat_step, arguments.repeats)
        for conf in arguments.confs.split(","):
            conf = "" if conf == "-" else conf
            try:
                kept, _, peak_kept = replay(operations, ends, conf, False)
                emptied, made, peak_emptied = replay(operations, ends, conf, True)
            except gpumem.GpumemError as error:
                sys.exit(f"bench/empty_cache_steps.py: {os.path.basename(path)} with conf {conf!r}: {error}")
            name = os.path.basename(path).replace('.csv.gz', '')
            if arguments.repeat_step is not None:
                name += f", step {arguments.repeat_step} x{arguments.repeats}"
            print(f"| {name} | {conf or 'defaults'} | {len(ends)} "
                  f"| {median_after_two(kept):.1f} | {median_after_two(emptied):.1f} | {median_after_two(made)} "
                  f"| {peak_kept >> 20} / {peak_emptied >> 20} |", flush=True)


if __name__ == "__main__":
    main()
