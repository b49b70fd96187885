"""Memory pressure and out-of-memory causes from Python: the ctypes layer over gm_set_pressure_policy,
gm_on_pressure, gm_get_pressure and gm_last_oom_cause, on the sim backend (no GPU, no PyTorch); the cgroup
signal on a fixture tree of /proc and /sys/fs/cgroup."""
import os
import shutil
import tempfile
import unittest

import gpumem

MiB = 1 << 20


class PressureTest(unittest.TestCase):
    def setUp(self):
        self.allocator = gpumem.Allocator("backend:sim,capacity:1GiB,engine:segments,release_before_growth:false",
                                          from_environment=False)

    def tearDown(self):
        self.allocator.close()

    def test_policy_levels_and_callbacks(self):
        self.assertIsNone(self.allocator.pressure_policy())
        self.allocator.set_pressure_policy(high=0.5, low=0.25, signals=("allocated",))
        policy = self.allocator.pressure_policy()
        self.assertEqual(policy["signals"], ("allocated",))
        self.assertEqual((policy["high"], policy["low"], policy["interval_ms"]), (0.5, 0.25, 100))
        seen = []

        def on_pressure(level, readings):
            seen.append((level, readings["allocated_bytes"], readings["signals_high"]))
            # No gpumem lock is held: the callback may allocate and free.
            self.allocator.free(self.allocator.malloc(4 * MiB))

        self.assertIs(self.allocator.on_pressure(on_pressure), on_pressure)
        block = self.allocator.malloc(512 * MiB)
        self.assertEqual(seen, [("high", 512 * MiB, ("allocated",))])
        pressure = self.allocator.pressure()
        self.assertEqual(pressure["level"], "high")
        self.assertEqual((pressure["high_bytes"], pressure["low_bytes"]), (512 * MiB, 256 * MiB))
        self.allocator.free(block)
        self.assertEqual(seen[-1], ("normal", 0, ()))
        stats = self.allocator.memory_stats()
        self.assertEqual(stats["num_pressure_rises"], 1)
        self.assertEqual(stats["num_pressure_callbacks"], 2)
        self.allocator.remove_pressure_callback(on_pressure)
        self.allocator.free(self.allocator.malloc(600 * MiB))
        self.assertEqual(len(seen), 2)
        with self.assertRaises(gpumem.GpumemError):
            self.allocator.remove_pressure_callback(on_pressure)
        with self.assertRaises(ValueError):
            self.allocator.set_pressure_policy(high=0.9, signals=("gpu",))
        with self.assertRaises(gpumem.GpumemError) as caught:
            self.allocator.set_pressure_policy(high=0.5, low=0.7)
        self.assertIn("low (0.7) must be in (0, high = 0.5)", str(caught.exception))
        self.allocator.set_pressure_policy(None)
        self.assertIsNone(self.allocator.pressure_policy())

    def test_critical_callback_frees_what_the_program_keeps(self):
        kept = [self.allocator.malloc(900 * MiB)]
        levels = []

        def release(level, readings):
            levels.append((level, readings["request_bytes"]))
            if level == "critical" and kept:
                self.allocator.free(kept.pop())

        self.allocator.on_pressure(release)
        pointer = self.allocator.malloc(300 * MiB)  # fails until the callback frees the 900 MiB
        self.assertTrue(pointer)
        self.assertEqual(levels, [("critical", 300 * MiB)])
        stats = self.allocator.memory_stats()
        self.assertEqual((stats["num_ooms"], stats["num_pressure_criticals"]), (0, 1))
        self.allocator.free(pointer)

    def test_out_of_memory_names_its_cause(self):
        with self.assertRaises(gpumem.OutOfMemoryError) as caught:
            self.allocator.malloc(2 << 30)
        self.assertEqual(caught.exception.cause, "capacity")
        self.assertIn("\nCause: capacity. The request alone (2.00 GiB)", str(caught.exception))
        self.allocator.sim_set_used_elsewhere(700 * MiB)
        with self.assertRaises(gpumem.OutOfMemoryError) as caught:
            self.allocator.malloc(500 * MiB)
        self.assertEqual(caught.exception.cause, "other_processes")
        self.allocator.sim_set_used_elsewhere(0)
        self.allocator.set_memory_limit(256 * MiB)
        with self.assertRaises(gpumem.OutOfMemoryError) as caught:
            self.allocator.malloc(300 * MiB)
        self.assertEqual(caught.exception.cause, "memory_limit")
        self.assertIn("Raise the limit to at least 300.00 MiB", str(caught.exception))

    def test_device_signal_and_check(self):
        self.allocator.set_pressure_policy(high=0.5, low=0.25, signals=("device",), interval_ms=3600000)
        self.assertEqual(self.allocator.check_pressure()["level"], "normal")
        self.allocator.sim_set_used_elsewhere(600 * MiB)
        readings = self.allocator.check_pressure()
        self.assertEqual((readings["level"], readings["device_used_bytes"]), ("high", 600 * MiB))
        self.assertEqual(readings["signals_high"], ("device",))

    def test_cgroup_signal_round_trip(self):
        root = tempfile.mkdtemp(prefix="gpumem_cgroup_")
        self.addCleanup(shutil.rmtree, root)

        def write(relative, text):
            path = os.path.join(root, relative.lstrip("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as file:
                file.write(text)

        write(f"/proc/{os.getpid()}/cgroup", "0::/job\n")
        write("/sys/fs/cgroup/job/memory.max", "1073741824\n")
        write("/sys/fs/cgroup/job/memory.high", "max\n")
        write("/sys/fs/cgroup/job/memory.current", "536870912\n")
        self.assertEqual(gpumem.PRESSURE_SIGNALS["cgroup"], 32)
        self.allocator.set_pressure_policy(high=0.9, low=0.8, signals=("cgroup", "reserved"), interval_ms=3600000,
                                           host_root=root)
        policy = self.allocator.pressure_policy()
        self.assertEqual(policy["signals"], ("reserved", "cgroup"))
        self.assertEqual(policy["host_root"], root)
        readings = self.allocator.check_pressure()
        self.assertEqual((readings["level"], readings["cgroup_current_bytes"], readings["cgroup_limit_bytes"]),
                         ("normal", 512 * MiB, 1024 * MiB))
        write("/sys/fs/cgroup/job/memory.current", "1020054733\n")  # 95% of memory.max
        readings = self.allocator.check_pressure()
        self.assertEqual((readings["level"], readings["signals_high"]), ("high", ("cgroup",)))
        self.assertEqual(readings["changes"], 1)  # the fields before the cgroup ones are where they were
        write("/sys/fs/cgroup/job/memory.max", "max\n")  # no limit: the level falls, nothing raises it
        readings = self.allocator.check_pressure()
        self.assertEqual((readings["level"], readings["cgroup_limit_bytes"]), ("normal", -1))
        with self.assertRaises(ValueError) as caught:
            self.allocator.set_pressure_policy(high=0.9, signals=("cgroups",))
        self.assertIn("unknown pressure signal 'cgroups'", str(caught.exception))
        self.assertIn("cgroup", str(caught.exception).split("known:")[1])


if __name__ == "__main__":
    unittest.main()
