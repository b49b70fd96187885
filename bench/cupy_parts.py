"""Where the time of one CuPy allocation under gpumem goes, step by step, in one process on a GPU.

    python3 bench/cupy_parts.py [--count N]

bench/cupy_alloc.py compares whole loops, each in a fresh process, on a machine that drifts; this takes
gpumem.cupy's compiled allocator functions (python/gpumem/cupy_allocate.c, cupy_pinned.c,
cupy_objects.c) apart in one process. bench/cupy_parts.c, built here with the system's C compiler,
includes those files and times each step from C through the same functions, on the allocator functions
gpumem.cupy.install() made, so that the steps add up to one allocation and its free:

  Python's part     the loop that calls a C function and drops what it returns (the whole is timed so)
  device memory     the allocator function for 256 B: its size argument, the memory hooks check (CuPy's
                    _has_memory_hooks), the current device (get_device_id), the thread's context check,
                    the device's allocator found, the current stream (get_current_stream_ptr), gm_malloc +
                    gm_free, the blocking hook set and cleared around both, CuPy's objects made (the memory
                    object: gpumem's own subclass of BaseMemory, or where CuPy's BaseMemory does not allow
                    it an UnownedMemory owning a Block; MemoryPointer) and dropped, the memory hooks check
                    of the free
  pinned memory     the pinned allocator function for 4 KiB: its size argument, the current device, the
                    context check, the device's allocator found, the current stream at the allocation,
                    gm_host_malloc + gm_host_free_with_streams, the blocking hook, the objects
                    (PinnedBlock, its ptr, PinnedMemoryPointer) made and dropped, the current stream at the free
Each table ends with the sum of the steps, the whole (the allocator function called from Python, the
pointer dropped) and the whole less the sum: what running the steps together costs beyond running each
alone in a loop (caches and branch predictors shared by all of them). Beside them, for comparison: CuPy's
own pools in the same process, CuPy's two objects through their constructors and through tp_new alone,
and CuPy's C functions on a fresh thread before and after its first allocation (cudaGetDevice is slow on
a thread with no CUDA context current; gpumem.cupy makes the device's context current at a thread's
first allocation). A step that fails prints its error in its row; the others are still timed.
Prints markdown tables of nanoseconds per call.
"""
import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAPSULES = (("get_device_id", "device", "int (int __pyx_skip_dispatch)"),
            ("get_current_stream_ptr", "stream", "intptr_t (void)"),
            ("_has_memory_hooks", "memory_hook", "int (int __pyx_skip_dispatch)"))
DEVICE_SIZE, PINNED_SIZE = 256, 4096


def build_parts(folder):
    """bench/cupy_parts.c built and imported."""
    target = os.path.join(folder, "_cupy_parts" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-I" + sysconfig.get_paths()["include"],
                    os.path.join(ROOT, "bench", "cupy_parts.c"), "-o", target], check=True)
    sys.path.insert(0, folder)
    import _cupy_parts
    return _cupy_parts


def per_call_ns(function, count, size):
    start = time.perf_counter()
    for _ in range(count):
        pointer = function(size)
        del pointer
    return (time.perf_counter() - start) / count * 1e9


def timed(function, *arguments):
    """(nanoseconds, None), or (None, the error's line): one row that cannot be timed does not stop the rest."""
    try:
        return function(*arguments), None
    except Exception as error:  # printed in the row
        return None, f"{type(error).__name__}: {error}"


def steps_table(title, parts, run, names, whole, count, comparisons):
    """A table of the steps (run(name, count) -> ns), their sum, the whole (timed) and the rest."""
    print(f"\n### {title}\n\n| step | ns per call |\n|---|---:|")
    rows = [("Python: the loop, a call to a C function, the result dropped",
             timed(per_call_ns, parts.returns_object, count, 0))]
    rows += [(name, timed(run, name, count)) for name in names]
    total, missing = 0.0, 0
    for name, (nanoseconds, error) in rows:
        print(f"| {name} | {nanoseconds:.0f} |" if error is None else f"| {name} | failed: {error} |")
        total += nanoseconds or 0
        missing += error is not None
    whole_ns, whole_error = whole
    note = f" ({missing} failed, left out)" if missing else ""
    print(f"| **sum of the steps**{note} | {total:.0f} |")
    if whole_error is None:
        print(f"| **the whole: the allocator function called from Python** | {whole_ns:.0f} |")
        print(f"| the whole less the sum | {whole_ns - total:.0f} |")
    else:
        print(f"| the whole | failed: {whole_error} |")
    for name, (nanoseconds, error) in comparisons:
        print(f"| {name} | {nanoseconds:.0f} |" if error is None else f"| {name} | failed: {error} |")


def capsule_times(parts, cupy, count):
    """CuPy's C functions timed on a fresh thread, before and after its first allocation."""
    from gpumem import cupy as gpumem_cupy
    rows = []

    def on_thread():
        try:
            for name, module, signature in CAPSULES:
                capsule = gpumem_cupy._cupy_capsule(cupy, module, name)
                rows.append([name, *timed(parts.capsule_call, capsule, signature, count)])
            block = cupy.cuda.alloc(DEVICE_SIZE)
            del block
            for row, (name, module, signature) in zip(rows, CAPSULES):
                row += timed(parts.capsule_call, gpumem_cupy._cupy_capsule(cupy, module, name), signature, count)
        except Exception as error:  # printed below
            rows.append(["fresh thread", None, f"{type(error).__name__}: {error}"])

    thread = threading.Thread(target=on_thread)
    thread.start()
    thread.join()
    return rows


def cell(result):
    value, error = result
    if error is not None:
        return f"failed: {error}"
    return f"{value:.0f}" if isinstance(value, float) else str(value)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200000)
    arguments = parser.parse_args()
    if arguments.count < 100:
        sys.exit("bench/cupy_parts.py: --count must be at least 100")
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # no CuPy, or no GPU: nothing to time
        sys.exit(f"bench/cupy_parts.py needs CuPy and a GPU: {type(error).__name__}: {error}")
    import gpumem
    import gpumem.cupy
    from gpumem import compiled
    count = arguments.count
    with tempfile.TemporaryDirectory() as folder:
        parts = build_parts(folder)
        parts.module.use_blocking_hook(gpumem.function_address("gm_set_blocking_hook"))
        gpumem.cupy.install()
        allocate = cupy.cuda.get_allocator()
        # gpumem.cupy's stand-in for CuPy's pinned pool keeps the pinned allocator function
        pinned_allocate = getattr(cupy.get_default_pinned_memory_pool(), "_allocate", None)
        if isinstance(allocate, types.FunctionType):
            sys.exit("bench/cupy_parts.py: gpumem.cupy took its Python path (no compiled module): "
                     "nothing to take apart")
        made_by = compiled.load("cupy_allocate").made_by_constructors
        made = [cell(timed(lambda function: str(made_by(function)), function)) if function else "no pinned allocator"
                for function in (allocate, pinned_allocate)]
        memory_type = cell(timed(lambda: compiled.load("cupy_allocate").memory_type(allocate).__qualname__))
        print(f"CuPy {cupy.__version__}; the device memory object: {memory_type}; objects made through their "
              f"constructors (else tp_new and their fields): the memory, MemoryPointer {made[0]}, "
              f"PinnedMemoryPointer {made[1]}")

        per_call_ns(allocate, count // 10, DEVICE_SIZE)  # warm: the device's allocator made, its cache filled
        device_whole = timed(per_call_ns, allocate, count, DEVICE_SIZE)
        pool = cupy.cuda.MemoryPool()
        per_call_ns(pool.malloc, count // 10, DEVICE_SIZE)
        steps_table(f"Device memory: the allocator function, {DEVICE_SIZE} B", parts, lambda name, n:
                    parts.device_part(name, allocate, n), parts.device_part_names(), device_whole, count, [
                        ("(compare) the allocator function of a cupy.cuda.MemoryPool",
                         timed(per_call_ns, pool.malloc, count, DEVICE_SIZE)),
                        ("(compare) UnownedMemory and MemoryPointer through their constructors, made and dropped",
                         timed(parts.objects_call, cupy.cuda.UnownedMemory, cupy.cuda.MemoryPointer, object(), count)),
                        ("(compare) the same through tp_new alone, made and dropped",
                         timed(parts.objects_new, cupy.cuda.UnownedMemory, cupy.cuda.MemoryPointer, count))])

        if pinned_allocate is None:
            print("\n### Pinned memory: not timed (gpumem.cupy's pinned allocator function not found)")
            pinned_allocate = lambda size: None  # noqa: E731 (the steps then fail, each in its row)
        timed(per_call_ns, pinned_allocate, count // 10, PINNED_SIZE)
        pinned_whole = timed(per_call_ns, pinned_allocate, count, PINNED_SIZE)
        pinned_pool = cupy.cuda.PinnedMemoryPool()
        per_call_ns(pinned_pool.malloc, count // 10, PINNED_SIZE)
        steps_table(f"Pinned memory: the pinned allocator function, {PINNED_SIZE} B", parts, lambda name, n:
                    parts.pinned_part(name, pinned_allocate, n), parts.pinned_part_names(), pinned_whole, count, [
                        ("(compare) cupy.cuda.alloc_pinned_memory under gpumem (CuPy's own steps added)",
                         timed(per_call_ns, cupy.cuda.alloc_pinned_memory, count, PINNED_SIZE)),
                        ("(compare) the allocator function of a cupy.cuda.PinnedMemoryPool",
                         timed(per_call_ns, pinned_pool.malloc, count, PINNED_SIZE))])

        main_thread = [(name, timed(parts.capsule_call, gpumem.cupy._cupy_capsule(cupy, module, name), signature,
                                    count)) for name, module, signature in CAPSULES]
        capsules = capsule_times(parts, cupy, count)
    print("\n### CuPy's C functions\n\n| function | ns per call |\n|---|---:|")
    for name, result in main_thread:
        print(f"| {name}, on the thread timed above | {cell(result)} |")
    for name, *results in capsules:
        after = cell(results[2:4]) if len(results) >= 4 else "not timed"
        print(f"| {name}, no context current / after the thread's first allocation | {cell(results[:2])} / {after} |")


if __name__ == "__main__":
    main()
