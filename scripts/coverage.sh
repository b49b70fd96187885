#!/usr/bin/env bash
# scripts/coverage.sh -- which lines and branches of the library the tests run: a build with gcc's
# --coverage (Debug, in build-coverage), the CPU tests, then gcov over every source file of src/, printed
# as a table, least covered first: what no test reaches is where a bug can hide unseen (an error path
# that no failure workload of tests/failure_workload.h meets, say). The cuda backend and NVML need the
# GPU machine (scripts/gpu-check.sh), so they read low here.
# Usage: scripts/coverage.sh [CTEST-ARGS...]   (default: -E "browser|exporter|install")
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-coverage
cmake -S . -B $build -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS="--coverage" \
    -DCMAKE_EXE_LINKER_FLAGS="--coverage" -DCMAKE_SHARED_LINKER_FLAGS="--coverage" >/dev/null
cmake --build $build -j"$(nproc)" >/dev/null
find $build -name "*.gcda" -delete
ctest --test-dir $build -j"$(nproc)" ${*:--E "browser|exporter|install"} >"$build/ctest.log" 2>&1 ||
    { echo "some tests failed: $build/ctest.log"; }
summary=$build/gcov-summary.txt
: >"$summary"
(cd $build && find . -name "*.gcda" -path "*/src/*" -print0 |
    xargs -0 -n1 sh -c 'gcov -b -c -n -o "$(dirname "$0")" "$0"' >>"gcov-summary.txt" 2>/dev/null)
python3 - "$summary" "$PWD/src/" <<'PY'
import re, sys
text, prefix = open(sys.argv[1]).read(), sys.argv[2]
rows = {}
for block in re.split(r"\nFile '", "\n" + text)[1:]:
    name = block.split("'")[0]
    lines = re.search(r"Lines executed:([\d.]+)% of (\d+)", block)
    taken = re.search(r"Taken at least once:([\d.]+)% of (\d+)", block)
    if not name.startswith(prefix) or not lines or name in rows:
        continue
    rows[name] = (float(lines.group(1)), int(lines.group(2)),
                  float(taken.group(1)) if taken else 100.0, int(taken.group(2)) if taken else 0)
print("| file | lines run | of | branches taken | of |")
print("|---|---|---|---|---|")
for name, (lines, count, branches, branch_count) in sorted(rows.items(), key=lambda item: item[1][0]):
    print(f"| {name[len(prefix):]} | {lines:.1f}% | {count} | {branches:.1f}% | {branch_count} |")
PY
echo "(lines not run: gcov -o OBJECT-DIR SOURCE in $build, then the .gcov files' ##### lines)"
