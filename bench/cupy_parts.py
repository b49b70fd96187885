"""Where the time of one CuPy allocation under gpumem goes, part by part, in one process on a GPU.

    python3 bench/cupy_parts.py [--count N]

bench/cupy_alloc.py compares whole loops, each in a fresh process, on a machine that drifts; this times
the parts of gpumem.cupy's compiled allocator function (python/gpumem/cupy_allocate.c) in one process,
the C parts from C (bench/cupy_parts.c, built here with the system's C compiler), so that they add up:
  allocator function         CuPy's current allocator called from Python for 256 B, the pointer dropped,
                             under gpumem, then under a cupy.cuda.MemoryPool in the same process
  objects, constructors      UnownedMemory and MemoryPointer made as the allocator function makes them
  objects, tp_new            the same two without their constructors' argument parsing (CuPy's pool's way)
  gm_malloc + gm_free        the allocation itself, through the addresses the allocator function uses
  get_device_id, get_current_stream_ptr, _has_memory_hooks   CuPy's C functions the allocator function
                             calls, each on a fresh thread before its first allocation (no CUDA context
                             current on it) and after it (gpumem.cupy makes the device's context current
                             at a thread's first allocation: cudaGetDevice is slow on a thread without one)
Prints a markdown table of nanoseconds per call.
"""
import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAPSULES = (("get_device_id", "device", "int (int __pyx_skip_dispatch)"),
            ("get_current_stream_ptr", "stream", "intptr_t (void)"),
            ("_has_memory_hooks", "memory_hook", "int (int __pyx_skip_dispatch)"))


def build_parts(folder):
    """bench/cupy_parts.c built and imported."""
    target = os.path.join(folder, "_cupy_parts" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-I" + sysconfig.get_paths()["include"],
                    os.path.join(ROOT, "bench", "cupy_parts.c"), "-o", target], check=True)
    sys.path.insert(0, folder)
    import _cupy_parts
    return _cupy_parts


def per_call_ns(function, count):
    start = time.perf_counter()
    for _ in range(count):
        pointer = function(256)
        del pointer
    return (time.perf_counter() - start) / count * 1e9


def capsule_times(parts, cupy, count):
    """CuPy's C functions timed on a fresh thread, before and after its first allocation."""
    from gpumem import cupy as gpumem_cupy
    rows = []

    def on_thread():
        for name, module, signature in CAPSULES:
            capsule = gpumem_cupy._cupy_capsule(cupy, module, name)
            rows.append([name, parts.capsule_call(capsule, signature, count)])
        block = cupy.cuda.alloc(256)
        del block
        for row, (name, module, signature) in zip(rows, CAPSULES):
            row.append(parts.capsule_call(gpumem_cupy._cupy_capsule(cupy, module, name), signature, count))

    thread = threading.Thread(target=on_thread)
    thread.start()
    thread.join()
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200000)
    arguments = parser.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # no CuPy, or no GPU: nothing to time
        sys.exit(f"bench/cupy_parts.py needs CuPy and a GPU: {type(error).__name__}: {error}")
    import gpumem
    import gpumem.cupy
    with tempfile.TemporaryDirectory() as folder:
        parts = build_parts(folder)
        gpumem.cupy.install()
        allocate = cupy.cuda.get_allocator()
        per_call_ns(allocate, arguments.count // 10)
        state = gpumem.cupy._allocators[cupy.cuda.runtime.getDevice()]
        count = arguments.count
        rows = [("allocator function, gpumem", per_call_ns(allocate, count)),
                ("objects, constructors", parts.objects_call(cupy.cuda.UnownedMemory, cupy.cuda.MemoryPointer,
                                                            object(), count)),
                ("objects, tp_new", parts.objects_new(cupy.cuda.UnownedMemory, cupy.cuda.MemoryPointer, count)),
                ("gm_malloc + gm_free", parts.gpumem_pair(gpumem.function_address("gm_malloc"),
                                                          gpumem.function_address("gm_free"), state.handle_address,
                                                          count))]
        main_thread = [(name, parts.capsule_call(gpumem.cupy._cupy_capsule(cupy, module, name), signature, count))
                       for name, module, signature in CAPSULES]
        capsules = capsule_times(parts, cupy, count)
        pool = cupy.cuda.MemoryPool()
        per_call_ns(pool.malloc, count // 10)
        rows.append(("allocator function, cupy.cuda.MemoryPool", per_call_ns(pool.malloc, count)))
    print("| part | ns per call |\n|---|---:|")
    for name, nanoseconds in rows:
        print(f"| {name} | {nanoseconds:.0f} |")
    for name, nanoseconds in main_thread:
        print(f"| {name}, on the thread timed above | {nanoseconds:.0f} |")
    for name, before, after in capsules:
        print(f"| {name}, no context current / after the thread's first allocation | {before:.0f} / {after:.0f} |")


if __name__ == "__main__":
    main()
