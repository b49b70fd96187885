"""CuPy's memory hooks (cupy.cuda.MemoryHook: LineProfileHook, DebugPrintHook, or a program's own, such
as one that records the peak bytes a function uses) around gpumem's allocations and frees.

CuPy calls the hooks registered on the calling thread from its memory pool: malloc_preprocess and
malloc_postprocess around every allocation, alloc_preprocess and alloc_postprocess when the pool takes
new memory from the device, free_preprocess and free_postprocess around every free. Once gpumem is
CuPy's allocator the pool is not used, so gpumem.cupy calls them instead, with CuPy's keyword
arguments and meanings:

  malloc_*   size: the bytes asked for; mem_size: the block's size (malloc_preprocess: the request
             rounded up to 512 bytes, as CuPy rounds; malloc_postprocess and the free hooks: the size of
             the block gpumem gave, so that a hook adding one and subtracting the other stays exact);
             mem_ptr and pmem_id (the id of the memory object CuPy holds) are 0 when it failed.
  alloc_*    called when the allocation made gpumem reserve more device memory: mem_size is how much
             more. gpumem decides that inside the allocation, so both calls come after it, in order.
  free_*     around the free of the block, on the thread that drops the memory, as CuPy's are.

Without a registered hook (cupy.cuda.memory_hook._has_memory_hooks() is false, one call) nothing
else is done. That check stays true once the thread has used a hook (its dict of hooks stays, empty):
the compiled path then asks the dict through CuPy's C get_memory_hooks, as CuPy's pool does, and only
the Python path calls `registered` below. A block allocated while no hook was registered tells a hook at its free the id of CuPy's
memory object all the same.
"""

ROUNDING = 512  # CuPy's pool rounds every request up to this


def lookup(cupy):
    """(has_hooks, registered): CuPy's own _has_memory_hooks (one call on the hot path: true once the
    calling thread has ever registered a hook) and a function () -> the hooks registered on the calling
    thread now, in order, or None."""
    hook_module = getattr(cupy.cuda, "memory_hook", None)
    if hook_module is None:
        return (lambda: False), (lambda: None)
    get_hooks = hook_module.get_memory_hooks

    def registered():
        return list(get_hooks().values()) or None

    return hook_module._has_memory_hooks, registered


def allocate_with_hooks(hooks, allocator, device, size, allocate, wrap):
    """allocate() -> pointer under the hooks; wrap(pointer, mem_size) -> (CuPy's memory pointer, its memory
    object). An exception from allocate() reaches the caller after malloc_postprocess has seen the
    failure. The block is wrapped before any hook runs after it, so a hook that raises drops the memory
    object and with it the block: nothing leaks."""
    for hook in hooks:
        hook.malloc_preprocess(device_id=device, size=size, mem_size=-(-size // ROUNDING) * ROUNDING)
    pointer, mem_size, pmem_id, result = 0, 0, 0, None
    before = allocator.reserved_bytes()
    try:
        pointer = allocate()
        mem_size = allocator.allocation_size(pointer) if pointer else 0
        result, memory = wrap(pointer, mem_size)
        pmem_id = id(memory)
        grown = allocator.reserved_bytes() - before
        if grown > 0:
            for hook in hooks:
                hook.alloc_preprocess(device_id=device, mem_size=grown)
            for hook in hooks:
                hook.alloc_postprocess(device_id=device, mem_size=grown, mem_ptr=pointer)
    finally:
        for hook in hooks:
            hook.malloc_postprocess(device_id=device, size=size, mem_size=mem_size, mem_ptr=pointer, pmem_id=pmem_id)
    return result


def free_with_hooks(hooks, device, mem_size, pointer, pmem_id, free):
    """free() under the hooks; the block goes back to gpumem even if a hook raises."""
    try:
        for hook in hooks:
            hook.free_preprocess(device_id=device, mem_size=mem_size, mem_ptr=pointer, pmem_id=pmem_id)
    finally:
        try:
            free()
        finally:
            for hook in hooks:
                hook.free_postprocess(device_id=device, mem_size=mem_size, mem_ptr=pointer, pmem_id=pmem_id)
