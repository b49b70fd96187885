#!/usr/bin/env bash
# bench/replay.sh -- replay every trace through gpumem's engines on the sim backend and print a
# table next to what PyTorch's allocator, expandable segments and cudaMallocAsync do on the same
# traces on an H200 (../shared/anchors/anchors.json).
#
# Usage: bench/replay.sh [TRACE_DIRECTORY] [ANCHORS_JSON]   (defaults: ../shared/traces, ../shared/anchors/anchors.json)
# Environment: GPUMEM (the gpumem binary, default build/gpumem), REPEAT (runs per cell, default 5;
# the median ns/op is reported).
set -euo pipefail
cd "$(dirname "$0")/.."
traces=${1:-../shared/traces}
anchors=${2:-../shared/anchors/anchors.json}
gpumem=${GPUMEM:-build/gpumem}
if [ ! -x "$gpumem" ]; then
    cmake -S . -B build >/dev/null && cmake --build build -j2 >/dev/null
fi
exec python3 bench/replay_table.py "$gpumem" "$traces" "$anchors" "${REPEAT:-5}"
