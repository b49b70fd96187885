"""Check gpumem against the anchors on the traces bench/record_traces.py recorded: for each trace, gpumem's
ratio (peak reserved / peak live, `gpumem replay TRACE --json` on the sim backend, default engine) next
to the ratios of PyTorch's allocator, expandable segments and cudaMallocAsync measured on the GPU, and
whether gpumem meets the target min(1.02, torch-expandable's ratio). No GPU and no PyTorch needed.

    python3 bench/more_traces_table.py ANCHORS_JSON [TRACE_DIRECTORY] [--gpumem build/gpumem] [--conf KEYS]

ANCHORS_JSON is record_traces.py's anchors.json; the traces (NAME.csv.gz) are looked for beside it
unless TRACE_DIRECTORY is given; --conf adds GPUMEM_CONF keys to gpumem's replay (for example
max_chunk_size:8MiB,move_slack:0.01). A trace that failed on the GPU, has no torch-expandable ratio, whose
peak live differs from the anchors' (another recording) or that gpumem cannot replay fails the check;
an unavailable workload (a package it needs not installed) is listed as such and is never a pass.

Exit status: 0 gpumem meets the target on every trace that is not unavailable; 1 it misses it on some,
or some could not be checked; 2 bad usage.
"""
import argparse
import json
import os
import sys

from replay_table import ANCHORS, replay

LIMIT = 1.02
MiB = 2**20


def check(gpumem, path, entry, conf=None):
    """One row of the table and whether it is a pass (None: unavailable, neither)."""
    name = os.path.basename(path).split(".")[0]
    if entry is not None and "unavailable" in entry:
        return [name] + [""] * 6 + [entry["unavailable"]], None
    try:
        ours = replay(gpumem, path, "pages", 1, conf) if os.path.exists(path) else None
    except SystemExit as failure:  # replay_table's message: gpumem's own error
        return [name] + [""] * 6 + ["gpumem replay failed: " + str(failure.code).replace("\n", " ")], False
    live = f"{ours['peak_live_bytes'] / MiB:.1f}" if ours else "-"
    ratio = f"{ours['ratio']:.4f}" if ours else "-"
    replayed = (entry or {}).get("replay", {})
    anchors = [f"{replayed[a]['ratio']:.4f}" if a in replayed else "-" for a in ANCHORS]
    expandable = replayed.get("torch-expandable")
    target = min(LIMIT, expandable["ratio"]) if expandable else None
    row = [name, live, ratio] + anchors + [f"{target:.4f}" if target is not None else "-"]
    errors = (entry or {}).get("errors")
    if entry is None:
        return row + ["no anchors for this trace"], False
    if errors:
        step, message = next(iter(errors.items()))
        return row + [f"failed on the GPU ({step}): {message}"], False
    if ours is None:
        return row + [f"no trace {path}"], False
    if target is None:
        return row + ["no torch-expandable ratio"], False
    if abs(ours["peak_live_bytes"] / MiB - entry["peak_live_MiB"]) > 0.1:
        return row + [f"peak live differs from the anchors' {entry['peak_live_MiB']} MiB"], False
    met = round(ours["ratio"], 4) <= target
    return row + ["yes" if met else "no"], met


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("anchors", help="anchors.json written by bench/record_traces.py")
    parser.add_argument("traces", nargs="?", help="the folder of NAME.csv.gz (default: the anchors' folder)")
    parser.add_argument("--gpumem", default=os.environ.get("GPUMEM", "build/gpumem"))
    parser.add_argument("--conf", help="GPUMEM_CONF keys for gpumem's replay (default: none, the defaults)")
    args = parser.parse_args()
    directory = args.traces or os.path.dirname(os.path.abspath(args.anchors))
    if not os.path.isfile(args.anchors) or not os.path.isdir(directory):
        parser.error(f"need an anchors file ({args.anchors}) and a trace folder ({directory})")
    if not os.access(args.gpumem, os.X_OK):
        parser.error(f"no gpumem at {args.gpumem}: build it (cmake -S . -B build && cmake --build build) or give --gpumem")
    with open(args.anchors) as f:
        entries = json.load(f)["traces"]
    names = set(entries) | {f.split(".")[0] for f in os.listdir(directory) if f.endswith(".csv.gz")}
    header = ["trace", "peak live MiB", "gpumem ratio"] + [f"{a} ratio" for a in ANCHORS] + \
             [f"target min({LIMIT}, expandable)", "gpumem meets it"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    passes, checked, unavailable = 0, 0, []
    for name in sorted(names):
        row, met = check(args.gpumem, os.path.join(directory, name + ".csv.gz"), entries.get(name), args.conf)
        print("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
        if met is None:
            unavailable.append(f"{name} ({row[-1]})")
            continue
        checked += 1
        passes += bool(met)
    print(f"\ngpumem meets the target on {passes} of {checked} traces; unavailable (no pass): "
          f"{', '.join(unavailable) or 'none'}")
    return 0 if passes == checked else 1


if __name__ == "__main__":
    sys.exit(main())
