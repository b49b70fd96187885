"""What the CuPy GPU tests (test_cupy_pinned.py, test_cupy_pools.py) start from: the real CuPy on a CUDA
device with gpumem installed as its allocator. Without CuPy, or without a device CuPy can open, the
importing test module is skipped, saying which."""
import pytest


def cupy_with_gpumem():
    """The cupy module, gpumem.cupy installed; skips the calling test module where that cannot be."""
    cupy = pytest.importorskip("cupy")
    try:
        devices = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver, or no device it can open
        devices = 0
    if devices == 0:
        pytest.skip("no CUDA device: CuPy sees none", allow_module_level=True)
    import gpumem.cupy
    gpumem.cupy.install()
    return cupy
