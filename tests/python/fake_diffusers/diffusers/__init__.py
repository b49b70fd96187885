"""A stand-in for diffusers (on PYTHONPATH where a test runs the unet workload): UNet2DModel is
the fake torch's model, model(sample, timesteps).sample of the sample's shape; the config is checked
as diffusers would: one channel count per block, divisible by the GroupNorm groups."""
import types

import torch


def UNet2DModel(**config):
    channels = config["block_out_channels"]
    assert len(channels) == len(config["down_block_types"]) == len(config["up_block_types"])
    assert all(c % config.get("norm_num_groups", 32) == 0 for c in channels), "GroupNorm needs whole groups"
    def output(sample):
        return types.SimpleNamespace(sample=torch.Tensor(sample.shape))
    return torch.FakeModel("unet", output)
