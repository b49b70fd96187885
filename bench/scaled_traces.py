"""Robustness beyond the four shared traces: each training trace with its large requests scaled (as
a different batch size would scale activations), replayed on the sim (an H200's capacity) by the pages
engine, by the pages engine without the room share (chunk_room_share:0: chunks of up to max_chunk_size
however full the device), without any chunk-size limit, and by the segments engine. Prints a markdown
table, with the device time of the first two.

    python3 bench/scaled_traces.py [--gpumem build/gpumem] [--traces data/traces] [--factors 0.37,0.5,0.73,1.3]

Requests above 1 MiB are multiplied by the factor (activations and their gradients grow with the
batch); smaller ones (small tensors, most parameters of these models stay below or near it) are kept.
The scaled traces are written to a temporary folder and removed afterwards.
"""
import argparse
import gzip
import os
import tempfile

from sim_replay import replay

CONFIGS = [("pages", ""), ("pages, chunk_room_share:0", "chunk_room_share:0"),
           ("pages, no chunk limit", "max_chunk_size:0,chunk_room_share:0"), ("segments", "engine:segments")]


def scale(source, factor, destination):
    with gzip.open(source, "rt") as reader, gzip.open(destination, "wt") as writer:
        for line in reader:
            if line.startswith("#"):
                writer.write(line)
                continue
            kind, ident, size, stream = line.rstrip("\n").split(",")
            size = int(size)
            if size > 1 << 20:
                size = max(1, int(size * factor))
            writer.write(f"{kind},{ident},{size},{stream}\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpumem", default="build/gpumem")
    parser.add_argument("--traces", default="data/traces")
    parser.add_argument("--factors", default="0.37,0.5,0.73,1.3")
    arguments = parser.parse_args()
    factors = [float(f) for f in arguments.factors.split(",")]
    names = sorted(n for n in os.listdir(arguments.traces) if n.endswith(".csv.gz") and "llm" not in n)
    header = ["trace", "factor", "peak live MiB"] + [f"{label} ratio" for label, _ in CONFIGS] + [
        "pages device ms", "pages, chunk_room_share:0 device ms"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            for factor in factors:
                path = os.path.join(folder, f"{factor}_{name}")
                scale(os.path.join(arguments.traces, name), factor, path)
                results = [replay(arguments.gpumem, path, conf) for _, conf in CONFIGS]
                row = [name.split(".")[0], f"{factor:g}", f"{results[0]['peak_live_bytes'] / 2**20:.0f}"]
                row += [f"{r['ratio']:.4f}" for r in results] + [f"{r['device_call_ms']:.1f}" for r in results[:2]]
                print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
