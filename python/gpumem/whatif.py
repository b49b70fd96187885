"""What would gpumem reserve for my workload? -- from a snapshot PyTorch dumped (under its own allocator,
or under gpumem: then the trace it writes is what `gpumem tune` compares configurations on).

    import torch
    torch.cuda.memory._record_memory_history(max_entries=1000000)
    run_your_code()
    torch.cuda.memory._dump_snapshot("snap.pickle")

    python -m gpumem.whatif snap.pickle [--device N] [--trace OUT.csv] [--conf KEY:VALUE,...] [--json]

The snapshot's event history (its "device_traces") becomes a gpumem allocation trace: every "alloc"
an allocation, every "free_requested" its free (gpumem waits for recorded streams itself). Tensors
that were already live when recording began, or whose allocation fell out of the history's ring, are
allocated at the start. That trace is replayed on gpumem's simulated device and the two peaks are
printed side by side: PyTorch's reserved memory, followed through the snapshot's segment events from
the segments it held, and gpumem's. `--trace` writes the trace in gpumem's format, so `gpumem replay
OUT.csv` gives the same number. Needs no GPU and no PyTorch: a snapshot is a pickle of plain Python
values. The simulated device is an H200 unless `--conf capacity:SIZE` says otherwise (a snapshot does not
say how much memory its GPU had), and gpumem's chunks are sized by the room on it.
"""
import argparse
import json
import pickle
import sys

import gpumem

_GROWS = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


class SnapshotError(ValueError):
    """The file is not a PyTorch memory snapshot with a history gpumem can use."""


def load(path):
    """The snapshot dict in `path`. Only plain values are accepted: a snapshot holds nothing else, and
    refusing other classes keeps a hostile pickle from running code."""

    class _PlainValues(pickle.Unpickler):
        def find_class(self, module, name):
            raise SnapshotError(f"{path}: not a memory snapshot (it pickles {module}.{name})")

    try:
        with open(path, "rb") as file:
            snapshot = _PlainValues(file).load()
    except OSError as error:
        raise SnapshotError(f"{path}: cannot read: {error.strerror}") from error
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as error:
        raise SnapshotError(f"{path}: not a memory snapshot ({error})") from error
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("device_traces"), list):
        raise SnapshotError(f"{path}: not a memory snapshot (no 'device_traces'); dump it with "
                            "torch.cuda.memory._dump_snapshot after _record_memory_history()")
    return snapshot


def to_trace(snapshot, device=0):
    """(operations, native_peak_reserved): operations are ("a"|"f", id, size, stream index) tuples."""
    traces = snapshot["device_traces"]
    if device >= len(traces) or not traces[device]:
        raise SnapshotError(f"the snapshot has no history for device {device} (recorded with "
                            "_record_memory_history()? devices with history: "
                            f"{[i for i, trace in enumerate(traces) if trace]})")
    streams, live, operations, early = {}, {}, [], []
    next_id = 0
    reserved = sum(segment.get("total_size", 0) for segment in snapshot.get("segments", [])
                   if segment.get("device", 0) == device)
    for entry in traces[device]:  # the reserved memory at the start of the history
        reserved -= _GROWS.get(entry.get("action"), 0) * entry.get("size", 0)
    peak_reserved = reserved
    for entry in traces[device]:
        action, address, size = entry.get("action"), entry.get("addr"), entry.get("size", 0)
        stream = streams.setdefault(entry.get("stream", 0), len(streams))
        if action == "alloc":
            live[address] = (next_id, size, stream)
            operations.append(("a", next_id, size, stream))
            next_id += 1
        elif action == "free_requested":
            if address not in live:  # allocated before the history began
                live[address] = (next_id, size, stream)
                early.append(("a", next_id, size, stream))
                next_id += 1
            identity, size, stream = live.pop(address)
            operations.append(("f", identity, size, stream))
        elif action in _GROWS:
            reserved += _GROWS[action] * size
            peak_reserved = max(peak_reserved, reserved)
    return early + operations, peak_reserved


def write_trace(operations, path):
    with open(path, "w") as file:
        file.write("# op,id,bytes,stream -- from a PyTorch memory snapshot (python -m gpumem.whatif)\n")
        for kind, identity, size, stream in operations:
            file.write(f"{kind},{identity},{size},{stream}\n")


def replay(operations, config=""):
    """Peak live and peak reserved bytes of the operations replayed on gpumem's simulated device."""
    pointers, live, peak_live = {}, 0, 0
    with gpumem.Allocator("backend:sim" + ("," + config if config else ""), from_environment=False) as allocator:
        for kind, identity, size, stream in operations:
            if kind == "a":
                pointers[identity] = allocator.malloc(size, stream)
                live += size
                peak_live = max(peak_live, live)
            else:
                allocator.free(pointers.pop(identity))
                live -= size
        return peak_live, allocator.memory_stats()["reserved_bytes.all.peak"]


def main(arguments=None):
    parser = argparse.ArgumentParser(prog="python -m gpumem.whatif", description=__doc__.split("\n\n")[0])
    parser.add_argument("snapshot", help="a pickle written by torch.cuda.memory._dump_snapshot")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--trace", help="also write the allocation trace here (for gpumem replay)")
    parser.add_argument("--conf", default="", help="GPUMEM_CONF-style keys for the replay; capacity:80GiB, say, "
                        "for a GPU other than an H200 (the simulated device's default): its memory sizes the chunks")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args(arguments)
    try:
        operations, native_peak = to_trace(load(options.snapshot), options.device)
        if options.trace:
            write_trace(operations, options.trace)
        peak_live, gpumem_peak = replay(operations, options.conf)
    except (SnapshotError, OSError) as error:
        print(f"gpumem.whatif: {error}", file=sys.stderr)
        return 1
    except gpumem.GpumemError as error:
        print(f"gpumem.whatif: the replay failed: {error}", file=sys.stderr)
        return 1
    result = {"operations": len(operations), "peak_live_bytes": peak_live,
              "native_peak_reserved_bytes": native_peak, "gpumem_peak_reserved_bytes": gpumem_peak}
    if options.json:
        print(json.dumps(result))
    else:
        mib = 1 << 20
        print(f"{len(operations)} allocations and frees; peak live {peak_live / mib:.1f} MiB")
        print(f"your peak reserved was {native_peak / mib:.1f} MiB"
              + (f" ({native_peak / peak_live:.4f} of live)" if peak_live else ""))
        print(f"under gpumem it would be {gpumem_peak / mib:.1f} MiB"
              + (f" ({gpumem_peak / peak_live:.4f} of live)" if peak_live else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
