"""Diagnostic: record find_batch_size's trials (and larger steps) event by event, with Python stacks,
for offline study of the step model. Writes OUT/trials-<workload>.json.gz."""
import gzip
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gpumem.torch  # noqa: E402
gpumem.torch.install()
from gpumem import batch_size as bs  # noqa: E402

F = torch.nn.functional


def record(step, make_batch, size):
    batch = make_batch(size)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start, reserved_start = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.memory._record_memory_history(max_entries=1 << 20, context="alloc", stacks="python")
    ok = True
    try:
        step(batch)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError:
        ok = False
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [(e["action"], e.get("addr"), e.get("size", 0), e.get("stream", 0),
               [f"{f['filename']}:{f['line']}:{f['name']}" for f in e.get("frames", [])][:8])
              for e in snapshot["device_traces"][0]]
    tensors = bs._device_tensors(batch)
    del batch
    return dict(size=size, ok=ok, start=start, reserved_start=reserved_start, tensors=tensors,
                peak_reserved=torch.cuda.max_memory_reserved(), peak_allocated=torch.cuda.max_memory_allocated(),
                limit=gpumem.torch.allocator().memory_limit(), events=events)


def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024),
                                torch.nn.GELU(), torch.nn.Linear(1024, 10)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step(batch):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(batch[0]).mean(1), batch[1]).backward()
        optimizer.step()

    def make_batch(size):
        return torch.randn(size, 128, 1024, device="cuda"), torch.randint(0, 10, (size,), device="cuda")
    return model, step, make_batch, optimizer


def main():
    name, sizes = sys.argv[1], [int(size) for size in sys.argv[2].split(",")]
    out = os.environ.get("OUT", ".")
    if name == "mlp":
        model, step, make_batch, optimizer = mlp()
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 6 * 2**30) / total)
    else:
        import governor as bench
        model, loss_of, make_batch, optimizer = bench.build(name)

        def step(ids):
            optimizer.zero_grad(set_to_none=True)
            loss_of(ids).backward()
            optimizer.step()
        if len(sys.argv) > 3:
            torch.cuda.set_per_process_memory_fraction(float(sys.argv[3]))
    torch.cuda.empty_cache()
    trials = [record(step, make_batch, size) for size in sizes]
    for trial in trials:
        print(name, trial["size"], trial["ok"], len(trial["events"]), trial["peak_reserved"], trial["peak_allocated"])
    search = gpumem.torch.find_batch_size(step, make_batch, state=(model, optimizer))
    print(name, "find_batch_size", search, search.trials)
    with gzip.open(os.path.join(out, f"trials-{name}.json.gz"), "wt") as file:
        json.dump({"trials": trials, "search": repr(search), "search_trials": search.trials}, file)


main()
