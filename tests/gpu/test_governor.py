"""gpumem.torch.adaptive and watch_leaks on a GPU, under gpumem (scripts/gpu-check.sh python):
    PYTHONPATH=python GPUMEM_LIBRARY=build-gpu/libgpumem.so python3 -m pytest tests/gpu/test_governor.py

- a step split into micro-batches gives the unsplit step's parameters (within float tolerance);
- under a memory cap that the unsplit step exceeds, adaptive catches the OOM, frees the failed step's
  memory (the live bytes after the step are the unsplit run's), splits, and ends with the unsplit
  run's parameters;
- with batch-norm, the running statistics equal the unsplit run's;
- find_batch_size finds, in at most 3 trials, a batch that fits and is at least 90% of the largest
  that doubling and bisection to one sample find, and restores the model and optimizer; under a cap,
  and on a nearly full device with no cap (the replay then keeps the device's chunk sizes);
- watch_leaks warns for the classic leak (keeping `loss`), naming the line, and not for `loss.item()`;
- an out-of-memory error is met by defragmenting first, once a step.
"""
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import gpumem.torch  # noqa: E402

gpumem.torch.install()
F = torch.nn.functional


def make_model(width, batchnorm=False):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(1024, width)]
    if batchnorm:
        layers.append(torch.nn.BatchNorm1d(width))
    layers += [torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10)]
    return torch.nn.Sequential(*layers).cuda()


def make_batches(count, size):
    generator = torch.Generator(device="cuda").manual_seed(1)
    return [(torch.randn(size, 1024, device="cuda", generator=generator),
             torch.randint(0, 10, (size,), device="cuda", generator=generator)) for _ in range(count)]


def train(model, batches, **options):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = gpumem.torch.adaptive(lambda batch: F.cross_entropy(model(batch[0]), batch[1]), model,
                                 log=lambda line: None, **options)
    losses, live_after = [], []
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        losses.append(step(batch).item())
        optimizer.step()
        torch.cuda.synchronize()
        live_after.append(torch.cuda.memory_allocated())
    return step, losses, live_after


def assert_same_parameters(model, reference, rtol=1e-4, atol=1e-5):
    for (name, value), expected in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(value, expected, rtol=rtol, atol=atol), \
            f"{name} differs by {(value - expected).abs().max().item()}"


def test_split_step_gives_the_unsplit_parameters():
    batches = make_batches(4, 512)
    reference = make_model(2048)
    _, reference_losses, _ = train(reference, batches)
    model = make_model(2048)
    step, losses, _ = train(model, batches, micro_batches=4)
    assert step.micro_batches == 4 and step.counts["out_of_memory"] == 0
    assert losses == pytest.approx(reference_losses, rel=1e-4)
    assert_same_parameters(model, reference)


def test_out_of_memory_splits_and_ends_as_unsplit():
    batches = make_batches(3, 16384)
    start = torch.cuda.memory_allocated()
    reference = make_model(8192)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    reference_step, reference_losses, reference_live = train(reference, batches)
    step_peak = torch.cuda.max_memory_allocated() - before
    reference_parameters = [p.detach().clone() for p in reference.parameters()]
    del reference, reference_step
    torch.cuda.empty_cache()
    model_start = torch.cuda.memory_allocated()
    model = make_model(8192)
    base = torch.cuda.memory_reserved()
    total = torch.cuda.get_device_properties(0).total_memory
    # A cap at 60% of what the unsplit steps needed on top of the model: the unsplit step cannot fit.
    torch.cuda.set_per_process_memory_fraction((base + 0.6 * step_peak) / total)
    try:
        step, losses, live = train(model, batches)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert step.counts["out_of_memory"] >= 1 and step.micro_batches >= 2, step.counts
    assert losses == pytest.approx(reference_losses, rel=1e-4)
    # The failed step's graph and partial gradients are gone: after each step the model holds what
    # the unsplit run's did (parameters, gradients, momentum).
    assert [bytes_live - model_start for bytes_live in live] == [bytes_live - start for bytes_live in reference_live]
    for value, expected in zip(model.parameters(), reference_parameters):
        assert torch.allclose(value, expected, rtol=1e-4, atol=1e-5)


def test_batchnorm_running_statistics_are_the_unsplit_ones():
    # One step: the next would start from parameters that differ (a micro-batch is normalized with
    # its own statistics, so the gradients are not the whole batch's), and so would the statistics.
    batches = make_batches(1, 512)
    reference = make_model(1024, batchnorm=True)
    train(reference, batches)
    model = make_model(1024, batchnorm=True)
    train(model, batches, micro_batches=4)
    norm, expected = model[1], reference[1]
    assert torch.allclose(norm.running_mean, expected.running_mean, rtol=1e-4, atol=1e-6)
    assert torch.allclose(norm.running_var, expected.running_var, rtol=1e-4, atol=1e-6)
    assert int(norm.num_batches_tracked) == int(expected.num_batches_tracked) == 1


def leaky_loop(keep_tensor, steps=14):
    model = make_model(256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    watch = gpumem.torch.watch_leaks(steps=5, warmup=2, log=lambda line: None)
    kept, reports = [], []
    for x, y in make_batches(steps, 64):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)  # the line the leak report must name
        loss.backward()
        optimizer.step()
        kept.append(loss if keep_tensor else loss.item())
        report = watch.step()
        if report:
            reports.append(report)
    return reports


def test_leak_of_kept_loss_is_reported_with_its_line():
    torch.cuda.memory._record_memory_history(max_entries=100000)
    try:
        with pytest.warns(ResourceWarning, match="live memory grew"):
            reports = leaky_loop(keep_tensor=True)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    assert len(reports) == 1, "warns once"
    report = reports[0]
    assert report["growth_per_step"] > 0
    assert any("test_governor.py" in where and "leaky_loop" in where for (_, where) in report["sites"]), report["message"]


def test_no_leak_no_warning():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        assert leaky_loop(keep_tensor=False) == []


def mlp_training():
    """The MLP the batch-size tests search on: (model, optimizer, step(batch), make_batch(size))."""
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
    return model, optimizer, step, make_batch


def largest_by_bisection(step, make_batch):
    """Doubling from 4, then bisection to one sample: the largest batch whose step runs."""
    def fits(size):
        try:
            step(make_batch(size))
            torch.cuda.synchronize()
            return True
        except torch.OutOfMemoryError:
            return False
    low, high = 2, 4
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def test_find_batch_size_in_three_trials():
    model, optimizer, step, make_batch = mlp_training()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 6 * 2**30) / total)
    try:
        largest = largest_by_bisection(step, make_batch)
        parameters_before = [p.detach().clone() for p in model.parameters()]
        steps_before = [float(value["step"]) for value in optimizer.state_dict()["state"].values()]
        search = gpumem.torch.find_batch_size(step, make_batch, state=(model, optimizer), log=lambda line: None)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    print(f"find_batch_size found {search.batch_size} in {search.trials}; bisection found {largest}")
    if os.environ.get("GOVERNOR_DUMP"):  # the recorded trials, to study the prediction offline
        import pickle
        with open(os.path.join(os.environ["GOVERNOR_DUMP"], "mlp-trials.pickle"), "wb") as file:
            pickle.dump({"budget": int(search.budget), "largest": largest, "trials": [vars(t) for t in search.recorded],
                         "config": gpumem.torch.installed_config()}, file)
    assert len(search.trials) <= 3, search.trials
    # Below the bisection's, by a few percent: at large batches this step allocates reduction staging
    # buffers that the small trials do not show, assumed to grow in proportion to the batch (docs/benchmarks.md).
    assert 0.9 * largest <= search.batch_size <= largest, (search, largest)
    assert search.out_of_memory == 0 and search.trials[-1][:2] == (search.batch_size, True), search
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), parameters_before)), "parameters restored"
    assert [float(value["step"]) for value in optimizer.state_dict()["state"].values()] == steps_before


def test_find_batch_size_without_a_cap_on_a_nearly_full_device():
    """No memory limit set, the device nearly full (all but 6 GiB more than gpumem holds taken with
    cuMemAlloc, outside any allocator): the budget is the room the device leaves, and the replay bounds
    it as the simulated device's capacity. find_batch_size finds, in at most 3 trials and with no out of
    memory, at least 90% of what doubling and bisection find on the same device."""
    import ctypes
    driver = ctypes.CDLL("libcuda.so.1")
    model, optimizer, step, make_batch = mlp_training()
    torch.cuda.empty_cache()
    assert gpumem.torch.allocator().memory_limit() >= torch.cuda.mem_get_info()[1]  # no limit set
    ballast = ctypes.c_uint64()
    free, _ = torch.cuda.mem_get_info()
    assert driver.cuMemAlloc_v2(ctypes.byref(ballast), ctypes.c_size_t(free - 6 * 2**30)) == 0
    try:
        largest = largest_by_bisection(step, make_batch)
        search = gpumem.torch.find_batch_size(step, make_batch, state=(model, optimizer), log=lambda line: None)
    finally:
        torch.cuda.empty_cache()
        assert driver.cuMemFree_v2(ballast) == 0
    print(f"without a cap: find_batch_size found {search.batch_size} in {search.trials}; bisection found {largest}")
    assert len(search.trials) <= 3, search.trials
    assert 0.9 * largest <= search.batch_size <= largest, (search, largest)
    assert search.out_of_memory == 0 and search.trials[-1][:2] == (search.batch_size, True), search


def test_out_of_memory_is_met_by_defragmenting_first():
    """After an out-of-memory error the step first defragments (once a step): when that gives memory back
    the step is tried again as it was, unsplit; when it gives nothing back, or the step runs out again,
    it splits as before. Under gpumem, gpumem.torch.adaptive defragments with gpumem.torch.defragment
    (nothing given back where that cannot run)."""
    from gpumem import governor
    model = torch.nn.Linear(4, 1)
    batch = torch.randn(8, 4)

    def run(failures, released):
        tries, calls = [], []

        def loss_of(part):
            tries.append(part.shape[0])
            if len(tries) <= failures:
                raise torch.OutOfMemoryError("out of memory (a test's)")
            return model(part).mean()
        step = governor.adaptive(loss_of, model, log=lambda line: None,
                                 defragment=lambda: calls.append(1) or released)
        step(batch)
        return tries, len(calls), step
    tries, calls, step = run(failures=1, released=8 << 20)
    assert tries == [8, 8] and calls == 1 and step.micro_batches == 1 and step.counts["defragments"] == 1
    tries, calls, step = run(failures=1, released=0)
    assert tries == [8, 4, 4] and calls == 1 and step.micro_batches == 2 and step.counts["defragments"] == 0
    tries, calls, step = run(failures=2, released=8 << 20)
    assert tries == [8, 8, 4, 4] and calls == 1 and step.micro_batches == 2 and step.counts["defragments"] == 1
    assert gpumem.torch.adaptive(lambda part: None, model).defragment is gpumem.torch._defragment_if_possible


def test_pressure_splits_ahead_of_running_out():
    batches = make_batches(2, 256)
    model = make_model(1024)
    allocator = gpumem.torch.allocator()
    total = torch.cuda.get_device_properties(0).total_memory
    held = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # keeps allocated bytes above the mark
    allocator.set_pressure_policy(high=max(torch.cuda.memory_allocated() / 2, 1 << 20) / total, low=0.5 / total * (1 << 20))
    try:
        torch.empty(1, device="cuda")  # a call that changes the counts: the level rises
        assert gpumem.torch.pressure_is_high()
        step, _, _ = train(model, batches)
    finally:
        allocator.set_pressure_policy(high=None)
    assert step.counts["pressure_splits"] >= 1 and step.counts["out_of_memory"] == 0, step.counts
    del held


def test_merges_back_after_quiet_steps():
    batches = make_batches(6, 256)
    reference = make_model(1024)
    _, reference_losses, _ = train(reference, batches)
    model = make_model(1024)
    step, losses, _ = train(model, batches, micro_batches=4, merge_after=2)
    assert step.counts["merges"] == 2 and step.micro_batches == 1, step.counts
    assert losses == pytest.approx(reference_losses, rel=1e-4)
    assert_same_parameters(model, reference)


def test_checkpointing_when_one_sample_does_not_fit():
    def blocks():
        torch.manual_seed(0)
        def block():
            return torch.nn.Sequential(*[layer for _ in range(4) for layer in
                                         (torch.nn.Linear(4096, 4096), torch.nn.ReLU())])
        return torch.nn.Sequential(*[block() for _ in range(4)]).cuda()
    x = torch.randn(1, 16384, 4096, device="cuda")
    reference = blocks()
    expected = reference(x).square().mean()
    expected.backward()
    expected_gradient = reference[0][0].weight.grad.clone()
    del reference, expected
    torch.cuda.empty_cache()
    model = blocks()
    total = torch.cuda.get_device_properties(0).total_memory
    # 3.5 GiB beside the model: what one sample's backward keeps (16 ReLU outputs of 256 MiB, 4 GiB) does
    # not fit; with each of the 4 blocks checkpointed (its input kept, one block of 4 layers recomputed
    # at a time, 1 GiB of gradients at most) it does.
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 3.5 * 2**30) / total)
    try:
        step = gpumem.torch.adaptive(lambda batch: model(batch).square().mean(), model, checkpoint=list(model),
                                     log=lambda line: None)
        step(x)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert step.counts["checkpointing"] == 1 and step.counts["out_of_memory"] >= 1, step.counts
    assert torch.allclose(model[0][0].weight.grad, expected_gradient, rtol=1e-4, atol=1e-6)
