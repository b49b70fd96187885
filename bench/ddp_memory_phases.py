"""DDP on one GPU: allocated memory after each phase of each step, and each phase's peak, per allocator.

    python3 bench/ddp_memory_phases.py [--steps 4] [--modes ddp,plain] [--allocators torch-native,torch-expandable,gpumem]

bench/multi_gpu.py found DDP's peak allocated higher under gpumem than under PyTorch's allocator on one
GPU. Peak allocated is the sum of live tensors, which the program decides, not the allocator; so this
prints where in the step the extra memory lives. Each allocator runs in a process of its own: GPT-2
with 6 layers (8 x 1024 tokens, AdamW, fp32) as a DDP job of one rank (`ddp`) and without DDP
(`plain`); for each step, memory_allocated at its start and after forward, backward and the optimizer
step, each phase's peak in brackets (peaks reset at each phase). Needs a GPU, transformers and NCCL.
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
ALLOCATORS = {"torch-native": {}, "torch-expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
              "gpumem": {"GPUMEM_TORCH": "1"}}


def child(mode, steps):
    import torch
    import torch.distributed as distributed
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.cuda.set_device(0)
    distributed.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6)).cuda()
    if mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator(device="cuda").manual_seed(1)
    batches = [torch.randint(0, 50257, (8, 1024), device="cuda", generator=generator) for _ in range(4)]

    def phase(work):
        torch.cuda.reset_peak_memory_stats()
        result = work()
        torch.cuda.synchronize()
        return result, torch.cuda.memory_allocated() / MIB, torch.cuda.max_memory_allocated() / MIB

    for step in range(steps):
        ids = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        start = torch.cuda.memory_allocated() / MIB
        loss, forward, forward_peak = phase(lambda: model(input_ids=ids, labels=ids).loss)
        _, backward, backward_peak = phase(loss.backward)
        _, optimizer_step, optimizer_peak = phase(optimizer.step)
        print(f"{step} | {start:.0f} | {forward:.0f} ({forward_peak:.0f}) | {backward:.0f} ({backward_peak:.0f}) | "
              f"{optimizer_step:.0f} ({optimizer_peak:.0f})", flush=True)
    distributed.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--modes", default="ddp,plain")
    parser.add_argument("--allocators", default=",".join(ALLOCATORS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        return child(arguments.child, arguments.steps)
    unknown = [name for name in arguments.allocators.split(",") if name not in ALLOCATORS]
    unknown += [mode for mode in arguments.modes.split(",") if mode not in ("ddp", "plain")]
    if unknown:
        parser.error(f"unknown allocator(s) or mode(s): {', '.join(unknown)}")
    print("| mode | allocator | step | start MiB | after forward (peak) | after backward (peak) | after optimizer (peak) |")
    print("|---|---|---|---|---|---|---|")
    failed, port = 0, 29600
    for mode in arguments.modes.split(","):
        for allocator in arguments.allocators.split(","):
            port += 1  # a fresh port per process: the last one's may still be closing
            environment = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                               **ALLOCATORS[allocator])
            environment["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(ROOT, "python"),
                                                                      os.environ.get("PYTHONPATH")]))
            if allocator != "gpumem":
                environment.pop("GPUMEM_TORCH", None)
            run = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, "--steps",
                                  str(arguments.steps)], env=environment, capture_output=True, text=True)
            if run.returncode != 0:
                failed += 1
                print(f"{mode} under {allocator} failed (exit status {run.returncode}):\n{run.stderr[-2000:]}",
                      file=sys.stderr)
                continue
            for line in run.stdout.splitlines():
                print(f"| {mode} | {allocator} | {line} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
