#!/usr/bin/env bash
# test_report_browser.sh -- the HTML reports as a browser shows them: headless Chromium renders each
# report with every host name unresolvable, and the rendered DOM must hold the curve with its path
# data, the page's own check must have run (<body data-report-check="ok">), the console must be silent
# (no error, no uncaught exception) and the page must have asked for nothing over the network (its
# requests, told apart from the browser's own by their file:// isolation key in Chromium's net log).
# Three pages broken on purpose -- a script that throws, a curve without data, an image from the web --
# must fail the same check, which shows that it can fail. Last, a screenshot at 1280x1600 must be a PNG
# of that size.
# Without Chromium the test exits 77, which CTest reports as skipped (SKIP_RETURN_CODE), not passed.
# Usage: test_report_browser.sh PATH/TO/gpumem DATA_DIRECTORY
set -u
gpumem=$1
data=$2
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
    echo "SKIP: no chromium (Debian: apt-get install --no-install-recommends chromium)"
    exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}

# run_browser OUTPUT_FILE CHROMIUM_ARGUMENTS...: headless, no sandbox (containers run as root), a
# fresh profile, every host name unresolvable, console messages on stderr (kept in $work/console.log).
run_browser() {
    local output=$1
    shift
    local profile
    profile=$(mktemp -d "$work/profile.XXXXXX")
    timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
        --user-data-dir="$profile" --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE localhost" \
        --enable-logging=stderr --v=0 "$@" >"$output" 2>"$work/console.log"
}

# rendered_problems FILE EXPECT_CURVE: what is wrong with the page as rendered (nothing: all is well).
rendered_problems() {
    local page=$1 expect_curve=$2
    rm -f "$work/net.json"
    run_browser "$work/dom.html" --log-net-log="$work/net.json" --dump-dom "file://$page"
    local status=$?
    if [ "$status" -ne 0 ]; then
        echo "chromium failed (exit $status): $(tail -3 "$work/console.log")"
        return
    fi
    grep -q '</html>' "$work/dom.html" || echo "no DOM came back"
    grep -q 'data-report-check="ok"' "$work/dom.html" ||
        echo "the page's check did not pass: $(grep -o 'data-report-check="[^"]*"' "$work/dom.html")"
    grep -E 'CONSOLE|Uncaught' "$work/console.log" | head -3 | sed 's/^/console: /'
    if [ -s "$work/net.json" ]; then
        grep '"network_isolation_key":"file://' "$work/net.json" | grep -oE '"url":"[a-z-]+:[^"]*"' |
            grep -vE '"url":"(file|data|about|blob):' | sort -u | head -3 | sed 's/^/the page asked the network for /'
    else
        echo "chromium wrote no net log"
    fi
    if [ "$expect_curve" = 1 ]; then
        grep -q '<svg id="memory-curve"' "$work/dom.html" || echo "no <svg id=\"memory-curve\"> in the DOM"
        local series points
        for series in curve-allocated curve-reserved; do
            points=$(grep -o "<path id=\"$series\" [^>]*d=\"[^\"]*\"" "$work/dom.html" | sed 's/.* d="//' | tr -cd 'L' | wc -c)
            [ "$points" -ge 300 ] || echo "$series has $points points in the DOM"
        done
    fi
}

# expect_page NAME FILE EXPECT_CURVE WANTED (whole or broken)
expect_page() {
    local name=$1 page=$2 expect_curve=$3 wanted=$4
    local problems
    problems=$(rendered_problems "$page" "$expect_curve")
    if [ "$wanted" = whole ] && [ -n "$problems" ]; then
        fail "$name renders broken:"
        echo "$problems" | sed 's/^/    /'
    elif [ "$wanted" = broken ] && [ -z "$problems" ]; then
        fail "$name is broken on purpose, but the check found nothing wrong"
    elif [ -z "$problems" ]; then
        echo "ok   $name renders whole"
    else
        echo "ok   $name renders broken, found: $(echo "$problems" | head -2 | tr '\n' ' ')"
    fi
}

"$gpumem" replay "$data/traces/resnet50.csv.gz" --snapshot "$work/snapshot.json" --history "$work/history.json" >/dev/null ||
    fail "gpumem replay --snapshot --history"
"$gpumem" report "$data/traces/resnet50.csv.gz" -o "$work/trace.html" || fail "gpumem report TRACE"
"$gpumem" report "$work/history.json" -o "$work/history.html" || fail "gpumem report HISTORY"
"$gpumem" report "$work/snapshot.json" -o "$work/snapshot.html" || fail "gpumem report SNAPSHOT"

expect_page "the trace's report" "$work/trace.html" 1 whole
expect_page "the history's report" "$work/history.html" 1 whole
expect_page "the snapshot's report" "$work/snapshot.html" 0 whole

# Broken on purpose: the check must notice.
sed 's/JSON\.parse(/JSON.parseNot(/' "$work/trace.html" >"$work/throws.html"
cmp -s "$work/trace.html" "$work/throws.html" && fail "could not break the page's script"
expect_page "a page whose script throws" "$work/throws.html" 1 broken
sed 's/<path id="curve-reserved" class="line reserved" d="[^"]*"/<path id="curve-reserved" class="line reserved" d=""/' \
    "$work/trace.html" >"$work/no_data.html"
cmp -s "$work/trace.html" "$work/no_data.html" && fail "could not empty the curve's path"
expect_page "a page whose curve has no data" "$work/no_data.html" 1 broken
sed 's|<div id="tooltip">|<img src="http://example.com/logo.png" alt=""><div id="tooltip">|' "$work/trace.html" >"$work/fetches.html"
cmp -s "$work/trace.html" "$work/fetches.html" && fail "could not add an image from the web"
expect_page "a page that fetches an image from the web" "$work/fetches.html" 1 broken

# A screenshot: a PNG of the window's size.
if run_browser "$work/screenshot.log" --hide-scrollbars --window-size=1280,1600 --screenshot="$work/report.png" \
    "file://$work/trace.html" && [ -s "$work/report.png" ]; then
    signature=$(head -c 8 "$work/report.png" | od -An -tx1 | tr -d ' \n')
    size=$(od -An -tu1 -j16 -N8 "$work/report.png" | awk '{print $3 * 256 + $4, $7 * 256 + $8}')
    bytes=$(wc -c <"$work/report.png")
    if [ "$signature" = 89504e470d0a1a0a ] && [ "$size" = "1280 1600" ] && [ "$bytes" -gt 20000 ]; then
        echo "ok   screenshot: PNG, $size, $bytes bytes"
    else
        fail "screenshot: signature $signature, size '$size', $bytes bytes"
    fi
else
    fail "chromium --screenshot wrote no PNG: $(tail -3 "$work/console.log")"
fi

if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
fi
