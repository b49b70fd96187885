#!/usr/bin/env bash
# test_stats_cli.sh -- gpumem stats PID from outside a running process: exact published numbers while
# it runs (device memory and the pinned host cache), a clear refusal once it is killed (its region is
# stale), and for a process with no region.
# Usage: test_stats_cli.sh PATH/TO/gpumem PATH/TO/publish_holder
set -u
gpumem=$1
holder=$2
work=$(mktemp -d)
export GPUMEM_SHM_DIR=$work/shm
mkdir -p "$GPUMEM_SHM_DIR"
holder_pid=
trap '[ -n "$holder_pid" ] && kill -9 "$holder_pid" 2>/dev/null; rm -rf "$work"' EXIT
failures=0

fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}

# The sizes the holder allocates, and what they occupy: each rounded up to 512 bytes.
sizes="1000 4096 1048577 3145728 100"
expected=0
for size in $sizes; do
    expected=$((expected + (size + 511) / 512 * 512))
done

# Pinned host memory (gm_host_malloc): 3000 bytes kept, 100000 taken and freed (idle in the cache). The
# cache's blocks are powers of two of at least 512 bytes: 4096 and 131072 bytes.
pinned_kept=3000
pinned_freed=100000
pinned_allocated=4096
pinned_reserved=$((4096 + 131072))

HOLDER_CHILD_BYTES=$((32 << 20)) HOLDER_PINNED_BYTES=$pinned_kept HOLDER_PINNED_FREED_BYTES=$pinned_freed \
    "$holder" $sizes >"$work/holder.out" 2>&1 &
holder_pid=$!
for _ in $(seq 100); do
    [ -s "$work/holder.out" ] && break
    sleep 0.1
done
read -r printed_pid region <"$work/holder.out"
[ "$printed_pid" = "$holder_pid" ] || fail "the holder printed '$(cat "$work/holder.out")', not its pid $holder_pid"
[ -f "$region" ] || fail "no region at '$region'"
case "$region" in "$GPUMEM_SHM_DIR"/gpumem.$(id -u).$holder_pid.0) ;; *) fail "region '$region' is misnamed" ;; esac
[ "$(stat -c %a "$region" 2>/dev/null)" = 600 ] || fail "region mode is $(stat -c %a "$region" 2>/dev/null), not 600"

"$gpumem" stats "$holder_pid" --json >"$work/stats.json" 2>&1
status=$?
[ "$status" -eq 0 ] || fail "gpumem stats $holder_pid --json exited $status: $(cat "$work/stats.json")"
grep -q "\"allocated_bytes.all.current\": $expected," "$work/stats.json" ||
    fail "allocated_bytes.all.current is not $expected: $(grep -o '"allocated_bytes.all.current": [0-9]*' "$work/stats.json")"
grep -q '"allocation.all.current": 5,' "$work/stats.json" || fail "allocation.all.current is not 5"
grep -q "\"pid\": $holder_pid, \"device\": 0, \"backend\": \"sim\", \"engine\": \"pages\"" "$work/stats.json" ||
    fail "header fields wrong: $(head -c 200 "$work/stats.json")"
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$work/stats.json" 2>/dev/null ||
    { command -v python3 >/dev/null && fail "the output is not one JSON object"; }
pinned_json="\"pinned_host\": {\"allocated_bytes\": $pinned_allocated, \"allocated_bytes_peak\": $pinned_reserved, \
\"reserved_bytes\": $pinned_reserved, \"reserved_bytes_peak\": $pinned_reserved, \"allocations\": 1, \
\"requested_bytes\": $pinned_kept, \"cache_hits\": 0, \"cache_misses\": 2, \"host_frees\": 0, \"pending_blocks\": 0, \
\"limit_bytes\": 0}}"
grep -qF "$pinned_json" "$work/stats.json" ||
    fail "gpumem stats --json's pinned host part is not $pinned_json: $(grep -o '"pinned_host": {[^}]*}' "$work/stats.json")"

"$gpumem" stats "$holder_pid" >"$work/stats.txt" 2>&1 || fail "gpumem stats $holder_pid (table) failed"
grep -qxF "pinned host: $pinned_reserved bytes reserved (peak $pinned_reserved), $pinned_allocated allocated in 1 block, \
0 hits, 2 misses, 0 pending" "$work/stats.txt" || fail "the table's pinned host line: $(grep "^pinned host" "$work/stats.txt")"

"$gpumem" summary "$holder_pid" >"$work/summary.txt" 2>&1 || fail "gpumem summary $holder_pid failed"
grep -q "gpumem memory summary, sim device ID 0" "$work/summary.txt" && grep -Eq "^\| Allocations +\| +5 " "$work/summary.txt" ||
    fail "gpumem summary's table is not the process's: $(head -12 "$work/summary.txt")"

# gpumem top lists the holder with its exact numbers, as JSON and as a table.
"$gpumem" top --once --json >"$work/top.json" 2>&1 || fail "gpumem top --once --json failed: $(cat "$work/top.json")"
grep -q "{\"pid\": $holder_pid, \"device\": 0, \"backend\": \"sim\", \"engine\": \"pages\", \"allocated_bytes\": $expected," \
    "$work/top.json" || fail "gpumem top --json does not list $holder_pid with $expected bytes: $(cat "$work/top.json")"
# Host memory of the holder and its child, which touched 32 MiB: the tree's RSS and PSS hold it.
python3 - "$work/top.json" "$holder_pid" <<'PYTHON' || fail "gpumem top --json's host memory is wrong: $(cat "$work/top.json")"
import json, sys
view = json.load(open(sys.argv[1]))
row = [p for p in view["processes"] if p["pid"] == int(sys.argv[2])][0]
assert row["host_rss_bytes"] > 0 and row["host_pss_bytes"] > 0, row
assert row["descendants"] == 1, row
assert row["tree_rss_bytes"] >= row["host_rss_bytes"] + (32 << 20), row
assert row["tree_pss_bytes"] >= row["host_pss_bytes"] + (30 << 20), row
host = view["host"]
assert 0 < host["memory_available_bytes"] <= host["memory_total_bytes"], host
assert row["largest_free_block_bytes"] <= row["cached_free_bytes"] <= row["reserved_bytes"], row
PYTHON
grep -qF "\"pinned_host_reserved_bytes\": $pinned_reserved, \"pinned_host_reserved_bytes_peak\": $pinned_reserved, \
\"pinned_host_allocated_bytes\": $pinned_allocated," "$work/top.json" ||
    fail "gpumem top --json's pinned host bytes are not $pinned_reserved reserved, $pinned_allocated allocated: $(cat "$work/top.json")"

# GPUs: the driver's rows, or (no NVML here) why there are none.
grep -Eq '"gpus": \[\{"index": 0, |"gpus": \[\], "gpu_error": "NVML is not available: ' "$work/top.json" ||
    fail "gpumem top --json has neither GPU rows nor the reason: $(cat "$work/top.json")"
"$gpumem" top --once >"$work/top.txt" 2>&1 || fail "gpumem top --once failed"
grep -Eq "^ *$holder_pid +0 +sim/pages " "$work/top.txt" || fail "gpumem top's table lacks $holder_pid: $(cat "$work/top.txt")"
# The PIN MiB column (the 12th): 135168 bytes is 0.1 MiB.
pin_column=$(awk -v pid="$holder_pid" '$1 == pid { print $12 }' "$work/top.txt")
[ "$pin_column" = 0.1 ] || fail "gpumem top's PIN MiB of $holder_pid is '$pin_column', not 0.1: $(cat "$work/top.txt")"
grep -q "^ *PID .* DEV CALLS  PIN MiB " "$work/top.txt" || fail "gpumem top's header lacks PIN MiB: $(cat "$work/top.txt")"
# In a real terminal (tmux; CI installs it): the live view redraws and shows the holder.
if command -v tmux >/dev/null; then
    session=gpumem-top-test-$$
    tmux new-session -d -s "$session" -x 160 -y 30 "GPUMEM_SHM_DIR='$GPUMEM_SHM_DIR' '$gpumem' top -d 0.2"
    shown=no
    for _ in $(seq 50); do
        sleep 0.1
        if tmux capture-pane -p -t "$session" 2>/dev/null | grep -Eq "^ *$holder_pid +0 +sim/pages "; then
            shown=yes
            break
        fi
    done
    tmux capture-pane -p -t "$session" >"$work/tmux.txt" 2>/dev/null
    tmux kill-session -t "$session" 2>/dev/null
    [ "$shown" = yes ] || fail "gpumem top in tmux does not show $holder_pid: $(cat "$work/tmux.txt")"
else
    fail "tmux is not installed (.ci/run installs it): gpumem top's terminal view is untested"
fi
# More regions than the table's 256 rows (the holder's copied for devices 1-300, each header's device,
# an int32 at byte 32, set to match its name): 256 shown, the rest counted apart, none refused.
python3 - "$region" "$GPUMEM_SHM_DIR" "$(id -u)" "$holder_pid" <<'PYTHON'
import struct, sys
region, folder, uid, pid = sys.argv[1:5]
data = bytearray(open(region, "rb").read())
for device in range(1, 301):
    struct.pack_into("<i", data, 32, device)
    with open(f"{folder}/gpumem.{uid}.{pid}.{device}", "wb") as copy:
        copy.write(data)
PYTHON
"$gpumem" top --once --json >"$work/top_many.json" 2>&1
python3 - "$work/top_many.json" <<'PYTHON' || fail "gpumem top with 301 regions: $(head -c 300 "$work/top_many.json")"
import json, sys
view = json.load(open(sys.argv[1]))
sys.exit(not (len(view["processes"]) == 256 and view["regions_beyond_the_table"] == 45 and view["refused_regions"] == 0))
PYTHON
"$gpumem" top --once >"$work/top_many.txt" 2>&1
grep -q "^gpumem top -- 1 process, 256 regions (45 more past the table's 256 rows)" "$work/top_many.txt" ||
    fail "gpumem top's header with 301 regions: $(head -n 1 "$work/top_many.txt")"
rm -f "$GPUMEM_SHM_DIR"/gpumem.*."$holder_pid".[1-9]*
"$gpumem" top -d 0 >"$work/top_usage.out" 2>&1
[ $? -eq 2 ] && grep -q "seconds from 0.1 to 3600" "$work/top_usage.out" || fail "gpumem top -d 0 is not a usage error"
grep -Eq "^allocated_bytes +current +$expected " "$work/stats.txt" || fail "the table lacks allocated_bytes $expected"

kill -9 "$holder_pid"
wait "$holder_pid" 2>/dev/null
[ -f "$region" ] || fail "the region vanished although its process was killed with SIGKILL"
"$gpumem" stats "$holder_pid" >"$work/stale.out" 2>&1
status=$?
[ "$status" -eq 1 ] || fail "gpumem stats of a killed process exited $status, not 1"
grep -q "process $holder_pid is gone.*stale" "$work/stale.out" || fail "stale region not reported: $(cat "$work/stale.out")"
"$gpumem" top --once --json >"$work/top_after.json" 2>&1
grep -q "\"pid\": $holder_pid," "$work/top_after.json" && fail "gpumem top still lists the killed $holder_pid"
grep -q '"stale_regions": 1,' "$work/top_after.json" || fail "gpumem top does not count the stale region: $(cat "$work/top_after.json")"
holder_pid=

"$gpumem" stats 999999999 >"$work/none.out" 2>&1
status=$?
[ "$status" -eq 1 ] || fail "gpumem stats of a missing process exited $status, not 1"
grep -q "process 999999999 does not exist" "$work/none.out" || fail "missing process not reported: $(cat "$work/none.out")"

"$gpumem" stats >"$work/usage.out" 2>&1
[ $? -eq 2 ] && grep -q "usage: gpumem stats PID" "$work/usage.out" || fail "gpumem stats without a pid is not a usage error"
"$gpumem" top -d >"$work/usage.out" 2>&1
[ $? -eq 2 ] && grep -q "seconds from 0.1 to 3600" "$work/usage.out" || fail "gpumem top -d without a value: $(head -n 1 "$work/usage.out")"
"$gpumem" stats --device 0 >"$work/usage.out" 2>&1
[ $? -eq 2 ] && grep -q "a process id is missing" "$work/usage.out" || fail "gpumem stats --device 0 does not say the pid is missing"
for word in abc 0 12x; do
    "$gpumem" summary "$word" >"$work/bad_pid.out" 2>&1
    [ $? -eq 2 ] && grep -q "gpumem summary: '$word' is not a process id" "$work/bad_pid.out" ||
        fail "gpumem summary $word: $(head -n 1 "$work/bad_pid.out")"
done

if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
fi
echo "ok   gpumem stats: exact bytes $expected while running, stale after SIGKILL"
