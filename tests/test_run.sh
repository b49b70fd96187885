#!/usr/bin/env bash
# test_run.sh -- gpumem run: the command's environment (publish:true, gpumem's Python package on
# PYTHONPATH, GPUMEM_TORCH), its exit status passed through, its final statistics printed whether
# it leaves its region behind or destroys its allocator, the regions it left removed, the process
# visible to gpumem top while it runs, and every bad use a clear error.
# Usage: test_run.sh PATH/TO/gpumem PATH/TO/publish_holder
set -u
gpumem=$1
holder=$2
work=$(mktemp -d)
export GPUMEM_SHM_DIR=$work/shm
mkdir -p "$GPUMEM_SHM_DIR"
run_pid=
live_pid=
trap '[ -n "$live_pid" ] && kill -9 "$live_pid" 2>/dev/null; [ -n "$run_pid" ] && kill -9 "$run_pid" 2>/dev/null; rm -rf "$work"' EXIT
failures=0
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}
unset GPUMEM_CONF GPUMEM_TORCH

# The environment: publish:true added to GPUMEM_CONF, --conf after it, the Python package importable.
GPUMEM_CONF=engine:segments "$gpumem" run --conf history:16 -- python3 -c '
import os, gpumem
print(os.environ["GPUMEM_CONF"]); print(os.environ["GPUMEM_TORCH"]); print(gpumem.library_path())' \
    >"$work/env.out" 2>"$work/env.err" || fail "gpumem run python3 failed: $(cat "$work/env.err")"
[ "$(sed -n 1p "$work/env.out")" = "engine:segments,history:16,publish:true" ] ||
    fail "GPUMEM_CONF under gpumem run is '$(sed -n 1p "$work/env.out")'"
[ "$(sed -n 2p "$work/env.out")" = 1 ] || fail "GPUMEM_TORCH is not 1 under gpumem run"
grep -q "libgpumem.so" "$work/env.out" || fail "gpumem's Python package does not find its library under gpumem run"
grep -q "exited with status 0" "$work/env.err" && grep -q "made no gpumem allocator" "$work/env.err" ||
    fail "gpumem run's end message for a command without gpumem: $(cat "$work/env.err")"
GPUMEM_TORCH=off "$gpumem" run -- sh -c 'echo "$GPUMEM_TORCH"' >"$work/torch.out" 2>/dev/null
[ "$(cat "$work/torch.out")" = 1 ] || fail "GPUMEM_TORCH=off under gpumem run is '$(cat "$work/torch.out")', not 1"
GPUMEM_TORCH=compact_min:2MiB "$gpumem" run -- sh -c 'echo "$GPUMEM_TORCH"' >"$work/torch.out" 2>/dev/null
[ "$(cat "$work/torch.out")" = compact_min:2MiB ] || fail "GPUMEM_TORCH's keys under gpumem run are '$(cat "$work/torch.out")'"
GPUMEM_CONF=publish:false "$gpumem" run -- sh -c 'echo "$GPUMEM_CONF"' >"$work/off.out" 2>/dev/null
[ "$(cat "$work/off.out")" = "publish:false" ] || fail "publish:false in GPUMEM_CONF was overridden: $(cat "$work/off.out")"

# Exit statuses: the command's; 128+N when killed by signal N; 127 when it cannot run.
"$gpumem" run -- sh -c 'exit 7' 2>/dev/null
[ $? -eq 7 ] || fail "gpumem run does not pass on exit status 7"
"$gpumem" run -- sh -c 'kill -TERM $$' 2>"$work/signal.err"
[ $? -eq 143 ] && grep -q "killed by signal 15" "$work/signal.err" || fail "a command killed by SIGTERM: $(cat "$work/signal.err")"
"$gpumem" run -- "$work/no-such-command" 2>"$work/missing.err"
[ $? -eq 127 ] && grep -q "cannot run '$work/no-such-command': No such file" "$work/missing.err" ||
    fail "a missing command: $(cat "$work/missing.err")"

# Final statistics: 3 MiB + 1 MiB live at the end; whether the region is left behind or removed.
for mode in leave destroy; do
    HOLDER_EXIT=$mode "$gpumem" run -- "$holder" 3145728 1048576 >"$work/$mode.out" 2>"$work/$mode.err"
    [ $? -eq 0 ] || fail "gpumem run of a holder that exits ($mode) failed: $(cat "$work/$mode.err")"
    read -r pid _ <"$work/$mode.out"
    grep -q "process $pid, sim device 0 (pages engine): peak allocated 4.00 MiB, peak reserved" "$work/$mode.err" ||
        fail "gpumem run's final numbers ($mode): $(cat "$work/$mode.err")"
    grep -Eq "^\| Allocations +\| +[0-9]+ +\| +2 " "$work/$mode.err" || fail "no summary table ($mode): $(cat "$work/$mode.err")"
    [ -z "$(ls "$GPUMEM_SHM_DIR")" ] || fail "regions left after gpumem run ($mode): $(ls "$GPUMEM_SHM_DIR")"
done

# Live: gpumem top sees the command (and the children it runs) while it runs.
"$gpumem" run -- sh -c "'$holder' 1048576; true" >"$work/live.out" 2>"$work/live.err" &
run_pid=$!
for _ in $(seq 100); do [ -s "$work/live.out" ] && break; sleep 0.1; done
read -r pid _ <"$work/live.out"
live_pid=$pid
"$gpumem" top --once --json >"$work/top.json" 2>&1
grep -q "\"pid\": $pid, \"device\": 0, \"backend\": \"sim\", \"engine\": \"pages\", \"allocated_bytes\": 1048576," \
    "$work/top.json" || fail "gpumem top does not show the command's process $pid: $(cat "$work/top.json")"
kill -9 "$pid"
live_pid=
wait "$run_pid"
[ $? -eq 0 ] || fail "gpumem run of sh did not exit 0 after its child was killed"
run_pid=
grep -q "process $pid, sim device 0 (pages engine): peak allocated 1.00 MiB" "$work/live.err" ||
    fail "gpumem run did not report its grandchild $pid: $(cat "$work/live.err")"
[ -z "$(ls "$GPUMEM_SHM_DIR")" ] || fail "the killed process's region was not removed: $(ls "$GPUMEM_SHM_DIR")"

# A grandchild killed as soon as it has published, likely before gpumem run looked (it polls): its
# region names its parent, so it is still the command's, reported and removed.
"$gpumem" run -- sh -c "'$holder' 2097152 >'$work/quick.out' & while [ ! -s '$work/quick.out' ]; do :; done
kill -9 \$!; wait; true" >/dev/null 2>"$work/quick.err"
read -r pid _ <"$work/quick.out"
grep -q "process $pid, sim device 0 (pages engine): peak allocated 2.00 MiB" "$work/quick.err" ||
    fail "gpumem run did not report its grandchild $pid killed at once: $(cat "$work/quick.err")"
[ -z "$(ls "$GPUMEM_SHM_DIR")" ] || fail "the quickly killed process's region was not removed: $(ls "$GPUMEM_SHM_DIR")"

# --report: the report is made from the history the command's allocators wrote into GPUMEM_RUN_OUTPUT
# (gpumem.torch does it at exit; this command does what it does, for a sim allocator).
"$gpumem" run --report "$work/run.html" -- python3 -c '
import os, gpumem
assert "history:" in os.environ["GPUMEM_CONF"]
allocator = gpumem.Allocator("backend:sim,capacity:1GiB")
blocks = [allocator.malloc(size) for size in (1 << 20, 3 << 20, 5 << 20)]
allocator.free(blocks[1])
with open(os.path.join(os.environ["GPUMEM_RUN_OUTPUT"], "history.%d.0.json" % os.getpid()), "w") as out:
    out.write(allocator.history_json())
print(os.environ["GPUMEM_RUN_OUTPUT"])' >"$work/report.out" 2>"$work/report.err"
[ $? -eq 0 ] || fail "gpumem run --report failed: $(cat "$work/report.err")"
grep -q 'id="memory-curve"' "$work/run.html" 2>/dev/null && grep -q "report written to $work/run.html" "$work/report.err" ||
    fail "gpumem run --report wrote no report: $(cat "$work/report.err")"
grep -q 'data-value="9437184"' "$work/run.html" || fail "the report's peak live is not 9 MiB"
[ -n "$(cat "$work/report.out")" ] && [ ! -e "$(cat "$work/report.out")" ] || fail "gpumem run left its output folder '$(cat "$work/report.out")'"
# --tune: the command's history (and its snapshot, for the memory its GPU left it) replayed under each
# configuration of gpumem tune. This command does what gpumem.torch does at exit, for a sim allocator of
# 2700 MiB with one chunk per growth (--conf chunk_room_share:0, which the replays keep), and runs out of
# memory: 1.5 MiB blocks pin the 62 MiB chunks of freed tensors. The defaults over that configuration fail
# the same request in the replay; small chunks fit it. The table goes to stderr, the command's own
# output alone to stdout, and the run's exit status stays the command's.
cat >"$work/pinned.py" <<'PROGRAM'
import atexit, json, os, gpumem
assert "history:1048576" in os.environ["GPUMEM_CONF"]
allocator = gpumem.Allocator("backend:sim,capacity:2700MiB")
def write_history_and_snapshot():
    folder = os.environ["GPUMEM_RUN_OUTPUT"]
    for kind, text in (("history", allocator.history_json()), ("snapshot", json.dumps(allocator.snapshot()))):
        with open(os.path.join(folder, "%s.%d.0.json" % (kind, os.getpid())), "w") as out:
            out.write(text)
atexit.register(write_history_and_snapshot)
print("the command's output")
blocks = [allocator.malloc(size) for _ in range(40) for size in (64487424, 1572864)]
for block in blocks[0::2]:
    allocator.free(block)
allocator.malloc(2097152000)
PROGRAM
"$gpumem" run --conf chunk_room_share:0 --tune -- python3 "$work/pinned.py" >"$work/tune.out" 2>"$work/tune.err"
status=$?
[ $status -eq 1 ] || fail "gpumem run --tune did not pass on the command's exit status 1 (got $status)"
[ "$(cat "$work/tune.out")" = "the command's output" ] || fail "gpumem run --tune wrote to stdout: $(cat "$work/tune.out")"
grep -q "on a simulated device of 2700MiB" "$work/tune.err" &&
    grep -Eq "^defaults +- +2520.0  1.0000 / - / - .* 1$" "$work/tune.err" &&
    grep -q "^recommended: page-sized chunks (max_chunk_size:2MiB): it fits, where 1 allocation ran out of memory under the defaults" "$work/tune.err" ||
    fail "gpumem run --tune: $(cat "$work/tune.err")"
"$gpumem" run --tune -- true 2>"$work/notune.err"
[ $? -eq 1 ] && grep -q "nothing to tune: the command wrote no gpumem history" "$work/notune.err" ||
    fail "gpumem run --tune of a command without history: $(cat "$work/notune.err")"
"$gpumem" run --report "$work/none.html" -- true 2>"$work/noreport.err"
[ $? -eq 1 ] && grep -q "no report: the command wrote no gpumem history" "$work/noreport.err" && [ ! -e "$work/none.html" ] ||
    fail "gpumem run --report of a command without history: $(cat "$work/noreport.err")"

# Bad use.
"$gpumem" run >/dev/null 2>"$work/usage.err"
[ $? -eq 2 ] && grep -q "no command given" "$work/usage.err" || fail "gpumem run without a command: $(cat "$work/usage.err")"
"$gpumem" run --conf bogus:1 -- true 2>"$work/conf.err"
[ $? -eq 2 ] && grep -q "unknown key 'bogus'" "$work/conf.err" || fail "a bad --conf: $(cat "$work/conf.err")"
# A bad configuration in the environment stops the run before the command starts (it would fail at
# its first tensor), and says which variable holds it; GPUMEM_TORCH's keys apply over the others'.
GPUMEM_CONF=history:16,bogus:1 "$gpumem" run -- touch "$work/started" 2>"$work/env.err"
[ $? -eq 2 ] && grep -q "^gpumem run: GPUMEM_CONF: unknown key 'bogus'" "$work/env.err" && [ ! -e "$work/started" ] ||
    fail "a bad GPUMEM_CONF: $(cat "$work/env.err")"
GPUMEM_TORCH=compact_min:2XB "$gpumem" run -- touch "$work/started" 2>"$work/torch.err"
[ $? -eq 2 ] && grep -q "^gpumem run: GPUMEM_TORCH: bad value for key 'compact_min'" "$work/torch.err" &&
    [ ! -e "$work/started" ] || fail "a bad GPUMEM_TORCH: $(cat "$work/torch.err")"
GPUMEM_CONF=pressure_high:0.9 "$gpumem" run --conf pressure_low:0.95 -- touch "$work/started" 2>"$work/order.err"
[ $? -eq 2 ] && grep -q "^gpumem run: --conf: key 'pressure_low' (0.95) must be below" "$work/order.err" &&
    [ ! -e "$work/started" ] || fail "--conf over GPUMEM_CONF: $(cat "$work/order.err")"
"$gpumem" run --frobnicate -- true 2>"$work/option.err"
[ $? -eq 2 ] && grep -q "unknown option '--frobnicate'" "$work/option.err" || fail "an unknown option: $(cat "$work/option.err")"

[ $failures -eq 0 ] && echo "test_run: all checks passed"
exit $((failures > 0))
