#!/usr/bin/env bash
# top_while_training.sh BUILD_DIR -- a PyTorch process on gpumem with publish:true, seen from outside:
# `gpumem top --once --json` and `gpumem stats PID --json` must report exactly the allocated and reserved
# bytes that the process's own torch.cuda.memory_stats() reports while it waits.
set -u
build=$1
work=$(mktemp -d)
trap 'kill -9 $pid 2>/dev/null; rm -rf "$work"' EXIT
PYTHONPATH=python GPUMEM_LIBRARY=$PWD/$build/libgpumem.so GPUMEM_TORCH=publish:true python3 -c '
import os, sys, time, torch
model = torch.nn.Linear(4096, 4096).cuda()
loss = model(torch.randn(64, 4096, device="cuda")).square().sum()
loss.backward()
torch.cuda.synchronize()
stats = torch.cuda.memory_stats()
print(os.getpid(), stats["allocated_bytes.all.current"], stats["reserved_bytes.all.current"], flush=True)
time.sleep(60)
' >"$work/out" 2>"$work/err" &
pid=$!
for _ in $(seq 120); do [ -s "$work/out" ] && break; sleep 0.5; done
read -r printed allocated reserved <"$work/out" || { echo "FAIL: the training process printed nothing: $(tail -5 "$work/err")"; exit 1; }
"$build/gpumem" top --once
"$build/gpumem" top --once --json >"$work/top.json"
"$build/gpumem" stats "$pid" --json >"$work/stats.json"
failed=0
grep -q "\"pid\": $pid, \"device\": 0, \"backend\": \"cuda\", \"engine\": \"pages\", \"allocated_bytes\": $allocated, \"reserved_bytes\": $reserved," "$work/top.json" ||
    { echo "FAIL: gpumem top does not show pid $pid with torch's $allocated allocated, $reserved reserved: $(cat "$work/top.json")"; failed=1; }
grep -q "\"allocated_bytes.all.current\": $allocated," "$work/stats.json" ||
    { echo "FAIL: gpumem stats differs from torch's allocated $allocated"; failed=1; }
grep -q '"gpus": \[{"index": 0, ' "$work/top.json" || { echo "FAIL: no GPU row from NVML"; failed=1; }
[ $failed -eq 0 ] && echo "ok   gpumem top and stats show pid $pid: allocated $allocated, reserved $reserved, as torch.cuda.memory_stats()"
exit $failed
