"""Time per allocation and free through PyTorch, per allocation pattern, under each allocator; prints a table.

    python3 bench/torch_latency.py [--allocators torch-native,torch-expandable,cuda-async,gpumem]
                                   [--patterns same,alternating,cycling,small,ascending,streams]
                                   [--iterations 20000] [--repeats 5] [--rounds 3] [--cpu N] [--out results.jsonl]

Each (allocator, repeat) is a fresh process; the repeats are interleaved (repeat 1 of every allocator,
then repeat 2, ...) so that a drift of the machine hits every allocator alike. Every process runs on
the same CPU (--cpu; default the second CPU the parent may use): left to the scheduler, the repeats
of one allocator fell into a fast and a slow group, by where each process landed, which buried the
allocators' differences. A process times each pattern's loop of `x = torch.empty(n, dtype=torch.uint8,
device="cuda"); del x` after a warm-up pass, and the same loop on CPU tensors of 1 byte: what Python
and the dispatcher cost without any allocator work, in --rounds alternating rounds, keeping each
loop's fastest round. "allocator µs" is the CUDA loop's time per iteration less the CPU loop's. The
table gives per pattern and allocator the median over repeats and their spread (max - min), and the
ratios of gpumem's medians to torch-native's, of the whole loop and of the allocator µs.

Patterns (sizes in bytes):
  same         4 MiB, every time
  alternating  1 MiB and 64 MiB in turn (a page move per pair in a naive VMM allocator)
  cycling      512, 4 KiB, 64 KiB, 1 MiB, 3 MiB, 17 MiB, 64 MiB in turn
  small        64 B to 64 KiB, pseudo-random
  ascending    a list of tensors that grows by 1 MiB each, freed in one go every 64
  streams      4 MiB allocated on one of four streams, freed after use on another (record_stream)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
ALLOCATORS = {
    "torch-native": {},
    "torch-expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cuda-async": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    "gpumem": {"GPUMEM_TORCH": "1"},
}
PATTERNS = ("same", "alternating", "cycling", "small", "ascending", "streams")


def sizes_of(pattern, iterations):
    if pattern == "same":
        return [4 * MIB] * iterations
    if pattern == "alternating":
        return [MIB if i % 2 == 0 else 64 * MIB for i in range(iterations)]
    if pattern == "cycling":
        cycle = [512, 4096, 65536, MIB, 3 * MIB, 17 * MIB, 64 * MIB]
        return [cycle[i % len(cycle)] for i in range(iterations)]
    if pattern == "small":
        state, sizes = 12345, []
        for _ in range(iterations):
            state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            sizes.append(64 << (state >> 61) % 11)  # 64 B .. 64 KiB
        return sizes
    return [MIB * (1 + i % 64) for i in range(iterations)]  # ascending, streams: unused sizes


def time_loop(torch, pattern, sizes, device):
    """Seconds for the pattern's loop over `sizes` on `device` ("cuda" or "cpu")."""
    if device == "cpu":
        sizes = [1] * len(sizes)
    if pattern == "ascending":
        started = time.perf_counter()
        held = []
        for i in range(len(sizes)):
            held.append(torch.empty(MIB * (1 + i % 64) if device == "cuda" else 1, dtype=torch.uint8, device=device))
            if len(held) == 64:
                held.clear()
        held.clear()
        return time.perf_counter() - started
    if pattern == "streams" and device == "cuda":
        streams = [torch.cuda.Stream() for _ in range(4)]
        started = time.perf_counter()
        for i in range(len(sizes)):
            with torch.cuda.stream(streams[i % 4]):
                x = torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")
            x.record_stream(streams[(i + 1) % 4])
            del x
        return time.perf_counter() - started
    started = time.perf_counter()
    for size in sizes:
        x = torch.empty(size, dtype=torch.uint8, device=device)
        del x
    return time.perf_counter() - started


def child(arguments):
    if arguments.cpu is not None:
        os.sched_setaffinity(0, {arguments.cpu})
    import torch
    torch.cuda.init()
    results = {}
    for pattern in arguments.patterns.split(","):
        sizes = sizes_of(pattern, arguments.iterations)
        time_loop(torch, pattern, sizes[: max(100, len(sizes) // 10)], "cuda")  # warm-up: the cache fills
        cuda = cpu = float("inf")
        for _ in range(arguments.rounds):
            torch.cuda.synchronize()
            cuda = min(cuda, time_loop(torch, pattern, sizes, "cuda"))
            torch.cuda.synchronize()
            cpu = min(cpu, time_loop(torch, pattern, sizes, "cpu"))
        results[pattern] = {"us": cuda / len(sizes) * 1e6, "cpu_us": cpu / len(sizes) * 1e6,
                            "reserved": torch.cuda.max_memory_reserved()}
    print("RESULT " + json.dumps(results), flush=True)


def spawn(allocator, arguments):
    environment = dict(os.environ, **ALLOCATORS[allocator])
    environment["PYTHONPATH"] = os.path.join(ROOT, "python")
    if allocator != "gpumem":
        environment.pop("GPUMEM_TORCH", None)
    command = [sys.executable, os.path.abspath(__file__), "--child", "--patterns", arguments.patterns,
               "--iterations", str(arguments.iterations), "--rounds", str(arguments.rounds), "--cpu", str(arguments.cpu)]
    run = subprocess.run(command, env=environment, capture_output=True, text=True)
    for line in run.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{allocator} failed:\n{run.stderr[-2000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--allocators", default=",".join(ALLOCATORS))
    parser.add_argument("--patterns", default=",".join(PATTERNS))
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per process; the fastest counts")
    parser.add_argument("--cpu", type=int, help="the CPU every process runs on (default: the second one allowed)")
    parser.add_argument("--out")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        return child(arguments)
    allowed = sorted(os.sched_getaffinity(0))
    if arguments.cpu is None:
        arguments.cpu = allowed[1] if len(allowed) > 1 else allowed[0]
    elif arguments.cpu not in allowed:
        parser.error(f"--cpu {arguments.cpu} is not one this process may run on ({allowed})")
    allocators = arguments.allocators.split(",")
    unknown = [name for name in allocators if name not in ALLOCATORS]
    if unknown:
        parser.error(f"unknown allocator(s) {', '.join(unknown)}; known: {', '.join(ALLOCATORS)}")
    runs = {name: [] for name in allocators}
    for repeat in range(arguments.repeats):
        order = allocators if repeat % 2 == 0 else allocators[::-1]
        for name in order:
            runs[name].append(spawn(name, arguments))
    print("| pattern | allocator | µs per alloc+free (median) | spread | allocator µs (less the CPU loop) | "
          "ratio to torch-native | allocator µs ratio |")
    print("|---|---|---|---|---|---|---|")
    records = []
    for pattern in arguments.patterns.split(","):
        native = native_own = None
        for name in allocators:
            times = [run[pattern]["us"] for run in runs[name]]
            own = [run[pattern]["us"] - run[pattern]["cpu_us"] for run in runs[name]]
            median, median_own = statistics.median(times), statistics.median(own)
            if name == "torch-native":
                native, native_own = median, median_own
            ratio = f"{median / native:.2f}" if native and name != "torch-native" else ""
            ratio_own = f"{median_own / native_own:.2f}" if native_own and name != "torch-native" else ""
            print(f"| {pattern} | {name} | {median:.2f} | {max(times) - min(times):.2f} | "
                  f"{median_own:.2f} | {ratio} | {ratio_own} |")
            records.append({"pattern": pattern, "allocator": name, "us": times, "allocator_us": own})
    if arguments.out:
        with open(arguments.out, "w") as out:
            for record in records:
                out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    sys.exit(main())
