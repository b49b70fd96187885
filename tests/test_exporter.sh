#!/usr/bin/env bash
# test_exporter.sh -- gpumem exporter from outside, as Prometheus would use it: a process that
# publishes known allocations (publish_holder), the exporter serving it on a free loopback port, its
# /metrics fetched over HTTP (exact bytes of device memory and of the pinned host cache, headers,
# promtool's lint), a target in absolute form, 404 and 405, a stale and two hostile regions counted,
# non-loopback and malformed addresses refused, a port in use, SIGTERM and SIGINT; the textfile mode once and every --interval,
# and an unwritable directory; then a real Prometheus scraping the exporter every second, whose query
# API must return the holder's reserved bytes exactly as `gpumem stats PID --json` gives them.
# Usage: test_exporter.sh PATH/TO/gpumem PATH/TO/publish_holder HTTP
#   HTTP: "http" (built with libmicrohttpd), "off" (built with -DGPUMEM_WITH_MICROHTTPD=OFF: the
#   listen mode must say so), "missing" (wanted but not found: checked like "off", then skipped, 77).
# Tools: python3 (fetching, free ports), promtool and prometheus (Debian's prometheus package);
# without one of them its part is skipped and the test exits 77 (skipped) if nothing else failed.
set -u
gpumem=$1
holder=$2
http=${3:-http}
work=$(mktemp -d)
export GPUMEM_SHM_DIR=$work/shm
mkdir -p "$GPUMEM_SHM_DIR"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill -9 "$pid" 2>/dev/null
    done
    wait 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
failures=0
skipped=()

fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}

have() {
    command -v "$1" >/dev/null 2>&1 || { skipped+=("$1 is not installed (.ci/run installs it)"); return 1; }
}

# fetch METHOD URL OUT: the status code on stdout; the body in OUT, the headers in OUT.headers.
fetch() {
    python3 - "$@" <<'PYTHON'
import sys, urllib.error, urllib.request
method, url, out = sys.argv[1:4]
request = urllib.request.Request(url, method=method, data=b"a=1" if method == "POST" else None)
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
try:
    with opener.open(request, timeout=10) as response:
        code, headers, body = response.status, response.headers, response.read()
except urllib.error.HTTPError as error:
    code, headers, body = error.code, error.headers, error.read()
open(out, "wb").write(body)
open(out + ".headers", "w").write("".join("%s: %s\n" % item for item in headers.items()))
print(code)
PYTHON
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_exporter OUT ARGUMENTS...: starts it in the background (pid in $exporter_pid), waits for its
# "listening on http://HOST:PORT/metrics" line; the port in $port ("" if it never came).
start_exporter() {
    local out=$1
    shift
    "$gpumem" exporter "$@" >"$out" 2>&1 &
    exporter_pid=$!
    pids+=("$exporter_pid")
    port=
    for _ in $(seq 100); do
        port=$(sed -n 's|^listening on http://.*:\([0-9][0-9]*\)/metrics$|\1|p' "$out")
        [ -n "$port" ] && return
        kill -0 "$exporter_pid" 2>/dev/null || return
        sleep 0.1
    done
}

# stop PID SIGNAL: the exit status of the process after the signal.
stop() {
    kill -"$2" "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}

# ---------------------------------------------------------------- the process to look at

sizes="1000 4096 1048577 3145728 100"
expected=0
for size in $sizes; do
    expected=$((expected + (size + 511) / 512 * 512))
done
# Pinned host memory: 3000 bytes kept (a 4096-byte block), 100000 freed (a 131072-byte block, idle).
HOLDER_CHILD_BYTES=$((8 << 20)) HOLDER_PINNED_BYTES=3000 HOLDER_PINNED_FREED_BYTES=100000 \
    "$holder" $sizes >"$work/holder.out" 2>&1 &
holder_pid=$!
pids+=("$holder_pid")
for _ in $(seq 100); do
    [ -s "$work/holder.out" ] && break
    sleep 0.1
done
read -r printed_pid _ <"$work/holder.out"
[ "$printed_pid" = "$holder_pid" ] || { fail "the holder printed '$(cat "$work/holder.out")'"; exit 1; }
labels="pid=\"$holder_pid\",device=\"0\",backend=\"sim\",engine=\"pages\""

# check_metrics FILE WHAT: the holder's exact numbers in a scrape.
check_metrics() {
    grep -qxF "gpumem_allocated_bytes{$labels,pool=\"all\"} $expected" "$1" ||
        fail "$2: no gpumem_allocated_bytes{$labels,pool=\"all\"} $expected: $(grep "^gpumem_allocated_bytes{" "$1")"
    grep -qxF "gpumem_allocations{$labels,pool=\"all\"} 5" "$1" || fail "$2: gpumem_allocations is not 5"
    grep -qxF "gpumem_ooms_total{$labels} 0" "$1" || fail "$2: no gpumem_ooms_total 0"
    grep -qxF "gpumem_process_descendants{pid=\"$holder_pid\"} 1" "$1" || fail "$2: the holder's child is not counted"
    grep -qE "^gpumem_process_resident_bytes\{pid=\"$holder_pid\"\} [1-9][0-9]{7,}$" "$1" ||
        fail "$2: the holder's tree (8 MiB in its child) is not resident: $(grep resident "$1")"
    grep -qE "^gpumem_host_memory_total_bytes [1-9][0-9]*$" "$1" || fail "$2: no host memory"
    grep -qxE "gpumem_gpu_available [01]" "$1" || fail "$2: no gpumem_gpu_available"
    grep -qE "^gpumem_device_calls_total\{$labels,call=\"map\"\} [1-9]" "$1" || fail "$2: no map calls"
    grep -qxF "gpumem_pinned_host_reserved_bytes{$labels} $((4096 + 131072))" "$1" ||
        fail "$2: gpumem_pinned_host_reserved_bytes is not $((4096 + 131072)): $(grep "^gpumem_pinned_host" "$1")"
    grep -qxF "gpumem_pinned_host_allocated_bytes{$labels} 4096" "$1" || fail "$2: gpumem_pinned_host_allocated_bytes is not 4096"
    grep -qxF "gpumem_pinned_host_cache_misses_total{$labels} 2" "$1" || fail "$2: gpumem_pinned_host_cache_misses_total is not 2"
    if grep -q "^gpumem_pinned_host_limit_bytes" "$1"; then
        fail "$2: gpumem_pinned_host_limit_bytes without a host_limit"
    fi
}

# check_lint FILE WHAT: promtool accepts the text, with no lint problem.
check_lint() {
    have promtool || return
    promtool check metrics <"$1" >"$work/promtool.out" 2>&1 || fail "$2: promtool check metrics failed: $(cat "$work/promtool.out")"
    [ -s "$work/promtool.out" ] && fail "$2: promtool reports: $(cat "$work/promtool.out")"
}

# ---------------------------------------------------------------- the textfile (no HTTP needed)

mkdir "$work/textfile"
"$gpumem" exporter --textfile "$work/textfile" --once >"$work/textfile.out" 2>&1
status=$?
[ "$status" -eq 0 ] || fail "--textfile --once exited $status: $(cat "$work/textfile.out")"
check_metrics "$work/textfile/gpumem.prom" "--textfile"
check_lint "$work/textfile/gpumem.prom" "--textfile"
[ "$(find "$work/textfile" -name '.gpumem.prom.*')" = "" ] || fail "--textfile left its temporary file"
[ "$(stat -c %a "$work/textfile/gpumem.prom")" = 644 ] || fail "the textfile is not readable by node_exporter"

"$gpumem" exporter --textfile "$work/textfile" --interval 0.2 >"$work/interval.out" 2>&1 &
interval_pid=$!
pids+=("$interval_pid")
first=$(stat -c %i "$work/textfile/gpumem.prom")
replaced=no
for _ in $(seq 50); do
    sleep 0.1
    inode=$(stat -c %i "$work/textfile/gpumem.prom" 2>/dev/null)
    [ -n "$inode" ] && [ "$inode" != "$first" ] && { replaced=yes; break; }
done
[ "$replaced" = yes ] || fail "--interval 0.2 did not replace the textfile within 5 s"
stop "$interval_pid" TERM
status=$?
[ "$status" -eq 0 ] || fail "--textfile --interval exited $status on SIGTERM: $(cat "$work/interval.out")"
check_metrics "$work/textfile/gpumem.prom" "--textfile --interval"

"$gpumem" exporter --textfile "$work/missing" --once >"$work/unwritable.out" 2>&1
status=$?
[ "$status" -eq 1 ] && grep -q "cannot write $work/missing/" "$work/unwritable.out" ||
    fail "an unwritable --textfile directory gave $status: $(cat "$work/unwritable.out")"
"$gpumem" exporter --textfile "$work/textfile/gpumem.prom" --once >"$work/notdir.out" 2>&1
[ $? -eq 1 ] || fail "a --textfile that is a file did not exit 1: $(cat "$work/notdir.out")"
"$gpumem" exporter --once >"$work/once.out" 2>&1
[ $? -eq 2 ] && grep -q "go with --textfile" "$work/once.out" || fail "--once without --textfile is not a usage error"
"$gpumem" exporter --textfile "$work/textfile" --interval 0 >"$work/interval0.out" 2>&1
[ $? -eq 2 ] || fail "--interval 0 is not a usage error"

# ---------------------------------------------------------------- HTTP

if [ "$http" != http ]; then
    "$gpumem" exporter --listen 127.0.0.1:0 >"$work/nohttp.out" 2>&1
    status=$?
    [ "$status" -eq 1 ] && grep -q "built without libmicrohttpd (install libmicrohttpd-dev and rebuild); --textfile works" \
        "$work/nohttp.out" || fail "without libmicrohttpd --listen gave $status: $(cat "$work/nohttp.out")"
    [ "$http" = missing ] && skipped+=("gpumem was built without libmicrohttpd (libmicrohttpd-dev is missing)")
elif have python3; then
    start_exporter "$work/exporter.out" --listen 127.0.0.1:0
    [ -n "$port" ] || { fail "the exporter did not say where it listens: $(cat "$work/exporter.out")"; exit 1; }
    grep -qx "listening on http://127.0.0.1:$port/metrics" "$work/exporter.out" || fail "odd address line"
    base=http://127.0.0.1:$port
    code=$(fetch GET "$base/metrics" "$work/metrics")
    [ "$code" = 200 ] || fail "GET /metrics answered $code"
    grep -qix "content-type: text/plain; version=0.0.4; charset=utf-8" "$work/metrics.headers" ||
        fail "GET /metrics content type: $(cat "$work/metrics.headers")"
    check_metrics "$work/metrics" "GET /metrics"
    check_lint "$work/metrics" "GET /metrics"
    grep -qxF 'gpumem_exporter_regions{state="read"} 1' "$work/metrics" || fail "not 1 region read"

    code=$(fetch HEAD "$base/metrics" "$work/head")
    [ "$code" = 200 ] && [ ! -s "$work/head" ] || fail "HEAD /metrics answered $code with $(wc -c <"$work/head") bytes"
    code=$(fetch GET "$base/" "$work/home")
    [ "$code" = 200 ] && grep -q '<a href="/metrics">' "$work/home" || fail "GET / answered $code: $(cat "$work/home")"
    code=$(fetch GET "$base/nothing" "$work/nothing")
    [ "$code" = 404 ] || fail "GET /nothing answered $code, not 404"
    # A request target in absolute form (RFC 9112, 3.2.2) asks for the same page.
    status_line=$(python3 - "$port" <<'PYTHON'
import socket, sys
connection = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
connection.sendall(b"GET http://127.0.0.1/metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
answer = b""
while True:
    chunk = connection.recv(65536)
    if not chunk:
        break
    answer += chunk
print(answer.split(b"\r\n", 1)[0].decode(), "gpumem_exporter_regions" in answer.decode(errors="replace"))
PYTHON
)
    [ "$status_line" = "HTTP/1.1 200 OK True" ] || fail "GET http://127.0.0.1/metrics answered '$status_line'"
    code=$(fetch POST "$base/metrics" "$work/post")
    [ "$code" = 405 ] && grep -qix "allow: GET, HEAD" "$work/post.headers" || fail "POST /metrics answered $code, not 405"

    # A stale region (its process is gone) and two hostile ones (a symbolic link, garbage) beside it.
    sleep 0 &
    dead_pid=$!
    wait "$dead_pid"
    uid=$(id -u)
    : >"$GPUMEM_SHM_DIR/gpumem.$uid.$dead_pid.0"
    ln -s /etc/hostname "$GPUMEM_SHM_DIR/gpumem.$uid.$$.0"
    echo garbage >"$GPUMEM_SHM_DIR/gpumem.$uid.$$.1"
    fetch GET "$base/metrics" "$work/hostile" >/dev/null
    grep -qxF 'gpumem_exporter_regions{state="read"} 1' "$work/hostile" &&
        grep -qxF 'gpumem_exporter_regions{state="stale"} 1' "$work/hostile" &&
        grep -qxF 'gpumem_exporter_regions{state="refused"} 2' "$work/hostile" ||
        fail "stale and hostile regions not counted: $(grep exporter_regions "$work/hostile")"
    check_metrics "$work/hostile" "with hostile regions"
    rm -f "$GPUMEM_SHM_DIR/gpumem.$uid.$dead_pid.0" "$GPUMEM_SHM_DIR/gpumem.$uid.$$.0" "$GPUMEM_SHM_DIR/gpumem.$uid.$$.1"

    # Addresses: non-loopback refused, malformed ones, a port in use.
    "$gpumem" exporter --listen 0.0.0.0:0 >"$work/remote.out" 2>&1
    status=$?
    [ "$status" -eq 2 ] && grep -q "0.0.0.0:0 is not a loopback address.*--allow-remote" "$work/remote.out" ||
        fail "--listen 0.0.0.0:0 without --allow-remote gave $status: $(cat "$work/remote.out")"
    for address in 127.0.0.1:70000 127.0.0.1: :9464 ::1:9464 127.0.0.1:x; do
        "$gpumem" exporter --listen "$address" >"$work/bad.out" 2>&1
        status=$?
        [ "$status" -eq 2 ] && grep -q "wants HOST:PORT" "$work/bad.out" || fail "--listen $address gave $status: $(cat "$work/bad.out")"
    done
    "$gpumem" exporter --listen no-such-host.invalid:0 >"$work/badhost.out" 2>&1
    [ $? -eq 2 ] || fail "--listen no-such-host.invalid:0 is not a usage error: $(cat "$work/badhost.out")"
    "$gpumem" exporter --listen "127.0.0.1:$port" >"$work/inuse.out" 2>&1
    status=$?
    [ "$status" -eq 1 ] && grep -q "127.0.0.1:$port is already in use" "$work/inuse.out" ||
        fail "a port in use gave $status: $(cat "$work/inuse.out")"
    main_pid=$exporter_pid
    main_port=$port
    # IPv6 loopback, where the machine has it.
    if python3 -c 'import socket; socket.socket(socket.AF_INET6).bind(("::1", 0))' 2>/dev/null; then
        start_exporter "$work/ipv6.out" --listen '[::1]:0'
        grep -qx "listening on http://\[::1\]:$port/metrics" "$work/ipv6.out" || fail "[::1]:0: $(cat "$work/ipv6.out")"
        [ -n "$port" ] && code=$(fetch GET "http://[::1]:$port/metrics" "$work/ipv6_metrics") && [ "$code" = 200 ] ||
            fail "GET http://[::1]:$port/metrics failed"
        stop "$exporter_pid" TERM || fail "the IPv6 exporter did not exit 0 on SIGTERM"
    fi
    # --allow-remote lets a non-loopback address through; SIGINT stops it cleanly.
    start_exporter "$work/remote_allowed.out" --allow-remote --listen 0.0.0.0:0
    if [ -n "$port" ]; then
        grep -qx "listening on http://0.0.0.0:$port/metrics" "$work/remote_allowed.out" || fail "odd line for 0.0.0.0"
        code=$(fetch GET "http://127.0.0.1:$port/metrics" "$work/remote_metrics")
        [ "$code" = 200 ] || fail "--allow-remote exporter answered $code"
    else
        fail "--allow-remote --listen 0.0.0.0:0 did not start: $(cat "$work/remote_allowed.out")"
    fi
    stop "$exporter_pid" INT
    status=$?
    [ "$status" -eq 0 ] || fail "SIGINT: the exporter exited $status"
    if have prometheus; then
        # A real Prometheus scraping the exporter every second; its own port and data directory.
        expected_reserved=$("$gpumem" stats "$holder_pid" --json |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["reserved_bytes.all.current"])')
        prometheus_port=$(free_port)
        cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gpumem
    static_configs:
      - targets: ['127.0.0.1:$main_port']
EOF
        prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
            --web.listen-address="127.0.0.1:$prometheus_port" --log.level=warn >"$work/prometheus.log" 2>&1 &
        pids+=("$!")
        python3 - "$prometheus_port" "$holder_pid" >"$work/query.out" 2>&1 <<'PYTHON'
import json, sys, time, urllib.parse, urllib.request
port, pid = sys.argv[1:3]
query = 'gpumem_reserved_bytes{pid="%s",pool="all"}' % pid
url = "http://127.0.0.1:%s/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": query}))
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
deadline = time.time() + 60
while time.time() < deadline:
    try:
        answer = json.load(opener.open(url, timeout=5))
        result = answer["data"]["result"]
        if result:
            labels = result[0]["metric"]
            assert labels["job"] == "gpumem" and labels["backend"] == "sim" and labels["device"] == "0", labels
            print(result[0]["value"][1])
            sys.exit(0)
    except (OSError, ValueError):
        pass
    time.sleep(0.5)
print("no result for %s within 60 s" % query)
sys.exit(1)
PYTHON
        [ $? -eq 0 ] && [ "$(cat "$work/query.out")" = "$expected_reserved" ] ||
            fail "Prometheus's gpumem_reserved_bytes{pid=\"$holder_pid\",pool=\"all\"}: '$(cat "$work/query.out")', not $expected_reserved (gpumem stats); log: $(tail -5 "$work/prometheus.log")"
    fi
    stop "$main_pid" TERM
    status=$?
    [ "$status" -eq 0 ] || fail "SIGTERM: the exporter exited $status: $(cat "$work/exporter.out")"
fi

if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
fi
if [ ${#skipped[@]} -ne 0 ]; then
    printf 'skipped: %s\n' "${skipped[@]}" | sort -u
    exit 77
fi
if [ "$http" = http ]; then
    echo "ok   gpumem exporter: exact bytes $expected over HTTP and in the textfile, lint-clean, read by Prometheus"
else
    echo "ok   gpumem exporter without libmicrohttpd: exact bytes $expected in the textfile, lint-clean; --listen says why not"
fi
