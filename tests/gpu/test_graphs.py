"""CUDA graphs and memory pools under gpumem (scripts/gpu-check.sh python):
    PYTHONPATH=python GPUMEM_LIBRARY=build-gpu/libgpumem.so python3 -m pytest tests/gpu/test_graphs.py

- torch.cuda.graph: capture and replays give eager's results; the graph's memory stays reserved while
  the graph lives (a later allocation does not land in it) and goes back once the graph is deleted;
- make_graphed_callables: a training step's parameters equal eager's;
- torch.cuda.MemPool / use_mem_pool: allocations land in the pool, use_count counts, the memory goes
  back when the pool and its tensors are gone;
- torch.compile(mode="reduce-overhead"): the same results as eager, also when a new branch is recorded
  after replays (the graph pool put back to a checkpoint);
- a process recording its memory history under cudagraph trees exits cleanly;
- a failed capture leaves the process usable: a normal training step follows (as with PyTorch's own
  allocator, its random generator stays unusable after a failed capture: that test runs last).
"""
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import gpumem.torch  # noqa: E402

gpumem.torch.install()


def model_and_data(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    data = torch.randn(64, 256, device="cuda")
    return model, data


def test_graph_replays_match_eager_and_keep_their_memory():
    model, data = model_and_data()
    static_input = data.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up on a side stream, as torch's docs do
            model(static_input)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_output = model(static_input)
    for seed in range(3):
        new = torch.randn(64, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        static_input.copy_(new)
        graph.replay()
        torch.testing.assert_close(static_output, model(new))
    output_address = static_output.data_ptr()
    reserved_with_graph = torch.cuda.memory_reserved()
    del static_output
    filler = torch.empty(64 * 10, dtype=torch.float32, device="cuda")  # the output's size: must not reuse it
    assert filler.data_ptr() != output_address
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() >= reserved_with_graph - (2 << 20)  # the graph's pool stays
    graph.replay()  # still valid
    del graph, filler
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() < reserved_with_graph


def test_graphed_callables_train_like_eager():
    eager, data = model_and_data()
    graphed_model, _ = model_and_data()
    target = torch.randint(0, 10, (64,), device="cuda")
    graphed = torch.cuda.make_graphed_callables(graphed_model, (data.clone().requires_grad_(False),))
    for module, optimizer in ((eager, torch.optim.SGD(eager.parameters(), lr=0.1)),
                              (graphed, torch.optim.SGD(graphed_model.parameters(), lr=0.1))):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(module(data), target).backward()
            optimizer.step()
    for p, q in zip(eager.parameters(), graphed_model.parameters()):
        torch.testing.assert_close(p, q)


def test_mem_pool_takes_allocations_and_gives_them_back():
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        inside = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    assert pool.use_count() >= 1
    outside = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    assert outside.data_ptr() != inside.data_ptr()
    address = inside.data_ptr()
    del inside
    again = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    assert again.data_ptr() != address  # the pool's memory is the pool's
    del again, outside, pool
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() <= before + (2 << 20)


def test_compile_reduce_overhead_matches_eager():
    model, data = model_and_data()
    compiled = torch.compile(model, mode="reduce-overhead")
    for _ in range(4):
        result = compiled(data)
    torch.testing.assert_close(result, model(data))


def test_compile_reduce_overhead_new_branch_after_replays():
    """A function first seen after replays (a new input shape, so a new compiled function): cudagraph
    trees put the graph pool back to the checkpoint of the replayed path (setCheckpointPoolState) before
    they warm it up and record it; every result equals eager's, forward and backward, and the pool holds
    exactly the tensors the trees know to be alive (checkPoolLiveAllocations, asserted by torch's
    slow-path checks, on by default)."""
    torch._dynamo.reset()
    model, _ = model_and_data()
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    shapes = [64] * 4 + [128] * 4 + [64] * 2 + [128] * 2
    for index, rows in enumerate(shapes):
        x = torch.randn(rows, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(index))
        model.zero_grad(set_to_none=True)
        out = compiled(x)
        out.square().sum().backward()
        result, gradient = out.detach().clone(), model[0].weight.grad.clone()
        model.zero_grad(set_to_none=True)
        expected = model(x)
        expected.square().sum().backward()
        torch.testing.assert_close(result, expected.detach())
        torch.testing.assert_close(gradient, model[0].weight.grad)
    with torch.no_grad():  # inference branches after the training ones
        for rows in (32, 64, 32):
            x = torch.randn(rows, 256, device="cuda")
            torch.testing.assert_close(compiled(x).clone(), model(x))


def test_exit_after_recording_history_under_cudagraph_trees():
    """A process that records its memory history (Python stacks) while torch.compile's cudagraph trees
    run exits cleanly: the allocator (and the history's Python tracebacks) is never destroyed after
    Python has finalized, as native's. glibc aborted that exit with "double free or corruption"."""
    import os
    import subprocess
    import sys
    script = ("import torch, gpumem.torch\n"
              "gpumem.torch.install()\n"
              "torch.cuda.memory._record_memory_history(max_entries=1000, stacks='python')\n"
              "model = torch.compile(torch.nn.Linear(64, 64).cuda(), mode='reduce-overhead')\n"
              "for _ in range(4):\n"
              "    model(torch.randn(8, 64, device='cuda'))\n"
              "print('done')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ),
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]


def test_process_stays_usable_after_a_failed_capture():
    """Last in this file: after a capture that failed, PyTorch's CUDA random generator refuses to draw
    ("Offset increment outside graph capture"), with its own allocator as with gpumem; the rest works."""
    model, data = model_and_data()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(Exception):
        with torch.cuda.graph(graph):
            model(data)
            torch.cuda.synchronize()  # not allowed during capture: the capture fails
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(data).square().mean()
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
