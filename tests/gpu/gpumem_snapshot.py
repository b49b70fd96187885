"""Dump a snapshot taken under gpumem, with its history, of a small training loop whose batch size
changes (data/snapshots/gpumem-mlp.pickle, which tests/python/test_whatif.py reads without a GPU):
    PYTHONPATH=python GPUMEM_LIBRARY=build-gpu/libgpumem.so python3 tests/gpu/gpumem_snapshot.py OUT.pickle
It prints torch's own peaks, which the test compares with what gpumem.whatif derives from the file."""
import json
import sys

import torch

import gpumem.torch

gpumem.torch.install()
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
torch.cuda.memory._record_memory_history(max_entries=100000)
for batch in (64, 2048, 512, 4096, 256):
    x = torch.ones(batch, 1024, device="cuda")
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del x
torch.cuda.memory._dump_snapshot(sys.argv[1])
torch.cuda.memory._record_memory_history(enabled=None)
print(json.dumps({"max_memory_reserved": torch.cuda.max_memory_reserved(),
                  "max_memory_allocated": torch.cuda.max_memory_allocated()}))
