#!/usr/bin/env bash
# run_training.sh BUILD_DIR -- issue 14's front door on the GPU: a PyTorch training script run with
# `gpumem run --report`, seen from a second shell while it waits at a quiet point: `gpumem top --once
# --json` and `gpumem stats PID --json` must show exactly the allocated, reserved and peak bytes of
# its own torch.cuda.memory_stats(); at exit gpumem run prints its peaks and summary, writes the
# HTML report of its memory over time and (--tune) replays its allocations under each configuration of
# gpumem tune, on a simulated device of what the GPU left the script.
set -u
build=$1
gpumem=$PWD/$build/gpumem
work=$(mktemp -d)
run_pid=
trap '[ -n "$run_pid" ] && kill -9 "$run_pid" 2>/dev/null; rm -rf "$work"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }

"$gpumem" run --report "$work/report.html" --tune -- python3 tests/gpu/train_under_run.py "$work" >"$work/out" 2>"$work/err" &
run_pid=$!
for _ in $(seq 240); do [ -s "$work/stats.json" ] && break; sleep 0.5; done
[ -s "$work/stats.json" ] || { fail "the training script wrote no statistics: $(tail -20 "$work/err")"; exit 1; }
"$gpumem" top --once
"$gpumem" top --once --json >"$work/top.json"
pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$work/stats.json")
"$gpumem" stats "$pid" --json >"$work/stats_outside.json"
# The Prometheus exporter, from the same second shell: one scrape.
"$gpumem" exporter --listen 127.0.0.1:0 >"$work/exporter.out" 2>&1 &
exporter_pid=$!
for _ in $(seq 50); do grep -q "^listening on" "$work/exporter.out" && break; sleep 0.1; done
if grep -q "^listening on" "$work/exporter.out"; then
    python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' \
        "$(sed -n 's/^listening on //p' "$work/exporter.out")" >"$work/metrics.txt" || fail "the exporter did not answer"
fi
kill "$exporter_pid" 2>/dev/null
if grep -q "without libmicrohttpd" "$work/exporter.out"; then # a GPU machine without libmicrohttpd-dev
    echo "note: gpumem was built without libmicrohttpd here; checking the exporter's --textfile instead"
    "$gpumem" exporter --textfile "$work" --once && cp "$work/gpumem.prom" "$work/metrics.txt"
fi
python3 - "$work" <<'PYTHON' || failed=1
import json, sys
folder = sys.argv[1]
inside = json.load(open(f"{folder}/stats.json"))
stats, pid = inside["stats"], inside["pid"]
top = json.load(open(f"{folder}/top.json"))
rows = [row for row in top["processes"] if row["pid"] == pid]
failed = False
def check(what, seen, expected):
    global failed
    if seen != expected:
        print(f"FAIL: {what} is {seen}, torch.cuda.memory_stats() says {expected}")
        failed = True
if not rows:
    print(f"FAIL: gpumem top does not list the training process {pid}: {top}")
    sys.exit(1)
row = rows[0]
check("top allocated_bytes", row["allocated_bytes"], stats["allocated_bytes.all.current"])
check("top reserved_bytes", row["reserved_bytes"], stats["reserved_bytes.all.current"])
check("top peak_allocated_bytes", row["peak_allocated_bytes"], stats["allocated_bytes.all.peak"])
check("top peak_reserved_bytes", row["peak_reserved_bytes"], stats["reserved_bytes.all.peak"])
check("top num_ooms", row["num_ooms"], stats["num_ooms"])
check("top backend", (row["backend"], row["device"]), ("cuda", 0))
outside = json.load(open(f"{folder}/stats_outside.json"))
for key in ("allocated_bytes.all.current", "reserved_bytes.all.current", "active_bytes.all.peak",
            "requested_bytes.all.current", "allocation.all.current", "segment.all.current", "num_alloc_retries"):
    check(f"gpumem stats {key}", outside.get(key), stats[key])
metrics = open(f"{folder}/metrics.txt").read().splitlines()
def sample(name, *labels):
    for line in metrics:
        if line.startswith(name + "{") and all(label in line for label in labels):
            return int(float(line.rsplit(" ", 1)[1]))
    return None
check("exporter gpumem_reserved_bytes", sample("gpumem_reserved_bytes", f'pid="{pid}"', 'pool="all"'),
      stats["reserved_bytes.all.current"])
check("exporter gpumem_allocated_bytes", sample("gpumem_allocated_bytes", f'pid="{pid}"', 'pool="all"'),
      stats["allocated_bytes.all.current"])
if not any(line.startswith("gpumem_gpu_memory_total_bytes{") for line in metrics):
    print("FAIL: the exporter has no gpumem_gpu_memory_total_bytes (NVML)")
    failed = True
if not top["gpus"]:
    print(f"FAIL: no GPU row from NVML: {top.get('gpu_error')}")
    failed = True
if not failed:
    print(f"ok   gpumem top and stats show training process {pid} as its torch.cuda.memory_stats(): "
          f"allocated {row['allocated_bytes']}, reserved {row['reserved_bytes']}, peak {row['peak_reserved_bytes']}")
sys.exit(failed)
PYTHON
touch "$work/go"
wait "$run_pid"
status=$?
run_pid=
cat "$work/err" | grep -v "^|" | tail -5
[ $status -eq 0 ] || fail "gpumem run exited $status: $(tail -20 "$work/err")"
grep -q "gpumem run: process $pid, cuda device 0 (pages engine): peak allocated" "$work/err" ||
    fail "gpumem run printed no final numbers for $pid"
grep -q "^| gpumem memory summary, cuda device ID 0" "$work/err" || fail "gpumem run printed no summary"
[ -s "$work/report.html" ] && grep -q 'id="memory-curve"' "$work/report.html" ||
    fail "gpumem run --report wrote no report with a memory curve"
room=$(sed -n 's/^gpumem run: this run.s allocations under each configuration (gpumem tune), on a simulated device of \([0-9]*\)MiB$/\1/p' "$work/err")
# What the GPU left the command: most of its memory (an H100's 80 GB or an H200's 141 GB), never more.
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
[ -n "$room" ] && [ -n "$total" ] && [ "$room" -gt $((total / 2)) ] && [ "$room" -le "$total" ] ||
    fail "gpumem run --tune did not take the GPU's memory for the simulated device: '$room' of '$total' MiB"
grep -Eq "^defaults +- +[0-9.]+  1\.[0-9]{4} / 1\.[0-9]{4} / 1\.[0-9]{4} .* 0$" "$work/err" &&
    grep -q "^recommended: " "$work/err" || fail "gpumem run --tune printed no table and recommendation"
sed -n '/gpumem tune/,$p' "$work/err"
[ $failed -eq 0 ] && echo "ok   gpumem run: final numbers, summary, report ($(stat -c %s "$work/report.html") bytes) and tuning"
# A program that dies of fragmentation with one chunk per growth (chunk_room_share:0): --tune replays it on
# what its GPU left it, where those settings fail the same request and another setting fits it. Under the
# defaults the chunks shrink with the room the GPU leaves (2700 MiB: page-sized), and the same program fits.
"$gpumem" run -- python3 tests/gpu/out_of_memory_under_run.py >"$work/fits.out" 2>"$work/fits.err" ||
    fail "the program ran out of memory under the defaults: $(tail -5 "$work/fits.err")"
[ $failed -eq 0 ] && echo "ok   gpumem run: the defaults' chunks near the capacity fit the program that chunk_room_share:0 does not"
"$gpumem" run --conf chunk_room_share:0 --tune -- python3 tests/gpu/out_of_memory_under_run.py >"$work/oom.out" 2>"$work/oom.err"
status=$?
sed -n '/gpumem tune/,$p' "$work/oom.err"
[ $status -eq 1 ] && grep -q "torch.OutOfMemoryError" "$work/oom.err" || fail "the program did not run out of memory ($status)"
grep -Eq "^defaults +- +.* [1-9][0-9]*$" "$work/oom.err" &&
    grep -Eq "^recommended: [a-z -]+ \([a-z_:0-9A-Z.,]+\): it fits, where [0-9]+ allocations? ran out of memory under the defaults" "$work/oom.err" ||
    fail "gpumem run --tune did not find the setting under which the program fits"
[ $failed -eq 0 ] && echo "ok   gpumem run --tune: the program that ran out of memory fits under another setting"
mkdir -p "${OUT:-gpu-results}/logs" && cp "$work/report.html" "${OUT:-gpu-results}/logs/run_report.html" 2>/dev/null
exit $failed
