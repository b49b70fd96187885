#!/usr/bin/env bash
# bench/publish_cost.sh [GPUMEM] [RUNS] -- what publishing statistics (publish:true) and the history ring
# cost on the sim: every trace of data/traces replayed with the defaults and with publish:true, RUNS
# times each, interleaved (so that a busy machine slows both alike), median ns/op; then history:1048576,
# three runs against three of the defaults. Prints a Markdown table.
set -euo pipefail
gpumem=${1:-build/gpumem}
runs=${2:-20}
export GPUMEM_SHM_DIR=$(mktemp -d)
trap 'rm -rf "$GPUMEM_SHM_DIR"' EXIT
ns_per_op() { "$gpumem" replay "$1" --json ${2:+--conf "$2"} | python3 -c 'import json,sys; print(json.load(sys.stdin)["ns_per_op"])'; }
median() { python3 -c 'import statistics,sys; print("%.1f" % statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }
echo "| trace | defaults | \`publish:true\` | \`history:1048576\` (defaults, same runs) |"
echo "|---|---|---|---|"
for trace in data/traces/*.csv.gz; do
    plain=() published=() history=() control=()
    for _ in $(seq "$runs"); do
        plain+=("$(ns_per_op "$trace")")
        published+=("$(ns_per_op "$trace" publish:true)")
    done
    for _ in 1 2 3; do
        control+=("$(ns_per_op "$trace")")
        history+=("$(ns_per_op "$trace" history:1048576)")
    done
    a=$(median "${plain[@]}") b=$(median "${published[@]}")
    change=$(python3 -c "print('%+.1f%%' % (100 * ($b / $a - 1)))")
    echo "| $(basename "$trace" .csv.gz) | $a | $b ($change) | $(median "${history[@]}") ($(median "${control[@]}")) |"
done
