"""A small training job for tests/gpu/run_training.sh, run as `gpumem run -- python3 train_under_run.py DIR`.

Trains a transformer encoder for a few steps, then, at a quiet point (synchronized, nothing
allocating), writes its pid and torch.cuda.memory_stats() to DIR/stats.json and waits until DIR/go
exists, so that a second shell can compare what gpumem top shows; then trains a few steps more,
writes DIR/final.json (memory_stats at the end) and exits.
"""
import json
import os
import sys
import time

import torch

folder = sys.argv[1]
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=6).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)


def step(batch, length):
    tokens = torch.randn(batch, length, 512, device="cuda")
    loss = model(tokens).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


for i in range(5):
    step(16, 128 + 64 * i)
torch.cuda.synchronize()


def write(name):
    stats = {key: value for key, value in torch.cuda.memory_stats().items() if isinstance(value, int)}
    with open(os.path.join(folder, name + ".tmp"), "w") as out:
        json.dump({"pid": os.getpid(), "stats": stats}, out)
    os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))


write("stats.json")
deadline = time.time() + 120
while not os.path.exists(os.path.join(folder, "go")) and time.time() < deadline:
    time.sleep(0.05)
for i in range(5):
    step(32, 256)
torch.cuda.synchronize()
write("final.json")
