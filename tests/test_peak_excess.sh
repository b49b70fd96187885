#!/usr/bin/env bash
# test_peak_excess.sh -- bench/peak_excess.c sorts the free memory of the pages engine exactly, on a trace
# whose layout is known: two 64 MiB tensors (one chunk each), the first freed, then a smaller tensor
# placed in its memory. With 64 MiB chunks that tensor pins the first chunk's free pages; with 8 MiB
# chunks it pins one chunk and the rest is idle. --stitch on two layouts of 64 MiB chunks whose free
# end and free start are known. Then bad input: each a message and a non-zero exit.
# Usage: test_peak_excess.sh PATH/TO/gpumem_peak_excess
set -u
tool=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

expect() { # description, pattern, output
    if ! grep -qF -- "$2" <<<"$3"; then
        echo "FAIL: $1: no '$2' in:"
        echo "$3"
        failures=$((failures + 1))
    fi
}

expect_failure() { # description, wanted status, message pattern, command...
    local description=$1 wanted=$2 pattern=$3
    shift 3
    local output status
    output=$("$@" 2>&1)
    status=$?
    if [ "$status" -ne "$wanted" ]; then
        echo "FAIL: $description: exit $status, not $wanted: $output"
        failures=$((failures + 1))
    fi
    expect "$description" "$pattern" "$output"
}

MiB=1048576
for tail in 10 9; do
    printf '# op,id,size,stream\na,0,%d,0\na,1,%d,0\nf,0,%d,0\na,2,%d,0\n' $((64 * MiB)) $((64 * MiB)) $((64 * MiB)) \
        $((tail * MiB)) >"$work/tail$tail.csv"
done

output=$("$tool" "$work/tail10.csv" --at 3 --chunks)
expect "peaks" "live peak 128.0 MiB at operation 1, reserved then 128.0 MiB (1.0000 of it)" "$output"
expect "the moment sorted" "after operation 3 (a 10.00 MiB request): reserved 128.0 MiB, allocated 74.0 MiB" "$output"
expect "the large pool" "large pool, stream 0: 128.0 MiB mapped in 2 chunks, 74.0 MiB live or pending, 54.0 MiB free" "$output"
expect "54 MiB pinned in a 64 MiB chunk" "whole pages in idle chunks 0.0 MiB; whole pages in chunks that live blocks pin 54.0 MiB (chunks of at most 8 MiB 0.0, 8-32 MiB 0.0, larger 54.0); pieces of pages 0.0 MiB" "$output"
expect "the chunk listed" "chunk at +0 MiB of 64 MiB: 10.0 MiB live, 54 MiB of whole free pages" "$output"

output=$("$tool" "$work/tail9.csv" "backend:sim,max_chunk_size:8MiB" --at 3)
expect "8 MiB chunks" "128.0 MiB mapped in 16 chunks, 73.0 MiB live or pending, 55.0 MiB free" "$output"
expect "the rest idle, a piece of a page" "whole pages in idle chunks 48.0 MiB; whole pages in chunks that live blocks pin 6.0 MiB (chunks of at most 8 MiB 6.0, 8-32 MiB 0.0, larger 0.0); pieces of pages 1.0 MiB" "$output"

# Without --at: the peak's own growth when nothing grows after the live peak.
output=$("$tool" "$work/tail10.csv")
expect "no growth after the live peak" "peak reserved 128.0 MiB at operation 1 (1.0000 of the live peak); 0 growths after the live peak" "$output"
expect "the peak's growth sorted" "after operation 1 (a 64.00 MiB request)" "$output"

# --stitch. Chunks A, B of one 128 MiB tensor; then 10 MiB at A's start, 58 MiB, 4 MiB inside B,
# 46 MiB, 10 MiB at B's end; the 58 and 46 MiB freed: A's free end is 54 MiB, B's free start 4 MiB
# (the 46 MiB lie between two live blocks), and a 100 MiB request needs 42 MiB more than both.
csv() { printf '# op,id,size,stream\n'; for operation in "$@"; do
    IFS=: read -r kind id mib <<<"$operation"; printf '%s,%s,%d,0\n' "$kind" "$id" $((mib * MiB)); done; }
csv a:0:128 f:0:128 a:1:10 a:2:58 a:3:4 a:4:46 a:5:10 f:2:58 f:4:46 a:6:100 >"$work/stitch_short.csv"
output=$("$tool" "$work/stitch_short.csv" "backend:sim,max_chunk_size:64MiB,stitch:false" --stitch)
expect "stitching short of a request" "operation 9: a 100.00 MiB request lifts reserved to 228.0 MiB with 124.0 MiB live; stitching: free end 54.0 + idle 0.0 + free start 4.0 MiB, 42.0 MiB still new" "$output"
# Chunks A, B, C of one 192 MiB tensor; A's first 10 MiB, all of B and C's last 42 MiB live: A's free
# end (54 MiB) and C's free start (22 MiB), apart, would hold a 70 MiB request.
csv a:0:192 f:0:192 a:1:10 a:2:54 a:3:64 a:4:22 a:5:42 f:2:54 f:4:22 a:6:70 >"$work/stitch_covers.csv"
output=$("$tool" "$work/stitch_covers.csv" "backend:sim,max_chunk_size:64MiB,stitch:false" --stitch)
expect "stitching covering a request" "operation 9: a 70.00 MiB request lifts reserved to 262.0 MiB with 186.0 MiB live; stitching: free end 54.0 + idle 0.0 + free start 22.0 MiB, covers it" "$output"
output=$("$tool" "$work/stitch_covers.csv" "backend:sim,max_chunk_size:64MiB,stitch:false")
if grep -q stitching <<<"$output"; then
    echo "FAIL: stitching shown without --stitch"
    failures=$((failures + 1))
fi

expect_failure "no trace" 2 "usage: gpumem_peak_excess" "$tool"
expect_failure "unreadable trace" 1 "cannot open" "$tool" "$work/missing.csv"
printf 'a,0,notanumber,0\n' >"$work/bad.csv"
expect_failure "malformed trace" 1 "gpumem_peak_excess:" "$tool" "$work/bad.csv"
expect_failure "bad configuration" 1 "unknown key 'bogus'" "$tool" "$work/tail10.csv" "backend:sim,bogus:1"
expect_failure "segments engine" 1 "only the pages engine" "$tool" "$work/tail10.csv" "backend:sim,engine:segments"
expect_failure "operation out of range" 2 "the trace has 4 operations" "$tool" "$work/tail10.csv" --at 4
expect_failure "operation not a number" 2 "--at wants an operation number" "$tool" "$work/tail10.csv" --at three
expect_failure "operation missing" 2 "--at wants an operation number" "$tool" "$work/tail10.csv" --at

if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
fi
echo "test_peak_excess: all checks passed"
