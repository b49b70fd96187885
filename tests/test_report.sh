#!/usr/bin/env bash
# test_report.sh -- gpumem report and gpumem replay --report: HTML reports of a trace, a history and a
# snapshot that are self-contained, draw the curve and the map, and give the same peaks as
# gpumem replay --json; bad input and unwritable output fail with the right exit status and message,
# leaving no file behind.
# Usage: test_report.sh PATH/TO/gpumem DATA_DIRECTORY
set -u
gpumem=$1
data=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
trace="$data/traces/resnet50.csv.gz"

fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}
ok() {
    echo "ok   $*"
}

# expect STATUS PATTERN -- COMMAND...: as in test_cli.sh.
expect() {
    local status=$1 pattern=$2
    shift 3
    "$@" >"$work/out" 2>&1
    local got=$?
    if [ "$got" -ne "$status" ] || ! grep -Eq -- "$pattern" "$work/out"; then
        fail "$* -> exit $got (wanted $status), output:"
        sed 's/^/    /' "$work/out" | head -20
        echo "    (wanted /$pattern/)"
    else
        ok "$*"
    fi
}

# quiet COMMAND...: the command succeeds and prints nothing.
quiet() {
    "$@" >"$work/out" 2>&1
    local got=$?
    if [ "$got" -ne 0 ] || [ -s "$work/out" ]; then
        fail "$* -> exit $got (wanted 0 and no output), output:"
        sed 's/^/    /' "$work/out" | head -20
    else
        ok "$*"
    fi
}

# json_number FILE KEY: the number after "KEY": in a one-line JSON text.
json_number() {
    grep -o "\"$2\": [0-9.]*" "$1" | head -1 | sed 's/.*: //'
}

# headline FILE ID: the data-value of the headline row with that id.
headline() {
    grep -o "<tr id=\"$2\" data-value=\"[^\"]*\"" "$1" | sed 's/.*data-value="//; s/"$//'
}

# path_points FILE ID: how many line-to commands the SVG path with that id has.
path_points() {
    grep -o "<path id=\"$2\" [^>]*d=\"[^\"]*\"" "$1" | sed 's/.* d="//' | tr -cd 'LHV' | wc -c
}

# same NAME GOT WANTED
same() {
    if [ -n "$2" ] && [ "$2" = "$3" ]; then ok "$1 = $3"; else fail "$1: got '$2', wanted '$3'"; fi
}

# self_contained FILE: one page, nothing fetched from anywhere.
self_contained() {
    local file=$1
    if [ ! -s "$file" ]; then
        fail "$file: missing or empty"
        return
    fi
    head -1 "$file" | grep -q '^<!DOCTYPE html>$' || fail "$file: does not start with <!DOCTYPE html>"
    tail -1 "$file" | grep -q '^</html>$' || fail "$file: does not end with </html>"
    if grep -Eiq 'https?://|<script[^>]*src=|<link|<img|<iframe|@import|url\(' "$file"; then
        fail "$file: refers to something outside itself:"
        grep -Eio '.{0,40}(https?://|<script[^>]*src=|<link|<img|<iframe|@import|url\().{0,40}' "$file" | head -5
    else
        ok "$file is self-contained"
    fi
}

# ---------------------------------------------------------------- the three inputs
"$gpumem" replay "$trace" --json --snapshot "$work/snapshot.json" --history "$work/history.json" >"$work/replay.json" ||
    fail "gpumem replay --json --snapshot --history"
peak_live=$(json_number "$work/replay.json" peak_live_bytes)
peak_reserved=$(json_number "$work/replay.json" peak_reserved_bytes)
ratio=$(json_number "$work/replay.json" ratio)
calls=$(json_number "$work/replay.json" total)
ops=$(json_number "$work/replay.json" ops)
[ -n "$peak_reserved" ] && [ "$peak_reserved" -gt 0 ] || fail "no peak_reserved_bytes in gpumem replay --json"

quiet "$gpumem" report "$trace" -o "$work/trace.html"
quiet "$gpumem" report "$work/history.json" -o "$work/history.html"
quiet "$gpumem" report "$work/snapshot.json" -o "$work/snapshot.html"
for kind in trace history snapshot; do
    self_contained "$work/$kind.html"
    same "$kind: peak live" "$(headline "$work/$kind.html" peak-live)" "$peak_live"
    same "$kind: peak reserved" "$(headline "$work/$kind.html" peak-reserved)" "$peak_reserved"
    same "$kind: ratio" "$(headline "$work/$kind.html" ratio)" "$ratio"
    grep -q '<svg id="memory-map"' "$work/$kind.html" || fail "$kind: no memory map"
    grep -q '<rect class="allocated"' "$work/$kind.html" || fail "$kind: the memory map has no allocated block"
    grep -q '<table id="largest-allocations">' "$work/$kind.html" || fail "$kind: no table of the largest allocations"
    [ "$(grep -c '^<tr><td class="number" data-value=' "$work/$kind.html")" -eq 20 ] ||
        fail "$kind: not 20 rows of largest allocations"
done
same "trace: device calls" "$(headline "$work/trace.html" device-calls)" "$calls"
same "snapshot: device calls" "$(headline "$work/snapshot.html" device-calls)" "$calls"
same "trace: operations" "$(headline "$work/trace.html" operations)" "$ops"

# The curve: a real path for each series (the trace has 24124 operations, the history more events).
for kind in trace history; do
    grep -q '<svg id="memory-curve"' "$work/$kind.html" || fail "$kind: no <svg id=\"memory-curve\">"
    for series in curve-allocated curve-reserved; do
        points=$(path_points "$work/$kind.html" "$series")
        if [ "$points" -ge 300 ] && [ "$points" -le 4000 ]; then ok "$kind: $series has $points points"
        else fail "$kind: $series has $points points (wanted 300 to 4000: downsampled, not trivial)"; fi
    done
    [ "$(path_points "$work/$kind.html" curve-peak-reserved)" -ge 2 ] || fail "$kind: no peak-reserved step line"
done
grep -q 'peak reserved 11.00 GiB at operation' "$work/trace.html" || fail "trace: the peak is not marked"
# The map at the peak holds exactly the peak's reserved memory (the history's map is rebuilt from events).
for kind in trace history; do
    same "$kind: memory mapped in the map at the peak" \
        "$(grep -o 'id="map-totals" data-mapped="[0-9]*"' "$work/$kind.html" | sed 's/.*data-mapped="//; s/"$//')" "$peak_reserved"
done
grep -q 'id="no-time-axis" class="note">A snapshot is one moment: it has no time axis' "$work/snapshot.html" &&
    ! grep -q '<svg id="memory-curve"' "$work/snapshot.html" && ok "snapshot: says it has no time axis" ||
    fail "snapshot: should say it has no time axis and draw no curve"
for kind in trace snapshot; do
    grep -q '<pre id="statistics-table">' "$work/$kind.html" && grep -q '| GPU reserved memory   |' "$work/$kind.html" &&
        ok "$kind: statistics table" || fail "$kind: no memory_summary() table"
done
grep -q 'id="no-statistics"' "$work/history.html" && ok "history: says it has no statistics" ||
    fail "history: should say it has no statistics"

# gpumem replay --report writes the same report, whatever else the replay does.
expect 0 '"peak_reserved_bytes": '"$peak_reserved" -- "$gpumem" replay "$trace" --json --report "$work/replayed.html" --history "$work/h2.json"
cmp -s "$work/trace.html" "$work/replayed.html" && ok "gpumem replay --report = gpumem report" ||
    fail "gpumem replay --report differs from gpumem report"

# An input read once: a trace or a history from a pipe gives the report of the file; a gzip history
# and a trace that starts with a UTF-8 byte-order mark are read as such.
gzip -dc "$trace" | "$gpumem" report /dev/stdin -o "$work/piped_trace.html" >"$work/out" 2>&1 || fail "trace from a pipe: $(cat "$work/out")"
same "trace from a pipe: peak reserved" "$(headline "$work/piped_trace.html" peak-reserved)" "$peak_reserved"
"$gpumem" report <(cat "$work/history.json") -o "$work/piped_history.html" >"$work/out" 2>&1 || fail "history from a pipe: $(cat "$work/out")"
same "history from a pipe: peak reserved" "$(headline "$work/piped_history.html" peak-reserved)" "$peak_reserved"
gzip -c "$work/history.json" >"$work/history.json.gz"
quiet "$gpumem" report "$work/history.json.gz" -o "$work/gzip_history.html"
same "gzip history: peak reserved" "$(headline "$work/gzip_history.html" peak-reserved)" "$peak_reserved"
printf '\xef\xbb\xbfa,0,3145728,0\nf,0,3145728,0\n' >"$work/bom.csv"
expect 0 '"peak_live_bytes": 3145728' -- "$gpumem" replay "$work/bom.csv" --json
quiet "$gpumem" report "$work/bom.csv" -o "$work/bom.html"
same "trace with a byte-order mark: peak live" "$(headline "$work/bom.html" peak-live)" 3145728

# A history whose ring dropped older events: the levels before its first event are lower bounds that
# keep reserved memory at least the allocated (a free of 100 bytes first: at least 100 were live); the
# peaks say "at least" and there is no ratio.
printf '{"format": "gpumem-history", "version": 1, "dropped": 3, "events": [{"action": "free_requested", "address": 4096, "size": 100}, {"action": "alloc", "address": 8192, "size": 1000}, {"action": "segment_unmap", "address": 0, "size": 2097152}]}\n' >"$work/dropped.json"
quiet "$gpumem" report "$work/dropped.json" -o "$work/dropped.html"
same "dropped events: peak live" "$(headline "$work/dropped.html" peak-live)" 1000
same "dropped events: peak reserved (the 1000 bytes still live after the unmap)" "$(headline "$work/dropped.html" peak-reserved)" 2098152
grep -q 'peak live (bytes requested)</th><td>at least ' "$work/dropped.html" && grep -q 'id="ratio" data-value=""><th>ratio</th><td>not known' "$work/dropped.html" &&
    ok "dropped events: lower bounds, no ratio" || fail "dropped events: the peaks should say at least and give no ratio"
printf '{"format": "gpumem-history", "version": 1, "dropped": 1, "events": [{"action": "free_requested", "address": 4096, "size": 100}, {"action": "segment_unmap", "address": 0, "size": 2097152}]}\n' >"$work/dropped_first.json"
quiet "$gpumem" report "$work/dropped_first.json" -o "$work/dropped_first.html"
same "dropped events: what was live before the first event counts" "$(headline "$work/dropped_first.html" peak-live)" 100

# The segments engine, many regions: compact rows, still every allocated block drawn.
quiet "$gpumem" report "$trace" --conf engine:segments -o "$work/segments.html"
[ "$(grep -c '<g class="region"' "$work/segments.html")" -ge 17 ] && ok "segments: one row per segment" ||
    fail "segments: fewer than 17 region rows"
same "segments: peak reserved" "$(headline "$work/segments.html" peak-reserved)" \
    "$(GPUMEM_CONF=engine:segments "$gpumem" replay "$trace" --json | grep -o '"peak_reserved_bytes": [0-9]*' | grep -o '[0-9]*$')"

# Strings from input are escaped.
odd="$work/<b>&\"x'.csv"
printf 'a,0,3145728,0\na,1,1000,0\nf,0,3145728,0\n' >"$odd"
quiet "$gpumem" report "$odd" -o "$work/odd.html"
grep -q "<title>gpumem report: &lt;b&gt;&amp;&quot;x&#39;.csv</title>" "$work/odd.html" && ! grep -q '<b>&' "$work/odd.html" &&
    ok "the input's name is escaped" || fail "the input's name is not escaped"
sed 's/"backend": "sim"/"backend": "<script>alert(1)<\/script>"/' "$work/snapshot.json" >"$work/odd_snapshot.json"
quiet "$gpumem" report "$work/odd_snapshot.json" -o "$work/odd_snapshot.html"
grep -q 'on the &lt;script&gt;alert(1 backend' "$work/odd_snapshot.html" && ! grep -q '<script>alert' "$work/odd_snapshot.html" &&
    ok "a snapshot's backend name is escaped" || fail "a snapshot's backend name is not escaped"

# ---------------------------------------------------------------- out of memory: a report, exit 3
printf 'a,0,2147483648,0\nf,0,2147483648,0\na,1,1024,0\n' >"$work/huge.csv"
expect 3 "1 allocations failed with out of memory" -- "$gpumem" report "$work/huge.csv" --capacity 1GiB -o "$work/huge.html"
same "out of memory: failed allocations" "$(headline "$work/huge.html" failed-allocations)" 1

# ---------------------------------------------------------------- bad usage and bad input
printf 'a,0,100,0\nq,1,5,0\n' >"$work/bad.csv"
printf '{"format": "gpumem-history", "version": 1, "events": [{"action": "alloc", "size": 1,}]}\n' >"$work/bad.json"
printf '{"format": "chrome-trace", "version": 1}\n' >"$work/other.json"
printf '{"format": "gpumem-snapshot", "version": 7, "regions": []}\n' >"$work/future.json"
head -c 20000 "$work/history.json" >"$work/truncated.json"
printf '{"format": "gpumem-snapshot", "version": 1, "regions": [{"address": 4096, "size": 512, "blocks": [{"address": 4096, "size": 1024, "state": "free"}]}]}\n' >"$work/outside.json"
printf '{"format": "gpumem-snapshot", "version": 1, "regions": [{"address": 4096, "size": 512, "blocks": [{"address": 4096, "size": 512, "state": "lost"}]}]}\n' >"$work/state.json"
expect 2 "usage: gpumem report INPUT -o FILE" -- "$gpumem" report
expect 0 "usage: gpumem report INPUT -o FILE" -- "$gpumem" report --help
expect 0 "report TRACE\|HISTORY\|SNAPSHOT -o FILE" -- "$gpumem" help
expect 2 "-o FILE is needed" -- "$gpumem" report "$trace"
expect 2 "-o needs a file name" -- "$gpumem" report "$trace" -o
expect 2 "unknown option '--fast'" -- "$gpumem" report "$trace" -o "$work/x.html" --fast
cp "$work/bad.csv" "$work/input.csv"
expect 2 "'$work/input.csv' is the input: the report would replace it" -- "$gpumem" report "$work/input.csv" -o "$work/input.csv"
cmp -s "$work/bad.csv" "$work/input.csv" && ok "the input is kept" || fail "the input was changed"
expect 2 "one input at a time" -- "$gpumem" report "$trace" "$trace" -o "$work/x.html"
expect 2 "unknown key 'colour'" -- "$gpumem" report "$trace" --conf colour:red -o "$work/x.html"
expect 2 "--report needs a file name" -- "$gpumem" replay "$trace" --report
expect 1 "missing.csv.gz: cannot open: No such file" -- "$gpumem" report "$work/missing.csv.gz" -o "$work/x.html"
expect 1 "cannot open: it is a directory" -- "$gpumem" report "$work" -o "$work/x.html"
expect 2 "bad.csv:2: unknown operation 'q'" -- "$gpumem" report "$work/bad.csv" -o "$work/x.html"
expect 2 "bad.json:1:85: expected a key \(a string\)" -- "$gpumem" report "$work/bad.json" -o "$work/x.html"
expect 2 "other.json: JSON, but not a gpumem snapshot or history" -- "$gpumem" report "$work/other.json" -o "$work/x.html"
expect 2 "future.json: gpumem-snapshot version 7 is not supported" -- "$gpumem" report "$work/future.json" -o "$work/x.html"
expect 2 "truncated.json:[0-9]+:[0-9]+: " -- "$gpumem" report "$work/truncated.json" -o "$work/x.html"
expect 2 "outside.json:1:[0-9]+: a region with a block outside it" -- "$gpumem" report "$work/outside.json" -o "$work/x.html"
python3 -c 'import sys
event = "{\"action\": \"alloc\", \"address\": %d, \"size\": 1}"
events = lambda first, count: ",".join(event % ((first + i) * 512) for i in range(count))
sys.stdout.write("{\"format\": \"gpumem-history\", \"version\": 1, \"events\": [%s], \"events\": [%s]}" % (events(0, 5000), events(6000, 100)))' >"$work/two_events.json"
expect 2 'two_events.json:1:[0-9]+: a history with two "events"' -- "$gpumem" report "$work/two_events.json" -o "$work/x.html"
expect 2 'two_events.json:1:[0-9]+: a history with two "events"' -- "$gpumem" tune "$work/two_events.json"
expect 2 "state.json:1:[0-9]+: a block whose \"state\" is 'lost'" -- "$gpumem" report "$work/state.json" -o "$work/x.html"
[ -e "$work/x.html" ] && fail "a failed report left $work/x.html" || ok "no report left by bad input"

expect 1 "cannot write the report to '$work/no/such/dir.html': No such file or directory" -- \
    "$gpumem" report "$work/snapshot.json" -o "$work/no/such/dir.html"
expect 1 "cannot write the report to '$work': it is a directory" -- "$gpumem" report "$work/snapshot.json" -o "$work"
expect 1 "gpumem replay: cannot write the report to '$work/no/such/dir.html'" -- \
    "$gpumem" replay "$trace" --report "$work/no/such/dir.html"
# A write that fails half-way (a file size limit of 10 KiB): no partial page, no temporary file, and
# a report already there stays as it was.
cp "$work/snapshot.html" "$work/kept.html"
expect 1 "cannot write the report to '$work/kept.html': File too large" -- \
    bash -c "ulimit -f 10; trap '' XFSZ; exec \"\$0\" report \"\$1\" -o \"\$2\"" "$gpumem" "$trace" "$work/kept.html"
cmp -s "$work/snapshot.html" "$work/kept.html" && ok "the earlier report is kept whole" || fail "the earlier report was changed"
expect 1 "cannot write the report to '$work/partial.html': File too large" -- \
    bash -c "ulimit -f 10; trap '' XFSZ; exec \"\$0\" report \"\$1\" -o \"\$2\"" "$gpumem" "$trace" "$work/partial.html"
[ -e "$work/partial.html" ] && fail "a failed write left a partial report" || ok "no partial report"
# gpumem replay's snapshot and history are saved the same way.
for kind in snapshot history; do
    cp "$work/$kind.json" "$work/kept_$kind.json"
    expect 1 "gpumem replay: cannot write the $kind to '$work/kept_$kind.json': File too large" -- \
        bash -c "ulimit -f 10; trap '' XFSZ; exec \"\$0\" replay \"\$1\" --$kind \"\$2\"" "$gpumem" "$trace" "$work/kept_$kind.json"
    cmp -s "$work/$kind.json" "$work/kept_$kind.json" && ok "the earlier $kind is kept whole" || fail "the earlier $kind was changed"
done
ls "$work" | grep -q '\.tmp\.' && fail "temporary files left: $(ls "$work" | grep '\.tmp\.')" || ok "no temporary file left"
# A device or a pipe is written directly; a regular file behind /dev/stdout is replaced as any file is.
"$gpumem" report "$work/snapshot.json" -o /dev/stdout >"$work/stdout.html" && cmp -s "$work/stdout.html" "$work/snapshot.html" &&
    ok "-o /dev/stdout" || fail "-o /dev/stdout did not write the report"
"$gpumem" report "$work/snapshot.json" -o /dev/stdout | cat >"$work/piped.html" && cmp -s "$work/piped.html" "$work/snapshot.html" &&
    ok "-o /dev/stdout into a pipe" || fail "-o /dev/stdout into a pipe did not write the report"
expect 1 "cannot write the report to '/dev/full': No space left on device" -- \
    "$gpumem" report "$work/snapshot.json" -o /dev/full

if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
fi
