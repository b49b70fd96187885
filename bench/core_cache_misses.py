"""Cache lines the C core touches per gm_malloc + gm_free when the caches are cold between calls.

    python3 bench/core_cache_misses.py [--program build/gpumem_core_cache_misses] [--iterations 20000]

Runs bench/core_cache_misses.c (gm_malloc and gm_free on the sim, 64 KiB read and 40 KiB of code run
after every call) under valgrind's cachegrind, whose simulated first-level caches hold 32 KiB each:
the misses counted inside gpumem's functions (and the C library's functions they call) are the cache
lines of data and of code a call touches, and the instructions those functions run. Each pattern runs twice, ITERATIONS and twice as many; the
difference, divided by ITERATIONS, leaves out creating and destroying the allocator. Prints a table.
The counts are deterministic (no timing), so they compare two builds on any machine: set
LD_LIBRARY_PATH to another build's folder to count its libgpumem.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
PATTERNS = {"same (4 MiB)": (4 * MIB, 4 * MIB), "alternating (1 MiB, 64 MiB)": (MIB, 64 * MIB),
            "small (4 KiB)": (4096, 4096)}
COUNT = r"([\d,]+|\.)\s*(?:\([^)]*\))?\s*"
ROW = re.compile(r"\s*" + COUNT * 4 + r"\s*(\S.*)$")


def counted(program, iterations, sizes):
    """(instructions, instruction-cache misses, data-cache misses) inside gpumem and the C library."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "cachegrind.out")
        run = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=yes", "--I1=32768,8,64",
                              "--D1=32768,8,64", "--LL=2097152,16,64", f"--cachegrind-out-file={out}", program,
                              str(iterations), str(sizes[0]), str(sizes[1])], capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"core_cache_misses: {program} failed under valgrind: {run.stderr.strip()[-400:]}")
        report = subprocess.run(["cg_annotate", "--show=Ir,I1mr,D1mr,D1mw", "--threshold=0", "--auto=no", out], capture_output=True, text=True,
                                check=True).stdout
    totals = [0, 0, 0]
    in_table = False
    for line in report.splitlines():
        if "file:function" in line:
            in_table = True
            continue
        if not in_table:
            continue
        if line.startswith("---") and totals[0]:
            break
        match = ROW.match(line)
        if not match or "core_cache_misses.c" in match.group(5) or "/dl-" in match.group(5) or \
                "stir_code" in match.group(5):
            continue
        values = [int(v.replace(",", "")) if v != "." else 0 for v in match.group(1, 2, 3, 4)]
        totals[0] += values[0]
        totals[1] += values[1]
        totals[2] += values[2] + values[3]
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--program", default=os.path.join(ROOT, "build", "gpumem_core_cache_misses"))
    parser.add_argument("--iterations", type=int, default=20000)
    arguments = parser.parse_args()
    if not os.access(arguments.program, os.X_OK):
        sys.exit(f"core_cache_misses: {arguments.program} is not an executable (build the target "
                 "gpumem_core_cache_misses first)")
    print("| pattern | instructions per malloc + free | instruction-cache misses | data-cache misses |")
    print("|---|---:|---:|---:|")
    for name, sizes in PATTERNS.items():
        once = counted(arguments.program, arguments.iterations, sizes)
        twice = counted(arguments.program, 2 * arguments.iterations, sizes)
        per_pair = [(b - a) / arguments.iterations for a, b in zip(once, twice)]
        print(f"| {name} | {per_pair[0]:.0f} | {per_pair[1]:.1f} | {per_pair[2]:.1f} |")


if __name__ == "__main__":
    main()
