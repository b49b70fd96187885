"""CuPy's allocations: time per iteration under CuPy's own memory pools and under gpumem.cupy.

    python3 bench/cupy_alloc.py [--allocators cupy-pool,gpumem] [--patterns empty-small,...] [--repeats 5]
                                [--out results.jsonl]

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
  objects       cupy.cuda.UnownedMemory(...) and cupy.cuda.MemoryPointer(memory, 0) made and dropped over
                a fixed pointer, no allocation: what making CuPy's two memory objects costs (the floor
                under gpumem's allocator function, which makes them for every block)
Each (allocator, pattern, repeat) runs in a fresh process; repeats alternate the allocators' order.
The table gives the median over repeats of each run's time per iteration, the spread, and gpumem's
median over the pool's.
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
            "pinned-small": 100000, "asarray-small": 30000, "allocator-small": 200000, "objects": 200000}
MIXED = [512, 64 << 10, 1 << 20, 16 << 20]


def child(allocator, pattern):
    import cupy
    import numpy
    if allocator == "gpumem":
        import gpumem.cupy
        gpumem.cupy.install()
    iterations = PATTERNS[pattern]

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
        elif pattern == "allocator-small":
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

    loop(max(iterations // 10, 10))
    start = time.perf_counter()
    loop(iterations)
    result = {"allocator": allocator, "pattern": pattern, "iterations": iterations,
              "us_per_iteration": (time.perf_counter() - start) / iterations * 1e6}
    if allocator == "gpumem":  # the compiled allocation path, or the Python one where it could not be built
        result["compiled"] = not isinstance(cupy.cuda.get_allocator(), types.FunctionType)
    return result


def run(allocator, pattern):
    environment = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    result = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", allocator, pattern],
                            env=environment, capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode or not lines:
        return {"allocator": allocator, "pattern": pattern, "error": result.stderr[-1500:]}
    return json.loads(lines[-1])


def main():
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2], sys.argv[3])), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--allocators", default="cupy-pool,gpumem")
    parser.add_argument("--patterns", default=",".join(PATTERNS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    allocators, patterns = args.allocators.split(","), args.patterns.split(",")
    results = {}
    with open(args.out, "a") if args.out else open(os.devnull, "w") as out:
        for repeat in range(args.repeats):
            for pattern in patterns:
                for allocator in (allocators if repeat % 2 == 0 else allocators[::-1]):
                    result = run(allocator, pattern)
                    out.write(json.dumps(dict(result, repeat=repeat)) + "\n")
                    results.setdefault((pattern, allocator), []).append(result)
    print("| pattern | allocator | us per iteration (median) | spread | vs " + allocators[0] + " |")
    print("|---|---|---|---|---|")
    failed = False
    for pattern in patterns:
        reference = None
        for allocator in allocators:
            runs = results[(pattern, allocator)]
            times = [r["us_per_iteration"] for r in runs if "us_per_iteration" in r]
            if len(times) < len(runs):
                failed = True
                error = next(r["error"] for r in runs if "error" in r).strip().splitlines()
                print(f"| {pattern} | {allocator} | failed: {error[-1] if error else 'no output'} | | |")
                continue
            median = statistics.median(times)
            reference = median if allocator == allocators[0] else reference
            ratio = f"{median / reference:.2f}" if reference else ""
            label = allocator + (" (Python path)" if any(r.get("compiled") is False for r in runs) else "")
            print(f"| {pattern} | {label} | {median:.2f} | {min(times):.2f}-{max(times):.2f} | {ratio} |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
