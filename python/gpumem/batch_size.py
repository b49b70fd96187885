"""The largest batch whose training step fits, in three trials (``gpumem.torch.find_batch_size``).

    search = gpumem.torch.find_batch_size(step, make_batch, state=(model, optimizer))
    search.batch_size, search.trials, search.out_of_memory

Finders that only run trials (doubling then bisection, or x0.9 after each "out of memory") need about
log2(N) full steps, several of them failures. This one needs three, because gpumem can say what a
step would reserve without running it: a step's allocation sequence, replayed on gpumem's simulated
device (the same engine as on the GPU: the same rounding, caching, fragmentation and releases under a
limit), reserves what the GPU would. What the replay does not hold (parameters, optimizer state: the
memory reserved before the step) is the trial's measured peak reserved less the replay's.

1. Trial 1 runs the step at ``start`` samples, recorded allocation by allocation with torch's memory
   history. Each allocation is *transient* (made and freed within the step: activations,
   temporaries), *persistent* (made and kept: gradients, the first step's optimizer state) or
   *released* (made before the step and freed in it: the last step's gradients).
2. With every transient allocation taken to grow in proportion to the batch (never less than the
   truth), the replay gives a batch size that surely fits. Trial 2 runs at three quarters of it:
   large, so that what only large batches allocate (a reduction's staging buffer, a GEMM workspace)
   is seen and what is left to extrapolate is short.
3. The two trials' transient allocations are paired (the same operations on batches of different
   sizes), so each one's size is a + b x batch; one seen only in trial 2 grows in proportion. That is
   the step's whole allocation sequence at any batch size N (the batch's own tensors scale with N).
4. The largest N whose replay runs within the limit, less what the replay does not hold, is the
   prediction (bisection on the simulator: milliseconds a replay). Trial 3 runs it to verify; only
   when it does not fit does the search bisect with real trials.

Each trial is a real training step: give ``state=(model, optimizer)`` to
have their states restored afterwards. A trial whose ``make_batch`` runs out of memory does not fit, as
one whose step does. A memory history the program records (``_record_memory_history``) stays on as it
was, the trials' events added to it; otherwise the search turns it on for each trial and off after.
"""
import os
import sys

import gpumem

# GPUMEM_CONF keys that change where the engine puts blocks: the replay uses the same.
_ENGINE_KEYS = ("engine", "page_size", "small_size", "small_segment_size", "large_segment_size",
                "min_large_alloc", "release_before_growth", "split_blocks", "cost_model", "device_credit_ns",
                "max_chunk_size", "chunk_room_share", "growth_lane", "tail_chunk", "rechunk_min", "compact_min",
                "refill_groups", "move_slack", "stitch")


_PAGE = 2 << 20  # the simulated device's page: no smaller limit or capacity can hold anything
_LARGEST = 1 << 24  # batch sizes the search gives up on: a step whose memory does not grow with the batch


def _log_to_stderr(line):
    print(line, file=sys.stderr, flush=True)


class BatchSizeSearch:
    """What find_batch_size found and how: ``batch_size``, ``trials`` (batch size, fitted, peak allocated,
    peak reserved), ``out_of_memory``, ``predicted``, ``paired`` (the second trial's transient allocations
    paired with the first's, and their number), ``outside`` (bytes the replay took as held outside
    the step)."""

    def __init__(self):
        self.batch_size = None
        self.trials = []
        self.out_of_memory = 0
        self.predicted = None
        self.paired = None
        self.outside = None
        self.peaks = None  # the second trial's peak reserved bytes, measured and replayed
        self.budget = None  # the bytes the step had to fit in
        self.recorded = []  # the recorded Trials the prediction came from (to study a prediction offline)

    def __repr__(self):
        return (f"BatchSizeSearch(batch_size={self.batch_size}, trials={len(self.trials)}, "
                f"out_of_memory={self.out_of_memory}, predicted={self.predicted}, paired={self.paired})")


class Trial:
    """One recorded step: its batch size, allocation events (action, address, size, stream) in order,
    the sizes of the batch's own device tensors, the reserved bytes measured at its start (batch made,
    cache emptied) and at its peak, and the sizes of the blocks held outside the step at its start
    (parameters, optimizer state: live then, neither the batch nor freed by the step)."""

    def __init__(self, size, events, batch_tensors, reserved_start, peak_reserved, outside_blocks=None):
        self.size = size
        self.events = events
        self.batch_tensors = batch_tensors
        self.reserved_start = reserved_start
        self.peak_reserved = peak_reserved
        self.outside_blocks = outside_blocks or []


def _transient_allocations(events):
    """Indexes of the allocations that the same events free."""
    open_allocations, transient = {}, set()
    for index, (action, address, _, _) in enumerate(events):
        if action == "alloc":
            open_allocations[address] = index
        elif address in open_allocations:
            transient.add(open_allocations.pop(address))
    return transient


def _match(small_sizes, large_sizes, ratio, band=64):
    """Pairs (i, j): small_sizes[i] and large_sizes[j] are the same allocation at the two batch sizes.

    The sizes are a + b x batch, so a pair's sizes grow by at most the ratio of the batch sizes. The
    two steps do the same operations in the same order, except for a few: the optimizer's first step
    makes other temporaries, a large batch may need a reduction's staging buffer or a GEMM workspace
    that a small one does not. So the pairing is the longest common subsequence under "may be the same
    allocation" (ties go to pairing in order), computed within a band around the diagonal, as wide as
    the difference of the lengths and `band` more."""
    n, m = len(small_sizes), len(large_sizes)
    lowest, highest = min(0, m - n) - band, max(0, m - n) + band  # j - i within the band
    width = highest - lowest + 1
    unreachable = -1
    score = [[unreachable] * width for _ in range(n + 1)]  # score[i][j - i - lowest]
    step = [bytearray(width) for _ in range(n + 1)]  # 1: pair, 2: skip small[i-1], 3: skip large[j-1]
    for i in range(n + 1):
        small = small_sizes[i - 1] if i else 0
        for column in range(width):
            j = i + lowest + column
            if j < 0 or j > m:
                continue
            if i == 0 or j == 0:
                score[i][column] = 0
                continue
            best, how = unreachable, 0
            up = score[i - 1][column + 1] if column + 1 < width else unreachable  # (i-1, j)
            if up > best:
                best, how = up, 2
            left = score[i][column - 1] if column else unreachable  # (i, j-1)
            if left > best:
                best, how = left, 3
            large = large_sizes[j - 1]
            if small <= large <= small * ratio + 512 and score[i - 1][column] >= 0:
                paired = score[i - 1][column] + 1
                if paired >= best:
                    best, how = paired, 1
            score[i][column], step[i][column] = best, how
    pairs, i, j = [], n, m
    while i > 0 and j > 0 and 0 <= j - i - lowest < width:
        how = step[i][j - i - lowest]
        if how == 1:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif how == 2:
            i -= 1
        else:
            j -= 1
    return pairs[::-1]


class StepModel:
    """The step's allocation sequence at any batch size, from one trial or two (the module's comment).

    A transient allocation paired with the smaller trial's grows as the pair says. One without a pair
    keeps its size if the smaller trial made a block of exactly that size too (an optimizer's
    temporary the size of a parameter); otherwise (and every one, from a single trial) it is taken to
    grow in proportion to the batch: the safe guess, since a + b x batch never exceeds that for sizes
    above the trial's. ``paired``: how many of the
    larger trial's transient allocations have a pair, of how many."""

    def __init__(self, large, small=None):
        self.small, self.large = small, large
        large_transient = sorted(_transient_allocations(large.events))
        large_sizes = [large.events[i][2] for i in large_transient]
        self.growth = {index: size / large.size for index, size in zip(large_transient, large_sizes)}
        self.paired = (0, len(large_sizes))
        if small is None or small.size >= large.size or len(small.batch_tensors) != len(large.batch_tensors):
            return
        small_transient = sorted(_transient_allocations(small.events))
        small_sizes = [small.events[i][2] for i in small_transient]
        pairs = _match(small_sizes, large_sizes, large.size / small.size)
        self.paired = (len(pairs), len(large_sizes))
        per = large.size - small.size
        for i, j in pairs:
            self.growth[large_transient[j]] = (large_sizes[j] - small_sizes[i]) / per
        made_at_both = {event[2] for event in small.events if event[0] == "alloc"}
        paired = {large_transient[j] for _, j in pairs}
        for index, size in zip(large_transient, large_sizes):
            if index not in paired and size in made_at_both:  # the same bytes at both sizes: not the batch's
                self.growth[index] = 0.0

    def operations(self, size):
        """("a" | "f", id, bytes, stream) of the step at `size` samples: first what it finds live (the
        blocks held outside it, those it releases, then the batch), then its own events. The blocks
        held outside share pages with the step's blocks on the device, so the replay holds them too."""
        large = self.large
        streams, ids, operations = {}, {}, []
        early = [("a", index, block_size, 0) for index, block_size in enumerate(large.outside_blocks)]
        stream_of = lambda event: streams.setdefault(event[3], len(streams))  # noqa: E731
        for event in _released_events(large.events):  # released: made before the step
            ids[event[1]] = len(early)
            early.append(("a", len(early), event[2], stream_of(event)))
        for tensor_bytes in large.batch_tensors:
            early.append(("a", len(early), max(1, -(-tensor_bytes * size // large.size)), 0))
        self.early = len(early)
        next_id = len(early)
        for index, (action, address, event_size, stream) in enumerate(large.events):
            if action == "alloc":
                grown = event_size + self.growth.get(index, 0.0) * (size - large.size)
                ids[address] = next_id
                operations.append(("a", next_id, max(1, int(round(grown))), stream_of(large.events[index])))
                next_id += 1
            elif address in ids:
                operations.append(("f", ids.pop(address), 0, stream_of(large.events[index])))
        return early + operations


def replay_config(config, capacity):
    """A sim configuration with the engine keys of `config` (GPUMEM_CONF style) and this capacity."""
    kept = []
    for item in (config or "").split(","):
        key = item.split(":", 1)[0].strip()
        if key in _ENGINE_KEYS:
            kept.append(item.strip())
    return ",".join(["backend:sim", f"capacity:{int(capacity)}"] + kept)


def within(config, limit):
    """`config` (replay_config's) bounded to `limit` bytes, as the simulated device's capacity: to the
    engine a memory limit is a smaller device, so the budget a memory limit sets and the room a device
    leaves replay alike."""
    return ",".join(f"capacity:{int(limit)}" if item.startswith("capacity:") else item for item in config.split(","))


def replay(operations, config, limit=None, mark=0):
    """(runs within the limit, peak reserved bytes, reserved bytes after the first `mark` operations) of
    the operations on gpumem's simulated device, within `limit` bytes if given (`within`)."""
    if limit is not None and limit < _PAGE:
        return False, 0, 0
    if limit is not None:
        config = within(config, limit)
    pointers, at_mark = {}, 0
    with gpumem.Allocator(config, from_environment=False) as allocator:
        reserved = lambda name: allocator.memory_stats()[f"reserved_bytes.all.{name}"]  # noqa: E731
        try:
            for index, (kind, identity, size, stream) in enumerate(operations):
                if index == mark:
                    at_mark = reserved("current")
                if kind == "a":
                    pointers[identity] = allocator.malloc(size, stream)
                else:
                    allocator.free(pointers.pop(identity))
        except gpumem.OutOfMemoryError:
            return False, reserved("peak"), at_mark
        return True, reserved("peak"), at_mark if mark < len(operations) else reserved("current")


def held_outside(model, config):
    """Reserved bytes the replay of the model's (larger) trial does not hold: the trial's reserved bytes
    at its start (cache emptied, batch made) less the replay's at the same point, where the replay
    holds the blocks that were live then. What is left is the device's looser packing of those blocks
    (made over the program's life, not in a row), or memory held outside gpumem's statistics' view;
    never less than nothing, so the replay's own packing is not trusted beyond the device's. Not from
    the peaks: the device keeps cache the replay need not keep the same way, and under a limit it
    releases cache, so the difference of the peaks mixes the engine's slack into what is held."""
    operations = model.operations(model.large.size)
    _, _, at_start = replay(operations, config, mark=model.early)
    return max(0, model.large.reserved_start - at_start)


def predict_by_replay(model, budget, config, maximum=None):
    """The largest batch whose replayed step fits in `budget` with what the step does not hold itself:
    (batch size, bytes held outside the step)."""
    large = model.large
    outside = held_outside(model, config)
    fits = lambda size: replay(model.operations(size), config, budget - outside)[0]  # noqa: E731
    low, high = large.size, 2 * large.size
    while high < _LARGEST and fits(high):  # doubling: a replay is cheap, a trial is not
        if maximum is not None and high >= maximum:
            return maximum, outside
        low, high = high, 2 * high
    if maximum is not None:
        high = min(high, maximum + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low, outside


def find_batch_size(step, make_batch, limit=None, start=2, margin=0.0, maximum=None, state=None, log=None,
                    config=None):
    """The largest batch size whose training step fits in ``limit`` bytes of device memory (default:
    gpumem's memory limit -- set_per_process_memory_fraction sets it -- or what the device has free).

    ``step(batch)`` runs one training step; ``make_batch(n)`` makes a batch of n samples. ``margin`` is
    a fraction of the limit kept free (default none). ``maximum``: no larger batch is wanted. ``config``:
    the allocator's GPUMEM_CONF keys, for the replay (default: gpumem.torch's). Returns a
    BatchSizeSearch."""
    import torch
    _check_sizes(start, maximum)
    log = log or _log_to_stderr
    budget = int(_memory_limit(limit) * (1 - margin))
    saved = _save_state(state)
    search = BatchSizeSearch()
    search.budget = budget
    try:
        search.batch_size = _search(step, make_batch, budget, start, maximum, config, search, log)
    finally:
        _restore_state(state, saved)
    if search.batch_size is None:
        raise torch.OutOfMemoryError(f"gpumem.find_batch_size: even a batch of {start} does not fit")
    log(f"gpumem.find_batch_size: batch size {search.batch_size} after {len(search.trials)} trials "
        f"({search.out_of_memory} out of memory)")
    return search


def _check_sizes(start, maximum):
    """ValueError unless start and maximum (if given) are batch sizes with start <= maximum."""
    for name, value in (("start", start), ("maximum", maximum)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"gpumem.find_batch_size: {name} must be a batch size (an int, 1 or more), not {value!r}")
    if maximum is not None and maximum < start:
        raise ValueError(f"gpumem.find_batch_size: maximum ({maximum}) is below start ({start}), the size of the "
                         "first trial: give a start of at most the maximum")


def _search(step, make_batch, budget, start, maximum, config, search, log):
    """Trial 1 at `start`; trial 2 as large as that trial alone says is safe (so that what only large
    batches allocate is seen); trial 3 at the prediction from both."""
    import torch
    first = _trial(step, make_batch, start, budget, search)
    if first is None:
        return None
    capacity = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    sim = replay_config(_installed_config() if config is None else config, capacity)
    safe, _ = predict_by_replay(StepModel(first), budget, sim, maximum)
    second_size = max(2 * start, safe * 3 // 4)
    if maximum is not None and second_size >= maximum:
        second_size = max(start, maximum)
    second = _trial(step, make_batch, second_size, budget, search)
    if second is None:
        return _bisect(step, make_batch, start, second_size, budget, search, log)
    if second_size == maximum:
        return second_size
    search.recorded = [first, second]
    predicted = _predict(first, second, budget, sim, maximum, search, log)
    search.predicted = predicted
    if predicted == second.size or _fits(step, make_batch, predicted, budget, search):
        return predicted
    return _bisect(step, make_batch, second.size, predicted, budget, search, log)


def _predict(small, large, budget, sim, maximum, search, log):
    model = StepModel(large, small)
    predicted, outside = predict_by_replay(model, budget, sim, maximum)
    search.paired, search.outside = model.paired, outside
    search.peaks = (large.peak_reserved, replay(model.operations(large.size), sim)[1])
    log(f"gpumem.find_batch_size: trials at {small.size} and {large.size} ({model.paired[0]} of "
        f"{model.paired[1]} allocations paired); within {budget / 2**20:.0f} MiB, {outside / 2**20:.0f} MiB "
        f"held outside the step, the replay predicts {predicted}: trying it")
    return max(large.size, min(predicted, maximum or predicted))


def _installed_config():
    from gpumem import torch as gpumem_torch
    return ",".join(part for part in (os.environ.get("GPUMEM_CONF", ""), gpumem_torch.installed_config()) if part)


def _memory_limit(limit):
    """The budget: `limit`, else gpumem's memory limit, but never more than the device leaves (its free
    memory and what the allocator holds: the CUDA context and other processes use the rest)."""
    import torch
    if limit is not None:
        return int(limit)
    free, _ = torch.cuda.mem_get_info()
    room = free + torch.cuda.memory_reserved()
    from gpumem import torch as gpumem_torch
    if gpumem_torch.is_installed():
        return min(gpumem_torch.allocator().memory_limit(), room)
    return room


def _history_is_on():
    """Whether torch's memory history is being recorded (torch._C._cuda_isHistoryEnabled; where torch
    lacks it, taken as off)."""
    import torch
    is_on = getattr(getattr(torch, "_C", None), "_cuda_isHistoryEnabled", None)
    return bool(is_on()) if is_on is not None else False


def _device_history(device):
    import torch
    traces = torch.cuda.memory._snapshot()["device_traces"]
    return traces[device] if device < len(traces) else []


def _events_of_step(step, batch):
    """Run the step with torch's memory history on; its allocation events in order. A history the program
    records already is left as it is (its settings, its events); the step's events are those after its
    last one. Else the history is on for the step alone."""
    import torch
    device = torch.cuda.current_device()
    if _history_is_on():
        before = _device_history(device)
        step(batch)
        torch.cuda.synchronize()
        traces = _entries_after(_device_history(device), before[-1] if before else None)
    else:
        torch.cuda.memory._record_memory_history(max_entries=1 << 20, context=None, stacks="python")
        try:
            step(batch)
            torch.cuda.synchronize()
            traces = _device_history(device)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
    return [(event["action"], event["addr"], event["size"], event.get("stream", 0)) for event in traces
            if event["action"] in ("alloc", "free_requested")]


def _entry_key(entry):
    return tuple(entry.get(key) for key in ("action", "addr", "size", "stream", "time_us"))


def _entries_after(entries, last_before):
    """The entries after `last_before` (the newest one before the step; None: every entry). The program's
    history is a ring: when the step pushed `last_before` out of it, the step's first events are gone too."""
    if last_before is None:
        return entries
    key = _entry_key(last_before)
    for index in range(len(entries) - 1, -1, -1):
        if _entry_key(entries[index]) == key:
            return entries[index + 1:]
    raise RuntimeError("gpumem.find_batch_size: the memory history this program records (torch.cuda.memory."
                       "_record_memory_history) keeps fewer entries than one training step makes: raise its "
                       "max_entries, or turn it off during the search")


def _live_blocks():
    """{address: bytes} of the blocks allocated (or freed and waiting for a stream) now on the current device."""
    import torch
    device = torch.cuda.current_device()
    live = {}
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device", device) != device:
            continue
        address = segment["address"]
        for block in segment["blocks"]:
            if block["state"] in ("active_allocated", "active_pending_free"):
                live[address] = block["size"]
            address += block["size"]
    return live


def _released_events(events):
    """The step's frees of blocks made before it, in order: a free of an address that the step has not
    allocated by then. (The step may allocate at that address again later, as backward() makes new
    gradients where zero_grad(set_to_none=True) freed the old ones: the old block is still released.)"""
    made, released, seen = set(), [], set()
    for event in events:
        if event[0] == "alloc":
            made.add(event[1])
        elif event[1] in made:
            made.discard(event[1])
        elif event[1] not in seen:
            seen.add(event[1])
            released.append(event)
    return released


def _outside_blocks(live, events, batch_storages):
    """Sizes of the blocks live at the step's start that are neither the batch nor freed by the step."""
    released = {event[1] for event in _released_events(events)}
    return [size for address, size in sorted(live.items()) if address not in released and address not in batch_storages]


def _device_tensors(batch, seen=None):
    """{data pointer: bytes} of each distinct device storage in the batch (tensors, or lists, tuples and
    dicts of them)."""
    import torch
    seen = {} if seen is None else seen
    if isinstance(batch, torch.Tensor):
        if batch.is_cuda:
            storage = batch.untyped_storage()
            seen.setdefault(storage.data_ptr(), storage.nbytes())
    elif isinstance(batch, dict):
        for value in batch.values():
            _device_tensors(value, seen)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            _device_tensors(value, seen)
    return seen


def _trial(step, make_batch, size, budget, search):
    """A recorded trial (a Trial), or None when the step at this size does not fit."""
    import torch
    torch.cuda.empty_cache()  # every trial starts from the memory the step does not hold, as the model assumes
    try:
        batch = make_batch(size)  # a batch that does not fit makes no step that fits
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        reserved_start = torch.cuda.memory_reserved()
        live_at_start = _live_blocks()
        events = _events_of_step(step, batch)
    except torch.OutOfMemoryError:
        search.out_of_memory += 1
        search.trials.append((size, False, None, None))
        return None
    storages = _device_tensors(batch)
    del batch
    peak_reserved = torch.cuda.max_memory_reserved()
    search.trials.append((size, peak_reserved <= budget, torch.cuda.max_memory_allocated(), peak_reserved))
    if peak_reserved > budget:
        return None
    return Trial(size, events, list(storages.values()), reserved_start, peak_reserved,
                 _outside_blocks(live_at_start, events, storages))


def _fits(step, make_batch, size, budget, search):
    """One trial: the step at this size runs without running out and keeps reserved within the budget."""
    import torch
    try:
        torch.cuda.empty_cache()
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
    """A fitting size in [low, high), where low fits and high does not: the largest one to within low / 64
    (each try is a real training step, so the bisection stops once the gap is at most max(1, low // 64)
    samples; the last size found to fit)."""
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
    import torch
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
