"""CuPy's pool calls under gpumem.cupy (python/gpumem/cupy_pools.py), without CuPy or a GPU: the stand-in
`cupy` of test_cupy_install.py, allocators on the sim backend (1 GiB device).

- cupy.get_default_memory_pool() answers for gpumem: used, free and total bytes follow allocations
  and frees, free_all_blocks gives the cache back (total 0, no free block), n_free_blocks counts it;
- set_limit / get_limit keep CuPy's meanings (0: none; a fraction of the device; its ValueErrors), and
  a limit refuses what does not fit under it with CuPy's out-of-memory error;
- CUPY_GPU_MEMORY_LIMIT (bytes or a percentage) caps each device's allocator as it is made; a
  malformed one is a ValueError that names the variable;
- cupy.get_default_pinned_memory_pool() answers for the pinned host cache (n_free_blocks,
  free_all_blocks), and install(pinned=False) leaves CuPy's own pinned pool in place;
- free_all_free warns that it is deprecated, as CuPy's does.
"""
import os
import unittest
from unittest import mock

from test_cupy_install import StandInCupyTest

MiB = 1 << 20
GiB = 1 << 30
CONFIG = "backend:sim,capacity:1GiB"


class CupyPoolsTest(StandInCupyTest):
    def setUp(self):
        super().setUp()
        self.cupy.get_default_pinned_memory_pool = lambda: "cupy's own pinned pool"

    def test_the_default_pool_counts_gpumem_memory_and_empties_its_cache(self):
        self.module.install(CONFIG, pinned=False)
        pool = self.cupy.get_default_memory_pool()
        self.assertEqual((pool.used_bytes(), pool.total_bytes(), pool.n_free_blocks()), (0, 0, 0))
        pointer = pool.malloc(4 * MiB)
        other = self.cupy.state.allocator(MiB)  # CuPy's allocator and the pool are the same memory
        self.assertEqual(pool.used_bytes(), 5 * MiB)
        self.assertGreaterEqual(pool.total_bytes(), 5 * MiB)
        self.assertEqual(pool.free_bytes(), pool.total_bytes() - pool.used_bytes())
        del pointer, other
        self.assertEqual(pool.used_bytes(), 0)
        self.assertGreater(pool.total_bytes(), 0)
        self.assertGreaterEqual(pool.n_free_blocks(), 1)
        pool.free_all_blocks()
        self.assertEqual((pool.total_bytes(), pool.n_free_blocks()), (0, 0))
        self.assertEqual(self.module.allocator().memory_stats()["reserved_bytes.all.current"], 0)
        self.assertEqual(self.cupy.get_default_pinned_memory_pool(), "cupy's own pinned pool")

    def test_limits_keep_cupys_meanings(self):
        self.module.install(CONFIG, pinned=False)
        pool = self.cupy.get_default_memory_pool()
        self.assertEqual(pool.get_limit(), 0)
        pool.set_limit(size=64 * MiB)
        self.assertEqual(pool.get_limit(), 64 * MiB)
        with self.assertRaises(self.cupy.cuda.memory.OutOfMemoryError):
            pool.malloc(128 * MiB)
        kept = pool.malloc(32 * MiB)
        pool.set_limit(fraction=0.5)
        self.assertEqual(pool.get_limit(), GiB // 2)
        pool.set_limit(size=4 * GiB)  # more than the device: CuPy reports what it was given
        self.assertEqual(pool.get_limit(), 4 * GiB)
        self.module.allocator().set_memory_limit(256 * MiB)  # changed behind the pool's back
        self.assertEqual(pool.get_limit(), 256 * MiB)
        pool.set_limit()
        self.assertEqual(pool.get_limit(), 0)
        pool.malloc(512 * MiB)
        for arguments in ({"fraction": 1.5}, {"size": -1}, {"size": MiB, "fraction": 0.5}):
            with self.subTest(arguments=arguments), self.assertRaises(ValueError):
                pool.set_limit(**arguments)
        self.assertEqual(pool.get_limit(), 0)
        del kept

    def test_cupy_gpu_memory_limit_caps_each_device(self):
        for value, limit in (("50%", GiB // 2), (str(100 * MiB), 100 * MiB), ("", 0)):
            with self.subTest(value=value), mock.patch.dict(os.environ, {"CUPY_GPU_MEMORY_LIMIT": value}):
                self.forget_allocators()
                self.module.install(CONFIG, pinned=False)
                self.assertEqual(self.cupy.get_default_memory_pool().get_limit(), limit)
        for value in ("lots", "150%", "-5"):
            with self.subTest(value=value), mock.patch.dict(os.environ, {"CUPY_GPU_MEMORY_LIMIT": value}):
                self.forget_allocators()
                self.module.install(CONFIG, pinned=False)
                with self.assertRaises(ValueError) as raised:
                    self.cupy.state.allocator(MiB)
                self.assertIn("CUPY_GPU_MEMORY_LIMIT", str(raised.exception))

    def test_the_pinned_pool_is_the_host_cache(self):
        self.module.install(CONFIG)
        pool = self.cupy.get_default_pinned_memory_pool()
        block = pool.malloc(MiB)
        second = self.cupy.state.pinned_allocator(3000)
        self.assertEqual(pool.n_free_blocks(), 0)
        del block, second
        self.assertEqual(pool.n_free_blocks(), 2)
        self.assertGreater(self.module.allocator().host_stats()["reserved_bytes"]["current"], 0)
        pool.free_all_blocks()
        self.assertEqual(pool.n_free_blocks(), 0)
        self.assertEqual(self.module.allocator().host_stats()["reserved_bytes"]["current"], 0)

    def test_free_all_free_is_deprecated(self):
        self.module.install(CONFIG)
        for pool in (self.cupy.get_default_memory_pool(), self.cupy.get_default_pinned_memory_pool()):
            with self.subTest(pool=type(pool).__name__), self.assertWarns(DeprecationWarning):
                pool.free_all_free()


class CupyPoolsPythonPathTest(CupyPoolsTest):
    compiled = False


if __name__ == "__main__":
    unittest.main()
