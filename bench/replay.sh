#!/usr/bin/env bash
# bench/replay.sh -- replay every trace through gpumem's engines on the sim backend and print a
# table next to what PyTorch's allocator, expandable segments and cudaMallocAsync do on the same
# traces on an H200 (../shared/anchors/anchors.json).
#
# Usage: bench/replay.sh [TRACE_DIRECTORY] [ANCHORS_JSON]   (defaults: ../shared/traces, ../shared/anchors/anchors.json;
# paths relative to the repository's root). Without the anchors the table has gpumem's columns only.
# Environment: GPUMEM (the gpumem binary, default build/gpumem), REPEAT (runs per cell, default 5;
# the median ns/op is reported).
set -euo pipefail
cd "$(dirname "$0")/.."
traces=${1:-../shared/traces}
anchors=${2:-../shared/anchors/anchors.json}
gpumem=${GPUMEM:-build/gpumem}
# The defaults exist only in a checkout that sits next to the project's shared folder: say so, and how to
# run on other traces (data/traces holds copies), instead of failing in Python.
if [ ! -d "$traces" ]; then
    echo "bench/replay.sh: no trace directory '$traces' (the default, ../shared/traces, is the project's shared" \
         "folder next to this checkout); give one: bench/replay.sh TRACE_DIRECTORY [ANCHORS_JSON]," \
         "for example bench/replay.sh data/traces" >&2
    exit 2
fi
if [ ! -f "$anchors" ]; then
    echo "bench/replay.sh: no anchors at '$anchors': PyTorch's columns are left empty" >&2
fi
if [ ! -x "$gpumem" ]; then
    cmake -S . -B build >/dev/null && cmake --build build -j2 >/dev/null
fi
exec python3 bench/replay_table.py "$gpumem" "$traces" "$anchors" "${REPEAT:-5}"
