"""Dump a snapshot of PyTorch's native allocator, with its history, for a real workload (for
`python -m gpumem.whatif`): python3 tests/gpu/native_snapshot.py WORKLOAD STEPS OUT.pickle"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import workloads  # noqa: E402

name, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.cuda.memory._record_memory_history(max_entries=10_000_000)
step = workloads.build(name, torch.device("cuda"))
for i in range(steps):
    step(i)
torch.cuda.synchronize()
torch.cuda.memory._dump_snapshot(out)
print(f"{name}: {steps} steps, native peak reserved {torch.cuda.max_memory_reserved() / 2**20:.1f} MiB, "
      f"peak allocated {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")
