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
size). Under gpumem an out-of-memory error is first met by defragmenting (``defragment``: the free
pages that live tensors pin given back, once a step, between the failed try and the next, where no
kernel of this step runs): when that gives memory back, the step runs again as it was. After
``merge_after`` steps in a row without trouble it tries half as many again. When even one
sample per micro-batch does not fit, the modules named in ``checkpoint`` are switched to activation
checkpointing (``torch.utils.checkpoint``) and the step is retried once more; when that fails too it
raises ``torch.OutOfMemoryError``. Every decision is a log line (``log``, default: standard error) and a
count in ``step.counts``. Gradients accumulated before the call are kept through its tries, and are what
the parameters hold if it raises.

Batch-norm: a micro-batch is normalized with its own statistics, as in any gradient accumulation, so
with batch-norm the gradients are not exactly the whole batch's. The running statistics are kept exact:
during a split step each batch-norm module's per-micro-batch mean and variance are recorded, the
running statistics are restored afterwards and updated once with the whole batch's mean and unbiased
variance combined from them, as one unsplit step would have done. A try that runs out of memory may have
run forward (updating them) before backward failed, so they are saved when the step starts and restored
before every retry, and when the step raises.

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
    """The samples in the batch: the first dimension of its first tensor (ValueError when it has none)."""
    if isinstance(batch, torch.Tensor):
        if len(batch.shape) == 0:
            raise ValueError("gpumem.adaptive cannot split a 0-dimensional tensor: the samples go along the "
                             "first dimension")
        return batch.shape[0]
    if isinstance(batch, (dict, list, tuple)):
        if not batch:
            raise ValueError(f"gpumem.adaptive cannot split an empty {type(batch).__name__}: the batch needs "
                             "a tensor with the samples along its first dimension")
        return _batch_size(next(iter(batch.values())) if isinstance(batch, dict) else batch[0])
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


def _tracking_batch_norms(modules):
    """The batch-norm modules whose forward updates running statistics."""
    return [m for m in modules if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
            and m.training and m.track_running_stats]


def _save_batch_norms(modules):
    """{module: (running mean, running variance, batches tracked)} copied, for _restore_batch_norms."""
    return {module: (module.running_mean.clone(), module.running_var.clone(), module.num_batches_tracked.clone())
            for module in modules}


def _restore_batch_norms(saved):
    with torch.no_grad():
        for module, (mean, variance, tracked) in saved.items():
            module.running_mean.copy_(mean), module.running_var.copy_(variance)
            module.num_batches_tracked.copy_(tracked)


class _BatchNormRecorder:
    """During a split step: each batch-norm module's micro-batch statistics, then one exact update."""

    def __init__(self, modules):
        self.modules = _tracking_batch_norms(modules)
        self.saved, self.seen, self.hooks = {}, {}, []

    def __enter__(self):
        self.saved = _save_batch_norms(self.modules)
        for module in self.modules:
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
            _restore_batch_norms(self.saved)
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

    def __init__(self, loss_of, model, micro_batches=1, merge_after=50, checkpoint=(), pressure=None, log=None,
                 defragment=None):
        self.loss_of = loss_of
        self.model = model if isinstance(model, torch.nn.Module) else None
        self.parameters = [p for p in (model.parameters() if self.model is not None else model) if p.requires_grad]
        self.micro_batches = max(1, int(micro_batches))
        self.merge_after = merge_after
        self.checkpoint = list(checkpoint)
        self.checkpointing = False
        self.pressure = pressure
        self.defragment = defragment
        self.log = log or _log_to_stderr
        self.steps = 0
        self.quiet_steps = 0
        self.counts = {"steps": 0, "out_of_memory": 0, "splits": 0, "merges": 0, "pressure_splits": 0,
                       "checkpointing": 0, "failed_merges": 0, "defragments": 0}

    def __call__(self, batch):
        size = _batch_size(batch)
        if size == 0:
            raise ValueError("gpumem.adaptive: the batch has no samples (its first dimension is 0)")
        self.steps += 1
        self.counts["steps"] += 1
        self._react_to_pressure(size)
        kept = [p.grad for p in self.parameters]  # gradients accumulated before this step, added back after
        for p in self.parameters:
            p.grad = None
        # Running statistics as before the step: every retry starts from them, as does the caller after a
        # failure (a failed try may have run forward, updating them, before it ran out in backward).
        norms = _save_batch_norms(_tracking_batch_norms(self.model.modules() if self.model is not None else ()))
        try:
            loss = self._run_until_it_fits(batch, size, norms)
        except BaseException:
            self._drop_gradients()
            _restore_batch_norms(norms)
            raise
        finally:
            for p, before in zip(self.parameters, kept):
                if before is not None:
                    p.grad = before if p.grad is None else before.add_(p.grad)
        self.quiet_steps += 1
        return loss

    def _drop_gradients(self):
        for p in self.parameters:
            p.grad = None  # the partial gradients go with the failed step's graph

    def _run_until_it_fits(self, batch, size, norms):
        """The step's loss, run again after each out-of-memory error: defragmented once, then at the
        micro-batches a failed merge left, then split further."""
        merging = self._time_to_merge()
        defragmented = False
        while True:
            try:
                return self._run(batch, size)
            except torch.OutOfMemoryError as error:
                message = str(error).splitlines()[0]
            self._drop_gradients()
            _restore_batch_norms(norms)
            self.counts["out_of_memory"] += 1
            self.quiet_steps = 0
            if not defragmented:
                defragmented = True
                if self._defragment(message):
                    continue
            if merging:
                merging = False
                self.micro_batches *= 2
                self.merge_after *= 2
                self.counts["failed_merges"] += 1
                self.log(f"gpumem.adaptive: step {self.steps}: merging back ran out of memory; staying at "
                         f"{self.micro_batches} micro-batches, next try after {self.merge_after} steps")
                continue
            self._split_further(size, message)

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

    def _defragment(self, reason):
        """The free pages that live tensors pin given back (self.defragment): True when some came back, and
        the step is then tried again as it was."""
        if self.defragment is None:
            return False
        released = self.defragment()
        if released <= 0:
            return False
        self.counts["defragments"] += 1
        self.log(f"gpumem.adaptive: step {self.steps}: out of memory ({reason}); defragmenting gave back "
                 f"{released / 2**20:.1f} MiB, retrying with {self.micro_batches} micro-batch"
                 f"{'es' if self.micro_batches > 1 else ''}")
        return True

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


def adaptive(loss_of, model, micro_batches=1, merge_after=50, checkpoint=(), pressure=None, log=None,
             defragment=None):
    """A step function ``step(batch) -> loss`` doing forward and backward of ``loss_of(batch)`` (the
    batch's mean loss) for the parameters of ``model`` (a module, or an iterable of parameters), split
    into micro-batches with gradient accumulation when memory runs short. ``pressure``: a callable that
    says memory is high (split before running out); ``checkpoint``: modules to checkpoint as a last resort;
    ``defragment``: a callable that gives back pinned free memory and returns the bytes (tried first,
    once a step, after an out-of-memory error)."""
    return Adaptive(loss_of, model, micro_batches, merge_after, checkpoint, pressure, log, defragment)


class LeakWatch:
    """Live bytes at step boundaries; warns once when they grow over `steps` boundaries in a row."""

    def __init__(self, steps=5, warmup=2, log=None):
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"gpumem.watch_leaks: steps must be a whole number of steps, 1 or more (got {steps!r})")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"gpumem.watch_leaks: warmup must be a whole number of steps, 0 or more (got {warmup!r})")
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
