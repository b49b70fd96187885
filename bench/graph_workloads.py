"""Workloads that run through CUDA graphs, under PyTorch's allocator and under gpumem: what they cost
in time and memory and whether their results are the same. Prints a markdown table.

    python3 bench/graph_workloads.py [--workloads captured_training,shared_pool_decode,compiled_training,
                                      compiled_inference] [--allocators torch-native,torch-expandable,gpumem,
                                      torch-native] [--iterations 50] [--repeats 7] [--out results.jsonl]
                                     [--snapshots FOLDER]

CUDA graphs are how inference servers and torch.compile users cut launch overhead, and each uses the
allocator's private pools in its own way:

- captured_training: a whole training step (forward, backward, a capturable Adam step) captured once
  with torch.cuda.graph, as PyTorch's documentation shows it, then replayed on new data copied into the
  static inputs; the graph's memory stays reserved for its replays.
- shared_pool_decode: a small decoder's one-token step with a preallocated KV cache captured for batch
  sizes 64 down to 1, every graph in one pool (torch.cuda.graph_pool_handle), largest first, as
  serving engines capture theirs; then the graphs replayed in turn.
- compiled_training: the same model as captured_training under torch.compile(mode="reduce-overhead"):
  cudagraph trees record forward and backward into their pool and replay them.
- compiled_inference: torchvision's ResNet-50 (bf16, channels-last) under
  torch.compile(mode="reduce-overhead"), batch 64.

Every (workload, allocator) is a fresh process (this script with --child). Columns: setup s (model,
warm-up and capture or compilation; the second process of a workload finds inductor's on-disk cache
filled by the first, so compare setup only between later runs), ms per iteration (median over the
repeats, each a loop of ITERATIONS replays timed between two synchronizations; spread = max - min),
memory (torch.cuda.memory_stats): the peaks of the setup, what is allocated and reserved after it, and
the peaks of the timed iterations (the peaks reset after the setup), and whether every output
(losses, logits) equals the first torch-native run's bit for bit. An allocator named twice runs
twice: the default list ends with a second torch-native run, the control that shows whether a
workload gives the same results twice. Exit status 1 if any run failed.
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

from torch_allocators import environment

ALLOCATORS = ("torch-native", "torch-expandable", "gpumem")
WORKLOADS = ("captured_training", "shared_pool_decode", "compiled_training", "compiled_inference")
MIB = 1 << 20


# ------------------------------------------------------------------------------------------ the child


def mlp_model(torch, seed):
    """Blocks of LayerNorm, Linear, GELU, Linear with a residual: deterministic kernels only (no atomics
    in its backward), so that two allocators can be held to identical losses."""
    torch.manual_seed(seed)

    class Block(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.norm = torch.nn.LayerNorm(width)
            self.up = torch.nn.Linear(width, 4 * width)
            self.down = torch.nn.Linear(4 * width, width)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    width = 1024
    return torch.nn.Sequential(*[Block(width) for _ in range(8)], torch.nn.Linear(width, 1024)).cuda()


def training_batches(torch, count, seed):
    generator = torch.Generator("cuda").manual_seed(seed)
    return [(torch.randn(64, 256, 1024, device="cuda", generator=generator),
             torch.randint(0, 1024, (64, 256), device="cuda", generator=generator)) for _ in range(count)]


def loss_of(torch, model, data, target):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(data)
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), target.flatten())


def captured_training(torch, iterations):
    """Returns (run(step) for one timed step, outputs so far)."""
    model = mlp_model(torch, 0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=True)
    batches = training_batches(torch, 8, 1)
    static_data, static_target = (tensor.clone() for tensor in batches[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as the documentation's example
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            loss_of(torch, model, static_data, static_target).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_of(torch, model, static_data, static_target)
        static_loss.backward()
        optimizer.step()
    losses = []

    def step(index):
        data, target = batches[index % len(batches)]
        static_data.copy_(data)
        static_target.copy_(target)
        graph.replay()
        losses.append(static_loss.detach().clone())
    return step, losses


def decoder(torch, seed, layers=4, width=1024, vocabulary=8192, max_batch=64, max_length=512):
    """A one-token decoding step over a preallocated KV cache: step(tokens, position) -> logits."""
    torch.manual_seed(seed)
    embed = torch.nn.Embedding(vocabulary, width).cuda().bfloat16()
    blocks = [torch.nn.ModuleDict({"qkv": torch.nn.Linear(width, 3 * width), "out": torch.nn.Linear(width, width),
                                   "up": torch.nn.Linear(width, 4 * width), "down": torch.nn.Linear(4 * width, width)})
              .cuda().bfloat16() for _ in range(layers)]
    head = torch.nn.Linear(width, vocabulary).cuda().bfloat16()
    heads = 16
    cache = [torch.zeros(2, max_batch, heads, max_length, width // heads, device="cuda", dtype=torch.bfloat16)
             for _ in range(layers)]

    def step(tokens, position):
        batch = tokens.shape[0]
        x = embed(tokens)  # (batch, width)
        for block, kv in zip(blocks, cache):
            q, k, v = block["qkv"](x).view(batch, 3, heads, 1, width // heads).unbind(1)
            kv[0, :batch].index_copy_(2, position, k)
            kv[1, :batch].index_copy_(2, position, v)
            mask = (torch.arange(max_length, device="cuda") <= position).view(1, 1, 1, max_length)
            attended = torch.nn.functional.scaled_dot_product_attention(q, kv[0, :batch], kv[1, :batch],
                                                                        attn_mask=mask)
            x = x + block["out"](attended.reshape(batch, width))
            x = x + block["down"](torch.nn.functional.gelu(block["up"](x)))
        return head(x)
    return step


def shared_pool_decode(torch, iterations):
    # cuBLAS may pick another reduction for the same product from one process to the next (its
    # workspace differs per stream): without its deterministic mode two torch-native runs differ.
    torch.use_deterministic_algorithms(True)
    step = decoder(torch, 0)
    sizes = (64, 32, 16, 8, 4, 2, 1)
    pool = torch.cuda.graph_pool_handle()
    graphs = {}
    with torch.no_grad():
        for batch in sizes:  # largest first: the smaller graphs reuse the larger one's memory
            tokens = torch.zeros(batch, dtype=torch.long, device="cuda")
            position = torch.zeros(1, dtype=torch.long, device="cuda")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step(tokens, position)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = step(tokens, position)
            graphs[batch] = (graph, tokens, position, logits)
    outputs = []

    def run(index):
        batch = sizes[index % len(sizes)]
        graph, tokens, position, logits = graphs[batch]
        tokens.copy_((torch.arange(batch, device="cuda") * 7 + index) % 8192)
        position.fill_(index % 512)
        graph.replay()
        outputs.append(logits[:, :64].clone())
    return run, outputs


def compiled_training(torch, iterations):
    model = mlp_model(torch, 0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    compiled = torch.compile(model, mode="reduce-overhead")
    batches = training_batches(torch, 8, 1)
    losses = []

    def step(index):
        torch.compiler.cudagraph_mark_step_begin()
        data, target = batches[index % len(batches)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = compiled(data)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), target.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach().clone())
    for index in range(3):  # warm-up, recording
        step(index)
    return step, losses


def compiled_inference(torch, iterations):
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda().eval().to(memory_format=torch.channels_last).bfloat16()
    compiled = torch.compile(model, mode="reduce-overhead")
    generator = torch.Generator("cuda").manual_seed(1)
    images = [torch.randn(64, 3, 224, 224, device="cuda", generator=generator, dtype=torch.bfloat16)
              .contiguous(memory_format=torch.channels_last) for _ in range(4)]
    outputs = []

    def step(index):
        with torch.no_grad():
            outputs.append(compiled(images[index % len(images)]).clone())
    for index in range(3):
        step(index)
    return step, outputs


def run_child(workload, iterations, repeats, snapshot):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
    import torch
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=1000000)
    started = time.perf_counter()
    step, outputs = globals()[workload](torch, iterations)
    torch.cuda.synchronize()
    setup_s = time.perf_counter() - started
    setup_stats = torch.cuda.memory_stats()
    torch.cuda.reset_peak_memory_stats()
    index = 0
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(iterations):
            step(index)
            index += 1
        torch.cuda.synchronize()
        times.append((time.perf_counter() - began) * 1000 / iterations)
    digest = hashlib.sha256()
    for output in outputs[-(len(outputs) // 2):]:  # the later half: every graph replayed many times by then
        digest.update(output.float().cpu().numpy().tobytes())
    if snapshot:
        torch.cuda.memory._dump_snapshot(snapshot)
    stats = torch.cuda.memory_stats()
    segments = [{"bytes": segment["total_size"], "allocated": segment["allocated_size"],
                 "private_pool": list(segment["segment_pool_id"]) != [0, 0], "stream": segment["stream"]}
                for segment in torch.cuda.memory_snapshot()]
    print(json.dumps({"setup_s": setup_s, "ms_per_iteration": times,
                      "setup_peak_allocated_MiB": setup_stats["allocated_bytes.all.peak"] / MIB,
                      "setup_peak_reserved_MiB": setup_stats["reserved_bytes.all.peak"] / MIB,
                      "allocated_after_setup_MiB": setup_stats["allocated_bytes.all.current"] / MIB,
                      "reserved_after_setup_MiB": setup_stats["reserved_bytes.all.current"] / MIB,
                      "peak_allocated_MiB": stats["allocated_bytes.all.peak"] / MIB,
                      "peak_reserved_MiB": stats["reserved_bytes.all.peak"] / MIB,
                      "segments": segments, "outputs": digest.hexdigest(), "output_count": len(outputs)}))


# ----------------------------------------------------------------------------------------- the parent


def run(workload, allocator, iterations, repeats, snapshots, label):
    command = [sys.executable, os.path.abspath(__file__), "--child", workload, "--iterations", str(iterations),
               "--repeats", str(repeats)]
    if snapshots:
        os.makedirs(snapshots, exist_ok=True)
        name = f"{workload}-{label.replace(' (again)', '-again')}.pickle"
        command += ["--snapshot", os.path.join(snapshots, name)]
    done = subprocess.run(command, env=environment(allocator), capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines and done.returncode == 0 else {"error": done.stderr[-2500:]}
    result.update(allocator=allocator, workload=workload, exit=done.returncode)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--allocators", default=",".join(ALLOCATORS) + ",torch-native")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out")
    parser.add_argument("--snapshots", metavar="FOLDER", help="record each run's memory history and dump its "
                        "snapshot there (WORKLOAD-ALLOCATOR.pickle, for memory_viz); slows the runs a little")
    parser.add_argument("--child", choices=WORKLOADS, help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        return run_child(a.child, a.iterations, a.repeats, a.snapshot)
    unknown = [name for name in a.workloads.split(",") if name not in WORKLOADS]
    unknown += [name for name in a.allocators.split(",") if name not in ALLOCATORS]
    if unknown:
        sys.exit(f"graph_workloads: unknown workload or allocator: {', '.join(unknown)}")
    allocators = a.allocators.split(",")
    print("| workload | allocator | setup s | ms per iteration (median) | spread | setup: peak allocated MiB | "
          "setup: peak reserved MiB | after setup: allocated MiB | after setup: reserved MiB | iterations: peak "
          "allocated MiB | iterations: peak reserved MiB | outputs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    failed = False
    for workload in a.workloads.split(","):
        reference = None
        for index, allocator in enumerate(allocators):
            label = allocator + (" (again)" if allocator in allocators[:index] else "")
            r = run(workload, allocator, a.iterations, a.repeats, a.snapshots, label)
            if a.out:
                with open(a.out, "a") as out:
                    out.write(json.dumps(r) + "\n")
            if r["exit"] != 0:
                failed = True
                last = r["error"].strip().splitlines()[-1] if r["error"].strip() else f"exit status {r['exit']}"
                print(f"| {workload} | {label} | failed: {last} |||||||||||", flush=True)
                print(r["error"], file=sys.stderr)
                continue
            if allocator == "torch-native" and reference is None:
                reference = r["outputs"]
            same = "no reference" if reference is None else ("identical" if r["outputs"] == reference else "DIFFER")
            times = r["ms_per_iteration"]
            print(f"| {workload} | {label} | {r['setup_s']:.1f} | {statistics.median(times):.3f} | "
                  f"{max(times) - min(times):.3f} | {r['setup_peak_allocated_MiB']:.1f} | {r['setup_peak_reserved_MiB']:.1f} | "
                  f"{r['allocated_after_setup_MiB']:.1f} | {r['reserved_after_setup_MiB']:.1f} | "
                  f"{r['peak_allocated_MiB']:.1f} | {r['peak_reserved_MiB']:.1f} | {same} |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
