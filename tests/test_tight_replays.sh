#!/usr/bin/env bash
# test_tight_replays.sh -- traces replayed where memory is short: under a memory limit, and on a device,
# of 1.005 and 1.02 times their live peak, with the engine's options that change where memory goes, two
# passes each. Requests may fail there, but only as out of memory (exit status 3, the report's own
# words), never as another error or a crash: an engine state that goes wrong only close to the limit
# (a growth once moved away a page it had just mapped: "inconsistent allocator state") shows here.
# Usage: test_tight_replays.sh PATH/TO/gpumem DATA_DIRECTORY
set -u
gpumem=$1
data=$2
failures=0
replays=0
# trace:thousandths of its live peak (llm_generate at 1.011, where that growth went wrong)
for case in traces-more/vit-seed1:1005,1020 traces-more/llama_varlen-seed1:1005,1020 traces/llm_generate:1011; do
    trace="$data/${case%%:*}.csv.gz"
    levels=${case#*:}
    peak=$("$gpumem" replay "$trace" --json | sed -E 's/.*"peak_live_bytes": ([0-9]+).*/\1/')
    for conf in engine:pages compact_min:2MiB max_chunk_size:8MiB,move_slack:0.01 rechunk_min:4MiB engine:segments; do
        for thousandths in ${levels//,/ }; do
            bytes=$((peak / 1000 * thousandths))
            for bound in "--conf $conf,memory_limit:$bytes" "--capacity $bytes --conf $conf"; do
                # shellcheck disable=SC2086 # the bound is two words
                output=$("$gpumem" replay "$trace" --json --passes 2 $bound 2>&1 >/dev/null)
                status=$?
                replays=$((replays + 1))
                if [ "$status" -ne 0 ] && { [ "$status" -ne 3 ] || ! grep -q "failed with out of memory" <<<"$output"; }; then
                    echo "FAIL: $(basename "$trace") $bound -> exit $status: $(head -2 <<<"$output")"
                    failures=$((failures + 1))
                fi
            done
        done
    done
done
echo "$replays replays, $failures failed otherwise than out of memory"
[ "$replays" -eq 50 ] && [ "$failures" -eq 0 ]
