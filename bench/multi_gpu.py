"""Data-parallel training on two GPUs under PyTorch's allocator and under gpumem: DDP and FSDP2.

    python3 bench/multi_gpu.py [--modes ddp,fsdp] [--allocators native,expandable,gpumem] [--repeats 2]
                               [--steps 20] [--gpus 2] [--out results.jsonl]

The allocators: native (PyTorch's caching allocator), expandable (the same with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which maps memory with CUDA's virtual-memory calls as
gpumem does) and gpumem. Each (repeat, mode, allocator) is one `torchrun --standalone
--nproc_per_node=GPUS` launch of this file, interleaved (repeat 1 of everything, then repeat 2) so that a
drift of the machine hits all alike. The
model is GPT-2 with 6 layers (transformers' GPT2LMHeadModel, 1024 tokens, 8 sequences per GPU, AdamW,
fp32, the same seed and batches everywhere): DDP wraps it whole; FSDP2 shards each block and then the
model (`fully_shard`). A rank's step time is its median over the steps after 5 of warm-up; the table
gives, per mode and allocator, the median of the launches' step times (the slower rank of each) and
their spread, the largest peak allocated and peak reserved of any rank and launch, and whether rank 0's
losses equal native's first launch bit for bit (for native: whether its launches agree with each other,
which says whether bit equality can be asked at all). gpumem's device-call counters over the steps
after warm-up go to --out. NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as the machine asks.

With --gpus 1 (a machine of one GPU) the same training runs as one rank: no peer, but FSDP2 still
all-gathers its parameters and reduce-scatters its gradients on streams of their own, whose buffers the
compute stream uses and frees -- the cross-stream traffic that makes FSDP2 differ from DDP.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
WARM_UP = 5


def child(arguments):
    if arguments.allocator == "gpumem":
        import gpumem.torch
        gpumem.torch.install()
    import time

    import torch
    import torch.distributed as distributed
    from transformers import GPT2Config, GPT2LMHeadModel

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    distributed.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6)).cuda()
    if arguments.mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    else:
        from torch.distributed.fsdp import fully_shard
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator(device="cuda").manual_seed(1 + rank)
    batches = [torch.randint(0, 50257, (8, 1024), device="cuda", generator=generator) for _ in range(4)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times, losses, counters = [], [], {}
    for step in range(arguments.steps):
        if step == WARM_UP:
            counters = _device_counters(arguments.allocator)
        ids = batches[step % len(batches)]
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        losses.append(loss.item())
    mine = {"rank": rank, "step_ms": 1000 * statistics.median(times[WARM_UP:]), "losses": losses,
            "peak_allocated": torch.cuda.max_memory_allocated(), "peak_reserved": torch.cuda.max_memory_reserved(),
            "device_calls_after_warm_up": {key: value - counters.get(key, 0)
                                           for key, value in _device_counters(arguments.allocator).items()}}
    everyone = [None] * distributed.get_world_size()
    distributed.all_gather_object(everyone, mine)
    if rank == 0:
        with open(arguments.out, "w") as out:
            json.dump(everyone, out)
    distributed.destroy_process_group()


def _device_counters(allocator):
    """gpumem's device-call counters (calls and nanoseconds by kind, syncs of all streams), to see what the
    steps after warm-up cost the engine; nothing under native."""
    if allocator != "gpumem":
        return {}
    import gpumem.torch
    stats = gpumem.torch.allocator().memory_stats()
    return {key: value for key, value in stats.items()
            if key.startswith(("device_call", "num_device", "num_page", "num_sync"))}


def launch(mode, allocator, steps, gpus):
    """One torchrun launch: the ranks' results, or an error string."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        path = handle.name
    environment = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                       NVSHMEM_DISABLE_NVLS="1", PYTHONPATH=os.path.join(ROOT, "python"))
    environment.pop("GPUMEM_TORCH", None)
    environment.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if allocator == "expandable":
        environment["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
               os.path.abspath(__file__), "--child", "--mode", mode, "--allocator", allocator,
               "--steps", str(steps), "--out", path]
    run = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)
    try:
        if run.returncode != 0:
            return f"exit status {run.returncode}: {run.stderr[-1500:]}"
        with open(path) as results:
            return json.load(results)
    finally:
        os.unlink(path)


def summarize(mode, allocator, runs, native_losses):
    good = [run for run in runs if isinstance(run, list)]
    if not good:
        return {"mode": mode, "allocator": allocator, "error": runs[0] if runs else "no run"}
    step_times = [max(rank["step_ms"] for rank in run) for run in good]
    reference = native_losses if native_losses is not None else good[0][0]["losses"]
    return {"mode": mode, "allocator": allocator, "launches": len(good), "step_ms": statistics.median(step_times),
            "spread_ms": max(step_times) - min(step_times),
            "peak_allocated": max(rank["peak_allocated"] for run in good for rank in run),
            "peak_reserved": max(rank["peak_reserved"] for run in good for rank in run),
            "losses": good[0][0]["losses"],
            "same_losses": all(run[0]["losses"] == reference for run in good),
            "device_calls_after_warm_up": [rank["device_calls_after_warm_up"] for run in good for rank in run],
            "errors": [run for run in runs if not isinstance(run, list)]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="ddp,fsdp")
    parser.add_argument("--allocators", default="native,gpumem")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--gpus", type=int, default=2, help="ranks, one per GPU (1: the one-GPU equivalent)")
    parser.add_argument("--out")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--allocator", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        return child(arguments)
    modes, allocators = arguments.modes.split(","), arguments.allocators.split(",")
    runs = {(mode, allocator): [] for mode in modes for allocator in allocators}
    for repeat in range(arguments.repeats):
        for mode in modes:
            for allocator in allocators:
                runs[(mode, allocator)].append(launch(mode, allocator, arguments.steps, arguments.gpus))
                print(f"repeat {repeat + 1}: {mode} {allocator} done", file=sys.stderr, flush=True)
    print("| mode | allocator | step ms (median of launches) | spread | peak allocated MiB | peak reserved MiB "
          "| losses equal native's (native: its launches agree) |")
    print("|---|---|---|---|---|---|---|")
    failed = False
    for mode in modes:
        native = summarize(mode, "native", runs.get((mode, "native"), []), None) if "native" in allocators else None
        for allocator in allocators:
            row = native if allocator == "native" else summarize(mode, allocator, runs[(mode, allocator)],
                                                                 native.get("losses") if native else None)
            if "error" in row:
                failed = True
                print(f"| {mode} | {allocator} | error: {row['error'][-300:]!r} | | | | |")
            else:
                print(f"| {mode} | {allocator} | {row['step_ms']:.1f} | {row['spread_ms']:.1f} | "
                      f"{row['peak_allocated'] / MIB:.0f} | {row['peak_reserved'] / MIB:.0f} | "
                      f"{'yes' if row['same_losses'] else 'NO'} |")
            if arguments.out:
                with open(arguments.out, "a") as out:
                    out.write(json.dumps(row) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
