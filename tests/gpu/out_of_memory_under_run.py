"""A PyTorch program that runs out of memory for fragmentation, for tests/gpu/run_training.sh: run as
`gpumem run --tune -- python3 out_of_memory_under_run.py`. It leaves itself 2700 MiB of the GPU (a
tensor takes the rest), fills them with 40 pairs of a 61.5 MiB and a 1.5 MiB tensor, frees the large
ones and asks for 2000 MiB: 2460 MiB are free, but with one chunk per growth (GPUMEM_CONF
chunk_room_share:0) every freed 61.5 MiB lies in a chunk that a 1.5 MiB tensor pins, so the request fails
and the program dies of it. gpumem run --tune then replays its allocations and names the setting under
which it fits. Under gpumem's defaults, whose chunks shrink with the room the GPU leaves (page-sized in
2700 MiB), the same program fits."""
import torch

MiB = 1 << 20
free, _ = torch.cuda.mem_get_info()
rest = torch.empty(free - 2700 * MiB - 512 * MiB, dtype=torch.uint8, device="cuda")  # 512 MiB for the context
pairs = [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(40) for size in (64487424, 1572864)]
del pairs[0::2]
print("asking for 2000 MiB with", torch.cuda.memory_reserved() // MiB, "MiB reserved", flush=True)
logits = torch.empty(2000 * MiB, dtype=torch.uint8, device="cuda")
