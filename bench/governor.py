"""The governor on real workloads (issue 15's benchmarks), on a GPU: prints three Markdown tables.

    python3 bench/governor.py [--steps N] [--workloads gpt2,bert,llama] [--out results.jsonl]

1. Under a cap: each workload's native peak reserved is measured uncapped (PyTorch's own allocator,
   a fresh process), then the cap (set_per_process_memory_fraction) is set to 70% of it. Native runs
   under the cap (it runs out of memory); gpumem with gpumem.torch.adaptive runs under the same cap.
   The loss curves are compared with the uncapped native run's.
2. Batch-size finders under the same cap, each in a fresh process on gpumem: gpumem.torch.find_batch_size,
   a Lightning-style finder (double from 2 until out of memory, then binary search, as Lightning's
   BatchSizeFinder in "binsearch" mode) and an accelerate-style one (start at 512, on out of memory
   retry with 90% of the batch, as accelerate's find_executable_batch_size). Trials, OOMs, wall time,
   the batch found.
3. Leak detection: gpumem.torch.watch_leaks on each workload as it is (no warning expected) and with
   the classic leak (the loss tensor kept every step): the step at which it warns.

Workloads (transformers models, bf16 autocast, AdamW): gpt2 (12 layers, 1024 tokens), bert (bert-base
masked LM, 512 tokens), llama (a small Llama: 8 layers, 1024 hidden, 1024 tokens). The batch is the
first dimension; the benchmarks use fixed lengths so that a batch size means one thing.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = {"gpt2": 24, "bert": 96, "llama": 24}
MARGIN = float(os.environ.get("GOVERNOR_MARGIN", "0"))  # find_batch_size's margin below the cap


def build(name, device="cuda"):
    """model, loss_of(batch), make_batch(n), optimizer."""
    import torch
    import transformers
    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024)
        model, length = transformers.GPT2LMHeadModel(config), 1024
    elif name == "bert":
        config = transformers.BertConfig()
        model, length = transformers.BertForMaskedLM(config), 512
    else:
        config = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                          num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                                          max_position_embeddings=2048)
        model, length = transformers.LlamaForCausalLM(config), 1024
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator(device="cpu").manual_seed(1)

    def make_batch(size):
        return torch.randint(0, config.vocab_size, (size, length), generator=generator).to(device)

    def loss_of(ids):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(input_ids=ids, labels=ids).loss

    return model, loss_of, make_batch, optimizer


# ---------------------------------------------------------------- runs, each in a fresh process

def run_training(name, steps, fraction, adaptive):
    import torch
    if fraction:
        torch.cuda.set_per_process_memory_fraction(fraction)
    model, loss_of, make_batch, optimizer = build(name)
    batches = [make_batch(BATCH[name]) for _ in range(steps)]
    step = None
    if adaptive:
        import gpumem.torch
        step = gpumem.torch.adaptive(loss_of, model, log=lambda line: print(line, file=sys.stderr))
    losses = []
    try:
        for ids in batches:
            optimizer.zero_grad(set_to_none=True)
            if step:
                losses.append(step(ids).item())
            else:
                loss = loss_of(ids)
                loss.backward()
                losses.append(loss.item())
            optimizer.step()
    except torch.OutOfMemoryError:
        return {"losses": losses, "oom_at_step": len(losses), "peak_reserved": torch.cuda.max_memory_reserved()}
    result = {"losses": losses, "oom_at_step": None, "peak_reserved": torch.cuda.max_memory_reserved()}
    if step:
        result.update(micro_batches=step.micro_batches, counts=step.counts)
    return result


def lightning_style(step, make_batch):
    """Double from 2 until out of memory, then binary search (Lightning's BatchSizeFinder, binsearch)."""
    import torch
    trials, ooms = 0, 0

    def fits(size):
        nonlocal trials, ooms
        trials += 1
        try:
            step(make_batch(size))
            torch.cuda.synchronize()
            return True
        except torch.OutOfMemoryError:
            ooms += 1
            return False
    low, high = 1, 2
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low, trials, ooms


def accelerate_style(step, make_batch, start=512):
    """From `start`, on out of memory try 90% of the batch (accelerate's find_executable_batch_size)."""
    import torch
    size, trials, ooms = start, 0, 0
    while size > 0:
        trials += 1
        try:
            step(make_batch(size))
            torch.cuda.synchronize()
            return size, trials, ooms
        except torch.OutOfMemoryError:
            ooms += 1
            size = int(size * 0.9)
    return 0, trials, ooms


def run_finder(name, finder, fraction):
    import torch
    import gpumem.torch
    torch.cuda.set_per_process_memory_fraction(fraction)
    model, loss_of, make_batch, optimizer = build(name)

    def step(ids):
        optimizer.zero_grad(set_to_none=True)
        loss_of(ids).backward()
        optimizer.step()
    started, extra = time.perf_counter(), {}
    if finder == "gpumem":
        lines = []
        search = gpumem.torch.find_batch_size(step, make_batch, state=(model, optimizer), margin=MARGIN,
                                              log=lines.append)
        found, trials, ooms = search.batch_size, len(search.trials), search.out_of_memory
        if os.environ.get("GOVERNOR_DUMP"):  # the recorded trials, to study the prediction offline
            import pickle
            with open(os.path.join(os.environ["GOVERNOR_DUMP"], f"{name}-trials.pickle"), "wb") as file:
                pickle.dump({"budget": int(search.budget), "trials": [vars(t) for t in search.recorded],
                             "config": gpumem.torch.installed_config()}, file)
        extra = {"predicted": search.predicted, "paired": search.paired, "outside": search.outside, "peaks": search.peaks,
                 "trial_list": search.trials, "log": lines}
    elif finder == "lightning":
        found, trials, ooms = lightning_style(step, make_batch)
    else:
        found, trials, ooms = accelerate_style(step, make_batch)
    return {"batch": found, "trials": trials, "ooms": ooms, "seconds": time.perf_counter() - started, **extra}


def run_leak(name, steps, leak):
    import torch
    import gpumem.torch
    model, loss_of, make_batch, optimizer = build(name)
    watch = gpumem.torch.watch_leaks(steps=5, warmup=2, log=lambda line: None)
    kept, warned_at = [], None
    for index in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(make_batch(4))
        loss.backward()
        optimizer.step()
        kept.append(loss if leak else loss.item())
        if watch.step() and warned_at is None:
            warned_at = index + 1
    return {"warned_at_step": warned_at}


def child(arguments):
    kind, name = arguments.child
    if kind == "train":
        result = run_training(name, arguments.steps, arguments.fraction, arguments.adaptive)
    elif kind == "finder":
        result = run_finder(name, arguments.finder, arguments.fraction)
    else:
        result = run_leak(name, arguments.steps, arguments.leak)
    print("RESULT " + json.dumps(result), flush=True)


def spawn(extra, gpumem=True):
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.path.join(ROOT, "python")
    if gpumem:
        environment["GPUMEM_TORCH"] = "1"
    else:
        environment.pop("GPUMEM_TORCH", None)
    run = subprocess.run([sys.executable, os.path.abspath(__file__)] + extra, env=environment, capture_output=True,
                         text=True)
    for line in run.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{' '.join(extra)} failed:\n{run.stderr[-3000:]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--workloads", default="gpt2,bert,llama")
    parser.add_argument("--out")
    parser.add_argument("--tables", default="cap,finder,leak", help="which tables: cap, finder, leak")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--fraction", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--adaptive", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--finder", help=argparse.SUPPRESS)
    parser.add_argument("--leak", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        return child(arguments)
    import torch
    total = torch.cuda.get_device_properties(0).total_memory
    names = arguments.workloads.split(",")
    records = []
    tables = arguments.tables.split(",")
    if "cap" in tables:
        caps = cap_table(names, arguments, total, records)
    else:  # the caps only: 70% of each workload's uncapped native peak
        caps = {name: 0.7 * spawn(["--child", "train", name, "--steps", "2"], gpumem=False)["peak_reserved"] / total
                for name in names}
    if "finder" in tables:
        finder_table(names, caps, records)
    if "leak" in tables:
        leak_table(names, records)
    if arguments.out:
        with open(arguments.out, "w") as out:
            for record in records:
                out.write(json.dumps(record) + "\n")


def cap_table(names, arguments, total, records):
    print("## Under a cap of 70% of native's peak reserved\n")
    print("| workload | batch | native peak reserved (MiB) | cap (MiB) | native under the cap | gpumem adaptive under "
          "the cap | micro-batches | max loss difference to uncapped native |")
    print("|---|---|---|---|---|---|---|---|")
    caps = {}
    for name in names:
        steps = ["--steps", str(arguments.steps)]
        native = spawn(["--child", "train", name] + steps, gpumem=False)
        cap = 0.7 * native["peak_reserved"]
        caps[name] = cap / total
        capped = spawn(["--child", "train", name, "--fraction", str(caps[name])] + steps, gpumem=False)
        adaptive = spawn(["--child", "train", name, "--fraction", str(caps[name]), "--adaptive"] + steps)
        difference = max((abs(a - b) for a, b in zip(adaptive["losses"], native["losses"])), default=float("nan"))
        native_text = (f"out of memory at step {capped['oom_at_step'] + 1}" if capped["oom_at_step"] is not None
                       else f"{len(capped['losses'])} steps")
        adaptive_text = (f"out of memory at step {adaptive['oom_at_step'] + 1}" if adaptive["oom_at_step"] is not None
                         else f"{len(adaptive['losses'])} of {arguments.steps} steps")
        print(f"| {name} | {BATCH[name]} | {native['peak_reserved'] / 2**20:.0f} | {cap / 2**20:.0f} | {native_text} | "
              f"{adaptive_text} | {adaptive.get('micro_batches', '-')} | {difference:.4f} |", flush=True)
        records.append({"table": "cap", "workload": name, "native": native, "capped": capped, "adaptive": adaptive})
    return caps


def finder_table(names, caps, records):
    print("\n## Batch-size finders under the same cap (on gpumem)\n")
    print("| workload | finder | batch found | trials | out of memory | seconds |")
    print("|---|---|---|---|---|---|")
    for name in names:
        for finder in ("gpumem", "lightning", "accelerate"):
            result = spawn(["--child", "finder", name, "--fraction", str(caps[name]), "--finder", finder])
            print(f"| {name} | {finder} | {result['batch']} | {result['trials']} | {result['ooms']} | "
                  f"{result['seconds']:.1f} |", flush=True)
            records.append({"table": "finder", "workload": name, "finder": finder, **result})


def leak_table(names, records):
    print("\n## Leak detection (watch_leaks: 5 growing boundaries after 2 warm-up steps)\n")
    print("| workload | without a leak: warning | keeping `loss` each step: warned at step |")
    print("|---|---|---|")
    for name in names:
        clean = spawn(["--child", "leak", name, "--steps", "20"])
        leaky = spawn(["--child", "leak", name, "--steps", "20", "--leak"])
        print(f"| {name} | {'none' if clean['warned_at_step'] is None else 'at step %d' % clean['warned_at_step']} | "
              f"{leaky['warned_at_step']} |", flush=True)
        records.append({"table": "leak", "workload": name, "clean": clean, "leaky": leaky})


if __name__ == "__main__":
    main()
