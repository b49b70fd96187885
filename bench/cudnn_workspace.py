"""Convolutions under each allocator with torch.backends.cudnn.benchmark off and on: the workspace cuDNN's
chosen plan uses and the time of a forward and backward pass. Prints a markdown table.

    python3 bench/cudnn_workspace.py [--allocators torch-native,torch-expandable,gpumem] [--repeats 2]
                                     [--out results.jsonl]

cuDNN leaves out every plan whose workspace is larger than what the allocator's cacheInfo answers
(the largest allocation it can serve now); the plan chosen for a shape is kept for the rest of the
process. Each run is a fresh process that empties the cache before each shape's first convolution, as
at the start of training or after torch.cuda.empty_cache(). Times are medians of 50 passes; the
allocators take turns, `--repeats` times.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from torch_allocators import SETTINGS, environment

SHAPES = ((32, 256, 32), (48, 128, 64), (16, 64, 128))  # batch, channels, side: 3x3 convolutions


def measure(benchmark):
    import torch
    torch.backends.cudnn.benchmark = benchmark
    result = {}
    for batch, channels, side in SHAPES:
        conv = torch.nn.Conv2d(channels, channels, 3, padding=1).cuda()
        images = torch.randn(batch, channels, side, side, device="cuda", requires_grad=True)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        conv(images).sum().backward()  # the plans are chosen here, with nothing cached
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad():
            output = conv(images)
            torch.cuda.synchronize()
        workspace = torch.cuda.max_memory_allocated() - base - output.numel() * output.element_size()
        del output
        times = []
        for _ in range(50):
            torch.cuda.synchronize()
            start = time.perf_counter()
            conv(images).sum().backward()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        result[f"{batch}x{channels}x{side}x{side}"] = {"workspace_MiB": workspace / 2**20,
                                                       "ms": 1e3 * statistics.median(times)}
    return result


def run(allocator, benchmark):
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(int(benchmark))],
                          env=environment(allocator), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{allocator} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def main():
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(measure(sys.argv[2] == "1")))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--allocators", default="torch-native,torch-expandable,gpumem")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out")
    a = parser.parse_args()
    allocators = a.allocators.split(",")
    for name in allocators:
        if name not in SETTINGS:
            raise SystemExit(f"unknown allocator {name} (known: {', '.join(SETTINGS)})")
    runs = {}
    for repeat in range(a.repeats):
        for benchmark in (False, True):
            for allocator in allocators:
                r = run(allocator, benchmark)
                runs.setdefault((benchmark, allocator), []).append(r)
                if a.out:
                    with open(a.out, "a") as out:
                        out.write(json.dumps({"allocator": allocator, "benchmark": benchmark, "repeat": repeat,
                                              "shapes": r}) + "\n")
    print("| cudnn.benchmark | shape (batch x channels x side x side) | allocator | workspace MiB | "
          "fwd+bwd ms (median of runs) | runs' ms |")
    print("|---|---|---|---|---|---|")
    for benchmark in (False, True):
        for shape in runs[(benchmark, allocators[0])][0]:
            for allocator in allocators:
                results = [r[shape] for r in runs[(benchmark, allocator)]]
                workspaces = sorted({round(r["workspace_MiB"], 1) for r in results})
                times = [r["ms"] for r in results]
                print(f"| {'on' if benchmark else 'off'} | {shape} | {allocator} | "
                      f"{' / '.join(str(w) for w in workspaces)} | {statistics.median(times):.3f} | "
                      f"{' / '.join(f'{t:.3f}' for t in times)} |")


if __name__ == "__main__":
    main()
