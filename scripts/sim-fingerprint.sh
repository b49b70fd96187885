#!/usr/bin/env bash
# scripts/sim-fingerprint.sh -- every decision the engines make on the sim, as text: each trace of
# data/traces (and data/traces-extra, data/traces-more) replayed by both engines, cold and warm (--passes 2), and under
# the options that switch engine rules, and with the device 500 operations behind the host (--lead:
# the waits for streams and the moves ahead of them), with every reported number except CPU time. A change that
# must not change behaviour (a refactor) leaves this output byte for byte the same:
#     scripts/sim-fingerprint.sh build/gpumem >before.txt; ...; scripts/sim-fingerprint.sh build/gpumem | diff before.txt -
set -euo pipefail
gpumem=${1:-build/gpumem}
cd "$(dirname "$0")/.."
configurations=("engine:pages" "engine:segments" "growth_lane:false" "tail_chunk:true" "max_chunk_size:0,chunk_room_share:0"
                "device_credit_ns:0" "memory_limit:30GiB" "capacity:32GiB" "engine:segments,release_before_growth:false" "compact_min:2MiB")
for trace in data/traces/*.csv.gz data/traces-extra/*.csv.gz data/traces-more/*.csv.gz; do
    for configuration in "${configurations[@]}"; do
        for passes in 1 2; do
            echo "# $(basename "$trace") $configuration passes:$passes"
            "$gpumem" replay "$trace" --conf "$configuration" --passes "$passes" --json |
                sed -E 's/"ns_per_op": [0-9.]+, //'
        done
    done
done
for trace in data/traces/*.csv.gz data/traces-extra/*.csv.gz data/traces-more/*.csv.gz; do
    echo "# $(basename "$trace") lead:500 passes:2"
    "$gpumem" replay "$trace" --passes 2 --lead 500 --json | sed -E 's/"ns_per_op": [0-9.]+, //'
done
