"""Warm passes on devices a few times a program's need: each trace replayed several times on one allocator
on a simulated device whose capacity is a multiple of the trace's peak of live bytes (1.05 to 3 times:
a 24 GB GPU under a 12 GB model is 2), as a training loop repeats its steps. A memory limit (GPUMEM_CONF
memory_limit, torch's memory fraction) is a smaller device to the engine, so the rows hold for limits
too. Per row: reserved / live peak in the first and the last pass, and the modelled device-call time
(the H200's cost model) of the warm passes -- what a settled program would not spend at all. No GPU
needed.

    python3 bench/smaller_devices.py [--gpumem build/gpumem] [--factors 1.05,1.2,1.5,2,3] [--passes 6]
                                     [--conf KEY:VALUE,...]... [TRACE ...]

Without traces: every trace of data/traces, data/traces-extra and data/traces-more. Each --conf adds a
table (on top of the defaults); without one, the defaults alone.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys

from near_capacity import ROOT, all_traces, factor_list, live_peaks, require_gpumem

WARM_MS_SETTLED = 1.0  # a warm pass under this is counted as settled


def replay_passes(gpumem, path, capacity, passes, conf):
    """The JSON line of each pass of `path` replayed `passes` times on one allocator (fewer when a pass
    ran out of memory: the replay stops there)."""
    command = [gpumem, "replay", path, "--json", "--passes", str(passes), "--capacity", str(capacity)]
    if conf:
        command += ["--conf", conf]
    run = subprocess.run(command, capture_output=True, text=True)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode not in (0, 3) or not lines:  # 3: some allocations failed with out of memory
        sys.exit(f"bench/smaller_devices.py: {' '.join(command)} failed with exit status {run.returncode}:\n"
                 f"{run.stderr.strip()}")
    return lines


def row_of(path, factor, results, passes):
    """One table row: the first and last pass's ratio, the warm passes' device time, failures."""
    warm = [r["device_call_ms"] for r in results[1:]]
    failed = sum(r["ooms"] for r in results)
    last = f"{results[-1]['ratio']:.4f}" + ("" if len(results) == passes else f" (pass {len(results)})")
    return [os.path.basename(path).split(".")[0], f"{factor:g}", f"{results[0]['ratio']:.4f}", last,
            f"{max(warm, default=0):.1f}", f"{sum(warm):.1f}", str(failed)]


def print_table(title, rows):
    header = ["trace", "device / live peak", "ratio, first pass", "ratio, last pass",
              "warm pass device ms, most", "warm passes device ms, all", "failed allocations"]
    print(f"{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    settled = sum(1 for row in rows if float(row[4]) < WARM_MS_SETTLED and row[6] == "0")
    print(f"\nsettled (every warm pass under {WARM_MS_SETTLED:g} ms, nothing failed): {settled} of {len(rows)}\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*")
    parser.add_argument("--gpumem", default=os.path.join(ROOT, "build", "gpumem"))
    parser.add_argument("--factors", default="1.05,1.2,1.5,2,3", type=factor_list,
                        help="capacities as multiples of the live peak, comma-separated, each at least 1")
    parser.add_argument("--passes", type=int, default=6, help="replays of each trace on one allocator (at least 2)")
    parser.add_argument("--conf", action="append", default=[], help="a configuration to compare (repeatable)")
    arguments = parser.parse_args()
    if arguments.passes < 2:
        sys.exit("bench/smaller_devices.py: --passes must be at least 2 (the warm passes are the question)")
    require_gpumem(arguments.gpumem, "bench/smaller_devices.py")
    traces = arguments.traces or all_traces()
    if not traces:
        sys.exit("bench/smaller_devices.py: no traces")
    configurations = [("defaults", "")] + [(conf, conf) for conf in arguments.conf]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        peaks = live_peaks(pool, arguments.gpumem, traces)
        jobs = {(path, factor, conf): pool.submit(replay_passes, arguments.gpumem, path, int(peaks[path] * factor),
                                                  arguments.passes, conf)
                for path in traces for factor in arguments.factors for _, conf in configurations}
        for name, conf in configurations:
            rows = [row_of(path, factor, jobs[(path, factor, conf)].result(), arguments.passes)
                    for path in traces for factor in arguments.factors]
            print_table(f"{name}, {arguments.passes} passes", rows)


if __name__ == "__main__":
    main()
