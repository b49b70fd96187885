"""Memory pressure and out-of-memory causes from Python: the ctypes layer over gm_set_pressure_policy,
gm_on_pressure, gm_get_pressure and gm_last_oom_cause, on the sim backend (no GPU, no PyTorch); the cgroup
signal on a fixture tree of /proc and /sys/fs/cgroup. Callbacks whose C function pointer outlives the
Python wrapper that registered them run in a child process (before gpumem.pressure's registry, a crash)."""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
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

    def run_child(self, code):
        """Run `code` in a Python process of its own (a crash fails the test, not the suite); its stdout."""
        run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(run.returncode, 0, f"exit status {run.returncode}: {run.stdout}{run.stderr}")
        return run.stdout

    def test_a_callback_lives_as_long_as_its_registration_not_its_wrapper(self):
        # gpumem.torch.allocator().on_pressure(cb) registers through a wrapper made for that call
        # (Allocator.attach): the C function must not go with it.
        out = self.run_child("""
            import gc, gpumem
            allocator = gpumem.Allocator("backend:sim,capacity:1GiB", from_environment=False)
            allocator.set_pressure_policy(high=0.5, low=0.4)
            def register_through_a_wrapper():
                gpumem.Allocator.attach(allocator.address).on_pressure(lambda level, readings: print("called", level))
            register_through_a_wrapper()
            gc.collect()
            junk = [bytearray(100) for _ in range(10000)]  # reuse the memory a freed thunk had
            allocator.malloc(700 << 20)
            print("survived")
        """)
        self.assertEqual(out.split("\n")[:2], ["called high", "survived"])

    def test_a_registration_is_the_allocators_whichever_wrapper_made_it(self):
        seen = []
        callback = self.allocator.on_pressure(lambda level, readings: seen.append(level))
        address = self.allocator.address
        gpumem.Allocator.attach(address).remove_pressure_callback(callback)  # "not registered" before
        with self.assertRaises(gpumem.GpumemError):
            self.allocator.remove_pressure_callback(callback)
        self.allocator.on_pressure(callback)
        self.allocator.close()  # the C allocator and its registrations go
        self.assertIsNone(gpumem._pressure_callbacks.find(address, callback))
        with self.assertRaises(gpumem.GpumemError) as caught:
            self.allocator.address
        self.assertIn("this allocator was closed", str(caught.exception))  # was AttributeError

    def test_the_same_callback_twice_is_refused_as_gm_on_pressure_refuses_it(self):
        # The second registration overwrote the first's thunk, which C still called (a crash). gm_on_pressure
        # refuses a function registered already with the same context: so does on_pressure.
        out = self.run_child("""
            import gc, gpumem
            allocator = gpumem.Allocator("backend:sim,capacity:1GiB", from_environment=False)
            allocator.set_pressure_policy(high=0.5, low=0.4, signals=("allocated",))
            def callback(level, readings): print("called", level)
            allocator.on_pressure(callback)
            for registering in (allocator, gpumem.Allocator.attach(allocator.address)):
                try:
                    registering.on_pressure(callback)
                except gpumem.GpumemError as error:
                    print("refused:", error.status, error)
            gc.collect()
            junk = [bytearray(100) for _ in range(10000)]
            allocator.free(allocator.malloc(700 << 20))
            allocator.remove_pressure_callback(callback)
            allocator.on_pressure(callback)  # registered again once removed
            print("survived")
        """)
        refusal = "refused: 1 invalid argument: on_pressure: this callback is already registered with this allocator"
        self.assertEqual(out.splitlines(), [refusal, refusal, "called high", "called normal", "survived"])

    def test_a_callback_may_remove_itself(self):
        calls = []

        def once(level, readings):
            calls.append(level)
            self.allocator.remove_pressure_callback(once)  # gpumem.h allows it; the thunk is on the stack

        self.allocator.set_pressure_policy(high=0.5, low=0.25, signals=("allocated",))
        self.allocator.on_pressure(once)
        for _ in range(3):
            self.allocator.free(self.allocator.malloc(600 * MiB))
        self.assertEqual(calls, ["high"])

    def test_policy_arguments_out_of_range_are_refused(self):
        # interval_ms went to C as a uint32_t: -1 became 4294967295 ms, 2**32 + 5 became 5.
        with self.assertRaises(ValueError) as caught:
            self.allocator.set_pressure_policy(high=0.9, interval_ms=-1)
        self.assertIn("interval_ms must not be negative", str(caught.exception))
        with self.assertRaises(OverflowError) as caught:
            self.allocator.set_pressure_policy(high=0.9, interval_ms=2**32 + 5)
        self.assertIn("interval_ms must be at most 2**32 - 1", str(caught.exception))
        with self.assertRaises(TypeError) as caught:
            self.allocator.set_pressure_policy(high="0.9")
        self.assertIn("high must be a number, not str", str(caught.exception))
        with self.assertRaises(ValueError) as caught:  # was "leaves no room for the default low"
            self.allocator.set_pressure_policy(high=-1)
        self.assertIn("high must be a fraction in (0, 1]", str(caught.exception))
        for signals, shown in ((b"reserved", "bytes"), (None, "NoneType")):  # "unknown signal 114"; not iterable
            with self.assertRaises(TypeError) as caught:
                self.allocator.set_pressure_policy(high=0.9, signals=signals)
            self.assertIn(f"pressure signals must be a name or a list of names, not {shown}", str(caught.exception))
        # NaN passed every comparison of the C check: a psi signal that could never trigger.
        for value in (float("nan"), float("inf")):
            with self.assertRaises(ValueError) as caught:
                self.allocator.set_pressure_policy(high=0.9, psi_high=value)
            self.assertIn("psi_high must be a finite number", str(caught.exception))
        # The default low (high - 0.1) is no fraction under a high of 0.1 or less: say so, and what to pass,
        # rather than complain about a low of -0.05 that was never given.
        with self.assertRaises(ValueError) as caught:
            self.allocator.set_pressure_policy(high=0.05)
        self.assertIn("set_pressure_policy(high=0.05) leaves no room for the default low (high - 0.1): pass low= "
                      "too, a fraction between 0 and 0.05", str(caught.exception))
        self.allocator.set_pressure_policy(high=0.05, low=0.02, interval_ms=2**32 - 1, signals="allocated")
        self.assertEqual(self.allocator.pressure_policy()["interval_ms"], 2**32 - 1)
        self.assertEqual(self.allocator.pressure_policy()["signals"], ("allocated",))  # one name alone: not 'a', ...
        self.assertIsNone(self.allocator.set_pressure_policy(high=0.5))
        self.assertEqual(self.allocator.pressure_policy()["low"], 0.4)

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
