"""Print the replay benchmark table: gpumem's engines on the sim backend next to the anchors.

Called by bench/replay.sh: replay_table.py GPUMEM TRACE_DIRECTORY ANCHORS_JSON REPEAT
For each trace and engine, gpumem replay --json runs REPEAT times; ratio and device-call time are
deterministic, ns/op is the median. The device-call budget is 2% of the trace's run time on the
GPU: 15 steps of torch-native's median step time (llm_generate: 7 calls of generate).
"""
import json
import os
import statistics
import subprocess
import sys

ENGINES = ["pages", "segments"]
ANCHORS = ["torch-native", "torch-expandable", "cuda-async"]


def replay(gpumem, path, engine, repeat, conf=None):
    runs = []
    for _ in range(repeat):
        run = subprocess.run([gpumem, "replay", path, "--json", "--conf", f"engine:{engine}" + (f",{conf}" if conf else "")],
                             capture_output=True, text=True)
        if run.returncode != 0:  # gpumem's own message says why; a traceback would hide it
            sys.exit(f"bench/replay.sh: gpumem replay {path} (engine {engine}) failed with exit status "
                     f"{run.returncode}:\n{run.stderr.strip()}")
        runs.append(json.loads(run.stdout))
    result = dict(runs[0])
    result["ns_per_op"] = statistics.median(r["ns_per_op"] for r in runs)
    return result


def main():
    gpumem, directory, anchors_path, repeat = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    anchors = {}
    if os.path.isfile(anchors_path):  # bench/replay.sh says when they are missing
        with open(anchors_path) as anchors_file:
            anchors = json.load(anchors_file)["traces"]
    names = sorted(f for f in os.listdir(directory) if f.endswith((".csv", ".csv.gz")))
    if not names:
        sys.exit(f"bench/replay.sh: no traces (.csv or .csv.gz files) in {directory}")
    header = ["trace", "peak live MiB"]
    for engine in ENGINES:
        header += [f"{engine} ratio", f"{engine} ns/op", f"{engine} device ms"]
    header += ["device budget ms"] + [f"{a} ratio" for a in ANCHORS] + [f"{a} ns/op" for a in ANCHORS]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    ratios = {engine: [] for engine in ENGINES}
    for name in names:
        trace = name.split(".")[0]
        results = {engine: replay(gpumem, os.path.join(directory, name), engine, repeat) for engine in ENGINES}
        row = [trace, f"{results['pages']['peak_live_bytes'] / 2**20:.1f}"]
        for engine in ENGINES:
            r = results[engine]
            ratios[engine].append(r["ratio"])
            row += [f"{r['ratio']:.4f}", f"{r['ns_per_op']:.0f}", f"{r['device_call_ms']:.1f}"]
        anchor = anchors.get(trace)
        if anchor:
            steps = 7 if trace == "llm_generate" else 15
            budget = 0.02 * steps * anchor["real"]["torch-native"]["step_ms_median"]
            row.append(f"{budget:.1f}")
            row += [f"{anchor['replay'][a]['ratio']:.4f}" for a in ANCHORS]
            row += [f"{anchor['replay'][a]['ns_per_op']}" for a in ANCHORS]
        else:
            row += ["-"] * (1 + 2 * len(ANCHORS))
        print("| " + " | ".join(row) + " |")
    means = ["**mean**", ""]
    for engine in ENGINES:
        means += [f"{statistics.mean(ratios[engine]):.4f}", "", ""]
    means += [""] * (1 + 2 * len(ANCHORS))
    print("| " + " | ".join(means) + " |")


if __name__ == "__main__":
    main()
