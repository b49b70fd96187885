"""More of test_torch_conformance.py's checks (each run under PyTorch's own allocator and under gpumem, in
the same child process as the others, before the failed capture): settings changed at run time, storage
resized as FSDP does, the memory fraction read back, the out-of-memory message's parts, the summary table
and the old names of the statistics, a dumped snapshot drawn by torch.cuda._memory_viz, streams made and
dropped, mixed precision with activation checkpointing, cuDNN's benchmark mode sizing its workspaces by
the allocator's cacheInfo, tensors outliving the external stream they were made on, the profiler's memory
timeline, tensors shared with CuPy through DLPack, the allocator's work under
torch.cuda.set_sync_debug_mode("error"), MemPools used again and destroyed, a memory fraction of nothing,
raw allocations with caching off, the GPU trace that the CUDA sanitizer listens to, the history's
out-of-memory entry, the history of a MemPool that does not split, empty_cache beside a MemPool in use,
counts that outlive a MemPool, nested MemPools, the stacks of frees and of blocks kept through a cleared
history, a process whose first allocation is in a MemPool with an allocator of its own, and a nearly full
device on which a MemPool(use_on_oom=True, no_split=True) and the device lend each other cached memory."""

MIB = 1 << 20
MORE_CHECKS = []


def check(function):
    MORE_CHECKS.append(function)
    return function


@check
def allocator_settings_changed_at_run_time(torch):
    """torch.cuda.memory._set_allocator_settings after the first tensor (as Megatron and vLLM call it):
    accepted, and allocations go on as before."""
    torch.ones(1, device="cuda")
    torch.cuda.memory._set_allocator_settings("garbage_collection_threshold:0.8,max_split_size_mb:64")
    first = torch.full((8 * MIB,), 5, dtype=torch.uint8, device="cuda")
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    second = torch.full((8 * MIB,), 6, dtype=torch.uint8, device="cuda")
    torch.cuda.memory._set_allocator_settings("expandable_segments:False")
    seen = (int(first.sum().item()), int(second[-1].item()))
    del first, second
    return seen


@check
def storage_resized_to_nothing_and_back(torch):
    """FSDP frees a parameter's memory with untyped_storage().resize_(0) and brings it back the same way."""
    torch.cuda.synchronize()
    tensor = torch.ones(4 * MIB, dtype=torch.uint8, device="cuda")
    storage = tensor.untyped_storage()
    before = torch.cuda.memory_allocated()
    storage.resize_(0)
    freed = before - torch.cuda.memory_allocated()
    storage.resize_(4 * MIB)
    regrown = torch.cuda.memory_allocated() - before
    tensor.fill_(7)
    return freed, regrown, int(tensor.sum().item())


@check
def memory_fraction_reads_back(torch):
    torch.cuda.set_per_process_memory_fraction(0.5)
    try:
        return torch.cuda.get_per_process_memory_fraction()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


@check
def out_of_memory_message_names_the_request(torch):
    """The message's parts that people and tools read: the request, the device's total, and the advice."""
    try:
        torch.empty(256 << 30, dtype=torch.uint8, device="cuda")  # more than the device has
        raise AssertionError("no error")
    except torch.OutOfMemoryError as error:
        message = str(error)
    return ("Tried to allocate 256.00 GiB" in message, "GPU 0 has a total capacity of" in message,
            "reserved by PyTorch but unallocated" in message, "PYTORCH_CUDA_ALLOC_CONF" in message)


@check
def memory_summary_and_aliases(torch):
    """memory_summary's table, and the old names of the statistics."""
    tensor = torch.empty(3 * MIB, dtype=torch.uint8, device="cuda")
    summary = torch.cuda.memory_summary()
    rows = [row for row in ("Allocated memory", "Active memory", "Requested memory", "GPU reserved memory",
                            "Non-releasable memory", "Allocations", "Active allocs", "GPU reserved segments",
                            "Oversize allocations") if row in summary]
    torch.cuda.reset_max_memory_allocated()
    torch.cuda.reset_max_memory_cached()
    aliases = (torch.cuda.memory_cached() == torch.cuda.memory_reserved(),
               torch.cuda.max_memory_cached() == torch.cuda.max_memory_reserved())
    del tensor
    return rows, aliases


@check
def dumped_snapshot_renders(torch):
    """_dump_snapshot's pickle, read back and drawn by torch.cuda._memory_viz as memory_viz does."""
    import pickle
    import tempfile
    from torch.cuda import _memory_viz
    torch.cuda.memory._record_memory_history(max_entries=1000)
    try:
        tensor = torch.empty(5 * MIB, dtype=torch.uint8, device="cuda")
        with tempfile.NamedTemporaryFile(suffix=".pickle") as file:
            torch.cuda.memory._dump_snapshot(file.name)
            with open(file.name, "rb") as reader:
                snapshot = pickle.load(reader)
        del tensor
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    html = _memory_viz.trace_plot(snapshot)
    segments = _memory_viz.segment_plot(snapshot)
    return "<html" in html.lower() or "<!doctype" in html.lower(), len(segments) > 1000


@check
def streams_made_and_dropped(torch):
    """Tensors on many short-lived streams, freed after the stream is gone: the memory comes back."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    kept = []
    for index in range(50):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            kept.append(torch.full((MIB + index,), 1, dtype=torch.uint8, device="cuda"))
        del stream
    total = sum(int(tensor.sum().item()) for tensor in kept)
    kept.clear()
    torch.cuda.synchronize()
    return total, torch.cuda.memory_allocated() - base


@check
def mixed_precision_and_checkpointing_losses(torch):
    """autocast with GradScaler, and activation checkpointing: the same losses bit for bit."""
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    first = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU()).cuda()
    second = torch.nn.Linear(512, 10).cuda()
    parameters = list(first.parameters()) + list(second.parameters())
    optimizer = torch.optim.SGD(parameters, lr=1e-2)
    scaler = torch.amp.GradScaler("cuda")
    generator = torch.Generator(device="cuda").manual_seed(2)
    losses = []
    for _ in range(10):
        data = torch.randn(128, 256, device="cuda", generator=generator)
        target = torch.randint(0, 10, (128,), device="cuda", generator=generator)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            hidden = checkpoint(first, data, use_reentrant=False)
            loss = torch.nn.functional.cross_entropy(second(hidden).float(), target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    return losses


@check
def cudnn_benchmark_gets_its_workspace(torch):
    """torch.backends.cudnn.benchmark with nothing cached: cuDNN leaves out every plan whose workspace is
    larger than the allocator's cacheInfo, which torch's allocator answers with the device's free memory.
    An allocator that answered with its cached blocks alone would leave only plans without a workspace,
    the slower ones (bench/cudnn_workspace.py measures it)."""
    torch.backends.cudnn.benchmark = True
    try:
        conv = torch.nn.Conv2d(128, 128, 3, padding=1).cuda()
        images = torch.randn(48, 128, 64, 64, device="cuda")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        with torch.no_grad():
            conv(images)  # the plan is chosen here, with nothing cached
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            output = conv(images)
            torch.cuda.synchronize()
        workspace = torch.cuda.max_memory_allocated() - base - output.numel() * output.element_size()
        assert workspace > 0, f"the convolution ran without a workspace ({workspace} bytes)"
    finally:
        torch.backends.cudnn.benchmark = False


def _driver_stream():
    """A stream made through the driver, as another library makes one, and the call that destroys it."""
    import ctypes
    driver = ctypes.CDLL("libcuda.so.1")
    handle = ctypes.c_void_p()
    status = driver.cuStreamCreate(ctypes.byref(handle), 1)  # non-blocking
    assert status == 0, f"cuStreamCreate returned {status}"
    return handle.value, lambda: driver.cuStreamDestroy_v2(ctypes.c_void_p(handle.value))


@check
def external_stream_destroyed_under_its_tensors(torch):
    """Tensors made on torch.cuda.ExternalStream over a stream of another library, which destroys it while
    memory freed on it is cached and while some of its tensors still live (their frees come after); then
    the default stream needs that memory, and caching_allocator_alloc names such a stream too. PyTorch's
    allocator never calls the driver on a tensor's stream after the allocation, so all of this works."""
    torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    handle, destroy = _driver_stream()
    with torch.cuda.stream(torch.cuda.ExternalStream(handle)):
        small = [torch.full((MIB + 4096 * index,), 1, dtype=torch.uint8, device="cuda") for index in range(600)]
        large = [torch.full((64 * MIB,), 2, dtype=torch.uint8, device="cuda") for _ in range(8)]
        made = sum(int(tensor.sum().item()) for tensor in small + large)
        raw = [torch.cuda.caching_allocator_alloc(MIB * (1 + index % 5), stream=handle) for index in range(50)]
    for pointer in raw:
        torch.cuda.caching_allocator_delete(pointer)
    del large, small[::2]
    torch.cuda.synchronize()
    destroyed = destroy()
    del small  # freed after their stream is gone
    # The default stream then needs that cached memory: the memory fraction leaves little beside it.
    reserved = torch.cuda.memory_reserved()
    total = torch.cuda.mem_get_info()[1]
    torch.cuda.set_per_process_memory_fraction((reserved + 256 * MIB) / total)
    try:
        count = int((reserved + 128 * MIB) // (96 * MIB))
        big = [torch.full((96 * MIB,), 3, dtype=torch.uint8, device="cuda") for _ in range(count)]
        used = sum(int(tensor[-1].item()) for tensor in big)
        del big
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return destroyed, made, used == 3 * count, count > 8, torch.cuda.memory_allocated() - base


@check
def profiler_memory_timeline(torch):
    """torch.profiler's export_memory_timeline (memory by category over time, built from the allocator's
    reports to the profiler): written, with the step's parameters, input and gradients in it."""
    import json
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    model = torch.nn.Linear(1024, 1024).cuda()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True, record_shapes=True,
                 with_stack=True) as profiler:
        inputs = torch.randn(256, 1024, device="cuda", requires_grad=True)
        model(inputs).sum().backward()
    with tempfile.TemporaryDirectory() as folder:
        path = folder + "/timeline.json"
        profiler.export_memory_timeline(path, device="cuda:0")
        with open(path) as file:
            times, sizes = json.load(file)
    assert times and len(times) == len(sizes), (len(times), len(sizes))
    peak = max(sum(row) if isinstance(row, list) else row for row in sizes)
    assert peak >= 2 * 1024 * 1024 * 4, f"the timeline's peak is {peak} bytes"  # weight and its gradient


@check
def dlpack_exchange_with_cupy(torch):
    """Tensors handed to CuPy and back through DLPack, as pipelines that mix the two do (under gpumem,
    CuPy on gpumem too): the memory is shared both ways, outlives the side that dropped it (new tensors
    do not take it), and is freed once both have dropped it."""
    import gc
    import os
    try:
        import cupy
    except ImportError:
        return "no cupy"
    if os.environ.get("GPUMEM_TORCH"):
        import gpumem.cupy
        gpumem.cupy.install()
    words = 4 * MIB // 4
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    tensor = torch.arange(words, dtype=torch.int32, device="cuda")
    array = cupy.from_dlpack(tensor)
    array += 1  # written by CuPy, read by torch
    cupy.cuda.get_current_stream().synchronize()
    seen = int(tensor[-1].item())
    del tensor
    others = [torch.full((words,), 7, dtype=torch.int32, device="cuda") for _ in range(4)]
    torch.cuda.synchronize()
    intact = int(array[-1]) == words and int(array.sum()) == words * (words + 1) // 2
    held = torch.cuda.memory_allocated() - base
    del array
    gc.collect()
    released = torch.cuda.memory_allocated() - base
    del others
    source = cupy.arange(1000, dtype=cupy.float32)
    view = torch.from_dlpack(source)
    del source
    gc.collect()
    view.mul_(2)  # CuPy's memory, still held by torch's view
    total = float(view.sum().item())
    del view
    return seen, intact, held // MIB, released // MIB, total


@check
def sync_debug_mode_sees_no_synchronization(torch):
    """torch.cuda.set_sync_debug_mode("error") raises on every synchronizing call PyTorch makes: the
    allocator's own work (tensors of every size on two streams, record_stream, the statistics, a
    snapshot, empty_cache) makes none."""
    torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for size in (1, 512, 4096, MIB, 3 * MIB, 64 * MIB, 300 * MIB) * 3:
            tensor = torch.empty(size, dtype=torch.uint8, device="cuda")
            with torch.cuda.stream(side):
                other = torch.empty(size, dtype=torch.uint8, device="cuda")
            tensor.record_stream(side)
            del tensor, other
        stats = torch.cuda.memory_stats()
        torch.cuda.memory_snapshot()
        torch.cuda.empty_cache()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return stats["num_ooms"]


COUNTED_ALLOCATOR_SOURCE = r"""
#include <cuda_runtime_api.h>
#include <sys/types.h>
static int allocations, frees;
void *counted_alloc(ssize_t size, int device, cudaStream_t stream) {
    void *pointer = 0;
    (void)device; (void)stream;
    if (cudaMalloc(&pointer, (size_t)size) != cudaSuccess) return 0;
    allocations++;
    return pointer;
}
void counted_free(void *pointer, ssize_t size, int device, cudaStream_t stream) {
    (void)size; (void)device; (void)stream;
    frees++;
    cudaFree(pointer);
}
int counted_allocations(void) { return allocations; }
int counted_frees(void) { return frees; }
"""


def counted_library():
    """COUNTED_ALLOCATOR_SOURCE built anew: the path of its shared library."""
    import os
    import subprocess
    import tempfile
    folder = tempfile.mkdtemp()
    source, library = os.path.join(folder, "counted.c"), os.path.join(folder, "libcounted.so")
    with open(source, "w") as out:
        out.write(COUNTED_ALLOCATOR_SOURCE)
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", f"-I{cuda}/include", source, "-o", library,
                    f"-L{cuda}/lib64", "-lcudart"], check=True, capture_output=True)
    return library


def counted_allocator(torch):
    """A cudaMalloc that counts (COUNTED_ALLOCATOR_SOURCE): the library (its counted_allocations() and
    counted_frees()), and a CUDAPluggableAllocator over it."""
    import ctypes
    library = counted_library()
    return ctypes.CDLL(library), torch.cuda.memory.CUDAPluggableAllocator(library, "counted_alloc", "counted_free")


@check
def empty_cache_keeps_a_mem_pool_in_use(torch):
    """torch.cuda.empty_cache() leaves the cached memory of a MemPool(allocator=...) that still has users
    (NCCL's pools keep their registered segments); once the MemPool is gone, its segments go back."""
    counted, allocator = counted_allocator(torch)
    pool = torch.cuda.MemPool(allocator.allocator())
    with torch.cuda.use_mem_pool(pool):
        tensor = torch.ones(MIB, dtype=torch.uint8, device="cuda")
    del tensor
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    kept = counted.counted_frees() == 0
    del pool
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return kept, counted.counted_frees() == counted.counted_allocations()


@check
def history_stacks_of_frees_and_of_blocks_kept(torch):
    """With stacks of allocations only (context="alloc"), a free in the trace shows its allocation's stack;
    a block allocated before the history is cleared (clear_history=True) keeps its stack in the snapshot."""
    freed_size, kept_size = 3 * MIB + 4096 + 512, 5 * MIB + 4096 + 512
    torch.cuda.memory._record_memory_history(context="alloc", max_entries=1000)
    try:
        freed = torch.empty(freed_size, dtype=torch.uint8, device="cuda")
        del freed
        kept = torch.empty(kept_size, dtype=torch.uint8, device="cuda")
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.memory._record_memory_history(context="alloc", max_entries=1000, clear_history=True)
        segments = torch.cuda.memory._snapshot()["segments"]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    frees = [entry for entry in trace if entry["action"] == "free_requested" and entry["size"] == freed_size]
    blocks = [block for segment in segments for block in segment["blocks"]
              if block["state"] == "active_allocated" and block.get("requested_size") == kept_size]
    del kept
    return bool(frees and frees[-1].get("frames")), bool(blocks and blocks[0].get("frames"))


@check
def counts_outlive_a_mem_pool(torch):
    """The device's allocation counts include a MemPool(allocator=...)'s, and keep them once the pool is
    gone (torch's statistics are the device's, never going back)."""
    counted, allocator = counted_allocator(torch)
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    pool = torch.cuda.MemPool(allocator.allocator())
    with torch.cuda.use_mem_pool(pool):
        tensors = [torch.ones(MIB, dtype=torch.uint8, device="cuda") for _ in range(3)]
    during = torch.cuda.memory_stats()["allocation.all.allocated"] - before
    del tensors, pool
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_stats()["allocation.all.allocated"] - before
    return during, after, counted.counted_frees() == counted.counted_allocations()


@check
def nested_mem_pools_take_the_inner(torch):
    """use_mem_pool inside another: the inner pool takes the allocations until it ends (PyTorch searches
    the pools allocated to last begun first), whichever kind each pool is (a MemPool with an allocator of
    its own inside a plain one, and the other way round)."""
    def live_sizes(pool):
        return sorted(block["requested_size"] for segment in pool.snapshot() for block in segment["blocks"]
                      if block["state"] == "active_allocated")
    outer, inner = torch.cuda.MemPool(), torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(outer):
        with torch.cuda.use_mem_pool(inner):
            first = torch.empty(3 * MIB + 4096, dtype=torch.uint8, device="cuda")
        second = torch.empty(5 * MIB + 4096, dtype=torch.uint8, device="cuda")
    plain_in_plain = live_sizes(inner), live_sizes(outer)
    counted, allocator = counted_allocator(torch)
    sourced, plain = torch.cuda.MemPool(allocator.allocator()), torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(sourced):
        with torch.cuda.use_mem_pool(plain):
            third = torch.empty(MIB, dtype=torch.uint8, device="cuda")
    plain_in_sourced = counted.counted_allocations()
    with torch.cuda.use_mem_pool(plain):
        with torch.cuda.use_mem_pool(sourced):
            fourth = torch.empty(MIB, dtype=torch.uint8, device="cuda")
    sourced_in_plain = counted.counted_allocations() > plain_in_sourced
    del first, second, third, fourth, outer, inner, sourced, plain
    return plain_in_plain, plain_in_sourced, sourced_in_plain


FIRST_IN_A_POOL_PROGRAM = r"""
import json, sys, torch
allocator = torch.cuda.memory.CUDAPluggableAllocator(sys.argv[1], "counted_alloc", "counted_free")
pool = torch.cuda.MemPool(allocator.allocator())
with torch.cuda.use_mem_pool(pool):
    inside = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
snapshot = torch.cuda.memory._snapshot()
blocks = [block["size"] for segment in snapshot["segments"] for block in segment["blocks"]
          if block["state"] == "active_allocated"]
print("POOL " + json.dumps([torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), blocks]))
"""


@check
def first_allocation_in_a_mem_pool_with_its_own_allocator(torch):
    """A process whose first allocation is in a MemPool(allocator=...) (the device's own pool never used):
    the statistics and the snapshot's segments show it."""
    import json
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", FIRST_IN_A_POOL_PROGRAM, counted_library()], capture_output=True,
                         text=True, timeout=300)
    for line in run.stdout.splitlines():
        if line.startswith("POOL "):
            return json.loads(line[5:])
    raise RuntimeError(f"the pool's process failed (status {run.returncode}): {run.stderr[-1500:]}")


@check
def mem_pool_used_again(torch):
    """use_mem_pool on one MemPool again and again (as NCCL's symmetric-memory pools are): each use adds a
    user that its end takes away, so the pool and its allocator live as long as the MemPool object, and
    its memory keeps coming from that allocator."""
    counted, allocator = counted_allocator(torch)
    pool = torch.cuda.MemPool(allocator.allocator())
    counts = []
    for round in range(3):
        with torch.cuda.use_mem_pool(pool):
            counts.append(pool.use_count())
            tensor = torch.full((MIB,), round, dtype=torch.uint8, device="cuda")
        counts.append(pool.use_count())
        del tensor
        torch.cuda.synchronize()
    frees_while_alive = counted.counted_frees()
    unsplit = torch.cuda.MemPool(no_split=True)
    for _ in range(2):
        with torch.cuda.use_mem_pool(unsplit):
            first, second = (torch.empty(MIB, dtype=torch.uint8, device="cuda") for _ in range(2))
        counts.append(unsplit.use_count())
        del first, second
    del pool, unsplit
    return counts, frees_while_alive, counted.counted_allocations() >= 1


@check
def mem_pool_destroyed_keeps_other_cache(torch):
    """A MemPool's end empties that pool only (its destructor calls emptyCache with its id): the device's
    own cached memory stays reserved."""
    torch.cuda.synchronize()
    cached = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    del cached
    reserved = torch.cuda.memory_reserved()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        inside = torch.empty(MIB, dtype=torch.uint8, device="cuda")
    del inside, pool
    return torch.cuda.memory_reserved() >= reserved


@check
def memory_fraction_of_nothing(torch):
    """set_per_process_memory_fraction(0.0) is accepted and lets nothing through; 1.0 lifts it."""
    torch.cuda.set_per_process_memory_fraction(0.0)
    try:
        torch.cuda.empty_cache()
        try:
            torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")
            refused = False
        except torch.OutOfMemoryError:
            refused = True
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    after = torch.ones(MIB, dtype=torch.uint8, device="cuda")
    return refused, int(after.sum().item())


@check
def caching_disabled_raw_allocations(torch):
    """With caching off, caching_allocator_alloc (raw_alloc) is the driver's memory too: not in the
    statistics, given back by caching_allocator_delete (raw_deleter's cudaFree)."""
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    torch.cuda.memory.caching_allocator_enable(False)
    try:
        free_before, _ = torch.cuda.mem_get_info()
        pointer = torch.cuda.caching_allocator_alloc(64 * MIB)
        counted = torch.cuda.memory_allocated() - allocated
        free_during, _ = torch.cuda.mem_get_info()
        torch.cuda.caching_allocator_delete(pointer)
        torch.cuda.synchronize()
        free_after, _ = torch.cuda.mem_get_info()
    finally:
        torch.cuda.memory.caching_allocator_enable(True)
    return counted, free_during <= free_before - 64 * MIB, free_after >= free_during + 60 * MIB


@check
def peaks_reset_with_a_pools_own_allocator(torch):
    """reset_peak_memory_stats() resets the peaks of MemPools with allocators of their own (no_split)
    too: their memory is in the device's statistics, as native's one set of statistics per device."""
    pool = torch.cuda.MemPool(no_split=True)
    with torch.cuda.use_mem_pool(pool):
        kept = torch.ones(MIB, dtype=torch.uint8, device="cuda")
        passing = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
        del passing
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    above = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
    del kept, pool
    return above


GPU_TRACE_PROGRAM = r"""
import json, torch
from torch.cuda import _gpu_trace
from torch.cuda._sanitizer import CUDASanitizerErrors, enable_cuda_sanitizer
heard = {"allocated": [], "freed": []}
enable_cuda_sanitizer()
_gpu_trace.register_callback_for_memory_allocation(heard["allocated"].append)
_gpu_trace.register_callback_for_memory_deallocation(heard["freed"].append)
side = torch.cuda.Stream()
first = torch.ones(1 << 20, device="cuda")
address = first.data_ptr()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    first.mul_(2)
first.record_stream(side)
del first
while not side.query():  # not a synchronization the sanitizer sees
    pass
reports = 0
for _ in range(4):  # the freed memory handed out again on the current stream
    try:
        again = torch.zeros(1 << 20, device="cuda")
        again.add_(1)
        del again
    except CUDASanitizerErrors:
        reports += 1
racing = torch.ones(1 << 20, device="cuda")
with torch.cuda.stream(side):
    try:
        racing.mul_(3)  # a real race: written on the current stream, no wait
        caught = False
    except CUDASanitizerErrors:
        caught = True
torch.cuda.synchronize()
print("TRACE " + json.dumps([address in heard["allocated"], address in heard["freed"], reports, caught]))
"""


@check
def gpu_trace_and_cuda_sanitizer(torch):
    """torch.cuda._gpu_trace hears of each allocation and free, and the CUDA sanitizer (which lives on in
    its process, so a fresh one) reports the real race and no race on memory freed after record_stream
    and handed out again."""
    import json
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", GPU_TRACE_PROGRAM], capture_output=True, text=True, timeout=300)
    for line in run.stdout.splitlines():
        if line.startswith("TRACE "):
            return json.loads(line[6:])
    raise RuntimeError(f"the sanitizer's process failed (status {run.returncode}): {run.stderr[-1500:]}")


@check
def out_of_memory_in_the_history(torch):
    """The history's "oom" entry (memory_viz shows it): the bytes asked for, and the device's free memory
    when the request failed."""
    torch.cuda.memory._record_memory_history(max_entries=1000)
    try:
        try:
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
            raise AssertionError("no error")
        except torch.OutOfMemoryError:
            pass
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    total = torch.cuda.get_device_properties(0).total_memory
    entries = [entry for trace in snapshot["device_traces"] for entry in trace if entry["action"] == "oom"]
    assert entries, "no oom entry"
    return entries[-1]["size"] >= 1 << 50, 0 < entries[-1].get("device_free", 0) <= total


@check
def history_of_a_pool_that_does_not_split(torch):
    """Allocations in a MemPool(no_split=True) (symmetric memory's) are in the history's trace, in their
    place among the device's."""
    sizes = (5 * MIB + 4096, 3 * MIB + 4096, 7 * MIB + 4096)
    torch.cuda.memory._record_memory_history(max_entries=1000)
    try:
        pool = torch.cuda.MemPool(no_split=True)
        before = torch.empty(sizes[0], dtype=torch.uint8, device="cuda")
        with torch.cuda.use_mem_pool(pool):
            inside = torch.empty(sizes[1], dtype=torch.uint8, device="cuda")
        after = torch.empty(sizes[2], dtype=torch.uint8, device="cuda")
        del inside
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    del before, after, pool
    allocations = [entry["size"] for entry in trace if entry["action"] == "alloc" and entry["size"] in sizes]
    freed = [entry["size"] for entry in trace if entry["action"] == "free_requested" and entry["size"] in sizes]
    return allocations, freed


@check
def a_full_device_and_a_pool_lend_cached_memory(torch):
    """With the device nearly full: an allocation outside a MemPool(use_on_oom=True, no_split=True) that
    only fits with the pool's cached memory succeeds, and so does one inside the pool that only fits with
    the memory cached outside it, neither counted as out of memory (native: one allocator, which lends a
    use_on_oom pool's free blocks and releases its cache before it gives up)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    ooms = torch.cuda.memory_stats().get("num_ooms", 0)
    free, _ = torch.cuda.mem_get_info()
    filler = torch.empty(free - 1536 * MIB, dtype=torch.uint8, device="cuda")
    try:
        pool = torch.cuda.MemPool(use_on_oom=True, no_split=True)
        with torch.cuda.use_mem_pool(pool):
            inside = torch.empty(1024 * MIB, dtype=torch.uint8, device="cuda")
        del inside  # cached by the pool: about 512 MiB of the device left
        outside = torch.ones(1024 * MIB, dtype=torch.uint8, device="cuda")
        lent = int(outside[-1].item())
        del outside
        with torch.cuda.use_mem_pool(pool):
            again = torch.full((1024 * MIB,), 2, dtype=torch.uint8, device="cuda")
        borrowed = int(again[-1].item())
        del again, pool
    finally:
        del filler
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return lent, borrowed, torch.cuda.memory_stats().get("num_ooms", 0) - ooms
