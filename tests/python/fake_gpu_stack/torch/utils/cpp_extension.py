"""The fake torch's load_inline: an extension whose replay() follows bench/anchor_replay.py's C++ replay()
(kind, id, size rows; returns ns/op, the async pool's reserved high, peak live, failures) with made-up
allocators, so that a test can compute what each should report:

- mode 0 (PyTorch's allocator): reserves the peak live rounded up to 20 MiB, or to 2 MiB under
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, kept cached afterwards (the fake torch's statistics);
- mode 1 (cudaMallocAsync): the peak live rounded up to 32 MiB, kept in the pool until trim_async_pool().

FAKE_TORCH_OOM_CONF and FAKE_TORCH_OOM_SIZE: under that PYTORCH_CUDA_ALLOC_CONF, a trace with an
allocation of that size makes replay() raise torch.OutOfMemoryError (as raw_alloc's exception would).
"""
import os

import torch

MiB = 2**20
pool = {"reserved": 0}


def _round_up(value, unit):
    return -(-value // unit) * unit


class Extension:
    def replay(self, ops, slots, mode):
        torch.log("replay", mode, ops.shape[0])
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        sizes, live, peak = {}, 0, 0
        for kind, ident, size in ops.rows:
            if mode == 0 and conf == os.environ.get("FAKE_TORCH_OOM_CONF") and \
                    str(size) == os.environ.get("FAKE_TORCH_OOM_SIZE"):
                raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} bytes.\nmore lines")
            if kind == 0:
                sizes[ident] = size
                live += size
                peak = max(peak, live)
            elif ident in sizes:
                live -= sizes.pop(ident)
        if mode == 0:
            reserved = _round_up(peak, 2 * MiB if conf == "expandable_segments:True" else 20 * MiB)
            torch.state["reserved"] += reserved
            torch.state["reserved_peak"] = max(torch.state["reserved_peak"], torch.state["reserved"])
            torch.state["device_allocations"] += 1
            return [100.0, 0.0, float(peak), 0.0]
        pool["reserved"] = max(pool["reserved"], _round_up(peak, 32 * MiB))
        return [150.0, float(pool["reserved"]), float(peak), 0.0]

    def trim_async_pool(self):
        torch.log("trim_async_pool")
        pool["reserved"] = 0
        return 0.0


def load_inline(name, cpp_sources, functions, with_cuda=False, extra_cflags=None, verbose=False):
    torch.log("load_inline", name, functions, with_cuda, os.environ.get("TORCH_EXTENSIONS_DIR"))
    return Extension()
