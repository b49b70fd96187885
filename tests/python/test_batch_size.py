"""gpumem.batch_size without a GPU: the step model built from two recorded trials, and the prediction by
replay on the simulated device, checked against brute force over every batch size."""
import random
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

if __name__ == "__main__":
    unittest.main()
