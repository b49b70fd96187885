"""Robustness beyond the shared llm_generate trace: the same generate calls in other orders, so that
the largest call (and the memory peak) comes after other calls instead of first. Replayed on the sim
with the pages engine's defaults and with its growth lane switched off. Prints a
markdown table.

    python3 bench/reordered_traces.py [--gpumem build/gpumem] [--trace data/traces/llm_generate.csv.gz]
                                      [--orders 4] [--seed 1]

The trace is cut where no allocation made after the first free is live (between generate calls);
the allocations before the first free (the weights) stay first, and the pieces are written in the
reversed order and in `--orders` random ones. The traces go to a temporary folder, removed afterwards.
"""
import argparse
import gzip
import os
import random
import sys
import tempfile

from sim_replay import replay

CONFIGS = [("defaults", ""), ("growth_lane:false", "growth_lane:false")]


def read_events(path):
    with gzip.open(path, "rt") as reader:
        return [line for line in reader if not line.startswith("#")]


def pieces(events, minimum=100000):
    """The weights' prefix length and the self-contained pieces (start, end) after it."""
    allocated, freed = {}, {}
    for index, line in enumerate(events):
        kind, ident = line.split(",", 2)[:2]
        (allocated if kind == "a" else freed)[ident] = index
    first_free = min(freed.values())
    change = [0] * (len(events) + 2)
    for ident, start in allocated.items():
        if start >= first_free and ident in freed:
            change[start + 1] += 1
            change[freed[ident] + 1] -= 1
    spanning, cuts, previous = 0, [], first_free
    for position in range(len(events) + 1):
        spanning += change[position]
        if position > first_free and spanning == 0 and position - previous >= minimum:
            cuts.append((previous, position))
            previous = position
    if previous < len(events):
        cuts.append((previous, len(events)))
    return first_free, cuts


def write(events, prefix, cuts, order, path):
    with gzip.open(path, "wt") as writer:
        writer.write("# op,id,size,stream\n")
        writer.writelines(events[:prefix])
        for piece in order:
            start, end = cuts[piece]
            writer.writelines(events[start:end])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpumem", default="build/gpumem")
    parser.add_argument("--trace", default="data/traces/llm_generate.csv.gz")
    parser.add_argument("--orders", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    events = read_events(args.trace)
    prefix, cuts = pieces(events)
    if len(cuts) < 2:
        sys.exit(f"{args.trace}: fewer than two self-contained pieces to reorder")
    generator = random.Random(args.seed)
    orders = [("original", list(range(len(cuts)))), ("reversed", list(range(len(cuts)))[::-1])]
    for number in range(args.orders):
        order = list(range(len(cuts)))
        generator.shuffle(order)
        orders.append((f"random {number + 1}", order))
    header = "| order | " + " | ".join(f"{name} ratio | {name} device ms" for name, _ in CONFIGS) + " |"
    print(header)
    print("|---|" + "---|---|" * len(CONFIGS))
    with tempfile.TemporaryDirectory() as folder:
        for name, order in orders:
            path = os.path.join(folder, "reordered.csv.gz")
            write(events, prefix, cuts, order, path)
            cells = []
            for _, conf in CONFIGS:
                result = replay(args.gpumem, path, conf)
                cells.append(f"{result['ratio']:.4f} | {result['device_call_ms']:.1f}")
            print(f"| {name} {''.join(map(str, order))} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
