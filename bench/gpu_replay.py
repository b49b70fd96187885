"""Replay allocation traces on the GPU through every allocator, side by side, and print a table.

    python3 bench/gpu_replay.py [--traces data/traces] [--library build/libgpumem.so] [--out results.jsonl]

Allocators: gpumem (its cuda backend, default configuration), PyTorch's caching allocator
(torch-native), PyTorch with expandable segments (torch-expandable) and cudaMallocAsync on the
default pool with an unlimited release threshold (cuda-async). Each allocator runs in a fresh process
(PYTORCH_CUDA_ALLOC_CONF only takes effect before CUDA starts); in it every trace is replayed twice,
cold (the first pass, which creates the device memory) and warm (the second, which reuses it).
The replay loop is C++ (a small torch extension compiled on first use, like ../shared/anchors/replay.py):
it calls c10::cuda::CUDACachingAllocator::raw_alloc/raw_delete, cudaMallocAsync/cudaFreeAsync, or
gm_malloc/gm_free, and times the whole pass including a final device synchronize.

Columns: ns per operation cold and warm; peak reserved bytes as the allocator reports them and as the
device's own free-memory reading shows them (used memory at the end of the cold pass, before the
leftovers are freed, less what was in use before the allocator started: none of these allocators
gives memory back on its own); ratio = peak reserved / peak live.

Times on a shared machine drift by tens of percent from one minute to the next (the H200 machine gave
81 and 144 warm ns/op for the same engine decisions a minute apart), so `--rounds N` (default 3) runs
every allocator N times, round by round (each round runs all allocators once, in turn), and the
table gives the median with the range; a second table compares gpumem with torch-native within each
round, where both ran a minute apart.

    python3 bench/gpu_replay.py [--rounds 3] [--allocators gpumem,torch-native]
"""
import argparse
import json
import os
import subprocess
import sys

ALLOCATORS = {
    "gpumem": {},
    "torch-native": {},
    "torch-expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cuda-async": {},
}

SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>
#include "gpumem.h"

static double now_ns() {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Replayer {
  int mode;  // 0 torch caching allocator, 1 cudaMallocAsync, 2 gpumem
  gm_allocator *gpumem = nullptr;
  cudaMemPool_t pool{};
};

static Replayer replayer;

void start(int64_t mode) {
  replayer.mode = (int)mode;
  if (mode == 1) {
    cudaDeviceGetDefaultMemPool(&replayer.pool, 0);
    uint64_t threshold = UINT64_MAX, zero = 0;
    cudaMemPoolSetAttribute(replayer.pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    cudaMemPoolSetAttribute(replayer.pool, cudaMemPoolAttrReservedMemHigh, &zero);
  } else if (mode == 2) {
    if (gm_create_from_environment("backend:cuda", &replayer.gpumem) != GM_OK)
      throw std::runtime_error(std::string("gpumem: ") + gm_last_error());
  }
}

static void *allocate(int64_t size) {
  void *pointer = nullptr;
  if (replayer.mode == 0) return c10::cuda::CUDACachingAllocator::raw_alloc(size);
  if (replayer.mode == 1) return cudaMallocAsync(&pointer, size, 0) == cudaSuccess ? pointer : nullptr;
  return gm_malloc(replayer.gpumem, size, 0, &pointer) == GM_OK ? pointer : nullptr;
}

static void release(void *pointer) {
  if (replayer.mode == 0) c10::cuda::CUDACachingAllocator::raw_delete(pointer);
  else if (replayer.mode == 1) cudaFreeAsync(pointer, 0);
  else gm_free(replayer.gpumem, pointer);
}

// ops: int64 [n, 3] = (0 allocate / 1 free, slot, size). Returns ns/op, peak live, failures,
// device-used bytes at the end of the pass (before leftovers are freed).
std::vector<double> replay_pass(torch::Tensor ops, int64_t slots) {
  auto a = ops.accessor<int64_t, 2>();
  std::vector<void *> slot(slots, nullptr);
  std::vector<int64_t> sizes(slots, 0);
  int64_t live = 0, peak = 0, failures = 0;
  cudaDeviceSynchronize();
  double t0 = now_ns();
  for (int64_t i = 0; i < ops.size(0); i++) {
    int64_t kind = a[i][0], id = a[i][1], size = a[i][2];
    if (kind == 0) {
      void *p = allocate(size);
      if (!p && size) { failures++; continue; }
      slot[id] = p; sizes[id] = size; live += size; if (live > peak) peak = live;
    } else if (slot[id]) {
      release(slot[id]); slot[id] = nullptr; live -= sizes[id];
    }
  }
  cudaDeviceSynchronize();
  double t1 = now_ns();
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  for (int64_t i = 0; i < slots; i++) if (slot[i]) release(slot[i]);
  cudaDeviceSynchronize();
  return {(t1 - t0) / ops.size(0), (double)peak, (double)failures, (double)(total - free_bytes)};
}

// Peak reserved bytes as the allocator reports them (torch reads its own stats in Python).
double reserved_peak() {
  if (replayer.mode == 1) {
    uint64_t value = 0;
    cudaMemPoolGetAttribute(replayer.pool, cudaMemPoolAttrReservedMemHigh, &value);
    return (double)value;
  }
  if (replayer.mode == 2) {
    gm_stats stats;
    gm_get_stats(replayer.gpumem, &stats);
    return (double)stats.reserved_bytes[GM_POOL_ALL].peak;
  }
  return 0;
}

// gpumem only: device-call time by kind, in ms, since start().
std::vector<double> device_ms_by_kind() {
  std::vector<double> times;
  if (replayer.mode != 2) return times;
  gm_stats stats;
  gm_get_stats(replayer.gpumem, &stats);
  for (int kind = 0; kind < GM_CALL_KIND_COUNT; kind++) times.push_back(stats.device_call_ns_by_kind[kind] / 1e6);
  return times;
}

// Bytes in use on the device now (context, other allocators, this one).
double device_used() {
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  return (double)(total - free_bytes);
}

void reset_peak() {
  if (replayer.mode == 1) { uint64_t zero = 0; cudaMemPoolSetAttribute(replayer.pool, cudaMemPoolAttrReservedMemHigh, &zero); }
  if (replayer.mode == 2) gm_reset_peak_stats(replayer.gpumem);
}

void finish() {
  if (replayer.mode == 2) { gm_destroy(replayer.gpumem, nullptr); replayer.gpumem = nullptr; }
  if (replayer.mode == 1) cudaMemPoolTrimTo(replayer.pool, 0);
  if (replayer.mode == 0) c10::cuda::CUDACachingAllocator::emptyCache();
  cudaDeviceSynchronize();
}
"""


def load_ops(path):
    import gzip
    import numpy as np
    import torch
    opener = gzip.open if path.endswith(".gz") else open
    ids, rows = {}, []
    with opener(path, "rt") as f:
        for line in f:
            if line[0] == "#":
                continue
            op, i, size, _ = line.split(",")
            rows.append((0 if op == "a" else 1, int(i), int(size)))
    ops = torch.tensor(np.array(rows, dtype=np.int64))
    return ops, int(ops[:, 1].max()) + 1


def worker(allocator, traces, library):
    import torch
    from torch.utils.cpp_extension import load_inline
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ext = load_inline("gpumem_gpu_replay", cpp_sources=SOURCE, functions=["start", "replay_pass", "reserved_peak",
                                                                          "reset_peak", "finish", "device_ms_by_kind",
                                                                          "device_used"],
                      with_cuda=True, extra_cflags=["-O2", f"-I{root}/include"],
                      extra_ldflags=[f"-L{os.path.dirname(os.path.abspath(library))}", "-lgpumem",
                                     f"-Wl,-rpath,{os.path.dirname(os.path.abspath(library))}"],
                      verbose=False)
    torch.cuda.init()
    torch.empty(1, device="cuda")
    mode = {"torch-native": 0, "torch-expandable": 0, "cuda-async": 1, "gpumem": 2}[allocator]
    kinds = ["segment_allocate", "segment_free", "address_reserve", "address_free", "physical_create",
             "physical_release", "map", "set_access", "unmap", "event_record", "event_query", "event_synchronize"]
    for path in traces:
        ops, slots = load_ops(path)
        torch.cuda.synchronize()
        baseline = ext.device_used()
        ext.start(mode)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_stats().get("reserved_bytes.all.current", 0)
        cold = ext.replay_pass(ops, slots)
        peak = ext.reserved_peak() if mode else torch.cuda.memory_stats()["reserved_bytes.all.peak"] - base
        cold_device_ms = dict(zip(kinds, ext.device_ms_by_kind()))
        warm = ext.replay_pass(ops, slots)
        ext.finish()
        result = {"allocator": allocator, "trace": os.path.basename(path).split(".")[0], "ops": int(ops.shape[0]),
                  "cold_ns_per_op": cold[0], "warm_ns_per_op": warm[0], "peak_live_bytes": cold[1],
                  "failures": cold[2] + warm[2], "peak_reserved_bytes": peak,
                  "device_used_bytes": cold[3] - baseline, "ratio": peak / cold[1] if cold[1] else None,
                  "device_ratio": (cold[3] - baseline) / cold[1] if cold[1] else None}
        if cold_device_ms:
            result["gpumem_cold_device_ms"] = {k: round(v, 3) for k, v in cold_device_ms.items() if v}
        print(json.dumps(result), flush=True)


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def spread(values):
    """The median and, over several rounds, the range: "515 (498-530)"."""
    if len(values) == 1:
        return f"{values[0]:.0f}"
    return f"{median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def table(results):
    traces = sorted({r["trace"] for r in results})
    lines = ["| trace | allocator | cold ns/op | warm ns/op | peak reserved MiB | device-read MiB | ratio | device ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for trace in traces:
        for name in ALLOCATORS:
            runs = [r for r in results if r["trace"] == trace and r["allocator"] == name]
            if not runs:
                continue
            last = runs[-1]
            lines.append(f"| {trace} | {name} | {spread([r['cold_ns_per_op'] for r in runs])} | "
                         f"{spread([r['warm_ns_per_op'] for r in runs])} | "
                         f"{last['peak_reserved_bytes'] / 2**20:.0f} | {last['device_used_bytes'] / 2**20:.0f} | "
                         f"{last['ratio']:.4f} | {last['device_ratio']:.4f} |")
    return "\n".join(lines)


def comparison(results, name="gpumem", reference="torch-native"):
    """gpumem's ns/op over torch-native's, round by round: cold (target at most 1) and warm (at most 0.5)."""
    rounds = sorted({r["round"] for r in results})
    header = " | ".join(f"round {k} cold | round {k} warm" for k in rounds)
    lines = [f"| trace | {header} |", "|---|" + "---|" * (2 * len(rounds))]
    for trace in sorted({r["trace"] for r in results}):
        cells = []
        for k in rounds:
            mine = [r for r in results if (r["trace"], r["allocator"], r["round"]) == (trace, name, k)]
            theirs = [r for r in results if (r["trace"], r["allocator"], r["round"]) == (trace, reference, k)]
            if not mine or not theirs:
                cells += ["", ""]
                continue
            cells += [f"{mine[0]['cold_ns_per_op'] / theirs[0]['cold_ns_per_op']:.2f}",
                      f"{mine[0]['warm_ns_per_op'] / theirs[0]['warm_ns_per_op']:.2f}"]
        lines.append(f"| {trace} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--traces", default="data/traces")
    parser.add_argument("--library", default="build/libgpumem.so")
    parser.add_argument("--out")
    parser.add_argument("--worker")
    parser.add_argument("--rounds", type=int, default=3, help="times every allocator runs, round by round")
    parser.add_argument("--allocators", help="comma-separated subset of " + ",".join(ALLOCATORS))
    parser.add_argument("files", nargs="*")
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.files, args.library)
    traces = sorted(os.path.join(args.traces, f) for f in os.listdir(args.traces) if ".csv" in f)
    names = args.allocators.split(",") if args.allocators else list(ALLOCATORS)
    unknown = [name for name in names if name not in ALLOCATORS]
    if unknown:
        parser.error(f"unknown allocator {', '.join(unknown)} (known: {', '.join(ALLOCATORS)})")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    results = []
    failed = False
    for round_number in range(1, args.rounds + 1):
        for name in names:
            env = dict(os.environ, **ALLOCATORS[name])
            run = subprocess.run([sys.executable, __file__, "--worker", name, "--library", args.library] + traces,
                                 env=env, capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{name} failed:\n{run.stderr[-3000:]}", file=sys.stderr)
                failed = True
                continue
            results += [dict(json.loads(line), round=round_number)
                        for line in run.stdout.splitlines() if line.startswith("{")]
    if args.out:
        with open(args.out, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    print(table(results))
    if "gpumem" in names and "torch-native" in names:
        print("\ngpumem's ns/op over torch-native's in the same round (targets: cold at most 1, warm at most 0.5):\n")
        print(comparison(results))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
