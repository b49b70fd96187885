"""CuPy's allocations: time per iteration under CuPy's own memory pools and under gpumem.cupy.

    python3 bench/cupy_alloc.py [--allocators cupy-pool,gpumem] [--patterns empty-small,...] [--repeats 3]
                                [--rounds 20] [--out results.jsonl]

Once gpumem.cupy.install() has made gpumem CuPy's allocator, every CuPy allocation goes through
gpumem.cupy's allocator functions (compiled: python/gpumem/cupy_allocate.c; the Python ones where that
could not be built, marked "(Python path)" in the table) instead of CuPy's compiled pools, so a program
whose arrays are small and many may pay for it. This measures that. Patterns (host time per iteration, the device synchronized at the
end of each timed loop; a warm-up loop first):
  empty-small   cupy.empty(256 bytes) and del: the allocation alone
  empty-mixed   512 B, 64 KiB, 1 MiB and 16 MiB in turn
  ops-small     y = x * 2 + 1 on 1024 float32 (two allocations per iteration, launch-bound)
  ops-large     the same on 16 Mi float32 (device-bound: the allocator should not show)
  pinned-small  cupy.cuda.alloc_pinned_memory(4 KiB) and del: CuPy's pinned memory pool against gpumem's
                pinned host cache (gpumem.cupy.install() makes it CuPy's pinned allocator)
  asarray-small cupy.asarray of a 1024-float32 NumPy array and del (CuPy stages the copy in pinned memory)
  allocator-small  CuPy's current allocator function called directly for 256 bytes, and the pointer
                dropped: the allocator's own cost, without cupy.empty's array around it
  allocator-hooked  the same on a thread that has used a memory hook once (its dict of hooks made, now
                empty, as after `with cupy.cuda.memory_hooks.LineProfileHook():`): CuPy's hook check
                then stays true, and every allocation and free asks the dict
  objects       cupy.cuda.UnownedMemory(...) and cupy.cuda.MemoryPointer(memory, 0) made and dropped over
                a fixed pointer, no allocation: what making CuPy's two memory objects costs (the floor
                under gpumem's allocator function, which makes them for every block)
Allocators take turns inside one process, so that the machine's drift (which moves whole runs between fresh
processes) falls on both alike: each (pattern, repeat) runs in a fresh
process that installs gpumem.cupy once, keeps both allocators' functions (CuPy's default pools' malloc
and gpumem's), and times --rounds rounds of PATTERNS[pattern] / rounds iterations, each round every
allocator in turn (the order alternating from round to round), switched by cupy.cuda.set_allocator and
set_pinned_memory_allocator. The table gives each allocator's median time per iteration over all rounds
of all repeats, and the median of the per-round ratios to the first allocator with their quartiles.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATTERNS = {"empty-small": 200000, "empty-mixed": 100000, "ops-small": 50000, "ops-large": 300,
            "pinned-small": 100000, "asarray-small": 30000, "allocator-small": 200000, "allocator-hooked": 200000,
            "objects": 200000}
MIXED = [512, 64 << 10, 1 << 20, 16 << 20]


def switches(cupy, allocators):
    """allocator name -> a function making it CuPy's device and pinned allocator."""
    pool, pinned_pool = cupy.get_default_memory_pool(), cupy.get_default_pinned_memory_pool()
    made = {"cupy-pool": (pool.malloc, pinned_pool.malloc)}
    if "gpumem" in allocators:
        import gpumem.cupy
        set_pinned, captured = cupy.cuda.set_pinned_memory_allocator, []
        cupy.cuda.set_pinned_memory_allocator = lambda function: (captured.append(function), set_pinned(function))
        try:
            gpumem.cupy.install()
        finally:
            cupy.cuda.set_pinned_memory_allocator = set_pinned
        made["gpumem"] = (cupy.cuda.get_allocator(), captured[-1])
    unknown = set(allocators) - set(made)
    if unknown:
        raise SystemExit(f"unknown allocator(s): {', '.join(sorted(unknown))} (known: cupy-pool, gpumem)")

    def switch(allocator):
        device, pinned = made[allocator]
        cupy.cuda.set_allocator(device)
        cupy.cuda.set_pinned_memory_allocator(pinned)
    return switch


def make_loop(cupy, numpy, pattern):
    def loop(count):
        if pattern == "empty-small":
            for _ in range(count):
                array = cupy.empty(256, dtype=cupy.uint8)
                del array
        elif pattern == "empty-mixed":
            for index in range(count):
                array = cupy.empty(MIXED[index % len(MIXED)], dtype=cupy.uint8)
                del array
        elif pattern == "pinned-small":
            for _ in range(count):
                memory = cupy.cuda.alloc_pinned_memory(4096)
                del memory
        elif pattern in ("allocator-small", "allocator-hooked"):
            allocate = cupy.cuda.get_allocator()
            for _ in range(count):
                pointer = allocate(256)
                del pointer
        elif pattern == "objects":
            owner = object()
            for _ in range(count):
                pointer = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(1 << 40, 256, owner, 0), 0)
                del pointer
        elif pattern == "asarray-small":
            host = numpy.ones(1024, dtype=numpy.float32)
            for _ in range(count):
                array = cupy.asarray(host)
                del array
        else:
            x = cupy.ones(1024 if pattern == "ops-small" else 16 << 20, dtype=cupy.float32)
            for _ in range(count):
                y = x * 2 + 1
                del y
        cupy.cuda.Device().synchronize()
    return loop


def child(allocators, pattern, rounds):
    """{"pattern", "rounds": [{allocator: us per iteration}, ...], "compiled"} for one process."""
    import cupy
    import numpy
    switch = switches(cupy, allocators)
    if pattern == "allocator-hooked":
        cupy.cuda.memory_hook.get_memory_hooks()  # the thread's dict of hooks, left empty
    loop = make_loop(cupy, numpy, pattern)
    iterations = max(PATTERNS[pattern] // rounds, 1)
    for allocator in allocators:  # warm-up: each allocator's cache and CuPy's kernels
        switch(allocator)
        loop(max(iterations // 2, 10))
    times = []
    for index in range(rounds):
        this_round = {}
        for allocator in (allocators if index % 2 == 0 else allocators[::-1]):
            switch(allocator)
            start = time.perf_counter()
            loop(iterations)
            this_round[allocator] = (time.perf_counter() - start) / iterations * 1e6
        times.append(this_round)
    result = {"pattern": pattern, "iterations_per_round": iterations, "rounds": times}
    if "gpumem" in allocators:  # the compiled allocation path, or the Python one where it could not be built
        switch("gpumem")
        result["compiled"] = not isinstance(cupy.cuda.get_allocator(), types.FunctionType)
    return result


def run(allocators, pattern, rounds):
    environment = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    command = [sys.executable, os.path.abspath(__file__), "--child", ",".join(allocators), pattern, str(rounds)]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode or not lines:
        return {"pattern": pattern, "error": result.stderr[-1500:]}
    return json.loads(lines[-1])


def quartiles(values):
    if len(values) < 2:
        return values[0], values[0]
    cut = statistics.quantiles(values, n=4)
    return cut[0], cut[2]


def main():
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2].split(","), sys.argv[3], int(sys.argv[4]))), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--allocators", default="cupy-pool,gpumem")
    parser.add_argument("--patterns", default=",".join(PATTERNS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args()
    allocators, patterns = args.allocators.split(","), args.patterns.split(",")
    unknown = [pattern for pattern in patterns if pattern not in PATTERNS]
    if unknown or args.repeats < 1 or args.rounds < 1:
        parser.error(f"unknown pattern(s) {', '.join(unknown)}" if unknown else "--repeats and --rounds must be >= 1")
    results = {}
    with open(args.out, "a") if args.out else open(os.devnull, "w") as out:
        for repeat in range(args.repeats):
            for pattern in patterns:
                result = run(allocators, pattern, args.rounds)
                out.write(json.dumps(dict(result, repeat=repeat)) + "\n")
                results.setdefault(pattern, []).append(result)
    first = allocators[0]
    print(f"| pattern | allocator | us per iteration (median of rounds) | vs {first}: median of per-round ratios | "
          "quartiles |")
    print("|---|---|---:|---:|---|")
    failed = False
    for pattern in patterns:
        runs = results[pattern]
        errors = [r["error"] for r in runs if "error" in r]
        if errors:
            failed = True
            lines = errors[0].strip().splitlines()
            print(f"| {pattern} | | failed: {lines[-1] if lines else 'no output'} | | |")
            continue
        rounds = [times for r in runs for times in r["rounds"]]
        for allocator in allocators:
            median = statistics.median(times[allocator] for times in rounds)
            label = allocator + (" (Python path)" if allocator == "gpumem" and
                                 any(r.get("compiled") is False for r in runs) else "")
            if allocator == first:
                print(f"| {pattern} | {label} | {median:.2f} | 1.00 | |")
                continue
            ratios = [times[allocator] / times[first] for times in rounds]
            low, high = quartiles(ratios)
            print(f"| {pattern} | {label} | {median:.2f} | {statistics.median(ratios):.2f} | {low:.2f}-{high:.2f} |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
