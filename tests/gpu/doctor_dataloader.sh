#!/usr/bin/env bash
# doctor_dataloader.sh BUILD_DIR -- `gpumem doctor --pid` on a PyTorch trainer with a DataLoader of 4
# persistent workers (pin_memory=True, synthetic random images, a small model on cuda). Once the trainer
# has run a few steps it writes a ready file with its pid and its workers' pids; then the JSON report must
# list the trainer at the root of the process tree, at least 4 processes below it, every worker among
# them, and a GPU section that read the driver (finding gpu.driver); the text report must show the
# trainer's row and gpu.driver too. Exits 0 only if every check passed. The trainer ends on SIGTERM
# (its workers with it) and by itself after 10 minutes.
set -u
build=$1
work=$(mktemp -d)
pid=
trainer=
workers=
stop_trainer() {
    [ -n "$pid" ] || return
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    for process in $pid $trainer $workers; do kill -9 "$process" 2>/dev/null; done
    wait "$pid" 2>/dev/null
    pid=
}
trap 'stop_trainer; rm -rf "$work"' EXIT

# A file, not standard input: DataLoader workers started by spawn or forkserver import the main module.
cat >"$work/trainer.py" <<'EOF'
import multiprocessing
import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class RandomImages(Dataset):
    """Images of noise with labels, made on demand by the workers."""

    def __len__(self):
        return 1 << 20

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        return torch.randn(3, 64, 64, generator=generator), index % 10


def small_model():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10)).cuda()


def write_ready(path):
    """The trainer's pid, then its workers'; written whole (renamed into place)."""
    pids = [os.getpid()] + sorted(child.pid for child in multiprocessing.active_children())
    with open(path + ".part", "w") as ready:
        ready.write(" ".join(map(str, pids)) + "\n")
    os.replace(path + ".part", path)


def train(ready_path):
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(RandomImages(), batch_size=64, num_workers=4, persistent_workers=True, pin_memory=True)
    deadline, step = time.monotonic() + 600, 0
    while time.monotonic() < deadline:
        for images, labels in loader:
            images, labels = images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step == 8:
                torch.cuda.synchronize()
                write_ready(ready_path)
            if time.monotonic() >= deadline:
                break


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # SystemExit: the DataLoader shuts its workers down
    train(sys.argv[1])
EOF
python3 "$work/trainer.py" "$work/ready" >"$work/trainer.out" 2>"$work/trainer.err" &
pid=$!

for _ in $(seq 480); do
    [ -s "$work/ready" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
done
if [ ! -s "$work/ready" ]; then
    echo "FAIL: the trainer did not get ready: $(tail -5 "$work/trainer.err")"
    exit 1
fi
read -r trainer workers <"$work/ready"
echo "trainer $trainer, DataLoader workers $workers"
[ "$trainer" = "$pid" ] || echo "note: the trainer $trainer is not the started process $pid (a python3 wrapper?)"

failed=0
# Exit status 4 or 5: the worst finding is warn or fail, a report all the same; 1 and 2 are errors.
"$build/gpumem" doctor --pid "$trainer" | tee "$work/doctor.txt"
status=${PIPESTATUS[0]}
case $status in 0 | 4 | 5) ;; *) echo "FAIL: gpumem doctor --pid $trainer exited $status"; failed=1 ;; esac
"$build/gpumem" doctor --pid "$trainer" --json >"$work/doctor.json"
status=$?
case $status in 0 | 4 | 5) ;; *) echo "FAIL: gpumem doctor --pid $trainer --json exited $status"; failed=1 ;; esac

python3 - "$work/doctor.json" "$trainer" $workers <<'EOF' || failed=1
import json
import sys

report = json.load(open(sys.argv[1]))
trainer, workers = int(sys.argv[2]), {int(worker) for worker in sys.argv[3:]}
processes = report.get("processes", [])
below = {process["pid"] for process in processes if process["depth"] >= 1}
findings = {finding["id"]: finding for finding in report["findings"]}
problems = []
if not any(process["pid"] == trainer and process["depth"] == 0 for process in processes):
    problems.append(f"the trainer {trainer} is not the root of the process tree")
if len(below) < 4:
    problems.append(f"{len(below)} processes below the trainer, not 4 or more")
if len(workers) < 4:
    problems.append(f"the trainer has {len(workers)} DataLoader workers, not 4")
if workers - below:
    problems.append(f"DataLoader workers {sorted(workers - below)} are not in the tree (of {sorted(workers)})")
driver = findings.get("gpu.driver", {}).get("value", "")
if not driver.startswith("driver "):
    problems.append(f"no GPU section with the driver: {findings.get('gpu', {}).get('value', 'no gpu finding')}")
for problem in problems:
    print("FAIL:", problem)
if not problems:
    print(f"ok   gpumem doctor --pid {trainer} --json: {len(processes)} processes, {len(below)} below the "
          f"trainer, workers {sorted(workers)} among them; {driver}")
sys.exit(1 if problems else 0)
EOF
grep -Eq "^$trainer " "$work/doctor.txt" || { echo "FAIL: the text report has no row for the trainer $trainer"; failed=1; }
grep -q "gpu.driver" "$work/doctor.txt" || { echo "FAIL: the text report has no gpu.driver finding"; failed=1; }
[ $failed -eq 0 ] && echo "ok   gpumem doctor reports the trainer, its DataLoader workers and the GPU"
exit $failed
