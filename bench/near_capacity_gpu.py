"""Training that nearly fills the GPU: bench/more_workloads.py's models run on a device of which all but a
little more than the run's peak allocated memory is taken first (cuMemAlloc, outside any allocator), under
PyTorch's allocators, gpumem's defaults, gpumem without the room share (gpumem-whole: chunk_room_share:0)
and gpumem with the page-sized chunks its out-of-memory report offers first.
Prints a markdown table. The GPU counterpart of bench/near_capacity.py.

    python3 bench/near_capacity_gpu.py [--runs vit:0,llama_varlen:1] [--factors 1.02,1.03]
                                       [--steps 4] [--warmup 2] [--out results.jsonl]
                                       [--allocators gpumem,gpumem-whole]

For each model and seed a calibration run (gpumem, the whole device) gives the peak allocated bytes P
and the memory the process uses outside the allocator as it runs (kernels loaded, library handles: G);
then each allocator runs in a fresh process with P x FACTOR + G MiB of the device left to it. "fits"
means all steps ran; otherwise the error's first line. gpumem-pages is gpumem with
GPUMEM_TORCH=max_chunk_size:2MiB, as the report offers.
"""
import argparse
import json
import statistics
import sys

import more_models_gpu
from near_capacity import factor_list
from torch_allocators import environment

ALLOCATORS = ("torch-native", "torch-expandable", "gpumem", "gpumem-whole", "gpumem-pages")


def allocator_list(text):
    """--allocators: some of ALLOCATORS, comma-separated, in the order given."""
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in ALLOCATORS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of {', '.join(ALLOCATORS)}: {text!r}")
    return names


def run(workload, seed, allocator, steps, warmup, room=None):
    """more_models_gpu.run with the device left `room` MiB (when given); gpumem-pages is gpumem with the
    page-sized chunks its out-of-memory report offers first. The error's tail is long
    enough to hold PyTorch's out-of-memory sentence before gpumem's report (whose remedies for
    fragmentation run to several thousand characters)."""
    env = environment("gpumem" if allocator == "gpumem-pages" else allocator)
    if allocator == "gpumem-pages":
        env["GPUMEM_TORCH"] = "max_chunk_size:2MiB"
    extra = ["--device-room", f"{room:.0f}"] if room else []
    result = more_models_gpu.run(workload, seed, allocator, steps, warmup, extra, env, error_tail=16000)
    result["room_MiB"] = room
    return result


def first_error_line(result):
    """The error's most telling line: PyTorch's out-of-memory sentence, else gpumem's cause, else the
    last line."""
    lines = [line for line in result.get("error", "").splitlines() if line.strip()]
    for marks in (("OutOfMemoryError", "out of memory"), ("Cause: ",)):
        for line in lines:
            if any(mark in line for mark in marks):
                return line.strip()[:160]
    return (lines[-1] if lines else f"exit status {result['exit']}")[:160]


def row(r, warmup):
    """The table's line for one run."""
    head = f"| {r['workload']} | {r['seed']} | {r['factor']:g} | {r['allocator']} | "
    if r["exit"] != 0:
        return head + "no: " + first_error_line(r).replace("|", "/") + " | - | - | - |"
    calls = "-"
    if r["allocator"].startswith("gpumem"):
        calls = f"{sum(step['ms'] for step in r['device_calls_per_step']):.1f}"
    return head + (f"yes | {r['peak_reserved_MiB']:.0f} | {statistics.median(r['step_ms'][warmup:]):.1f} | "
                   f"{calls} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="vit:0,llama_varlen:1")
    parser.add_argument("--factors", default="1.02,1.03", type=factor_list)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out")
    parser.add_argument("--allocators", default=",".join(ALLOCATORS), type=allocator_list,
                        help="which allocators run at each factor (default: all of them)")
    a = parser.parse_args()
    print("| model | seed | room / peak allocated | allocator | fits | peak reserved MiB | step ms (median) | "
          "gpumem device calls ms (all steps) |")
    print("|---|---|---|---|---|---|---|---|")
    for item in a.runs.split(","):
        workload, seed = item.split(":")
        calibration = run(workload, int(seed), "gpumem", a.steps, a.warmup)
        if calibration["exit"] != 0:
            sys.exit(f"bench/near_capacity_gpu.py: the calibration run of {item} failed: "
                     f"{first_error_line(calibration)}")
        peak = calibration["peak_alloc_MiB"]
        growth = max(0.0, calibration["driver_used_end_MiB"] - calibration["driver_used_start_MiB"]
                     - calibration["reserved_end_MiB"])
        results = [calibration]
        print(f"{item}: peak allocated {peak:.0f} MiB, memory used outside the allocator grew {growth:.0f} MiB",
              file=sys.stderr, flush=True)
        for factor in a.factors:
            room = peak * factor + growth
            for allocator in a.allocators:
                r = run(workload, int(seed), allocator, a.steps, a.warmup, room)
                r["factor"], r["outside_growth_MiB"] = factor, growth
                results.append(r)
                print(row(r, a.warmup), flush=True)
        if a.out:
            with open(a.out, "a") as out:
                for r in results:
                    out.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
