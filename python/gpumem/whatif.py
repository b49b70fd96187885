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
allocated at the start: those the history frees, and those it never names that the snapshot's segments
hold allocated at the end (live throughout: the weights). That trace is replayed on gpumem's simulated
device and the two peaks are printed side by side: PyTorch's reserved memory, followed through the
snapshot's segment events from the segments it held, and gpumem's. `--trace` writes the trace in
gpumem's format, so `gpumem replay OUT.csv` gives the same number. Needs no GPU and no PyTorch: a
snapshot is a pickle of plain Python values, and anything else (another class, a damaged pickle, fields
of the wrong type or out of range) is refused with a message (exit status 1). The simulated device is an
H200 unless `--conf capacity:SIZE` says otherwise (a snapshot does not say how much memory its GPU had),
and gpumem's chunks are sized by the room on it.
"""
import argparse
import json
import pickle
import sys

import gpumem

_GROWS = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
_EVENTS = ("alloc", "free_requested", *_GROWS)  # the actions read; others (free_completed, oom, ...) are not


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
    except SnapshotError:
        raise
    except OSError as error:
        raise SnapshotError(f"{path}: cannot read: {error.strerror}") from error
    except Exception as error:  # a damaged pickle fails in many ways: UnpicklingError, EOFError, OverflowError...
        raise SnapshotError(f"{path}: not a memory snapshot ({str(error) or type(error).__name__})") from error
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("device_traces"), list):
        raise SnapshotError(f"{path}: not a memory snapshot (no 'device_traces'); dump it with "
                            "torch.cuda.memory._dump_snapshot after _record_memory_history()")
    return snapshot


_SIZE_LIMIT = 1 << 64  # sizes are size_t


def _field(record, key, where, default=None, kind="size"):
    """record[key] checked: a size (an int in 0 .. 2**64 - 1), or for kind "id" any int (addresses, streams)."""
    value = record.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SnapshotError(f"{where}: '{key}' must be an integer, not {value!r}"[:200])
    if kind == "size" and not 0 <= value < _SIZE_LIMIT:
        raise SnapshotError(f"{where}: '{key}' must be a size in 0 .. 2**64 - 1, not {value}")
    return value


def _list_of_dicts(value, where):
    if not isinstance(value, list):
        raise SnapshotError(f"{where} must be a list, not {type(value).__name__}")
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise SnapshotError(f"{where}[{index}] must be a dict, not {type(item).__name__}")
    return value


def _history(snapshot, device):
    """The device's trace entries, checked as far as to_trace reads them."""
    traces = snapshot["device_traces"]
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise SnapshotError(f"--device must be a device number (0 or more), not {device}")
    if device >= len(traces) or not traces[device]:
        raise SnapshotError(f"the snapshot has no history for device {device} (recorded with "
                            "_record_memory_history()? devices with history: "
                            f"{[i for i, trace in enumerate(traces) if trace]})")
    entries = _list_of_dicts(traces[device], f"device_traces[{device}]")
    for index, entry in enumerate(entries):
        if not isinstance(entry.get("action"), str):
            raise SnapshotError(f"device_traces[{device}][{index}]: its action is {entry.get('action')!r}, not a name")
        if entry.get("action") in _EVENTS:
            where = f"device_traces[{device}][{index}] ({entry.get('action')})"
            _field(entry, "addr", where, kind="id"), _field(entry, "size", where)
            _field(entry, "stream", where, default=0, kind="id")
    return entries


def _segments(snapshot, device):
    """The device's segments, checked as far as to_trace reads them."""
    segments = [segment for segment in _list_of_dicts(snapshot.get("segments", []), "segments")
                if segment.get("device", 0) == device]
    for segment in segments:
        where = f"segment at {segment.get('address')!r}"
        _field(segment, "total_size", where, default=0), _field(segment, "stream", where, default=0, kind="id")
        address = _field(segment, "address", where, default=0, kind="id")
        for block in _list_of_dicts(segment.get("blocks", []), f"{where}: blocks"):
            _field(block, "address", where, default=address, kind="id")
            address += _field(block, "size", where)
            _field(block, "requested_size", where, default=0)
    return segments


def to_trace(snapshot, device=0):
    """(operations, native_peak_reserved): operations are ("a"|"f", id, size, stream index) tuples, first
    the allocations of the blocks live when the history began (live throughout, then those it frees).
    SnapshotError for a snapshot that is not one (fields of the wrong type, sizes out of range, segments
    that cannot have held what the history reserved)."""
    entries, segments = _history(snapshot, device), _segments(snapshot, device)
    streams, live, operations, early, seen = {}, {}, [], [], set()
    next_id = 0
    reserved = sum(segment.get("total_size", 0) for segment in segments)
    for entry in entries:  # the reserved memory at the start of the history
        reserved -= _GROWS.get(entry.get("action"), 0) * entry.get("size", 0)
    if reserved < 0:
        raise SnapshotError(f"device {device}'s segment events reserve {-reserved} bytes more than its segments "
                            "hold at the end: the segments and the history are not of one snapshot")
    peak_reserved = reserved
    for entry in entries:
        action, address, size = entry.get("action"), entry.get("addr"), entry.get("size", 0)
        if action not in _EVENTS:
            continue
        stream = streams.setdefault(entry.get("stream", 0), len(streams))
        if action == "alloc":
            if address in live:
                raise SnapshotError(f"device {device}'s history allocates at {address:#x}, which it has not freed")
            live[address] = (next_id, size, stream)
            operations.append(("a", next_id, size, stream))
            next_id += 1
            seen.add(address)
        elif action == "free_requested":
            if address not in live and address in seen:
                raise SnapshotError(f"device {device}'s history frees {address:#x} twice without an allocation "
                                    "between")
            seen.add(address)
            if address not in live:  # allocated before the history began
                live[address] = (next_id, size, stream)
                early.append(("a", next_id, size, stream))
                next_id += 1
            identity, size, stream = live.pop(address)
            operations.append(("f", identity, size, stream))
        else:
            reserved += _GROWS[action] * size
            peak_reserved = max(peak_reserved, reserved)
    mentioned = {entry.get("addr") for entry in entries if entry.get("action") in ("alloc", "free_requested")}
    always_live = [("a", next_id + index, size, streams.setdefault(stream, len(streams)))
                   for index, (size, stream) in enumerate(_blocks_live_throughout(segments, mentioned))]
    return always_live + early + operations, peak_reserved


def _blocks_live_throughout(segments, mentioned):
    """(size, stream) of each block the segments hold allocated (or freed, waiting for a stream) whose
    address no allocation or free of the history names: live for the whole history (the weights, made
    before recording began)."""
    blocks = []
    for segment in segments:
        address = segment.get("address", 0)
        for block in segment.get("blocks", []):
            address = block.get("address", address)
            if block.get("state") in ("active_allocated", "active_pending_free") and address not in mentioned:
                blocks.append((block.get("requested_size") or block["size"], segment.get("stream", 0)))
            address += block["size"]
    return blocks


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


def _trace_of_file(path, device):
    """to_trace of the snapshot in `path`; its errors name the file."""
    snapshot = load(path)
    try:
        return to_trace(snapshot, device)
    except SnapshotError as error:
        raise SnapshotError(f"{path}: {error}") from None


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
        operations, native_peak = _trace_of_file(options.snapshot, options.device)
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
