"""Programs that nearly fill the device: each trace replayed on a simulated device whose capacity is a
little above the trace's peak of live bytes, under gpumem's defaults and under the remedies its
out-of-memory report offers for fragmentation, and without the room share (chunk_room_share:0: chunks
of up to max_chunk_size however full the device). A cell is "failed allocations / modelled device ms"
(the H200's cost model); 0 failed means the trace fits on that device. No GPU needed.

    python3 bench/near_capacity.py [--gpumem build/gpumem] [--factors 1.005,1.01,1.02] [--grid] [TRACE ...]

With --grid: the smallest device each trace fits on, as one row per trace and configuration (the
defaults, and chunk_room_share:0) with a column per factor: "fits" or the allocations that failed.

Without traces: every trace of data/traces, data/traces-extra and data/traces-more. A memory limit is a
smaller device to the engine, so a limit just under the capacity fits what the defaults fit; the
report's first remedy is page-sized chunks (max_chunk_size:2MiB).
"""
import argparse
import concurrent.futures
import glob
import json
import os
import subprocess
import sys

MiB = 2**20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


CONFIGURATIONS = [("defaults", "engine:pages"),
                  ("chunk_room_share:0 (one chunk per growth up to max_chunk_size)", "chunk_room_share:0"),
                  ("max_chunk_size:2MiB (page-sized chunks)", "max_chunk_size:2MiB"),
                  ("compact_min:2MiB", "compact_min:2MiB"),
                  ("max_chunk_size:8MiB,move_slack:0.01", "max_chunk_size:8MiB,move_slack:0.01")]


def replay(gpumem, path, capacity=None, conf="engine:pages"):
    command = [gpumem, "replay", path, "--json", "--conf", conf]
    if capacity:
        command += ["--capacity", str(capacity)]
    run = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode not in (0, 3) or not lines:  # 3: some allocations failed with out of memory
        sys.exit(f"bench/near_capacity.py: {' '.join(command)} failed with exit status {run.returncode}:\n"
                 f"{run.stderr.strip()}")
    return json.loads(lines[0])


def live_peaks(pool, gpumem, traces):
    """Each trace's peak of live bytes, from one replay on the default device."""
    return dict(zip(traces, pool.map(lambda path: replay(gpumem, path)["peak_live_bytes"], traces)))


def print_grid(gpumem, traces, factors):
    """--grid: for each trace, under the defaults and without the room share, whether it fits on a device
    of each factor times its live peak."""
    grid = [("defaults", "engine:pages"), ("chunk_room_share:0", "chunk_room_share:0")]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        peaks = live_peaks(pool, gpumem, traces)
        jobs = {(path, factor, conf): pool.submit(replay, gpumem, path, int(peaks[path] * factor), conf)
                for path in traces for factor in factors for _, conf in grid}
        header = ["trace", "configuration"] + [f"{factor:g}" for factor in factors]
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for path in traces:
            for name, conf in grid:
                cells = []
                for factor in factors:
                    failed = jobs[(path, factor, conf)].result()["ooms"]
                    cells.append("fits" if failed == 0 else f"{failed} failed")
                print("| " + " | ".join([os.path.basename(path).split(".")[0], name] + cells) + " |")


def all_traces():
    """Every trace of data/traces, data/traces-extra and data/traces-more, folder by folder."""
    return sorted((p for d in ("traces", "traces-extra", "traces-more")
                   for p in glob.glob(os.path.join(ROOT, "data", d, "*.csv.gz"))),
                  key=lambda p: (os.path.basename(os.path.dirname(p)), os.path.basename(p)))


def require_gpumem(path, script):
    """Exit with a clear message unless `path` is an executable (the gpumem command to replay with)."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        sys.exit(f"{script}: {path} is not the gpumem command (build it first, or pass --gpumem PATH)")


def factor_list(text):
    """--factors: numbers of at least 1, comma-separated."""
    try:
        factors = [float(f) for f in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None
    if not factors or any(f < 1 for f in factors):
        raise argparse.ArgumentTypeError(f"each factor must be at least 1: {text!r}")
    return factors


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*")
    parser.add_argument("--gpumem", default=os.path.join(ROOT, "build", "gpumem"))
    parser.add_argument("--factors", default="1.005,1.01,1.02", type=factor_list,
                        help="capacities as multiples of the live peak, comma-separated, each at least 1")
    parser.add_argument("--grid", action="store_true",
                        help="a row per trace and configuration (defaults, chunk_room_share:0), a column per factor")
    arguments = parser.parse_args()
    factors = arguments.factors
    require_gpumem(arguments.gpumem, "bench/near_capacity.py")
    traces = arguments.traces or all_traces()
    if not traces:
        sys.exit("bench/near_capacity.py: no traces")
    if arguments.grid:
        print_grid(arguments.gpumem, traces, factors)
        return
    names = [c[0] for c in CONFIGURATIONS]
    header = ["trace", "peak live MiB", "capacity / peak live"] + names
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        peaks = live_peaks(pool, arguments.gpumem, traces)
        jobs = {}
        for path in traces:
            for factor in factors:
                capacity = int(peaks[path] * factor)
                for name, conf in CONFIGURATIONS:
                    jobs[(path, factor, name)] = pool.submit(replay, arguments.gpumem, path, capacity, conf)
        fits = {name: 0 for name in names}
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for path in traces:
            for factor in factors:
                row = [os.path.basename(path).split(".")[0], f"{peaks[path] / MiB:.1f}", f"{factor:g}"]
                for name in names:
                    result = jobs[(path, factor, name)].result()
                    fits[name] += result["ooms"] == 0
                    row.append(f"{result['ooms']} / {result['device_call_ms']:.0f}")
                print("| " + " | ".join(row) + " |")
    cells = len(traces) * len(factors)
    print()
    for name in names:
        print(f"{name}: fits {fits[name]} of {cells} (trace, capacity) pairs")


if __name__ == "__main__":
    main()
