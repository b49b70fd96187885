"""Pinned host memory allocators on a GPU: time per allocation, memory held, copy bandwidth of the blocks.

    python3 bench/pinned_host.py [--allocators gpumem,cudaHostAlloc,torch,cupy-pool]
                                 [--patterns same,mixed,copies] [--iterations N] [--out results.jsonl]

Prints a markdown table, and with --out one JSON line per (allocator, pattern). Allocators:
  gpumem         gm_host_malloc / gm_host_free through the Python binding (backend cuda): gpumem's pinned
                 host cache (power-of-two blocks, reused once their recorded streams are done)
  cudaHostAlloc  cudaHostAlloc / cudaFreeHost on every call (cupy.cuda.runtime): nothing cached
  torch          torch.empty(n, dtype=torch.uint8, pin_memory=True) and del: PyTorch's caching host allocator
  cupy-pool      cupy.cuda.alloc_pinned_memory served by a PinnedMemoryPool, the class of CuPy's default
                 pool, over a base allocator that counts its bytes here (the pool reports none)
Patterns, timed after a warm-up of 16 iterations:
  same    4 MiB, allocated and freed
  mixed   64 KiB, 128 KiB, ..., 64 MiB in turn
  copies  4 MiB blocks, each the source of an async host-to-device copy on a non-default stream, freed as
          soon as the copy is queued (as DataLoader's pinned batches are), at most 4 copies in flight.
          Safe where reuse is deferred: gpumem (host_free with the copy's stream), torch (copy_
          records an event), cupy-pool (CuPy's watch list, as its own transfers use it); cudaHostAlloc
          waits for the copy before cudaFreeHost.
µs per alloc+free: the loop's host time per iteration (for copies, queueing the copy included). Memory
held: the allocator's pinned bytes after the loop (stream synchronized) and at their peak: gpumem's
reserved_bytes; torch.cuda.host_memory_stats()'s reserved_bytes, or its allocated_bytes in releases whose
active_bytes is the handed-out part; counted here for cudaHostAlloc and cupy-pool. GB/s: a 256 MiB block
copied to and from the device, timed with CUDA events, median of 5. Each (allocator, pattern) runs in a
process of its own, so caches and peaks start empty; one that fails shows its error in its row.
"""
import argparse
import collections
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
import weakref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
PATTERN_ITERATIONS = {"same": 2000, "mixed": 220, "copies": 1000}
MIXED_SIZES = [(64 << 10) << i for i in range(11)]  # 64 KiB .. 64 MiB
WARM_UP = 16
IN_FLIGHT = 4
BANDWIDTH_BYTES = 256 * MIB
CHILD_TIMEOUT_S = 40


class CupyCopied:
    """An allocator whose blocks are host addresses, copied by CuPy to and from one device buffer on a
    non-blocking stream. live / peak: pinned bytes held now and at most, counted here for the allocators
    that report none themselves."""

    def __init__(self):
        self.cuda = importlib.import_module("cupy").cuda
        self.stream = self.cuda.Stream(non_blocking=True)
        self.device = self.cuda.runtime.malloc(BANDWIDTH_BYTES)  # plain cudaMalloc, outside any pool
        self.live = self.peak = 0

    def copy(self, block, size, to_device):
        runtime, host = self.cuda.runtime, self.address(block)
        source, target, kind = ((host, self.device, runtime.memcpyHostToDevice) if to_device else
                                (self.device, host, runtime.memcpyDeviceToHost))
        runtime.memcpyAsync(target, source, size, kind, self.stream.ptr)

    def record(self):
        return self.stream.record()

    def elapsed_ms(self, start, end):
        return self.cuda.get_elapsed_time(start, end)

    def address(self, block):
        return block

    def count(self, size):
        self.live += size
        self.peak = max(self.peak, self.live)

    def held(self):
        return self.live, self.peak


class Gpumem(CupyCopied):
    def __init__(self):
        super().__init__()
        sys.path.insert(0, os.path.join(ROOT, "python"))
        self.allocator = importlib.import_module("gpumem").Allocator("backend:cuda,device:0")

    def allocate(self, size):
        return self.allocator.host_malloc(size)

    def release(self, block, size, copy_event):
        self.allocator.host_free(block, (self.stream.ptr,) if copy_event is not None else ())

    def held(self):
        reserved = self.allocator.host_stats()["reserved_bytes"]
        return reserved["current"], reserved["peak"]

    def details(self):
        stats = self.allocator.host_stats()
        return {key: stats[key] for key in ("cache_hits", "cache_misses", "host_allocations", "pending_blocks")}


class CudaHostAlloc(CupyCopied):
    def allocate(self, size):
        self.count(size)
        return self.cuda.runtime.hostAlloc(size, 0)

    def release(self, block, size, copy_event):
        if copy_event is not None:
            copy_event.synchronize()
        self.cuda.runtime.freeHost(block)
        self.count(-size)


class CupyPool(CupyCopied):
    def __init__(self):
        super().__init__()
        self.watch = getattr(importlib.import_module("cupy.cuda.pinned_memory"), "_add_to_watch_list", None)
        self.cuda.set_pinned_memory_allocator(self.cuda.PinnedMemoryPool(self.counted_host_alloc).malloc)

    def counted_host_alloc(self, size):
        memory = self.cuda.PinnedMemory(size, self.cuda.runtime.hostAllocPortable)
        self.count(size)
        weakref.finalize(memory, self.count, -size)
        return self.cuda.PinnedMemoryPointer(memory, 0)

    def allocate(self, size):
        return self.cuda.alloc_pinned_memory(size)

    def address(self, block):
        return block.ptr

    def release(self, block, size, copy_event):
        if copy_event is not None and self.watch:
            self.watch(copy_event, block)  # kept until the copy is done, then back to the pool
        elif copy_event is not None:
            copy_event.synchronize()


class Torch:
    """Pinned tensors, copied to and from one device tensor on a non-default stream."""

    def __init__(self):
        self.torch = importlib.import_module("torch")
        self.stream = self.torch.cuda.Stream()
        self.device = self.torch.empty(BANDWIDTH_BYTES, dtype=self.torch.uint8, device="cuda")

    def allocate(self, size):
        return self.torch.empty(size, dtype=self.torch.uint8, pin_memory=True)

    def release(self, block, size, copy_event):
        pass  # the tensor goes when the caller drops it; a non_blocking copy_ recorded its event

    def copy(self, tensor, size, to_device):
        source, target = (tensor[:size], self.device[:size]) if to_device else (self.device[:size], tensor[:size])
        with self.torch.cuda.stream(self.stream):
            target.copy_(source, non_blocking=True)

    def record(self):
        event = self.torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return event

    def elapsed_ms(self, start, end):
        return start.elapsed_time(end)

    def held(self):
        stats = getattr(self.torch.cuda, "host_memory_stats", dict)()
        key = "reserved_bytes" if "reserved_bytes.current" in stats else "allocated_bytes"
        if key == "allocated_bytes" and "active_bytes.current" not in stats:
            return None, None  # a schema this script does not know: held is not guessed
        return stats[f"{key}.current"], stats[f"{key}.peak"]


ALLOCATORS = {"gpumem": Gpumem, "cudaHostAlloc": CudaHostAlloc, "torch": Torch, "cupy-pool": CupyPool}


def sizes_of(pattern, count):
    if pattern == "mixed":
        return [MIXED_SIZES[i % len(MIXED_SIZES)] for i in range(count)]
    return [4 * MIB] * count


def one_iteration(allocator, pattern, size, in_flight):
    block = allocator.allocate(size)
    copy_event = None
    if pattern == "copies":
        allocator.copy(block, size, to_device=True)
        copy_event = allocator.record()
        in_flight.append(copy_event)
    allocator.release(block, size, copy_event)
    if len(in_flight) > IN_FLIGHT:
        in_flight.popleft().synchronize()


def microseconds_per_iteration(allocator, pattern, iterations):
    sizes = sizes_of(pattern, WARM_UP + iterations)
    in_flight = collections.deque()
    for size in sizes[:WARM_UP]:
        one_iteration(allocator, pattern, size, in_flight)
    started = time.perf_counter()
    for size in sizes[WARM_UP:]:
        one_iteration(allocator, pattern, size, in_flight)
    seconds = time.perf_counter() - started
    allocator.stream.synchronize()
    return seconds / iterations * 1e6


def bandwidth(allocator):
    """GB/s of a BANDWIDTH_BYTES block of the allocator's, to the device and back: median of 5 copies."""
    block, result = allocator.allocate(BANDWIDTH_BYTES), {}
    for name, to_device in (("h2d_gbps", True), ("d2h_gbps", False)):
        allocator.copy(block, BANDWIDTH_BYTES, to_device)
        milliseconds = []
        for _ in range(5):
            start = allocator.record()
            allocator.copy(block, BANDWIDTH_BYTES, to_device)
            end = allocator.record()
            end.synchronize()
            milliseconds.append(allocator.elapsed_ms(start, end))
        result[name] = round(BANDWIDTH_BYTES / (statistics.median(milliseconds) / 1e3) / 1e9, 2)
    allocator.release(block, BANDWIDTH_BYTES, None)
    return result


def measure(name, pattern, iterations):
    """The child process's work: one JSON line on stdout."""
    allocator = ALLOCATORS[name]()
    row = {"allocator": name, "pattern": pattern, "iterations": iterations,
           "us_per_alloc_free": round(microseconds_per_iteration(allocator, pattern, iterations), 2)}
    held, peak = allocator.held()
    row["held_mib"], row["peak_mib"] = ("n/a", "n/a") if held is None else (round(held / MIB, 1), round(peak / MIB, 1))
    row.update(getattr(allocator, "details", dict)())
    row.update(bandwidth(allocator))
    print(json.dumps(row), flush=True)


def run_in_child(name, pattern, iterations):
    command = [sys.executable, os.path.abspath(__file__), "--child", name, pattern, "--iterations", str(iterations)]
    failed = {"allocator": name, "pattern": pattern, "iterations": iterations}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return dict(failed, error=f"no result within {CHILD_TIMEOUT_S} s")
    results = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and results:
        return json.loads(results[-1])
    last_lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}, no output"]
    return dict(failed, error=last_lines[-1])


def markdown(rows):
    lines = ["| allocator | pattern | µs per alloc+free | memory held MiB (after / peak) | H2D GB/s | D2H GB/s |",
             "|---|---|---:|---:|---:|---:|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['allocator']} | {row['pattern']} | error: {row['error'].replace('|', '/')} | | | |")
            continue
        lines.append(f"| {row['allocator']} | {row['pattern']} | {row['us_per_alloc_free']:.2f} | "
                     f"{row['held_mib']} / {row['peak_mib']} | {row['h2d_gbps']:.1f} | {row['d2h_gbps']:.1f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocators", default=",".join(ALLOCATORS))
    parser.add_argument("--patterns", default=",".join(PATTERN_ITERATIONS))
    parser.add_argument("--iterations", type=int, help="per pattern (default: same 2000, mixed 220, copies 1000)")
    parser.add_argument("--out", help="JSON lines, one per row")
    parser.add_argument("--child", nargs=2, metavar=("ALLOCATOR", "PATTERN"), help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        measure(*arguments.child, arguments.iterations)
        return
    names, patterns = arguments.allocators.split(","), arguments.patterns.split(",")
    unknown = [name for name in names if name not in ALLOCATORS] + [p for p in patterns if p not in PATTERN_ITERATIONS]
    if unknown:
        parser.error(f"unknown allocator or pattern: {', '.join(unknown)}")
    rows = []
    for name in names:
        for pattern in patterns:
            rows.append(run_in_child(name, pattern, arguments.iterations or PATTERN_ITERATIONS[pattern]))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(markdown(rows))
    if arguments.out:
        with open(arguments.out, "w") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)
    sys.exit(1 if any("error" in row for row in rows) else 0)


if __name__ == "__main__":
    main()
