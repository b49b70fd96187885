"""gpumem.batch_size without a GPU: the step model built from two recorded trials, and the prediction by
replay on the simulated device, checked against brute force over every batch size. Then find_batch_size
and gpumem.governor's adaptive step and leak watch over a stand-in torch (fake_torch below: tensors on
Python lists, torch.cuda's calls as find_batch_size makes them, its memory history)."""
import contextlib
import random
import sys
import types
import unittest

import gpumem
from gpumem import batch_size

MIB = 1 << 20
GRADIENTS = (4 * MIB, 6 * MIB, 512)


def step_events(size, first_step=False, activation=3 * MIB + 4096):
    """A training step's allocation events at `size` samples, as torch's memory history gives them:
    the last step's gradients released (or the optimizer's state made, on the first step), activations
    that grow with the batch, temporaries that do not, new gradients kept."""
    events, address = [], [1 << 40]

    def alloc(nbytes):
        address[0] += 1 << 30
        events.append(("alloc", address[0], nbytes, 7))
        return address[0]
    free = lambda where, nbytes: events.append(("free_requested", where, nbytes, 7))  # noqa: E731
    activations = [alloc(activation * size + 512 * layer) for layer in range(4)]
    scratch = alloc(2 * MIB)
    free(scratch, 2 * MIB)
    if first_step:
        for nbytes in GRADIENTS:
            alloc(2 * nbytes)  # optimizer state, kept
    else:
        for index, nbytes in enumerate(GRADIENTS):
            free(100 + index, nbytes)  # the last step's gradients, made before this step
    for layer in reversed(range(4)):
        temporary = alloc(activation * size // 2 + 1000)
        free(temporary, activation * size // 2 + 1000)
        free(activations[layer], activation * size + 512 * layer)
    for nbytes in GRADIENTS:
        alloc(nbytes)
    return events


def batch_tensors(size):
    return [size * 3 * 4096, size * 8]


class StepModelTest(unittest.TestCase):
    def setUp(self):
        self.config = batch_size.replay_config("", 8 << 30)

    def trial(self, size, first_step=False, outside=0, limit=None):
        """The trial as a device would measure it: `outside` bytes held before the step (parameters),
        then the step; its reserved bytes at the start and at the peak, under `limit` if given."""
        model = batch_size.StepModel(batch_size.Trial(size, step_events(size, first_step), batch_tensors(size), 0, 0))
        operations = [("a", -1, outside, 0)] + model.operations(size) if outside else model.operations(size)
        ran, peak, at_start = batch_size.replay(operations, self.config, limit, mark=model.early + bool(outside))
        self.assertTrue(ran)
        return batch_size.Trial(size, step_events(size, first_step), batch_tensors(size), at_start, peak)

    def test_model_gives_the_step_at_any_size(self):
        model = batch_size.StepModel(self.trial(4), self.trial(2, first_step=True))
        self.assertEqual(model.paired, (9, 9))
        operations = model.operations(10)
        sizes = sorted(size for kind, _, size, _ in operations if kind == "a")
        expected = sorted(list(GRADIENTS) + batch_tensors(10)  # released, batch, the step's own
                          + [e[2] for e in step_events(10) if e[0] == "alloc"])
        self.assertEqual(sizes, expected)
        frees = [identity for kind, identity, _, _ in operations if kind == "f"]
        self.assertEqual(len(frees), len(set(frees)))
        self.assertEqual(len(frees), 3 + 4 + 4 + 1)

    def test_prediction_equals_the_largest_size_that_fits_on_the_device(self):
        outside = 40 * MIB  # parameters and optimizer state, held before the step
        small, large = self.trial(2, first_step=True, outside=outside), self.trial(4, outside=outside)
        model = batch_size.StepModel(large, small)
        for budget in (200 * MIB, 333 * MIB, 1 << 30):
            predicted, seen_outside = batch_size.predict_by_replay(model, budget, self.config)
            self.assertEqual(seen_outside, outside)
            on_device = lambda size: batch_size.replay(  # noqa: E731
                [("a", -1, outside, 0)] + model.operations(size), self.config, budget)[0]
            self.assertTrue(on_device(predicted), budget)
            self.assertFalse(any(on_device(size) for size in range(predicted + 1, predicted + 40)), budget)
        capped, _ = batch_size.predict_by_replay(model, 1 << 30, self.config, maximum=9)
        self.assertEqual(capped, 9)

    def test_outside_from_the_start_even_when_the_limit_bound_the_trial(self):
        """A step of mixed sizes, after which the engine keeps some cache: under a limit the device
        releases it and reserves less at the peak, so the peak does not tell what is held outside."""
        generator, events, live = random.Random(1), [], []
        for index in range(400):
            if live and generator.random() < 0.5:
                address, nbytes = live.pop(generator.randrange(len(live)))
                events.append(("free_requested", address, nbytes, 0))
            else:
                live.append((index, generator.randrange(1, 20) * MIB + generator.randrange(4096)))
                events.append(("alloc", live[-1][0], live[-1][1], 0))
        outside, operations = 40 * MIB, batch_size.StepModel(batch_size.Trial(4, events, [], 0, 0)).operations(4)
        on_device = lambda limit: batch_size.replay([("a", -1, outside, 0)] + operations, self.config,  # noqa: E731
                                                    limit, mark=1)
        _, free_peak, start = on_device(None)
        # The tightest limit a few pages below the free peak at which the step still runs.
        limit = next(free_peak - cut * MIB for cut in range(16, 0, -2) if on_device(free_peak - cut * MIB)[0])
        ran, bound_peak, _ = on_device(limit)
        self.assertLess(bound_peak, free_peak)  # the device released cache to fit
        for peak in (free_peak, bound_peak):
            model = batch_size.StepModel(batch_size.Trial(4, events, [], start, peak))
            self.assertEqual(batch_size.held_outside(model, self.config), outside)
            self.assertTrue(batch_size.replay(model.operations(4), self.config, limit - outside)[0])
        _, replayed, _ = batch_size.replay(operations, self.config)
        self.assertLess(bound_peak - replayed, outside)  # what the peaks alone would have said

    def test_blocks_held_outside_are_replayed_with_the_step(self):
        """Small blocks held outside the step (biases, norms) leave room in their pages that the step's
        small blocks fill on the device: the replay holds them, so it counts only what the device
        reserved beyond its own packing of them, and predicts more than counting their pages would."""
        outside_blocks = [3 * 1024] * 300 + [6 * MIB] * 4  # about 1 MiB of small blocks, 24 MiB of large
        events, address = [], 1000
        for _ in range(50):  # the step: small temporaries, a large activation per sample
            events.append(("alloc", address, 64 * 1024, 0))
            events.append(("alloc", address + 1, 4 * MIB, 0))
            events.append(("free_requested", address, 64 * 1024, 0))
            address += 2
        for freed in range(1001, address, 2):
            events.append(("free_requested", freed, 4 * MIB, 0))
        with_blocks = batch_size.Trial(4, events, [], 0, 0, outside_blocks)
        _, _, start = batch_size.replay(batch_size.StepModel(with_blocks).operations(4), self.config,
                                        mark=len(outside_blocks))
        for slack in (0, 10 * MIB):  # the device packed them as the replay does, or looser
            model = batch_size.StepModel(batch_size.Trial(4, events, [], start + slack, 0, outside_blocks))
            self.assertEqual(batch_size.held_outside(model, self.config), slack)
        counted = batch_size.StepModel(batch_size.Trial(4, events, [], start, 0))  # pages counted as held
        self.assertEqual(batch_size.held_outside(counted, self.config), start)
        budget = 400 * MIB
        exact, _ = batch_size.predict_by_replay(batch_size.StepModel(with_blocks), budget, self.config)
        looser, _ = batch_size.predict_by_replay(counted, budget, self.config)
        self.assertGreaterEqual(exact, looser)
        fits = lambda size: batch_size.replay(batch_size.StepModel(with_blocks).operations(size),  # noqa: E731
                                              self.config, budget)[0]
        self.assertTrue(fits(exact))
        self.assertFalse(fits(exact + 1))

    def test_a_block_freed_and_made_again_at_its_address_is_released(self):
        """zero_grad(set_to_none=True) frees the last step's gradients and backward() makes new ones where
        they were: the old ones are released by the step, not held outside it through the step (they were
        counted twice, and the batch predicted too small by the gradients' size)."""
        events = [("free_requested", 100, 4 * MIB, 7), ("alloc", 200, 8 * MIB, 7), ("alloc", 100, 4 * MIB, 7),
                  ("free_requested", 200, 8 * MIB, 7)]
        self.assertEqual(batch_size._outside_blocks({100: 4 * MIB, 300: 16 * MIB}, events, {}), [16 * MIB])
        model = batch_size.StepModel(batch_size.Trial(1, events, [], 0, 0))
        operations = model.operations(1)
        self.assertEqual(model.early, 1)  # the old gradient: made before the step, freed by it
        self.assertEqual(operations[0], ("a", 0, 4 * MIB, 0))
        self.assertEqual(operations[1:], [("f", 0, 0, 0), ("a", 1, 8 * MIB, 0), ("a", 2, 4 * MIB, 0), ("f", 1, 0, 0)])

    def test_one_trial_gives_a_size_that_fits(self):
        outside = 40 * MIB
        first = self.trial(2, first_step=True, outside=outside)
        exact_model = batch_size.StepModel(self.trial(4, outside=outside), first)
        for budget in (200 * MIB, 333 * MIB, 1 << 30):
            safe, _ = batch_size.predict_by_replay(batch_size.StepModel(first), budget, self.config)
            exact, _ = batch_size.predict_by_replay(exact_model, budget, self.config)
            self.assertLessEqual(safe, exact, budget)
            self.assertGreater(safe, exact // 3, budget)  # the fixed parts of this step are small

    def test_allocations_without_a_pair_grow_in_proportion(self):
        events = step_events(2)
        del events[4:6]  # the small trial made no scratch block
        small = batch_size.Trial(2, events, batch_tensors(2), 0, 0)
        large = batch_size.Trial(4, step_events(4), batch_tensors(4), 0, 0)
        model = batch_size.StepModel(large, small)
        self.assertEqual(model.paired, (8, 9))
        self.assertEqual(batch_size.StepModel(large).paired, (0, 9))
        self.assertEqual(large.events[4][:3:2], ("alloc", 2 * MIB))
        self.assertEqual(model.growth[4], 2 * MIB / 4)
        self.assertEqual(model.growth[0], 3 * MIB + 4096)  # paired: a layer's activation

    def test_replay_config_keeps_only_the_engine_keys(self):
        config = batch_size.replay_config("engine:segments, publish:true,page_size:4MiB,memory_limit:1GiB", 1 << 30)
        self.assertEqual(config, "backend:sim,capacity:1073741824,engine:segments,page_size:4MiB")
        self.assertEqual(batch_size.replay([("a", 0, 2 << 30, 0)], config), (False, 0, 0))
        self.assertEqual(batch_size.replay([("a", 0, 1, 0)], config, limit=0), (False, 0, 0))
        with self.assertRaises(gpumem.GpumemError):
            batch_size.replay([], batch_size.replay_config("page_size:3", 1 << 30))
        # Compaction and the refill rule change where blocks go, so the replay keeps them too.
        config = batch_size.replay_config("compact_min:2MiB,refill_groups:false,history:1000", 1 << 30)
        self.assertEqual(config, "backend:sim,capacity:1073741824,compact_min:2MiB,refill_groups:false")
        self.assertEqual(batch_size.replay([("a", 0, 1 << 20, 0)], config)[0], True)

    def test_every_key_that_moves_blocks_is_kept(self):
        """Every key gm_config_help lists is either kept (it changes where blocks go or what the engine
        reserves) or named here as one that does not: a new engine key left out of the replay would
        predict for another engine than the user's."""
        keys = {line.split()[0] for line in gpumem.config_help().splitlines()[1:] if line.startswith("  ")}
        placed_elsewhere = {"backend", "device", "capacity", "memory_limit", "host_limit", "history", "publish",
                            "pressure_high", "pressure_low", "pressure_signals", "pressure_interval_ms",
                            "pressure_psi_high", "pressure_psi_low", "fault_rate", "fault_seed"}
        self.assertEqual(keys - placed_elsewhere, set(batch_size._ENGINE_KEYS))
        self.assertEqual(batch_size.replay_config("stitch:false,split_blocks:false", 1 << 30),
                         "backend:sim,capacity:1073741824,stitch:false,split_blocks:false")

    def test_a_budget_replays_as_a_device_of_its_size(self):
        """The budget is replayed as the simulated device's capacity. To the engine a memory limit of the
        same bytes is the same device (the same fits, the same peak reserved bytes), so a budget that
        gpumem's memory limit sets and one that the device's room leaves predict alike. The prediction
        is the largest size that fits, checked against brute force, for a step whose layers each leave
        a small block saved beside a large temporary (the saved blocks pin the temporaries' chunks),
        with one chunk per growth (chunk_room_share:0)."""
        config = batch_size.replay_config("chunk_room_share:0", 8 << 30)

        def events(size):
            made, saved = [], []
            for layer in range(12):
                temporary, kept = 30 * MIB * size // 4 + 4096 * layer, MIB + 8192 * layer
                made += [("alloc", 2 * layer, temporary, 0), ("alloc", 2 * layer + 1, kept, 0),
                         ("free_requested", 2 * layer, temporary, 0)]
                saved.append(("free_requested", 2 * layer + 1, kept, 0))
            return made + [("alloc", 99, 60 * MIB * size // 4, 0), ("free_requested", 99, 60 * MIB * size // 4, 0)] + saved
        model = batch_size.StepModel(batch_size.Trial(4, events(4), [], 0, 0), batch_size.Trial(2, events(2), [], 0, 0))
        for budget in (333 * MIB, 700 * MIB, 1000 * MIB):
            predicted, _ = batch_size.predict_by_replay(model, budget, config)
            on_device = lambda size: batch_size.replay(model.operations(size), config, budget)  # noqa: E731
            self.assertTrue(on_device(predicted)[0], budget)
            self.assertFalse(any(on_device(size)[0] for size in range(predicted + 1, predicted + 20)), budget)
            for size in (predicted, predicted + 1):
                under_limit = batch_size.replay(model.operations(size), f"{config},memory_limit:{budget}")
                self.assertEqual(under_limit[:2], on_device(size)[:2], (budget, size))

    def test_within_bounds_a_configuration_as_the_capacity(self):
        config = batch_size.replay_config("max_chunk_size:8MiB", 1 << 30)
        self.assertEqual(batch_size.within(config, 5 << 20), "backend:sim,capacity:5242880,max_chunk_size:8MiB")
        self.assertEqual(batch_size.replay([("a", 0, 1, 0)], config, 1 << 20), (False, 0, 0))
        self.assertEqual(batch_size.replay([("a", 0, 4 << 20, 0)], config, 5 << 20)[0], True)
        self.assertEqual(batch_size.replay([("a", 0, 6 << 20, 0)], config, 5 << 20)[0], False)

class FakeTensor:
    """A float tensor of one or two dimensions on Python lists: what the governor does with a batch, a
    batch-norm module's input and its running statistics."""

    dtype = "float32"

    def __init__(self, values, shape=None):
        if shape is None:
            nested = bool(values) and isinstance(values[0], list)
            shape = (len(values), len(values[0])) if nested else (len(values),)
            values = [x for row in values for x in row] if nested else list(values)
        self.values, self.shape = [float(x) for x in values], tuple(shape)

    def rows(self):
        width = self.shape[1]
        return [self.values[i * width:(i + 1) * width] for i in range(self.shape[0])]

    def __getitem__(self, where):
        return FakeTensor(self.rows()[where] if len(self.shape) == 2 else self.values[where])

    def _apply(self, other, operation):
        others = other.values if isinstance(other, FakeTensor) else [other] * len(self.values)
        return FakeTensor([operation(a, b) for a, b in zip(self.values, others)], self.shape)

    __add__ = __radd__ = lambda self, other: self._apply(other, lambda a, b: a + b)
    __mul__ = __rmul__ = lambda self, other: self._apply(other, lambda a, b: a * b)
    __sub__ = lambda self, other: self._apply(other, lambda a, b: a - b)
    __truediv__ = lambda self, other: self._apply(other, lambda a, b: a / b)
    __pow__ = lambda self, other: self._apply(other, lambda a, b: a ** b)
    detach = float = lambda self: self
    to = lambda self, dtype: self  # noqa: E731
    reshape = lambda self, rows, columns: self  # noqa: E731 (only ever of a transposed 2-D tensor)
    clone = lambda self: FakeTensor(list(self.values), self.shape)  # noqa: E731
    item = lambda self: self.values[0]  # noqa: E731

    def transpose(self, first, second):
        return FakeTensor([list(column) for column in zip(*self.rows())])

    def mean(self, dimension):
        return FakeTensor([sum(row) / len(row) for row in self.rows()])

    def var(self, dimension, unbiased=True):
        return FakeTensor([sum((x - sum(row) / len(row)) ** 2 for x in row) / (len(row) - unbiased)
                           if len(row) > unbiased else float("nan") for row in self.rows()])

    def copy_(self, other):
        self.values = list(other.values)
        return self

    def add_(self, other):
        self.values = self._apply(other, lambda a, b: a + b).values
        return self


class FakeModule:
    def __init__(self, *children):
        self.children, self.hooks, self.training = list(children), [], True

    def __call__(self, *inputs):
        for hook in list(self.hooks):
            hook(self, inputs)
        return self.forward(*inputs)

    def forward(self, x):
        for child in self.children:
            x = child(x)
        return x

    def register_forward_pre_hook(self, hook):
        self.hooks.append(hook)
        return types.SimpleNamespace(remove=lambda: self.hooks.remove(hook))

    def modules(self):
        yield self
        for child in self.children:
            yield from child.modules()

    def parameters(self):
        return []


class FakeBatchNorm(FakeModule):
    """Updates its running statistics in forward, as torch's batch norm does in training."""

    def __init__(self):
        super().__init__()
        self.momentum, self.track_running_stats = 0.1, True
        self.running_mean, self.running_var = FakeTensor([0.0]), FakeTensor([1.0])
        self.num_batches_tracked = FakeTensor([0.0])

    def forward(self, x):
        columns, m = x.transpose(0, 1), self.momentum
        self.running_mean.copy_((1 - m) * self.running_mean + m * columns.mean(1))
        self.running_var.copy_((1 - m) * self.running_var + m * columns.var(1, unbiased=True))
        self.num_batches_tracked.copy_(self.num_batches_tracked + 1)
        return x


class FakeDevice:
    """torch.cuda as find_batch_size sees it: the peak a step sets, and the memory history (its entries
    while on; turning it off clears them, as torch does)."""

    def __init__(self):
        self.history_on, self.entries, self.history_calls, self.peak, self.clock = False, [], [], 0, 0
        self.segments, self.current = [], 0

    def record_history(self, enabled="all", **settings):
        self.history_calls.append(enabled)
        self.history_on = enabled is not None
        if not self.history_on:
            self.entries = []

    def event(self, action, address, size):
        self.clock += 1
        if self.history_on:
            self.entries.append({"action": action, "addr": address, "size": size, "stream": 0, "time_us": self.clock})


def fake_torch(device=None):
    """A stand-in torch module: FakeTensor, FakeModule and FakeBatchNorm as torch.Tensor, torch.nn.Module and
    batch norm; torch.cuda over a FakeDevice."""
    device = device or FakeDevice()
    torch = types.ModuleType("torch")
    torch.Tensor, torch.OutOfMemoryError, torch.no_grad = FakeTensor, type("OutOfMemoryError", (RuntimeError,), {}), \
        contextlib.nullcontext
    torch.is_tensor = lambda value: isinstance(value, FakeTensor)
    torch.nn = types.SimpleNamespace(Module=FakeModule, modules=types.SimpleNamespace(
        batchnorm=types.SimpleNamespace(_BatchNorm=FakeBatchNorm)))
    nothing = lambda *arguments: None  # noqa: E731
    torch.cuda = types.SimpleNamespace(
        empty_cache=nothing, synchronize=nothing, current_device=lambda: device.current, memory_reserved=lambda: 0,
        reset_peak_memory_stats=lambda: setattr(device, "peak", 0), max_memory_reserved=lambda: device.peak,
        max_memory_allocated=lambda: device.peak, memory_snapshot=lambda: device.segments, memory_allocated=lambda: 0,
        get_device_properties=lambda index: types.SimpleNamespace(total_memory=80 << 30),
        memory=types.SimpleNamespace(_record_memory_history=device.record_history,
                                     _snapshot=lambda: {"device_traces": [list(device.entries)], "segments": []}))
    torch._C = types.SimpleNamespace(_cuda_isHistoryEnabled=lambda: device.history_on)
    return torch, device


class StandInTorchTest(unittest.TestCase):
    """fake_torch() as sys.modules["torch"] for each test (gpumem.governor's global `torch` too)."""

    def setUp(self):
        self.torch, self.device = fake_torch()
        saved = sys.modules.get("torch")
        sys.modules["torch"] = self.torch
        self.addCleanup(lambda: sys.modules.__setitem__("torch", saved) if saved else sys.modules.pop("torch", None))
        from gpumem import governor
        self.governor, saved_torch = governor, getattr(governor, "torch", None)
        governor.torch = self.torch
        self.addCleanup(setattr, governor, "torch", saved_torch)


class FindBatchSizeTest(StandInTorchTest):
    def step(self, samples):
        """A step of 1 MiB of activations a sample, out of memory above 200 MiB."""
        self.device.event("alloc", 1, samples * MIB)
        self.device.event("free_requested", 1, samples * MIB)
        self.device.peak = samples * MIB
        if samples * MIB > 200 * MIB:
            raise self.torch.OutOfMemoryError("step out of memory")

    def find(self, make_batch=lambda samples: samples, **options):
        return batch_size.find_batch_size(self.step, make_batch, limit=1 << 30, log=lambda line: None, config="",
                                          **options)

    def test_a_batch_that_does_not_fit_is_a_size_that_does_not_fit(self):
        def make_batch(samples):  # the batch's own tensors run out above 64 samples
            if samples > 64:
                raise self.torch.OutOfMemoryError(f"out of memory making a batch of {samples}")
            return samples
        search = self.find(make_batch)  # raised the second trial's OutOfMemoryError
        self.assertEqual(search.batch_size, 64)
        self.assertEqual(search.trials[1][:2], (768, False))

    def test_a_history_the_program_records_stays_on(self):
        self.device.record_history("all")
        self.device.history_calls = []
        self.device.event("alloc", 99, 5 * MIB)  # the program's own
        self.assertEqual(batch_size._events_of_step(self.step, 3), [("alloc", 1, 3 * MIB, 0),
                                                                    ("free_requested", 1, 3 * MIB, 0)])
        self.assertIn(self.find().batch_size, range(196, 201))
        self.assertTrue(self.device.history_on)  # was turned off, and emptied
        self.assertEqual(self.device.history_calls, [])  # its settings left as they were
        self.assertEqual(self.device.entries[0]["addr"], 99)

    def test_a_history_that_was_off_is_off_after(self):
        search = self.find()
        self.assertFalse(self.device.history_on)
        self.assertEqual(self.device.history_calls[:2], ["all", None])
        self.assertIn(search.batch_size, range(196, 201))  # the bisection stops within 1/64

    def test_blocks_live_are_the_current_devices(self):
        self.device.current = 1
        self.device.segments = [
            {"device": 0, "address": 4096, "blocks": [{"size": 512, "state": "active_allocated"}]},
            {"device": 1, "address": 8192, "blocks": [{"size": 512, "state": "inactive"},
                                                      {"size": 1024, "state": "active_pending_free"}]}]
        self.assertEqual(batch_size._live_blocks(), {8704: 1024})  # device 0's block counted too

    def test_a_maximum_below_the_start_is_refused(self):
        # It returned a size above the maximum.
        with self.assertRaises(ValueError) as caught:
            self.find(start=8, maximum=4)
        self.assertIn("maximum (4) is below start (8)", str(caught.exception))
        self.assertEqual(self.device.clock, 0)  # no trial ran
        self.assertEqual(self.find(start=4, maximum=4).batch_size, 4)


class Parameter:
    requires_grad, grad = True, None


class AdaptiveTest(StandInTorchTest):
    def model_and_step(self, failures=0, **options):
        """A model (one batch norm, one parameter) and its adaptive step, whose backward runs out of memory
        `failures` times: after forward has updated the running statistics."""
        norm, parameter, left = FakeBatchNorm(), Parameter(), [failures]
        model = FakeModule(norm)
        model.parameters = lambda: [parameter]

        def backward():
            if left[0]:
                left[0] -= 1
                raise self.torch.OutOfMemoryError("CUDA out of memory (in backward)")
            parameter.grad = FakeTensor([1.0])

        def loss_of(batch):
            model(batch)
            return _Loss(backward)
        return norm, parameter, self.governor.adaptive(loss_of, model, log=lambda line: None, **options)

    def statistics(self, norm):
        return norm.running_mean.values, norm.running_var.values, norm.num_batches_tracked.values

    def test_running_statistics_are_restored_before_every_retry(self):
        batch = FakeTensor([[1.0], [2.0], [3.0], [4.0]])
        norm, _, step = self.model_and_step()
        step(batch)
        unsplit = self.statistics(norm)
        retries = {"split": {}, "defragmented": {"defragment": lambda: 8 << 20},
                   "failed merge": {"micro_batches": 2, "merge_after": 0}}
        for name, options in retries.items():
            norm, _, step = self.model_and_step(failures=1, **options)
            step(batch)  # one try ran forward (the statistics updated), then out of memory in backward
            self.assertEqual(self.statistics(norm), unsplit, name)
        self.assertEqual((step.counts["failed_merges"], step.micro_batches), (1, 2))

    def test_gradients_from_before_the_call_are_kept_when_it_fails(self):
        norm, parameter, step = self.model_and_step(failures=99)
        parameter.grad = FakeTensor([5.0])  # accumulated by an earlier call
        before = self.statistics(norm)
        with self.assertRaises(self.torch.OutOfMemoryError) as caught:
            step(FakeTensor([[1.0], [2.0]]))
        self.assertIn("a single sample does not fit", str(caught.exception))
        self.assertEqual(parameter.grad.values, [5.0])  # was None
        self.assertEqual(self.statistics(norm), before)
        norm, parameter, step = self.model_and_step()
        parameter.grad = FakeTensor([5.0])
        step(FakeTensor([[1.0], [2.0]]))
        self.assertEqual(parameter.grad.values, [6.0])

    def test_batches_without_samples_are_clear_errors(self):
        _, _, step = self.model_and_step()
        for batch, message in ((FakeTensor([]), "the batch has no samples"), ({}, "cannot split an empty dict"),
                               ([], "cannot split an empty list")):  # ZeroDivisionError, StopIteration, IndexError
            with self.assertRaises(ValueError) as caught:
                step(batch)
            self.assertIn(message, str(caught.exception))
        for steps, warmup in ((0, 2), (1.5, 2), (5, -1)):  # steps=0 was a ZeroDivisionError at the first step
            with self.assertRaises(ValueError):
                self.governor.watch_leaks(steps=steps, warmup=warmup)


class _Loss:
    """A micro-batch's loss: scaled and summed as the governor does, and its backward."""

    def __init__(self, backward):
        self.backward = backward

    def __mul__(self, factor):
        return self

    def __add__(self, other):
        return self

    def detach(self):
        return self


if __name__ == "__main__":
    unittest.main()
