#!/usr/bin/env bash
# test_soak.sh -- short runs of the soak (bench/soak.c), which checks the allocator's books at barriers
# while threads share it: the plain soak's random operations on sim; the --trace soak, whose threads
# replay real traces, on sim (resnet50 on an 80 GiB device, which stitches requests from its first
# pass) and on the host backend, where every live block's data is checked before its free, so that a
# stitched block's bytes are shown to be its own. Each run must end with no violation, and the trace runs
# must have stitched (else they no longer cover stitching, and this test says so). Then bad input: a
# message and exit status 2 each. The plain runs are short (the soak itself is a tool: docs/benchmarks.md,
# Soak); GPUMEM_SOAK_SCALE divides them under ThreadSanitizer.
# Usage: test_soak.sh PATH/TO/gpumem_soak PATH/TO/data
set -u
soak=$1
data=$2
scale=${GPUMEM_SOAK_SCALE:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

field() { # name, JSON line: the number after "name":
    grep -o "\"$1\":[0-9.]*" <<<"$2" | head -1 | cut -d: -f2
}

run_soak() { # description, least stitches, soak arguments...
    local description=$1 least_stitches=$2
    shift 2
    local output status violations stitches
    output=$("$soak" "$@" --json 2>&1)
    status=$?
    violations=$(field violations "$output")
    stitches=$(field stitches "$output")
    if [ "$status" -ne 0 ] || [ "${violations:-x}" != 0 ]; then
        echo "FAIL: $description: exit $status, violations ${violations:-none reported}:"
        echo "$output" | tail -20
        failures=$((failures + 1))
    elif [ "${stitches:-0}" -lt "$least_stitches" ]; then
        echo "FAIL: $description: $stitches stitches, fewer than $least_stitches: it no longer covers stitching"
        echo "$output"
        failures=$((failures + 1))
    else
        echo "ok: $description: $(field mallocs "$output") mallocs, $(field stitches "$output") stitches," \
             "$(field faults_injected "$output") faults injected, $(field seconds "$output") s"
    fi
}

expect_failure() { # description, message pattern, soak arguments...
    local description=$1 pattern=$2
    shift 2
    local output status
    output=$("$soak" "$@" 2>&1)
    status=$?
    if [ "$status" -ne 2 ] || ! grep -qF -- "$pattern" <<<"$output"; then
        echo "FAIL: $description: exit $status (not 2) or no '$pattern' in: $output"
        failures=$((failures + 1))
    fi
}

resnet50=$data/traces/resnet50.csv.gz
unet=$data/traces-more/unet-seed1.csv.gz
run_soak "plain soak, sim, 4 threads" 0 --threads 4 --operations $((200000 / scale))
run_soak "plain soak, host, data checked, 2 threads" 0 --backend host --threads 2 --operations $((40000 / scale))
run_soak "trace soak, sim, resnet50 on 80 GiB, 1 thread" 1 --trace "$resnet50" --capacity 80GiB --threads 1 \
    --operations 20000
run_soak "trace soak, sim, resnet50 on 80 GiB, 4 threads" 0 --trace "$resnet50" --capacity 80GiB --threads 4 \
    --operations $((100000 / scale))
run_soak "trace soak, host, the UNet's data checked, 1 thread" 1 --backend host --trace "$unet" --capacity 12GiB \
    --threads 1 --operations 12000

printf 'garbage\n1,2\n' >"$work/malformed.csv"
printf '# op,id,size,stream\n' >"$work/empty.csv"
expect_failure "a trace that does not exist" "cannot open" --trace "$work/none.csv"
expect_failure "a malformed trace" "expected 4 comma-separated fields" --trace "$work/malformed.csv"
expect_failure "a trace with no operations" "holds no operations" --trace "$work/empty.csv"
expect_failure "--trace without a file" "bad value '(missing)' for --trace" --trace
expect_failure "a trace with a bad --conf" "unknown key 'bogus'" --trace "$resnet50" --conf bogus:1
expect_failure "--conf setting the engine, which --engine sets" "give it with --engine" --conf stitch:false,engine:segments
expect_failure "--conf setting the backend, which --backend sets" "give it with --backend" --conf "stitch:false, 	backend:host"

[ "$failures" -eq 0 ] && echo "test_soak: all passed" || echo "test_soak: $failures failed"
[ "$failures" -eq 0 ]
