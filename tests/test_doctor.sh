#!/usr/bin/env bash
# test_doctor.sh -- gpumem doctor on fixture trees of /proc and /sys (a healthy machine, a swap storm,
# a tiny /dev/shm, low memlock and open-files limits, a cgroup v2 and a v1 limit below RAM, nothing
# readable, a process tree), checking the exact findings and exit statuses; then on this machine
# (no exit status 1, JSON that parses, --pid $$ lists the shell) and the errors of a missing root
# and a bad pid.
# With a second argument, the directory of tests/fake_nvml.c's libnvidia-ml.so.1, the GPU findings
# are checked on its fake GPU.
# Usage: test_doctor.sh PATH/TO/gpumem [FAKE_NVML_DIRECTORY]
set -u
gpumem=$1
fake_nvml=${2:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}

# A healthy 64 GiB machine with 8 GiB of unused swap, two NUMA nodes, cgroup v2 without limits.
make_machine() {
    local root=$1
    mkdir -p "$root/proc/self" "$root/proc/pressure" "$root/proc/sys/vm" "$root/sys/kernel/mm/transparent_hugepage" \
        "$root/sys/devices/system/node/node0" "$root/sys/devices/system/node/node1" \
        "$root/sys/fs/cgroup/user.slice/job" "$root/.statvfs/dev"
    printf 'MemTotal:       67108864 kB\nMemFree:        40000000 kB\nMemAvailable:   50331648 kB\nSwapTotal:       8388608 kB\nSwapFree:        8388608 kB\n' >"$root/proc/meminfo"
    printf 'some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n' >"$root/proc/pressure/memory"
    echo 10 >"$root/proc/sys/vm/swappiness"
    echo 262144 >"$root/proc/sys/vm/min_free_kbytes"
    echo 0 >"$root/proc/sys/vm/overcommit_memory"
    echo 50 >"$root/proc/sys/vm/overcommit_ratio"
    echo 'always [madvise] never' >"$root/sys/kernel/mm/transparent_hugepage/enabled"
    printf '0::/user.slice/job\n' >"$root/proc/self/cgroup"
    echo max >"$root/sys/fs/cgroup/user.slice/job/memory.max"
    echo max >"$root/sys/fs/cgroup/user.slice/job/memory.high"
    echo 1073741824 >"$root/sys/fs/cgroup/user.slice/job/memory.current"
    echo max >"$root/sys/fs/cgroup/user.slice/job/memory.swap.max"
    set_limits "$root/proc/self/limits" unlimited 65536
    printf 'total 34359738368\navailable 33285996544\n' >"$root/.statvfs/dev/shm"
}

set_limits() {
    printf 'Limit                     Soft Limit           Hard Limit           Units     \n' >"$1"
    printf 'Max stack size            8388608              unlimited            bytes     \n' >>"$1"
    printf 'Max open files            %-20s %-20s files     \n' "$3" "$3" >>"$1"
    printf 'Max locked memory         %-20s %-20s bytes     \n' "$2" "$2" >>"$1"
}

# check NAME ROOT STATUS EXPECTED [ARGUMENTS...]: `gpumem doctor --root ROOT --json ARGUMENTS` exits with
# STATUS and every line "id|severity|value" of the file EXPECTED is a finding; with a first line
# "exact", the findings are exactly those lines, in order. "@ROOT" in a value stands for the root.
check() {
    local name=$1 root=$2 status=$3 expected=$4
    shift 4
    "$gpumem" doctor --root "$root" --json "$@" >"$work/out.json" 2>"$work/err"
    local got=$?
    if [ "$got" -ne "$status" ]; then
        fail "$name: exit $got (wanted $status)"
        sed 's/^/    /' "$work/err" "$work/out.json" | head -20
        return
    fi
    if ! python3 - "$work/out.json" "$expected" "$root" "$status" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
lines = [line.rstrip("\n") for line in open(sys.argv[2]) if line.strip()]
exact = lines[0] == "exact"
if exact:
    lines = lines[1:]
wanted = [tuple(line.replace("@ROOT", sys.argv[3]).split("|", 2)) for line in lines]
got = [(f["id"], f["severity"], f["value"]) for f in report["findings"]]
bad = False
if report["format"] != "gpumem-doctor" or report["version"] != 1:
    print("    format/version:", report["format"], report["version"]); bad = True
if report["exit_status"] != int(sys.argv[4]):
    print("    exit_status in the JSON:", report["exit_status"]); bad = True
for finding in report["findings"]:
    if finding["severity"] in ("warn", "fail") and not finding["why"]:
        print("    no why:", finding["id"]); bad = True
    if finding["severity"] in ("warn", "fail") and not finding["fix"]:
        print("    no fix:", finding["id"]); bad = True
if exact and got != wanted:
    print("    wanted:", *wanted, "    got:", *got, sep="\n      "); bad = True
for item in wanted:
    if item not in got:
        print("    missing:", item, "\n    got:", *got, sep="\n      "); bad = True
sys.exit(1 if bad else 0)
EOF
    then
        fail "$name: findings"
    else
        echo "ok   $name"
    fi
}

healthy=$work/healthy
make_machine "$healthy"
cat >"$work/healthy.expected" <<'EOF'
exact
memory.total|ok|64.0 GiB
memory.available|ok|48.0 GiB of 64.0 GiB (75.0%)
memory.swap|ok|0.0 GiB of 8.0 GiB used (0.0%)
memory.pressure|ok|some avg10=0.00 avg60=0.00, full avg10=0.00 avg60=0.00
vm.swappiness|ok|10
vm.min_free_kbytes|ok|262144 KiB
vm.overcommit|ok|overcommit_memory 0, overcommit_ratio 50
memory.thp|ok|madvise
numa.nodes|ok|2
cgroup.path|ok|v2 /user.slice/job
cgroup.memory_max|ok|max (RAM 64.0 GiB)
cgroup.memory_high|ok|max
cgroup.memory_current|ok|1.0 GiB (no limit)
cgroup.swap_max|ok|max
limits.memlock|ok|unlimited
limits.open_files|ok|65536
shm.size|ok|32.0 GiB, 1.0 GiB used (3.1%)
gpu|unknown|not read under --root @ROOT
EOF
check healthy "$healthy" 0 "$work/healthy.expected"

storm=$work/storm
make_machine "$storm"
printf 'MemTotal:       67108864 kB\nMemAvailable:    2097152 kB\nSwapTotal:       8388608 kB\nSwapFree:        2097152 kB\n' >"$storm/proc/meminfo"
printf 'some avg10=35.50 avg60=20.00 avg300=5.00 total=123\nfull avg10=12.00 avg60=5.00 avg300=1.00 total=45\n' >"$storm/proc/pressure/memory"
echo 60 >"$storm/proc/sys/vm/swappiness"
echo 'always madvise [never]' >"$storm/sys/kernel/mm/transparent_hugepage/enabled"
cat >"$work/storm.expected" <<'EOF'
memory.available|fail|2.0 GiB of 64.0 GiB (3.1%)
memory.swap|fail|6.0 GiB of 8.0 GiB used (75.0%)
memory.pressure|fail|some avg10=35.50 avg60=20.00, full avg10=12.00 avg60=5.00
vm.swappiness|warn|60
memory.thp|ok|never
shm.size|ok|32.0 GiB, 1.0 GiB used (3.1%)
EOF
check "swap storm" "$storm" 5 "$work/storm.expected"

# Swap used but no pressure: warn, not a storm.
swap_only=$work/swap_only
make_machine "$swap_only"
printf 'MemTotal:       67108864 kB\nMemAvailable:   33554432 kB\nSwapTotal:       8388608 kB\nSwapFree:        4194304 kB\n' >"$swap_only/proc/meminfo"
echo 'memory.swap|warn|4.0 GiB of 8.0 GiB used (50.0%)' >"$work/swap_only.expected"
check "swap used without pressure" "$swap_only" 4 "$work/swap_only.expected"

tiny_shm=$work/tiny_shm
make_machine "$tiny_shm"
printf 'total 67108864\navailable 33554432\n' >"$tiny_shm/.statvfs/dev/shm"
echo 'shm.size|warn|64.0 MiB, 32.0 MiB used (50.0%)' >"$work/tiny_shm.expected"
check "tiny /dev/shm" "$tiny_shm" 4 "$work/tiny_shm.expected"

# 4 GiB is over 1 GiB but under 10% of 64 GiB.
small_shm=$work/small_shm
make_machine "$small_shm"
printf 'total 4294967296\navailable 4294967296\n' >"$small_shm/.statvfs/dev/shm"
echo 'shm.size|warn|4.0 GiB, 0.0 MiB used (0.0%)' >"$work/small_shm.expected"
check "/dev/shm under 10% of RAM" "$small_shm" 4 "$work/small_shm.expected"

low_limits=$work/low_limits
make_machine "$low_limits"
set_limits "$low_limits/proc/self/limits" 65536 1024
printf 'limits.memlock|warn|0.1 MiB\nlimits.open_files|warn|1024\n' >"$work/low_limits.expected"
check "low memlock and open files" "$low_limits" 4 "$work/low_limits.expected"

cgroup=$work/cgroup
make_machine "$cgroup"
echo 17179869184 >"$cgroup/sys/fs/cgroup/user.slice/job/memory.max"
echo 15032385536 >"$cgroup/sys/fs/cgroup/user.slice/job/memory.high"
echo 16106127360 >"$cgroup/sys/fs/cgroup/user.slice/job/memory.current"
echo 0 >"$cgroup/sys/fs/cgroup/user.slice/job/memory.swap.max"
cat >"$work/cgroup.expected" <<'EOF'
cgroup.path|ok|v2 /user.slice/job
cgroup.memory_max|warn|16.0 GiB (RAM 64.0 GiB)
cgroup.memory_high|warn|14.0 GiB
cgroup.memory_current|warn|15.0 GiB (93.8% of the limit)
cgroup.swap_max|ok|0.0 MiB
EOF
check "cgroup v2 limit below RAM" "$cgroup" 4 "$work/cgroup.expected"

cgroup_v1=$work/cgroup_v1
make_machine "$cgroup_v1"
printf '4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n0::/\n' >"$cgroup_v1/proc/self/cgroup"
mkdir -p "$cgroup_v1/sys/fs/cgroup/memory/docker/abc"
echo 8589934592 >"$cgroup_v1/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"
echo 1073741824 >"$cgroup_v1/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes"
cat >"$work/cgroup_v1.expected" <<'EOF'
cgroup.path|ok|v1 /docker/abc
cgroup.memory_max|warn|8.0 GiB (RAM 64.0 GiB)
cgroup.memory_current|ok|1.0 GiB (12.5% of the limit)
EOF
check "cgroup v1 limit below RAM" "$cgroup_v1" 4 "$work/cgroup_v1.expected"

# cgroup v2 at the root (a host, not a container): the root cgroup has no memory.max file.
cgroup_root=$work/cgroup_root
make_machine "$cgroup_root"
printf '0::/\n' >"$cgroup_root/proc/self/cgroup"
printf 'cgroup.path|ok|v2 /\ncgroup.memory_max|ok|max (root cgroup, RAM 64.0 GiB)\n' >"$work/cgroup_root.expected"
check "cgroup v2 root" "$cgroup_root" 0 "$work/cgroup_root.expected"

# Strict overcommit, THP always, a small min_free_kbytes on a large machine.
settings=$work/settings
make_machine "$settings"
echo 2 >"$settings/proc/sys/vm/overcommit_memory"
echo '[always] madvise never' >"$settings/sys/kernel/mm/transparent_hugepage/enabled"
echo 16384 >"$settings/proc/sys/vm/min_free_kbytes"
printf 'vm.overcommit|warn|overcommit_memory 2, overcommit_ratio 50\nmemory.thp|warn|always\nvm.min_free_kbytes|warn|16384 KiB\n' >"$work/settings.expected"
check "kernel settings" "$settings" 4 "$work/settings.expected"

# Nothing readable: every finding says what it could not read, and an audit that saw nothing is an
# error (exit 1, worst "unknown"), not "all ok".
empty=$work/empty
mkdir -p "$empty"
cat >"$work/empty.expected" <<'EOF'
exact
memory.total|unknown|cannot read @ROOT/proc/meminfo
memory.pressure|unknown|cannot read @ROOT/proc/pressure/memory
vm.swappiness|unknown|cannot read @ROOT/proc/sys/vm/swappiness
vm.min_free_kbytes|unknown|cannot read @ROOT/proc/sys/vm/min_free_kbytes
vm.overcommit|unknown|cannot read @ROOT/proc/sys/vm/overcommit_memory
memory.thp|unknown|cannot read @ROOT/sys/kernel/mm/transparent_hugepage/enabled
numa.nodes|unknown|cannot read @ROOT/sys/devices/system/node
cgroup.path|unknown|cannot read @ROOT/proc/self/cgroup
limits.memlock|unknown|cannot read @ROOT/proc/self/limits
limits.open_files|unknown|cannot read @ROOT/proc/self/limits
shm.size|unknown|cannot read @ROOT/.statvfs/dev/shm
gpu|unknown|not read under --root @ROOT
EOF
check "nothing readable" "$empty" 1 "$work/empty.expected"
grep -q "gpumem doctor: not one finding could be read under $empty: nothing was checked" "$work/err" ||
    fail "nothing readable: no message on stderr"
python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["worst"] != "unknown")' "$work/out.json" ||
    fail "nothing readable: worst is not unknown"

# A process tree: 100 (python) with a worker 101 and a grandchild 103; 102 is unrelated.
tree=$work/tree
make_machine "$tree"
add_process() { # ROOT PID PARENT NAME RSS_KB PSS_KB PRIVATE_CLEAN_KB PRIVATE_DIRTY_KB SWAP_KB LOCKED_KB
    local directory=$1/proc/$2
    mkdir -p "$directory"
    echo "$2 ($4) S $3 $2 $2 0 -1" >"$directory/stat"
    printf 'Name:\t%s\nVmLck:\t%8d kB\nVmRSS:\t%8d kB\n' "$4" "${10}" "$5" >"$directory/status"
    printf 'Rss: %d kB\nPss: %d kB\nPrivate_Clean: %d kB\nPrivate_Dirty: %d kB\nSwap: %d kB\n' "$5" "$6" "$7" "$8" "$9" \
        >"$directory/smaps_rollup"
    cp "$1/proc/self/cgroup" "$directory/cgroup"
    set_limits "$directory/limits" 67108864 4096
}
add_process "$tree" 100 1 python 1000 800 100 300 0 1024
add_process "$tree" 101 100 pt_data_worker 500 200 0 50 0 0
add_process "$tree" 102 1 sshd 300 300 300 0 0 0
add_process "$tree" 103 101 worker_child 100 100 100 0 0 0
cat >"$work/tree.expected" <<'EOF'
limits.memlock|ok|64.0 MiB
limits.open_files|ok|4096
process.tree|ok|3 processes, RSS 1.6 MiB, PSS 1.1 MiB, USS 0.5 MiB, swap 0.0 MiB, locked 1.0 MiB
EOF
check "process tree" "$tree" 0 "$work/tree.expected" --pid 100
if python3 -c '
import json, sys
processes = json.load(open(sys.argv[1]))["processes"]
got = [(p["pid"], p["parent"], p["depth"], p["name"], p["rss_bytes"], p["pss_bytes"], p["uss_bytes"], p["swap_bytes"], p["locked_bytes"]) for p in processes]
wanted = [(100, 1, 0, "python", 1024000, 819200, 409600, 0, 1048576),
          (101, 100, 1, "pt_data_worker", 512000, 204800, 51200, 0, 0),
          (103, 101, 2, "worker_child", 102400, 102400, 102400, 0, 0)]
sys.exit(0 if got == wanted else print(got) or 1)' "$work/out.json"; then
    echo "ok   process tree: the processes"
else
    fail "process tree: the processes"
fi
add_process "$tree" 104 100 swapping_worker 100 100 100 0 2048 0
echo 'process.tree|warn|4 processes, RSS 1.7 MiB, PSS 1.2 MiB, USS 0.6 MiB, swap 2.0 MiB, locked 1.0 MiB' >"$work/swapping.expected"
check "process tree with swap" "$tree" 4 "$work/swapping.expected" --pid 100
# A worker whose smaps_rollup cannot be read (another user's, say): its RSS and swap from status, its PSS
# and USS unknown, so the tree's sums of those are lower bounds.
add_process "$tree" 105 100 other_users_worker 400 0 0 0 0 0
rm "$tree/proc/105/smaps_rollup"
printf 'VmSwap:\t       0 kB\n' >>"$tree/proc/105/status"
echo 'process.tree|warn|5 processes, RSS 2.1 MiB, PSS >= 1.2 MiB, USS >= 0.6 MiB, swap 2.0 MiB, locked 1.0 MiB' \
    >"$work/unreadable.expected"
check "process tree with an unreadable process" "$tree" 4 "$work/unreadable.expected" --pid 100

# This machine: no error, JSON that parses, a table that names the worst severity.
"$gpumem" doctor --json >"$work/live.json" 2>"$work/err"
status=$?
if [ "$status" -eq 1 ] || [ "$status" -eq 2 ] || ! python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$work/live.json"; then
    fail "live --json: exit $status"
    cat "$work/err"
else
    echo "ok   live --json (exit $status)"
fi
# The GPU section: with NVML a gpu.driver finding, without it one "gpu" finding that says why (not a failure).
if python3 -c '
import json, sys
findings = json.load(open(sys.argv[1]))["findings"]
gpu = [f for f in findings if f["id"] == "gpu" or f["id"].startswith("gpu.")]
sys.exit(0 if gpu and (gpu[0]["id"] == "gpu.driver" or (gpu[0]["severity"] == "unknown" and gpu[0]["value"])) else 1)' "$work/live.json"; then
    echo "ok   live GPU section"
else
    fail "live GPU section"
fi
"$gpumem" doctor >"$work/live.txt" 2>&1
status=$?
if [ "$status" -eq 1 ] || [ "$status" -eq 2 ] || ! grep -q '^worst: ' "$work/live.txt" || ! grep -q 'memory.total' "$work/live.txt"; then
    fail "live table: exit $status"
    cat "$work/live.txt"
else
    echo "ok   live table (exit $status)"
fi
"$gpumem" doctor --json --pid $$ >"$work/self.json" 2>"$work/err"
status=$?
if [ "$status" -eq 1 ] || ! python3 -c '
import json, sys
report = json.load(open(sys.argv[1]))
sys.exit(0 if report["processes"][0]["pid"] == int(sys.argv[2]) and report["processes"][0]["depth"] == 0
         and any(f["id"] == "process.tree" for f in report["findings"]) else 1)' "$work/self.json" $$; then
    fail "--pid \$\$: exit $status"
    cat "$work/err"
else
    echo "ok   --pid \$\$ lists the shell"
fi

# The GPU findings on the fake NVML: its PCIe link runs at x8 of x16, which warns.
if [ -n "$fake_nvml" ]; then
    LD_LIBRARY_PATH="$fake_nvml${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$gpumem" doctor --json >"$work/fake.json" 2>"$work/err"
    status=$?
    if [ "$status" -ne 4 ] && [ "$status" -ne 5 ]; then
        fail "fake NVML: exit $status (wanted 4 or 5: the narrow link warns)"
    elif python3 -c '
import json, sys
findings = {f["id"]: (f["severity"], f["value"]) for f in json.load(open(sys.argv[1]))["findings"]}
wanted = {"gpu.driver": ("ok", "driver 550.54.15, CUDA 12.4, 1 GPU"),
          "gpu.0": ("warn", "Fake H200, 140.0 GiB, 1.0 GiB used; persistence on, ECC on, MIG off, "
                            "PCIe gen5 x8 (max gen5 x16), 1 process holding 1.0 GiB")}
bad = {k: findings.get(k) for k in wanted if findings.get(k) != wanted[k]}
sys.exit(print("    got:", bad) or 1 if bad else 0)' "$work/fake.json"; then
        echo "ok   fake NVML: the GPU findings"
    else
        fail "fake NVML: the GPU findings"
    fi
fi

# expect STATUS PATTERN -- COMMAND...
expect() {
    local status=$1 pattern=$2
    shift 3
    "$@" >"$work/out" 2>&1
    local got=$?
    if [ "$got" -ne "$status" ] || ! grep -Eq -- "$pattern" "$work/out"; then
        fail "$* -> exit $got (wanted $status)"
        sed 's/^/    /' "$work/out" | head -10
    else
        echo "ok   $*"
    fi
}
expect 1 "the root $work/missing is not a readable directory" -- "$gpumem" doctor --root "$work/missing"
expect 1 "no process 999999999" -- "$gpumem" doctor --pid 999999999
expect 1 "no process 4242" -- "$gpumem" doctor --root "$healthy" --pid 4242
expect 2 "--pid needs a positive process id, not 'abc'" -- "$gpumem" doctor --pid abc
expect 2 "--pid needs a positive process id, not '-3'" -- "$gpumem" doctor --pid -3
expect 2 "--pid needs a positive process id, not '99999999999999999999'" -- "$gpumem" doctor --pid 99999999999999999999
expect 2 "--root needs a value" -- "$gpumem" doctor --root
expect 2 "unknown argument '--fast'" -- "$gpumem" doctor --fast
expect 0 "usage: gpumem doctor" -- "$gpumem" doctor --help
expect 0 "doctor \[--json\]" -- "$gpumem" help

if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)"
    exit 1
fi
echo "all passed"
