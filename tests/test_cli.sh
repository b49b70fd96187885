#!/usr/bin/env bash
# test_cli.sh -- the gpumem command line: results, exit statuses and messages for good and bad input.
# Usage: test_cli.sh PATH/TO/gpumem DATA_DIRECTORY
set -u
gpumem=$1
data=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# expect STATUS PATTERN -- COMMAND...: the command exits with STATUS and its output (stdout and
# stderr together) matches the extended regular expression PATTERN.
expect() {
    local status=$1 pattern=$2
    shift 3
    "$@" >"$work/out" 2>&1
    local got=$?
    if [ "$got" -ne "$status" ] || ! grep -Eq -- "$pattern" "$work/out"; then
        echo "FAIL: $* -> exit $got (wanted $status), output:"
        sed 's/^/    /' "$work/out" | head -20
        echo "    (wanted /$pattern/)"
        failures=$((failures + 1))
    else
        echo "ok   $*"
    fi
}

printf '# op,id,size,stream\na,0,3145728,0\na,1,1000,0\nf,0,3145728,0\na,2,100,1\n' >"$work/small.csv"
printf 'a,0,100,0\nq,1,5,0\n' >"$work/bad.csv"
printf 'a,0,100,0\nf,9,100,0\n' >"$work/unknown_free.csv"
printf 'a,0,2147483648,0\nf,0,2147483648,0\na,1,1024,0\n' >"$work/huge.csv"

expect 2 "usage: gpumem" -- "$gpumem"
expect 0 "replay TRACE" -- "$gpumem" help
expect 2 "unknown command 'fly'" -- "$gpumem" fly
expect 0 "gpumem [0-9]+\.[0-9]+" -- "$gpumem" version
expect 0 "memory_limit" -- "$gpumem" config
expect 0 "^  move_slack +pages engine: idle chunks" -- "$gpumem" config move_slack max_chunk_size
expect 2 "unknown key 'max_chunk'" -- "$gpumem" config max_chunk_size max_chunk
expect 2 "unknown option '--chek'" -- "$gpumem" config --chek
expect 0 "^  max_chunk_size +8MiB +pages engine" -- "$gpumem" config --check max_chunk_size:8MiB,move_slack:0.01
expect 0 "^  publish +true +keep the statistics" -- "$gpumem" config --check " history:10 ,  publish:true ,"
expect 1 "^gpumem config: the configuration is not valid: bad value for key 'max_chunk_size'" -- \
    "$gpumem" config --check max_chunk_size:8XB
expect 1 "GPUMEM_CONF is not valid: unknown key 'foo'" -- env GPUMEM_CONF=history:10,foo:1 "$gpumem" config --check
expect 1 "GPUMEM_TORCH over GPUMEM_CONF is not valid: key 'pressure_low' \(0.95\) must be below" -- \
    env GPUMEM_CONF=pressure_high:0.9 GPUMEM_TORCH=pressure_low:0.95 "$gpumem" config --check
expect 0 "GPUMEM_TORCH is valid" -- env -u GPUMEM_CONF GPUMEM_TORCH=compact_min:2MiB "$gpumem" config --check
expect 0 "no keys in GPUMEM_CONF or GPUMEM_TORCH" -- env -u GPUMEM_CONF GPUMEM_TORCH=1 "$gpumem" config --check
for off in 0 " Off " false no ""; do  # the adapter turned off, as python/gpumem/torch.py reads it: no keys
    expect 0 "no keys in GPUMEM_CONF or GPUMEM_TORCH" -- env -u GPUMEM_CONF GPUMEM_TORCH="$off" "$gpumem" config --check
done
expect 2 "takes one configuration string" -- "$gpumem" config --check a:1 b:2
# The simulated device that gm_create would make from the capacity and page size is checked too.
expect 1 "the configuration is not valid: sim backend: page_size \(2.00 MiB\) is larger than the capacity \(80 B\)" -- \
    "$gpumem" config --check capacity:80
expect 1 "host backend: a capacity of 1.00 TiB in pages of 4.00 KiB" -- "$gpumem" config --check backend:host,capacity:1TiB,page_size:4KiB
expect 0 "the configuration is valid" -- "$gpumem" config --check backend:cuda,device:3
expect 2 "usage: gpumem replay" -- "$gpumem" replay
expect 0 "usage: gpumem replay TRACE" -- "$gpumem" replay --help
expect 0 "usage: gpumem info" -- "$gpumem" info -h
expect 2 "unknown option '--fast'" -- "$gpumem" replay "$work/small.csv" --fast
expect 2 "one trace at a time" -- "$gpumem" replay "$work/small.csv" "$work/small.csv"
expect 2 "--capacity needs a value" -- "$gpumem" replay "$work/small.csv" --capacity
expect 1 "cannot open" -- "$gpumem" replay "$work/missing.csv.gz"
expect 2 "bad.csv:2: unknown operation 'q'" -- "$gpumem" replay "$work/bad.csv"
expect 2 "unknown_free.csv:2: free of id 9, which is not live" -- "$gpumem" replay "$work/unknown_free.csv"
expect 2 "unknown key 'colour'" -- "$gpumem" replay "$work/small.csv" --conf colour:red
expect 2 "bad value for key 'capacity'" -- "$gpumem" replay "$work/small.csv" --capacity lots
expect 2 "GPUMEM_CONF: bad value 'turbo'" -- env GPUMEM_CONF=engine:turbo "$gpumem" replay "$work/small.csv"
expect 0 '"peak_live_bytes": 3146728, ' -- "$gpumem" replay "$work/small.csv" --json
expect 0 '"trace": "small.csv", "backend": "sim", "engine": "pages", "ops": 4, ' -- "$gpumem" replay "$work/small.csv" --json
expect 0 '"ratio": [0-9.]+, "ns_per_op": [0-9.]+, "device_call_ms": [0-9.]+' -- "$gpumem" replay "$work/small.csv" --json
expect 0 '"device_calls": \{"total": [0-9]+, "segment_allocate": 0' -- "$gpumem" replay "$work/small.csv" --json
expect 0 '"pass": 0\}' -- "$gpumem" replay "$work/small.csv" --json
expect 0 '"pass": 1\}' -- "$gpumem" replay "$work/small.csv" --json --passes 2
expect 0 'pass            2 of 2 \(warm\)' -- "$gpumem" replay "$work/small.csv" --passes 2
expect 2 "--passes needs a whole number from 1 to 100" -- "$gpumem" replay "$work/small.csv" --passes 0
expect 2 "--passes needs a whole number from 1 to 100" -- "$gpumem" replay "$work/small.csv" --passes two
expect 2 "--passes needs a whole number from 1 to 100" -- "$gpumem" replay "$work/small.csv" --passes
# --lead: the simulated device runs behind the host. Stream 1's idle chunk must move to stream 0 under the
# limit, after a wait for stream 1's queued work: its two operations' units when the device is 10 behind,
# the last one when it is 1 behind.
printf 'a,0,67108864,1\nf,0,67108864,1\na,1,67108864,0\nf,1,67108864,0\n' >"$work/cross.csv"
expect 0 "waits +1 for streams, finishing 2 units of work early \(the device 10 operations behind\)" -- \
    "$gpumem" replay "$work/cross.csv" --conf memory_limit:64MiB --lead 10
expect 0 '"event_synchronize": 1\}.*"lead": 1, "units_waited": 1, "pass": 0\}' -- \
    "$gpumem" replay "$work/cross.csv" --conf memory_limit:64MiB --lead 1 --json
for bad in 0 -3 ten 1000001 ""; do
    expect 2 "--lead needs a whole number of operations from 1 to 1000000" -- "$gpumem" replay "$work/small.csv" --lead $bad
done
expect 0 '"engine": "segments"' -- env GPUMEM_CONF=engine:segments "$gpumem" replay "$work/small.csv" --json
expect 0 '"engine": "pages"' -- env GPUMEM_CONF=engine:segments "$gpumem" replay "$work/small.csv" --json --conf engine:pages
expect 0 "GPU reserved memory" -- "$gpumem" replay "$work/small.csv"
expect 0 '"backend": "host"' -- "$gpumem" replay "$work/small.csv" --backend host --json
expect 3 '"ooms": 1, ' -- "$gpumem" replay "$work/huge.csv" --capacity 1GiB --json
expect 3 'Tried to allocate 2.00 GiB' -- "$gpumem" replay "$work/huge.csv" --capacity 1GiB --json
expect 3 'Cause: capacity. The request alone \(2.00 GiB\) is larger than the whole device' -- "$gpumem" replay "$work/huge.csv" --capacity 1GiB
# A fragmentation report is long; the replay prints it whole, down to its last advice. (chunk_room_share:0:
# with the room share's smaller chunks near the capacity ViT fits on this device; stitch:false: so it does
# with stitching.)
expect 3 '  [0-9]\. [0-9.]+ MiB of the free memory is in other streams' -- "$gpumem" replay "$data/traces-more/vit-seed1.csv.gz" --capacity 10502000000 --conf chunk_room_share:0,stitch:false
expect 0 '"ooms": 0, ' -- "$gpumem" replay "$data/traces-more/vit-seed1.csv.gz" --capacity 10502000000 --json
expect 0 "backend +sim" -- "$gpumem" info
expect 0 "memory +1024.0 MiB total" -- "$gpumem" info --backend host --capacity 1GiB
expect 2 "unknown argument 'now'" -- "$gpumem" info now
expect 0 '"peak_live_bytes": 11785936912, ' -- "$gpumem" replay "$data/traces/resnet50.csv.gz" --json

# Snapshots and the history of a replay (docs/formats.md).
expect 0 '"pass": 0' -- "$gpumem" replay "$work/small.csv" --json --snapshot "$work/snapshot.json" --history "$work/history.json"
expect 0 '"format": "gpumem-snapshot", "version": 1' -- cat "$work/snapshot.json"
expect 0 '"requested": 1000, "state": "allocated"' -- cat "$work/snapshot.json"
expect 0 '"action": "alloc", "address": [0-9]+, "size": 3145728' -- cat "$work/history.json"
expect 0 '"action": "free_completed"' -- cat "$work/history.json"
expect 0 'peak reserved' -- "$gpumem" replay "$work/small.csv" --history "$work/history.json" --conf history:3
expect 0 '"dropped": 9, "events": \[$' -- cat "$work/history.json"
expect 1 "cannot write the snapshot to '$work/no/such/dir.json'" -- "$gpumem" replay "$work/small.csv" --snapshot "$work/no/such/dir.json"
expect 1 "^gpumem replay: cannot write the history to '$work/no/such/dir.json'" -- "$gpumem" replay "$work/small.csv" --history "$work/no/such/dir.json"
expect 2 "--snapshot needs a file name" -- "$gpumem" replay "$work/small.csv" --snapshot
expect 2 "bad value for key 'history'" -- "$gpumem" replay "$work/small.csv" --conf history:-1

# Input that once crashed, hung or was misread (issue 18): binary data, a truncated gzip file, sizes and
# capacities beyond what the engines address, a --conf longer than any fixed buffer.
printf 'a,0,100,0\na,1,200,0\0a,2,300,0\n' >"$work/nul.csv"
head -c 20000 "$data/traces/resnet50.csv.gz" >"$work/cut.csv.gz"
printf 'a,0,9223372036854775808,0\n' >"$work/eight_exbibytes.csv"
long_conf=$(printf 'engine:pages,%.0s' $(seq 100))cost_model:true
expect 2 "nul.csv:2: a NUL byte at column 10" -- "$gpumem" replay "$work/nul.csv"
expect 2 "/dev/zero:1: a NUL byte at column 1" -- timeout 60 "$gpumem" replay /dev/zero
expect 1 "cut.csv.gz: truncated or corrupt gzip data" -- "$gpumem" replay "$work/cut.csv.gz"
expect 3 "Tried to allocate 8.00 EiB \(9223372036854775808 bytes\)" -- "$gpumem" replay "$work/eight_exbibytes.csv"
expect 2 "bad value for key 'capacity': it must be positive" -- "$gpumem" replay "$work/small.csv" --capacity 0
expect 2 "bad value for key 'capacity': 24TiB is more than the 1TiB supported" -- "$gpumem" replay "$work/small.csv" --capacity 24TiB
expect 2 "bad value for key 'page_size': 1TiB is more than the 1GiB supported" -- "$gpumem" replay "$work/small.csv" --conf page_size:1TiB
expect 2 "in pages of 4.00 KiB is 36805376 pages" -- "$gpumem" replay "$work/small.csv" --conf page_size:4KiB
expect 1 "sim backend: device 5 does not exist" -- "$gpumem" replay "$work/small.csv" --conf device:5
expect 0 '"backend": "host"' -- "$gpumem" replay "$work/small.csv" --conf "$long_conf" --backend host --capacity 2GiB --json
expect 0 "memory +2048.0 MiB total" -- "$gpumem" info --conf "$long_conf" --backend host --capacity 2GiB
expect 2 "gpumem run: GPUMEM_CONF with --conf is too long" -- "$gpumem" run --conf "$(printf 'engine:pages,%.0s' $(seq 700))cost_model:true" -- true

# Newcomer friction (issue 18, item 6): the README's trace on the host backend says how to make it fit;
# a pass that runs out of memory says the later passes were not run; --help says --json prints JSON
# lines; --version; the summary says the reserved memory left is the cache.
expect 3 "peak at 10.98 GiB, more than the host device's 1.00 GiB: raise it with --capacity, e.g. --capacity 14GiB" -- "$gpumem" replay "$data/traces/resnet50.csv.gz" --backend host
# The suggestion stays within what --capacity takes (1TiB); beyond that, no capacity would do.
printf 'a,0,1000000000000,0\nf,0,0,0\n' >"$work/terabyte.csv"
expect 3 "peak at 931.32 GiB, more than the sim device's .*: raise it with --capacity, e.g. --capacity 1024GiB" -- "$gpumem" replay "$work/terabyte.csv"
expect 0 "ratio +1.0000" -- "$gpumem" replay "$work/terabyte.csv" --capacity 1024GiB
expect 3 "peak at 8589934592.00 GiB, more than the largest sim device gpumem makes \(1024 GiB\): it cannot be replayed whole" -- "$gpumem" replay "$work/eight_exbibytes.csv"
expect 3 "passes 2 to 3 were not run: pass 1 ran out of memory" -- "$gpumem" replay "$work/huge.csv" --capacity 1GiB --passes 3
# Output that cannot be written (a full disk, a closed descriptor) fails the command, whichever it is.
for command in "replay $work/small.csv --json" "replay $work/small.csv" "config" "info" "--help"; do
    expect 1 "^gpumem: could not write all of its output to standard output" -- sh -c "\"\$0\" $command >/dev/full" "$gpumem"
done
expect 1 "could not write all of its output to standard output" -- sh -c '"$0" info >&-' "$gpumem"
expect 0 "usage: gpumem top \[-d SECONDS\] \[--once\] \[--json\]" -- "$gpumem" top --help
expect 0 "one JSON object per pass, one per line \(JSON lines\)" -- "$gpumem" replay --help
expect 0 "one JSON object per pass, one per line \(JSON lines\)" -- "$gpumem" help
# The sim's capacity sizes the chunks, so the results: the help names the default, the sim has it.
expect 0 "simulated device's memory, by default an H200's 143771 MiB" -- "$gpumem" replay --help
expect 0 "by default an H200's 143771 MiB; give what your GPU leaves" -- "$gpumem" tune --help
expect 0 "143771.0 MiB total" -- "$gpumem" info --backend sim
expect 0 "^gpumem [0-9]+\.[0-9]+\.[0-9]+$" -- "$gpumem" --version
expect 0 "the GPU reserved memory still counted, [0-9.]+ MiB, is the cache kept for reuse; gm_empty_cache releases it" -- "$gpumem" replay "$work/small.csv"
bench_replay="$(dirname "$0")/../bench/replay.sh"
expect 2 "bench/replay.sh: no trace directory '$work/no/traces'" -- env GPUMEM="$gpumem" "$bench_replay" "$work/no/traces"
mkdir -p "$work/traces" && cp "$work/small.csv" "$work/traces/small.csv"
expect 0 "no anchors at '$work/no/anchors.json'" -- env GPUMEM="$gpumem" REPEAT=1 "$bench_replay" "$work/traces" "$work/no/anchors.json"
if grep -q Traceback "$work/out"; then echo "FAIL: bench/replay.sh printed a traceback"; failures=$((failures + 1)); fi

# gpumem tune: the defaults and the opt-in settings side by side, and the one that reserves the least named
# (page-sized chunks only where the defaults run out of memory: resnet50 shows four rows).
# ViT wastes pages in 128 MiB chunks that small chunks give back; resnet50 gains nothing worth a setting;
# in pinned.csv 1.5 MiB blocks pin each 62 MiB chunk whose tensor was freed, so that the last request
# fits only where pinned chunks give up their free pages: with one chunk per growth (chunk_room_share:0;
# by default a device of 2700 MiB gets page-sized chunks, and the defaults fit it too, their warm passes
# making new memory within the slack that such a device gets rather than moving pages).
{
    echo "# op,id,size,stream"
    for i in $(seq 0 39); do echo "a,$((2 * i)),64487424,0"; echo "a,$((2 * i + 1)),1572864,0"; done
    for i in $(seq 0 39); do echo "f,$((2 * i)),64487424,0"; done
    echo "a,100,2097152000,0"
} >"$work/pinned.csv"
expect 2 "usage: gpumem tune TRACE" -- "$gpumem" tune
expect 0 "names the configuration that reserves the least memory" -- "$gpumem" tune --help
expect 0 "^recommended: small chunks \(max_chunk_size:8MiB,move_slack:0.01\): [0-9.]+ MiB less reserved at its peak" -- \
    "$gpumem" tune "$data/traces-more/vit-seed0.csv.gz"
expect 0 "^compaction +compact_min:2MiB +[0-9.]+  1\.0[0-9]{3} / 1\.0[0-9]{3} / 1\.0[0-9]{3} +[0-9.]+ +[0-9.]+ +0$" -- \
    "$gpumem" tune "$data/traces-more/vit-seed0.csv.gz"
expect 0 "^recommended: the defaults: no candidate reserves at least 56.2 MiB \(half a percent of the live peak\) less" -- \
    "$gpumem" tune "$data/traces/resnet50.csv.gz" --passes 2
if grep -q "max_chunk_size:2MiB" "$work/out"; then echo "FAIL: gpumem tune tried page-sized chunks where nothing ran out of memory"; failures=$((failures + 1)); fi
expect 0 "^defaults +- +2568.0  1.0000 / 1.0190 / 1.0190 +[0-9.]+ +[0-9.]+ +0$" -- "$gpumem" tune "$work/pinned.csv" --capacity 2700MiB
expect 0 "it fits, where 1 allocation ran out of memory under the defaults" -- "$gpumem" tune "$work/pinned.csv" --capacity 2700MiB --conf chunk_room_share:0
expect 0 "^defaults +- +2520.0  1.0000 / - / - +[0-9.]+ +- +1$" -- "$gpumem" tune "$work/pinned.csv" --capacity 2700MiB --conf chunk_room_share:0
# where the defaults run out of memory, the OOM report's first remedy is tried too: page-sized chunks
expect 0 "^page-sized chunks +max_chunk_size:2MiB +[0-9.]+  1.0000 / 1.0[0-9]{3} / 1.0[0-9]{3} .* 0$" -- \
    "$gpumem" tune "$work/pinned.csv" --capacity 2700MiB --conf chunk_room_share:0
expect 0 '"name": "compaction", "configuration": "compact_min:2MiB", "ran": true, "peak_reserved_bytes": [0-9]+, "failed_allocations": 0, "passes_run": 3' -- \
    "$gpumem" tune "$work/pinned.csv" --capacity 2700MiB --conf chunk_room_share:0 --json
expect 0 '"recommended": "page-sized chunks", "configuration": "max_chunk_size:2MiB"}$' -- \
    "$gpumem" tune "$work/pinned.csv" --capacity 2700MiB --conf chunk_room_share:0 --json
expect 3 "no configuration fits: every candidate ran out of memory .*; the trace's live allocations alone peak at 11239.9 MiB, more than the device's 10240.0 MiB" -- \
    "$gpumem" tune "$data/traces/resnet50.csv.gz" --capacity 10GiB --passes 1
expect 3 '"recommended": null, "configuration": null' -- "$gpumem" tune "$work/huge.csv" --capacity 1GiB --json
# A history (gpumem replay --history, gpumem run --tune) is the same allocations: the same table. One whose
# ring dropped the oldest events gets the blocks freed in it allocated first; a snapshot is refused.
"$gpumem" replay "$data/traces-more/vit-seed0.csv.gz" --history "$work/vit.history.json" >/dev/null
"$gpumem" tune "$data/traces-more/vit-seed0.csv.gz" | grep -v '^trace ' >"$work/vit.tune"
"$gpumem" tune "$work/vit.history.json" | grep -v '^trace ' >"$work/vit.history.tune"
if cmp -s "$work/vit.tune" "$work/vit.history.tune" && grep -q "^recommended: small chunks" "$work/vit.tune"; then
    echo "ok   gpumem tune HISTORY gives the table of its trace"
else
    echo "FAIL: gpumem tune of vit-seed0's history differs from its trace's:"; diff "$work/vit.tune" "$work/vit.history.tune" | head
    failures=$((failures + 1))
fi
"$gpumem" replay "$data/traces/resnet50.csv.gz" --conf history:3000 --history "$work/short.history.json" >/dev/null
expect 0 "the history holds the newest 3000 events \(34112 older ones dropped\); 714 blocks freed in it were allocated before it" -- \
    "$gpumem" tune "$work/short.history.json" --passes 1
"$gpumem" replay "$work/small.csv" --snapshot "$work/small.snapshot.json" >/dev/null
expect 2 "a snapshot holds the blocks of one moment, not the allocations over time" -- "$gpumem" tune "$work/small.snapshot.json"
printf '{"format": "gpumem-history", "version": 1, "dropped": 0, "events": [\n%s,\n%s]}\n' \
    '{"time_ns": 1, "action": "alloc", "address": 4096, "size": 100, "stream": 0, "tag": 0}' \
    '{"time_ns": 2, "action": "alloc", "address": 4096, "size": 100, "stream": 0, "tag": 0}' >"$work/twice.history.json"
expect 2 "twice.history.json:2: allocation id 4096 is already live \(allocated at event 1\)" -- "$gpumem" tune "$work/twice.history.json"
expect 1 "cannot open" -- "$gpumem" tune "$work/missing.csv"
expect 2 "bad.csv:2: unknown operation 'q'" -- "$gpumem" tune "$work/bad.csv"
expect 2 "cannot create the allocator .*unknown key 'colour'" -- "$gpumem" tune "$work/small.csv" --conf colour:red
expect 2 "--passes needs a whole number from 1 to 10" -- "$gpumem" tune "$work/small.csv" --passes 11
expect 2 "--passes needs a whole number from 1 to 10" -- "$gpumem" tune "$work/small.csv" --passes
expect 2 "unknown option '--fast'" -- "$gpumem" tune "$work/small.csv" --fast
expect 2 "one trace at a time" -- "$gpumem" tune "$work/small.csv" "$work/bad.csv"

# The cuda backend: without a GPU a clear error and a non-zero exit; with one, a working device.
if "$gpumem" info --backend cuda >/dev/null 2>&1; then
    expect 0 "backend +cuda" -- "$gpumem" info --backend cuda
    expect 0 '"backend": "cuda"' -- "$gpumem" replay "$work/small.csv" --backend cuda --json
    expect 0 '"recommended": "defaults"' -- "$gpumem" tune "$work/small.csv" --backend cuda --json
else
    expect 1 "no device: cuda backend: .*(libcuda.so.1|no usable GPU|no CUDA device)" -- "$gpumem" info --backend cuda
    expect 1 "cannot create the allocator: no device: cuda backend" -- "$gpumem" replay "$work/small.csv" --backend cuda
    expect 1 "gpumem tune: cannot create the allocator .*no device: cuda backend" -- "$gpumem" tune "$work/small.csv" --backend cuda
fi

if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
fi
