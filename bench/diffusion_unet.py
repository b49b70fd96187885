"""A DDPM-style diffusion UNet in plain PyTorch, for bench/more_workloads.py's unet workload where the
diffusers package is not installed (the GPU machine has none).

It follows the layout of diffusers' UNet2DModel, whose constructor arguments it takes (those the workload
uses): a sinusoidal timestep embedding and its MLP; per level, `layers_per_block` residual blocks
(GroupNorm, SiLU, 3x3 convolutions, the timestep embedding added between them), self-attention after
each of them where the block type says "Attn", and a strided convolution down to the next level; a
middle block of residual block, attention, residual block; then the levels back up, each with one
residual block more, every one taking a skip connection of the way down (concatenated channels),
nearest-neighbour upsampling and a convolution. The model returns an object with `.sample`, as
diffusers' does. What a training step allocates is what such a network allocates: the skip
connections and attention maps held for the backward pass, the concatenations, the upsampled
activations. No weights are loaded; the numbers do not matter, the memory does.
"""
import math
import types

import torch
from torch import nn
from torch.nn import functional


def timestep_embedding(timesteps, channels):
    """Sinusoidal embedding of integer timesteps, cosines first (diffusers' flip_sin_to_cos)."""
    half = channels // 2
    frequencies = torch.exp(-math.log(10000.0) * torch.arange(half, device=timesteps.device) / half)
    angles = timesteps[:, None].float() * frequencies[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)


class ResidualBlock(nn.Module):
    def __init__(self, in_channels, out_channels, embedding_channels, groups):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.embedding = nn.Linear(embedding_channels, out_channels)
        self.norm2 = nn.GroupNorm(groups, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()

    def forward(self, x, embedding):
        hidden = self.conv1(functional.silu(self.norm1(x)))
        hidden = hidden + self.embedding(functional.silu(embedding))[:, :, None, None]
        hidden = self.conv2(functional.silu(self.norm2(hidden)))
        return self.shortcut(x) + hidden


class SelfAttention(nn.Module):
    def __init__(self, channels, head_channels, groups):
        super().__init__()
        self.heads = max(1, channels // head_channels)
        self.norm = nn.GroupNorm(groups, channels)
        self.query, self.key, self.value = (nn.Linear(channels, channels) for _ in range(3))
        self.out = nn.Linear(channels, channels)

    def forward(self, x):
        batch, channels, height, width = x.shape
        tokens = self.norm(x).flatten(2).transpose(1, 2)  # batch, positions, channels

        def heads(projection):
            return projection(tokens).view(batch, -1, self.heads, channels // self.heads).transpose(1, 2)
        attended = attention(heads(self.query), heads(self.key), heads(self.value))
        attended = attended.transpose(1, 2).reshape(batch, -1, channels)
        return x + self.out(attended).transpose(1, 2).reshape(batch, channels, height, width)


def attention(query, key, value):
    """softmax(q k^T / sqrt(d)) v: PyTorch's fused kernel where it has one (2.0 and later)."""
    fused = getattr(functional, "scaled_dot_product_attention", None)
    if fused is not None:
        return fused(query, key, value)
    weights = torch.softmax(query @ key.transpose(-1, -2) / math.sqrt(query.shape[-1]), dim=-1)
    return weights @ value


class Level(nn.Module):
    """One level of the way down or up: residual blocks, each followed by attention if asked, then a
    resampling convolution (none at the coarsest level down, nor at the finest level up)."""

    def __init__(self, in_channels, out_channels, skip_channels, layers, with_attention, resample, options):
        super().__init__()
        embedding, groups, head = options
        self.blocks = nn.ModuleList(
            ResidualBlock((in_channels if i == 0 else out_channels) + skip_channels[i], out_channels, embedding, groups)
            for i in range(layers))
        self.attentions = nn.ModuleList(SelfAttention(out_channels, head, groups) for _ in range(layers)) \
            if with_attention else None
        self.resample = resample
        self.resampler = (nn.Conv2d(out_channels, out_channels, 3, stride=2 if resample == "down" else 1, padding=1)
                          if resample else None)


class UNet2DModel(nn.Module):
    def __init__(self, in_channels=3, out_channels=3, layers_per_block=2, block_out_channels=(64, 128, 256, 256),
                 down_block_types=None, up_block_types=None, attention_head_dim=8, norm_num_groups=32):
        super().__init__()
        channels = list(block_out_channels)
        down_block_types = down_block_types or ["DownBlock2D"] * len(channels)
        up_block_types = up_block_types or ["UpBlock2D"] * len(channels)
        embedding = 4 * channels[0]
        options = (embedding, norm_num_groups, attention_head_dim)
        self.embedding_channels = channels[0]
        self.time_mlp = nn.Sequential(nn.Linear(channels[0], embedding), nn.SiLU(), nn.Linear(embedding, embedding))
        self.conv_in = nn.Conv2d(in_channels, channels[0], 3, padding=1)
        self.down = nn.ModuleList()
        skips = [channels[0]]  # the channels of each skip connection, in the order they are made
        for i, kind in enumerate(down_block_types):
            last = i == len(channels) - 1
            self.down.append(Level(channels[max(i - 1, 0)], channels[i], [0] * layers_per_block, layers_per_block,
                                   kind.startswith("Attn"), None if last else "down", options))
            skips += [channels[i]] * (layers_per_block + (0 if last else 1))
        self.middle = nn.ModuleList([ResidualBlock(channels[-1], channels[-1], embedding, norm_num_groups),
                                     SelfAttention(channels[-1], attention_head_dim, norm_num_groups),
                                     ResidualBlock(channels[-1], channels[-1], embedding, norm_num_groups)])
        self.up = nn.ModuleList()
        reversed_channels = channels[::-1]
        for i, kind in enumerate(up_block_types):
            taken = [skips.pop() for _ in range(layers_per_block + 1)]
            self.up.append(Level(reversed_channels[max(i - 1, 0)], reversed_channels[i], taken, layers_per_block + 1,
                                 kind.startswith("Attn"), None if i == len(channels) - 1 else "up", options))
        self.norm_out = nn.GroupNorm(norm_num_groups, channels[0])
        self.conv_out = nn.Conv2d(channels[0], out_channels, 3, padding=1)

    def forward(self, sample, timesteps):
        embedding = self.time_mlp(timestep_embedding(timesteps, self.embedding_channels).to(sample.dtype))
        x = self.conv_in(sample)
        skips = [x]
        for level in self.down:
            for j, block in enumerate(level.blocks):
                x = block(x, embedding)
                if level.attentions is not None:
                    x = level.attentions[j](x)
                skips.append(x)
            if level.resampler is not None:
                x = level.resampler(x)
                skips.append(x)
        resnet, middle_attention, resnet2 = self.middle
        x = resnet2(middle_attention(resnet(x, embedding)), embedding)
        for level in self.up:
            for j, block in enumerate(level.blocks):
                x = block(torch.cat([x, skips.pop()], dim=1), embedding)
                if level.attentions is not None:
                    x = level.attentions[j](x)
            if level.resampler is not None:
                x = level.resampler(functional.interpolate(x, scale_factor=2.0, mode="nearest"))
        return types.SimpleNamespace(sample=self.conv_out(functional.silu(self.norm_out(x))))
