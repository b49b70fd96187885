"""A longer run made of a trace: its steps repeated with the tensors that outlive them kept.

    python3 bench/repeat_steps.py TRACE.csv.gz REPEATS OUT.csv.gz

`gpumem replay --passes N` replays a whole trace N times and frees everything between passes, so each
pass starts from memory with no live block: unlike a training job, whose weights and optimizer state
stay where they were made while its steps repeat. This writes one trace in which the allocations the
trace never frees (the model's state) are made once, by the first copy, and every other event is
repeated REPEATS times (ids renumbered per copy, the same stream), so that a single replay of OUT
(`gpumem replay OUT --json`, `python3 bench/expandable_model.py OUT`) shows what a longer run of the
same steps reserves.
"""
import argparse
import gzip
import sys

from trace_file import read_events


def repeat(events, repeats):
    """The events of `repeats` copies: kept allocations only in the first; ids offset per copy."""
    freed = {ident for kind, ident, _, _ in events if kind == "f"}
    kept = {ident for kind, ident, _, _ in events if kind == "a" and ident not in freed}
    offset = max((ident for _, ident, _, _ in events), default=0) + 1
    for copy in range(repeats):
        for kind, ident, size, stream in events:
            if copy and ident in kept:
                continue
            yield kind, ident + copy * offset, size, stream


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("repeats", type=int)
    parser.add_argument("out")
    a = parser.parse_args()
    if a.repeats < 1:
        parser.error("REPEATS wants 1 or more")
    try:
        events = read_events(a.trace)
        with gzip.open(a.out, "wt") as out:
            out.write("# op,id,size,stream\n")
            for kind, ident, size, stream in repeat(events, a.repeats):
                out.write(f"{kind},{ident},{size},{stream}\n")
    except (OSError, ValueError, EOFError) as error:
        print(f"repeat_steps: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
