"""Where a workload's step time goes: GPU-busy time against wall time, and the host's top operators.

    python3 bench/profile_workload.py WORKLOAD [--steps 4] [--warmup 3] [--top 12]

Runs bench/workloads.py's WORKLOAD (same seed, same shapes) under whatever allocator the environment
selects (PYTORCH_CUDA_ALLOC_CONF, or GPUMEM_TORCH=1 with python/ on PYTHONPATH for gpumem), profiles
the measured steps with torch.profiler and prints, per step, the wall time and the time the GPU spent
in kernels and copies; then the operators with the most host (self CPU) time. A step whose GPU time is
far below its wall time is bound by the host, and its timing follows the host's speed.
"""
import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402  (bench/workloads.py)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("workload")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    step = workloads.build(args.workload, torch.device("cuda"))
    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    walls = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(args.warmup, args.warmup + args.steps):
            start = time.perf_counter()
            step(i)
            torch.cuda.synchronize()
            walls.append(1e3 * (time.perf_counter() - start))
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events)
    print(f"{args.workload}: {args.steps} steps, wall ms per step: " + ", ".join(f"{w:.1f}" for w in walls))
    print(f"GPU busy per step (kernels and copies): {device_us / 1e3 / args.steps:.1f} ms; "
          f"wall per step {sum(walls) / len(walls):.1f} ms")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
