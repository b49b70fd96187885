"""Training steps that survive memory pressure, and a leak watch (``gpumem.torch.adaptive``, ``watch_leaks``).

    step = gpumem.torch.adaptive(loss_of, model)   # loss_of(batch) -> the batch's mean loss
    for batch in loader:
        optimizer.zero_grad()
        loss = step(batch)      # forward and backward, split into micro-batches when memory is short
        optimizer.step()

``adaptive`` runs forward and backward itself so that it can split: a batch of N samples in micro-batches
of n_i samples gives each micro-batch's mean loss the weight n_i / N, so the accumulated gradients are
those of the whole batch's mean loss (the same gradients, up to floating-point summation order). When
the step raises ``torch.OutOfMemoryError`` -- or, when a gpumem pressure source says memory is high,
before it does -- the partial gradients are dropped, their memory is freed with the failed step's
graph, and the step runs again split into twice as many micro-batches (2, 4, ... up to the batch
size). After ``merge_after`` steps in a row without trouble it tries half as many again. When even one
sample per micro-batch does not fit, the modules named in ``checkpoint`` are switched to activation
checkpointing (``torch.utils.checkpoint``) and the step is retried once more. Every decision is a log
line (``log``, default: standard error) and a count in ``step.counts``.

Batch-norm: a micro-batch is normalized with its own statistics, as in any gradient accumulation, so
with batch-norm the gradients are not exactly the whole batch's. The running statistics are kept exact:
during a split step each batch-norm module's per-micro-batch mean and variance are recorded, the
running statistics are restored afterwards and updated once with the whole batch's mean and unbiased
variance combined from them, as one unsplit step would have done.

``watch_leaks`` looks at the live bytes at step boundaries: when they grow over ``steps`` boundaries
in a row (after ``warmup`` steps), it warns once, with the growth per step and the allocations made
during the growth that are still alive (sizes; and Python stacks when torch's memory history is
recorded). The classic leak -- keeping ``loss`` instead of ``loss.item()`` -- grows by one small block
a step, so any growth counts: a training loop that does not leak has the same live bytes at every
boundary.
"""
import sys
import warnings

import torch


def _log_to_stderr(line):
    print(line, file=sys.stderr, flush=True)


def _batch_size(batch):
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        return _batch_size(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)):
        return _batch_size(batch[0])
    raise TypeError(f"gpumem.adaptive cannot split a {type(batch).__name__}: give tensors, or tuples, lists or "
                    "dicts of them, with the samples along the first dimension")


def _slice(batch, start, stop):
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, dict):
        return {key: _slice(value, start, stop) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_slice(value, start, stop) for value in batch)
    return batch


def _bounds(size, parts):
    """(start, stop) of `parts` micro-batches as equal as can be."""
    edges = [size * i // parts for i in range(parts + 1)]
    return [(edges[i], edges[i + 1]) for i in range(parts) if edges[i + 1] > edges[i]]


class _BatchNormRecorder:
    """During a split step: each batch-norm module's micro-batch statistics, then one exact update."""

    def __init__(self, modules):
        self.modules = [m for m in modules if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                        and m.training and m.track_running_stats]
        self.saved, self.seen, self.hooks = {}, {}, []

    def __enter__(self):
        for module in self.modules:
            self.saved[module] = (module.running_mean.clone(), module.running_var.clone(),
                                  module.num_batches_tracked.clone())
            self.seen[module] = []
            self.hooks.append(module.register_forward_pre_hook(self._record))
        return self

    def _record(self, module, inputs):
        with torch.no_grad():
            values = inputs[0].detach().transpose(0, 1).reshape(inputs[0].shape[1], -1).float()
            self.seen[module].append((values.shape[1], values.mean(1), values.var(1, unbiased=False)))

    def __exit__(self, *failure):
        for hook in self.hooks:
            hook.remove()
        if failure[0] is not None:
            for module, (mean, variance, tracked) in self.saved.items():
                module.running_mean.copy_(mean), module.running_var.copy_(variance)
                module.num_batches_tracked.copy_(tracked)
            return False
        with torch.no_grad():
            for module, (mean, variance, tracked) in self.saved.items():
                self._update(module, mean, variance, tracked, self.seen[module])
        return False

    @staticmethod
    def _update(module, mean, variance, tracked, seen):
        total = sum(count for count, _, _ in seen)
        whole_mean = sum(count * chunk_mean for count, chunk_mean, _ in seen) / total
        squares = sum(count * (chunk_variance + (chunk_mean - whole_mean) ** 2) for count, chunk_mean, chunk_variance in seen)
        whole_variance = squares / max(total - 1, 1)
        tracked = tracked + 1
        momentum = module.momentum if module.momentum is not None else 1.0 / float(tracked.item())
        module.running_mean.copy_((1 - momentum) * mean + momentum * whole_mean.to(mean.dtype))
        module.running_var.copy_((1 - momentum) * variance + momentum * whole_variance.to(variance.dtype))
        module.num_batches_tracked.copy_(tracked)


class Adaptive:
    """A training step that splits itself into micro-batches when memory is short (see the module's text)."""

    def __init__(self, loss_of, model, micro_batches=1, merge_after=50, checkpoint=(), pressure=None, log=None):
        self.loss_of = loss_of
        self.model = model if isinstance(model, torch.nn.Module) else None
        self.parameters = [p for p in (model.parameters() if self.model is not None else model) if p.requires_grad]
        self.micro_batches = max(1, int(micro_batches))
        self.merge_after = merge_after
        self.checkpoint = list(checkpoint)
        self.checkpointing = False
        self.pressure = pressure
        self.log = log or _log_to_stderr
        self.steps = 0
        self.quiet_steps = 0
        self.counts = {"steps": 0, "out_of_memory": 0, "splits": 0, "merges": 0, "pressure_splits": 0,
                       "checkpointing": 0, "failed_merges": 0}

    def __call__(self, batch):
        size = _batch_size(batch)
        self.steps += 1
        self.counts["steps"] += 1
        self._react_to_pressure(size)
        merging = self._time_to_merge()
        kept = [p.grad for p in self.parameters]  # gradients accumulated before this step, added back after
        for p in self.parameters:
            p.grad = None
        while True:
            try:
                loss = self._run(batch, size)
                break
            except torch.OutOfMemoryError as error:
                message = str(error).splitlines()[0]
            for p in self.parameters:
                p.grad = None  # the partial gradients go with the failed step's graph
            self.counts["out_of_memory"] += 1
            self.quiet_steps = 0
            if merging:
                merging = False
                self.micro_batches *= 2
                self.merge_after *= 2
                self.counts["failed_merges"] += 1
                self.log(f"gpumem.adaptive: step {self.steps}: merging back ran out of memory; staying at "
                         f"{self.micro_batches} micro-batches, next try after {self.merge_after} steps")
                continue
            self._split_further(size, message)
        for p, before in zip(self.parameters, kept):
            if before is not None:
                p.grad = before if p.grad is None else before.add_(p.grad)
        self.quiet_steps += 1
        return loss

    def _run(self, batch, size):
        parts = _bounds(size, min(self.micro_batches, size))
        if len(parts) == 1:
            loss = self.loss_of(batch)
            loss.backward()
            return loss.detach()
        total = None
        with _BatchNormRecorder(self.model.modules() if self.model is not None else ()):
            for start, stop in parts:
                loss = self.loss_of(_slice(batch, start, stop)) * ((stop - start) / size)
                loss.backward()
                total = loss.detach() if total is None else total + loss.detach()
                del loss
        return total

    def _split_further(self, size, reason):
        if self.micro_batches < size:
            self.micro_batches = min(self.micro_batches * 2, size)
            self.counts["splits"] += 1
            self.log(f"gpumem.adaptive: step {self.steps}: out of memory ({reason}); retrying with "
                     f"{self.micro_batches} micro-batches")
            return
        if self.checkpoint and not self.checkpointing:
            self._enable_checkpointing()
            self.log(f"gpumem.adaptive: step {self.steps}: out of memory with one sample per micro-batch; "
                     f"activation checkpointing on for {len(self.checkpoint)} modules, retrying")
            return
        self.log(f"gpumem.adaptive: step {self.steps}: out of memory with one sample per micro-batch"
                 f"{' and checkpointing' if self.checkpointing else ''}: giving up")
        raise torch.OutOfMemoryError(f"gpumem.adaptive: a single sample does not fit ({reason})")

    def _react_to_pressure(self, size):
        if self.pressure is None or self.micro_batches >= size or not self.pressure():
            return
        self.micro_batches *= 2
        self.quiet_steps = 0
        self.counts["pressure_splits"] += 1
        self.log(f"gpumem.adaptive: step {self.steps}: memory pressure is high; splitting into "
                 f"{self.micro_batches} micro-batches before running out")

    def _time_to_merge(self):
        if self.micro_batches == 1 or self.quiet_steps < self.merge_after:
            return False
        if self.pressure is not None and self.pressure():
            return False
        self.micro_batches //= 2
        self.quiet_steps = 0
        self.counts["merges"] += 1
        self.log(f"gpumem.adaptive: step {self.steps}: {self.merge_after} quiet steps; trying "
                 f"{self.micro_batches} micro-batches")
        return True

    def _enable_checkpointing(self):
        from torch.utils.checkpoint import checkpoint
        for module in self.checkpoint:
            forward = module.forward
            module.forward = lambda *inputs, _forward=forward, **named: checkpoint(
                _forward, *inputs, use_reentrant=False, **named)
        self.checkpointing = True
        self.counts["checkpointing"] += 1


def adaptive(loss_of, model, micro_batches=1, merge_after=50, checkpoint=(), pressure=None, log=None):
    """A step function ``step(batch) -> loss`` doing forward and backward of ``loss_of(batch)`` (the
    batch's mean loss) for the parameters of ``model`` (a module, or an iterable of parameters), split
    into micro-batches with gradient accumulation when memory runs short. ``pressure``: a callable that
    says memory is high (split before running out); ``checkpoint``: modules to checkpoint as a last resort."""
    return Adaptive(loss_of, model, micro_batches, merge_after, checkpoint, pressure, log)


class LeakWatch:
    """Live bytes at step boundaries; warns once when they grow over `steps` boundaries in a row."""

    def __init__(self, steps=5, warmup=2, log=None):
        self.window = steps
        self.warmup = warmup
        self.log = log or _log_to_stderr
        self.boundaries = []  # (live bytes, addresses live then) at each boundary after the warm-up
        self.seen = 0
        self.warned = False
        self.report = None

    def step(self):
        """Mark a step boundary (after the optimizer step). Returns the report once it warns, else None."""
        self.seen += 1
        if self.seen <= self.warmup or self.warned:
            return None
        torch.cuda.synchronize()
        self.boundaries.append((torch.cuda.memory_allocated(), self._live_blocks()))
        self.boundaries = self.boundaries[-(self.window + 1):]
        if len(self.boundaries) <= self.window:
            return None
        live = [bytes_live for bytes_live, _ in self.boundaries]
        if not all(later > earlier for earlier, later in zip(live, live[1:])):
            return None
        self.warned = True
        self.report = self._describe(live)
        self.log(self.report["message"])
        warnings.warn(self.report["message"], ResourceWarning, stacklevel=2)
        return self.report

    @staticmethod
    def _live_blocks():
        """address -> (size, frames) of every allocated block, from the allocator's snapshot."""
        blocks = {}
        for segment in torch.cuda.memory._snapshot()["segments"]:
            for block in segment["blocks"]:
                if block["state"] == "active_allocated":
                    blocks[block["address"]] = (block.get("requested_size", block["size"]), block.get("frames", []))
        return blocks

    def _describe(self, live):
        growth = (live[-1] - live[0]) / self.window
        first, last = self.boundaries[0][1], self.boundaries[-1][1]
        new = sorted(((size, frames) for address, (size, frames) in last.items() if address not in first),
                     key=lambda item: -item[0])
        sites = {}
        for size, frames in new:
            where = _call_site(frames)
            count, total = sites.get((size, where), (0, 0))
            sites[(size, where)] = (count + 1, total + size)
        lines = [f"gpumem.watch_leaks: live memory grew at each of the last {self.window} step boundaries, "
                 f"by {growth:,.0f} bytes a step ({live[0]:,} to {live[-1]:,} bytes); still alive from those steps:"]
        for (size, where), (count, total) in sorted(sites.items(), key=lambda item: -item[1][1])[:10]:
            lines.append(f"  {count} x {size:,} bytes allocated at {where}")
        return {"growth_per_step": growth, "live_bytes": live, "sites": sites, "message": "\n".join(lines)}


def _call_site(frames):
    """The innermost frame of the program's own code (not torch's, not gpumem's), with the innermost
    frame of all when that is elsewhere."""
    import os
    library = os.path.dirname(torch.__file__)
    python = [frame for frame in frames if frame.get("filename", "").endswith(".py")]
    if not python:
        return "unknown (record torch's memory history for stacks)"
    describe = lambda frame: f"{frame['filename']}:{frame['line']} in {frame['name']}"  # noqa: E731
    own = next((frame for frame in python if not frame["filename"].startswith(library)
                and "/gpumem/" not in frame["filename"]), None)
    if own is None:
        return describe(python[0])
    return describe(own) if own is python[0] else f"{describe(own)} (in {describe(python[0])})"


def watch_leaks(steps=5, warmup=2, log=None):
    """A LeakWatch: call ``.step()`` at each step boundary."""
    return LeakWatch(steps, warmup, log)


class BatchSizeSearch:
    """The result of find_batch_size: the batch, and how it was found."""

    def __init__(self):
        self.batch_size = None
        self.trials = []  # (batch size, fitted, peak allocated or None, peak reserved or None)
        self.out_of_memory = 0
        self.predicted = None

    def __repr__(self):
        return (f"BatchSizeSearch(batch_size={self.batch_size}, trials={len(self.trials)}, "
                f"out_of_memory={self.out_of_memory}, predicted={self.predicted})")


def _events_of_step(step, batch):
    """Run the step with torch's memory history on; its allocation events (alloc and free) in order."""
    torch.cuda.memory._record_memory_history(max_entries=1 << 20, context=None, stacks="python")
    try:
        step(batch)
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    device = torch.cuda.current_device()
    traces = snapshot["device_traces"][device] if snapshot["device_traces"] else []
    return [(event["action"], event["addr"], event["size"]) for event in traces
            if event["action"] in ("alloc", "free_requested")]


def _curve_of_step(events):
    """The step's live bytes after each event, in three parts: transient (allocated and freed within the
    step: activations, temporaries), persistent (allocated and kept: gradients, the first step's
    optimizer state) and released (freed, allocated before: the last step's gradients). One entry
    (transient, persistent, released) per transient event, the highest point until the next one: a
    persistent allocation raises the current entry, a release counts from the next. So two steps that
    differ only in what they keep (the first step makes the optimizer's state) have matching entries."""
    freed_later, transient_allocations = set(), set()
    for index in range(len(events) - 1, -1, -1):
        action, address, _ = events[index]
        if action == "free_requested":
            freed_later.add(address)
        elif address in freed_later:
            freed_later.discard(address)
            transient_allocations.add(index)
    transient = persistent = released = 0
    curve, open_transient = [], set()
    for index, (action, address, size) in enumerate(events):
        if action == "alloc" and index in transient_allocations:
            open_transient.add(address)
            transient += size
        elif action == "alloc":  # kept: the entry since the last transient event now holds it too
            persistent += size
            if curve:
                curve[-1] = (transient, persistent, curve[-1][2])
            continue
        elif address in open_transient:
            open_transient.discard(address)
            transient -= size
        else:  # released: from here on (the entry before it is the higher point)
            released += size
            continue
        curve.append((transient, persistent, released))
    return curve


def _largest_fitting(small, large, budget):
    """The largest batch whose steady-state step stays within `budget` bytes, from two measured trials.

    Each trial: (batch size, allocated bytes at the start, bytes of its batch, curve). The transient
    parts of the two curves are matched event by event (the same operations on batches of different
    sizes): each event's transient bytes are a + b x batch. The persistent and released parts are
    the second trial's (the steady state), the fixed bytes its start less its batch; the batch adds
    its bytes per sample."""
    (size_1, _, _, curve_1), (size_2, start_2, batch_2, curve_2) = small, large
    per_sample_input = batch_2 / size_2
    fixed = start_2 - batch_2
    if len(curve_1) != len(curve_2):  # the steps differ: only their peaks can be compared
        curve_1, curve_2 = [max(curve_1, default=(0, 0, 0))], [max(curve_2, default=(0, 0, 0))]
    best = None
    for (transient_1, _, _), (transient_2, persistent, released) in zip(curve_1, curve_2):
        slope = (transient_2 - transient_1) / (size_2 - size_1) + per_sample_input
        constant = fixed + persistent - released + transient_2 - (slope - per_sample_input) * size_2
        if slope <= 0:
            if constant > budget:
                return 0
            continue
        limit = int((budget - constant) // slope)
        best = limit if best is None else min(best, limit)
    return best if best is not None else size_2


def _memory_limit(limit):
    if limit is not None:
        return int(limit)
    from gpumem import torch as gpumem_torch
    if gpumem_torch.is_installed():
        return gpumem_torch.allocator().memory_limit()
    free, _ = torch.cuda.mem_get_info()
    return free + torch.cuda.memory_reserved()


def find_batch_size(step, make_batch, limit=None, start=2, margin=0.03, maximum=None, state=None, log=None):
    """The largest batch size whose training step fits in ``limit`` bytes of device memory (default:
    gpumem's memory limit -- set_per_process_memory_fraction sets it -- or what the device has free).

    ``step(batch)`` runs one training step; ``make_batch(n)`` makes a batch of n samples. Two small
    trials (``start`` and twice that) are recorded event by event; at every event the step's memory is
    fitted as fixed + per-sample x batch (the persistent part as in the steady state: the first step's
    optimizer state counts from the start), and the predicted largest batch keeps every event within
    the limit; the third runs the predicted largest batch (``margin`` of the limit left for the allocator's
    rounding and fragmentation) to verify it. Only when the prediction is wrong does it bisect. Each trial is a real
    step: give ``state=(model, optimizer)`` to have their states restored afterwards. Returns a
    BatchSizeSearch (``.batch_size``, ``.trials``, ``.out_of_memory``)."""
    log = log or _log_to_stderr
    budget = _memory_limit(limit)
    saved = _save_state(state)
    search = BatchSizeSearch()
    try:
        fits = _measured_trials(step, make_batch, start, search)
        if fits is None:
            raise torch.OutOfMemoryError(f"gpumem.find_batch_size: even a batch of {start} does not fit")
        small, large_trial = fits
        large = large_trial[0]
        predicted = _largest_fitting(small, large_trial, budget * (1 - margin))
        predicted = max(large, min(predicted, maximum or predicted))
        search.predicted = predicted
        log(f"gpumem.find_batch_size: within {budget / 2**20:.0f} MiB the model predicts {predicted}: trying it")
        if predicted == large or _fits(step, make_batch, predicted, budget, search):
            search.batch_size = predicted
        else:
            search.batch_size = _bisect(step, make_batch, large, predicted, budget, search, log)
    finally:
        _restore_state(state, saved)
    log(f"gpumem.find_batch_size: batch size {search.batch_size} after {len(search.trials)} trials "
        f"({search.out_of_memory} out of memory)")
    return search


def _measured_trials(step, make_batch, start, search):
    measured = []
    torch.cuda.empty_cache()  # cached memory of earlier work is not this step's
    for size in (start, 2 * start):
        torch.cuda.synchronize()
        before_batch = torch.cuda.memory_allocated()
        batch = make_batch(size)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start_bytes = torch.cuda.memory_allocated()
        try:
            events = _events_of_step(step, batch)
        except torch.OutOfMemoryError:
            search.out_of_memory += 1
            search.trials.append((size, False, None, None))
            return None
        del batch
        search.trials.append((size, True, torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()))
        measured.append((size, start_bytes, start_bytes - before_batch, _curve_of_step(events)))
    return measured[0], measured[1]


def _fits(step, make_batch, size, budget, search):
    """One trial: the step at this size runs without running out and keeps reserved within the budget."""
    try:
        batch = make_batch(size)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step(batch)
        torch.cuda.synchronize()
        del batch
    except torch.OutOfMemoryError:
        search.out_of_memory += 1
        search.trials.append((size, False, None, None))
        return False
    reserved = torch.cuda.max_memory_reserved()
    search.trials.append((size, reserved <= budget, torch.cuda.max_memory_allocated(), reserved))
    return reserved <= budget


def _bisect(step, make_batch, low, high, budget, search, log):
    """Largest fitting size in [low, high): low fits, high does not."""
    log(f"gpumem.find_batch_size: {high} does not fit; bisecting between {low} and {high}")
    while high - low > max(1, low // 64):
        middle = (low + high) // 2
        if _fits(step, make_batch, middle, budget, search):
            low = middle
        else:
            high = middle
    return low


def _to_host(value):
    """A state dict's tensors copied to host memory (the device's would skew the trials)."""
    if torch.is_tensor(value):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _to_host(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(item) for item in value)
    return value


def _save_state(state):
    return None if state is None else [_to_host(part.state_dict()) for part in state]


def _restore_state(state, saved):
    if state is None:
        return
    for part, values in zip(state, saved):
        part.load_state_dict(values)
