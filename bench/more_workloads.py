"""More real PyTorch training workloads to record allocation traces from, beside the anchors' four
(bench/anchor_workloads.py): a ViT, a ConvNeXt at several resolutions, a Llama-style decoder with
variable sequence lengths and a diffusion UNet (diffusers' UNet2DModel, or where diffusers is not
installed the same network in plain PyTorch: bench/diffusion_unet.py).

    python3 bench/more_workloads.py WORKLOAD --seed S [--steps 4] [--warmup 2] [--trace OUT.csv] [--device-room MIB]

WORKLOAD is one of vit, convnext, llama_varlen, unet. Every step is a full training step: forward under
bf16 autocast, backward, optimizer step, zero_grad(set_to_none=True). The input shapes of each step
are drawn from random.Random(SEED), so two seeds give two input mixes (the weights are seeded too).
With --trace the whole run (model build included) is recorded with PyTorch's memory history and
written in the anchors' trace format (anchor_workloads.export_trace: a|f,id,bytes,stream per line).

Prints one JSON line, with the keys of bench/workloads.py's (peak allocated / reserved, median step
time, trace_events) plus the seed, the shape each step drew, each step's loss and time (warm-up
included) and, under gpumem, the copies of each step (compaction's, compact_min) and what its device
calls took (all of them, and the waits before unmapping).

Exit status: 0 recorded; 4 the workload is unavailable here (torchvision or transformers not installed:
the JSON line says so under "unavailable"); anything else a failure (a Python traceback on stderr).
"""
import argparse
import importlib.util
import json
import os
import random
import statistics
import sys
import time

import torch

from anchor_workloads import export_trace

WORKLOADS = ("vit", "convnext", "llama_varlen", "unet")
UNAVAILABLE_STATUS = 4


class Unavailable(Exception):
    """The workload cannot run on this machine for a documented reason (a package not installed)."""


LOSSES = []  # every step's loss, kept on the device until the run ends (no synchronisation in a step)


def training_step(model, optimizer, loss_of):
    """step(inputs): forward under bf16 autocast, backward, optimizer step, gradients dropped."""
    def step(*inputs):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(model, *inputs)
        loss.backward()
        LOSSES.append(loss.detach().float())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def build(name, dev, seed):
    """The model of workload NAME on device DEV; returns step(i), which runs training step i on inputs
    of a shape drawn from random.Random(SEED) and returns that shape as text."""
    torch.manual_seed(seed)
    shapes = random.Random(seed)

    needed = {"vit": "torchvision", "convnext": "torchvision", "llama_varlen": "transformers"}.get(name)
    if needed and importlib.util.find_spec(needed) is None:
        raise Unavailable(f"{needed} not installed")

    if name == "vit":
        import torchvision
        model = torchvision.models.vit_b_16(weights=None).to(dev)
        train = training_step(model, torch.optim.AdamW(model.parameters(), lr=1e-4),
                              lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y))

        def step(i):
            batch = shapes.choice([32, 64, 96, 128])
            train(torch.randn(batch, 3, 224, 224, device=dev), torch.randint(0, 1000, (batch,), device=dev))
            return f"batch {batch} at 224x224"
        return step

    if name == "convnext":
        import torchvision
        model = torchvision.models.convnext_tiny(weights=None).to(dev)
        train = training_step(model, torch.optim.AdamW(model.parameters(), lr=1e-4),
                              lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y))
        batch = 64

        def step(i):
            side = shapes.choice([160, 192, 224, 256, 288])
            train(torch.randn(batch, 3, side, side, device=dev), torch.randint(0, 1000, (batch,), device=dev))
            return f"batch {batch} at {side}x{side}"
        return step

    if name == "llama_varlen":
        from transformers import LlamaConfig, LlamaForCausalLM
        config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                             num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048)
        model = LlamaForCausalLM(config).to(dev)
        train = training_step(model, torch.optim.AdamW(model.parameters(), lr=1e-4),
                              lambda m, ids: m(input_ids=ids, labels=ids).loss)
        tokens = 16384

        def step(i):
            length = shapes.randint(128, 2048)
            batch = max(1, tokens // length)
            train(torch.randint(0, config.vocab_size, (batch, length), device=dev))
            return f"batch {batch} x {length} tokens"
        return step

    if name == "unet":
        if importlib.util.find_spec("diffusers") is not None:
            from diffusers import UNet2DModel
        else:  # the same network in plain PyTorch
            from diffusion_unet import UNet2DModel
        # A small DDPM-style UNet: attention at the two coarsest levels and in the middle block.
        model = UNet2DModel(
            in_channels=3, out_channels=3, layers_per_block=2, block_out_channels=(64, 128, 256, 256),
            down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D")).to(dev)

        def noise_prediction_loss(m, images, noise, timesteps):
            noisy = images + noise  # the noise schedule does not change what is allocated
            return torch.nn.functional.mse_loss(m(noisy, timesteps).sample.float(), noise)
        train = training_step(model, torch.optim.AdamW(model.parameters(), lr=1e-4), noise_prediction_loss)

        def step(i):
            batch, side = shapes.choice([16, 32, 48]), shapes.choice([64, 128])
            images = torch.randn(batch, 3, side, side, device=dev)
            train(images, torch.randn(batch, 3, side, side, device=dev),
                  torch.randint(0, 1000, (batch,), device=dev))
            return f"batch {batch} at {side}x{side}"
        return step

    raise SystemExit(f"unknown workload {name} (known: {', '.join(WORKLOADS)})")


def hold_all_but(room_mib, free):
    """Take the device's free memory but ROOM_MIB with one cuMemAlloc in the process's context (outside
    any allocator, never freed), so that the run finds a device it nearly fills. Returns the bytes taken."""
    import ctypes
    driver = ctypes.CDLL("libcuda.so.1")
    take = int(free - room_mib * 2**20)
    if take <= 0:
        return 0
    pointer = ctypes.c_uint64()
    status = driver.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(take))
    if status != 0:
        sys.exit(f"bench/more_workloads.py: cuMemAlloc of {take} bytes failed with CUDA error {status}")
    return take


def step_device_calls(before, after):
    """What gpumem's device calls took in one step (from two memory_stats readings): all of them in ms,
    the waits for a stream before unmapping memory it may still use (cuEventSynchronize) in ms and count,
    and the chunks created."""
    def spent(key):
        return after[key] - before[key]
    return {"ms": round(spent("device_call_ns") / 1e6, 2),
            "wait_ms": round(spent("device_call_ns.event_synchronize") / 1e6, 2),
            "waits": spent("device_calls.event_synchronize"), "created": spent("device_calls.physical_create")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=WORKLOADS)
    parser.add_argument("--seed", type=int, default=0, help="draws the input shapes and the weights")
    parser.add_argument("--steps", type=int, default=4, help="measured steps, after the warm-up")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--trace", help="record the run and write its allocation trace here")
    parser.add_argument("--device-room", type=float, metavar="MIB",
                        help="first take all but MIB of the device's free memory with cuMemAlloc, outside any "
                             "allocator: a device that the run nearly fills")
    a = parser.parse_args()
    dev = torch.device("cuda")
    free_at_start, total = torch.cuda.mem_get_info()  # creates the context, allocates nothing
    ballast = hold_all_but(a.device_room, free_at_start) if a.device_room else 0
    if a.trace:
        torch.cuda.memory._record_memory_history(max_entries=5_000_000, context=None, stacks="python")
    t0 = time.perf_counter()
    try:
        step = build(a.workload, dev, a.seed)
    except Unavailable as why:
        print(json.dumps({"workload": a.workload, "seed": a.seed, "unavailable": str(why)}), flush=True)
        sys.exit(UNAVAILABLE_STATUS)
    gpumem_torch = sys.modules.get("gpumem.torch")  # under GPUMEM_TORCH: gpumem's device-call counts too
    times, shapes, all_times, copies, device_calls, peaks = [], [], [], [], [], []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        before = gpumem_torch.allocator().memory_stats() if gpumem_torch else None
        s = time.perf_counter()
        shapes.append(step(i))
        torch.cuda.synchronize()
        all_times.append(time.perf_counter() - s)
        peaks.append([round(torch.cuda.max_memory_allocated() / 2**20, 1), round(torch.cuda.max_memory_reserved() / 2**20, 1)])
        if gpumem_torch:
            after = gpumem_torch.allocator().memory_stats()
            copies.append(after["device_calls.copy"] - before["device_calls.copy"])
            device_calls.append(step_device_calls(before, after))
        if i >= a.warmup:
            times.append(all_times[-1])
    res = {"workload": a.workload, "seed": a.seed, "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "native"),
           "steps": a.steps, "warmup": a.warmup, "shapes": shapes,
           "step_ms_median": 1e3 * statistics.median(times) if times else None,
           "total_s": time.perf_counter() - t0, "torch": torch.__version__,
           "losses": [loss.item() for loss in LOSSES], "step_ms": [round(1e3 * t, 2) for t in all_times],
           "copies_per_step": copies, "device_calls_per_step": device_calls,
           "peaks_so_far_MiB": peaks,  # after each step: [peak allocated, peak reserved] since the start
           "device": torch.cuda.get_device_name()}
    if a.workload == "unet":
        res["unet_from"] = "diffusers" if importlib.util.find_spec("diffusers") else "bench/diffusion_unet.py"
    st = torch.cuda.memory_stats()
    res["peak_alloc_MiB"] = st.get("allocated_bytes.all.peak", 0) / 2**20
    res["peak_reserved_MiB"] = st.get("reserved_bytes.all.peak", 0) / 2**20
    res["num_device_alloc"] = st.get("num_device_alloc")
    res["num_alloc_retries"] = st.get("num_alloc_retries")
    free, total = torch.cuda.mem_get_info()
    res["driver_used_end_MiB"] = (total - free) / 2**20
    res["driver_used_start_MiB"] = (total - free_at_start) / 2**20
    res["reserved_end_MiB"] = st.get("reserved_bytes.all.current", 0) / 2**20
    res["ballast_MiB"] = ballast / 2**20
    if a.trace:
        snap = torch.cuda.memory._snapshot()
        res["trace_events"] = export_trace(snap, a.trace)
        torch.cuda.memory._record_memory_history(enabled=None)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
