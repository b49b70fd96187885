"""A trace file's events, as the bench scripts that replay or rewrite traces in Python read them.

    from trace_file import read_events
    for kind, ident, size, stream in read_events("data/traces/gpt2.csv.gz"): ...

The format is `../shared/README.md`'s (gzip-compressed when the name ends in .gz): a `#` header, then
`a,<id>,<bytes>,<stream>` or `f,<id>,<bytes>,<stream>` a line. A line of any other shape raises
ValueError naming the file and the line, so that a malformed trace is refused, not half replayed.
"""
import gzip


def read_events(path):
    """The events of the trace at `path`: a list of (kind, id, bytes, stream), ids and bytes as ints."""
    opener = gzip.open if path.endswith(".gz") else open
    events = []
    with opener(path, "rt") as lines:
        for line in lines:
            if line.startswith("#") or not line.strip():
                continue
            fields = line.strip().split(",")
            if fields[0] not in ("a", "f") or len(fields) != 4:
                raise ValueError(f"{path}: not a trace line: {line.strip()!r}")
            events.append((fields[0], int(fields[1]), int(fields[2]), fields[3]))
    return events
