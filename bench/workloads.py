"""Real PyTorch workloads for measuring GPU allocators side by side.

Copied from ../shared/anchors/workloads.py (how the anchors were measured), with additions for
gpumem's benchmark: --batch N (gpt2: batch of 1024-token sequences; bert_varlen: batch of 512-token
sequences, the longest it draws), --memory-fraction F (torch.cuda.set_per_process_memory_fraction
before the model is built), --no-cudnn-attention (attention without cuDNN's backend, whose plan
building on the host for every new shape dominates bert_varlen's step time and its noise) and
--lockstep R,W (take turns with another process, one step each, through two pipes), --replay-shapes
(the measured steps repeat the warm-up steps' shapes: with as many warm-up as measured steps, every
measured shape has been seen once, so per-shape setup such as cuDNN's plans is not timed). An
out-of-memory error prints {"oom": true, "message": ..., peaks} and exits 3.

Usage: python3 workloads.py WORKLOAD [--steps N] [--trace OUT.csv] [--json OUT.json]
The allocator is chosen by PYTORCH_CUDA_ALLOC_CONF (native, expandable_segments,
backend:cudaMallocAsync) or by --pluggable LIB.so (a CUDAPluggableAllocator).
Prints one JSON line: peak allocated / reserved, median step time.
"""
import argparse, json, os, sys, time, statistics, random

import torch


def build(name, dev, batch=None, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    random.seed(seed)
    if name == "resnet50":
        import torchvision
        m = torchvision.models.resnet50(weights=None).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        bs = 256

        def step(i):
            x = torch.randn(bs, 3, 224, 224, device=dev)
            y = torch.randint(0, 1000, (bs,), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024)
        m = GPT2LMHeadModel(cfg).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        bs = batch or 16

        def step(i):
            L, b = 1024, bs
            ids = torch.randint(0, cfg.vocab_size, (b, L), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = m(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    if name == "bert_varlen":
        from transformers import BertConfig, BertForMaskedLM
        cfg = BertConfig()  # bert-base shape
        m = BertForMaskedLM(cfg).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)

        def step(i):
            L = random.randint(32, 512) if not batch else 512
            b = random.choice([8, 16, 24, 32, 48, 64]) if not batch else batch
            ids = torch.randint(0, cfg.vocab_size, (b, L), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = m(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    if name == "llm_generate":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=24, n_embd=1024, n_head=16, n_positions=2048)
        m = GPT2LMHeadModel(cfg).to(dev, dtype=torch.bfloat16).eval()

        def step(i):
            b = random.choice([4, 8, 16, 32])
            p = random.randint(16, 256)
            n = random.randint(64, 384)
            ids = torch.randint(0, cfg.vocab_size, (b, p), device=dev)
            with torch.no_grad():
                m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                           min_new_tokens=n, do_sample=False, pad_token_id=0)
        return step

    raise SystemExit(f"unknown workload {name}")


def export_trace(snap, path):
    """Compact trace: one line per event: a|f,id,size,stream (ids instead of addresses)."""
    ids, nxt, n = {}, 0, 0
    with open(path, "w") as f:
        f.write("# op,id,size,stream\n")
        for dt in snap["device_traces"]:
            for e in dt:
                a = e["action"]
                if a == "alloc":
                    ids[e["addr"]] = nxt
                    f.write(f"a,{nxt},{e['size']},{e['stream']}\n")
                    nxt += 1; n += 1
                elif a == "free_requested":
                    i = ids.pop(e["addr"], None)
                    if i is not None:
                        f.write(f"f,{i},{e['size']},{e['stream']}\n"); n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--trace")
    ap.add_argument("--pluggable")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--memory-fraction", type=float)
    ap.add_argument("--lockstep", metavar="READ_FD,WRITE_FD",
                    help="take turns with another process: before each step read one byte from READ_FD, after "
                         "it write one to WRITE_FD (bench/torch_workloads.py --lockstep)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the random shapes (default 0, the anchors' runs); another seed records "
                         "another trace of the same workload")
    ap.add_argument("--replay-shapes", action="store_true",
                    help="the measured steps draw the same shapes as the warm-up steps (random's state is put "
                         "back after warm-up), so no measured step pays for a shape seen the first time")
    ap.add_argument("--no-cudnn-attention", action="store_true",
                    help="scaled-dot-product attention without cuDNN's backend (which builds a plan on the host "
                         "for every new shape)")
    a = ap.parse_args()
    if a.pluggable:
        alloc = torch.cuda.memory.CUDAPluggableAllocator(a.pluggable, "gm_torch_malloc", "gm_torch_free")
        torch.cuda.memory.change_current_allocator(alloc)
    dev = torch.device("cuda")
    if a.no_cudnn_attention:
        torch.backends.cuda.enable_cudnn_sdp(False)
    if a.trace:
        torch.cuda.memory._record_memory_history(max_entries=5_000_000, context=None, stacks="python")
    if a.memory_fraction:
        torch.cuda.set_per_process_memory_fraction(a.memory_fraction)
    t0 = time.perf_counter()
    times = []
    try:
        step = build(a.workload, dev, a.batch, a.seed)
        turn_in, turn_out = map(int, a.lockstep.split(",")) if a.lockstep else (None, None)
        shapes = random.getstate()
        for i in range(a.warmup + a.steps):
            if a.replay_shapes and i == a.warmup:
                random.setstate(shapes)
            torch.cuda.synchronize()
            if turn_in is not None and os.read(turn_in, 1) != b"s":
                sys.exit("lockstep: the coordinator went away")
            s = time.perf_counter()
            step(i)
            torch.cuda.synchronize()
            if i >= a.warmup:
                times.append(time.perf_counter() - s)
            if turn_out is not None:
                os.write(turn_out, b"d")
    except torch.OutOfMemoryError as error:
        # The allocator's own message (gpumem's explains the request, reserved vs allocated and what it
        # tried) and the peaks reached before the failure.
        res = {"workload": a.workload, "oom": True, "batch": a.batch, "memory_fraction": a.memory_fraction,
               "message": str(error).split("\nException raised from")[0][:4000]}
        try:
            res["peak_alloc_MiB"] = torch.cuda.max_memory_allocated() / 2**20
            res["peak_reserved_MiB"] = torch.cuda.max_memory_reserved() / 2**20
            res["reserved_at_oom_MiB"] = torch.cuda.memory_reserved() / 2**20
        except Exception as e:
            res["stats_error"] = str(e)[:100]
        print(json.dumps(res), flush=True)
        sys.exit(3)
    res = {"workload": a.workload,
           "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "native") if not a.pluggable else "pluggable",
           "steps": a.steps, "step_ms_median": 1e3 * statistics.median(times),
           "step_ms": [round(1e3 * t, 3) for t in times], "batch": a.batch, "memory_fraction": a.memory_fraction,
           "total_s": time.perf_counter() - t0}
    try:
        st = torch.cuda.memory_stats()
        res["peak_alloc_MiB"] = st.get("allocated_bytes.all.peak", 0) / 2**20
        res["peak_reserved_MiB"] = st.get("reserved_bytes.all.peak", 0) / 2**20
        res["num_device_alloc"] = st.get("num_device_alloc")
        res["num_alloc_retries"] = st.get("num_alloc_retries")
    except Exception as e:  # pluggable allocators have no stats
        res["stats_error"] = str(e)[:100]
    free, total = torch.cuda.mem_get_info()
    res["driver_used_end_MiB"] = (total - free) / 2**20
    res["device_total_MiB"] = total / 2**20
    if a.trace:
        snap = torch.cuda.memory._snapshot()
        res["trace_events"] = export_trace(snap, a.trace)
        torch.cuda.memory._record_memory_history(enabled=None)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
