"""A stand-in for torchvision: vit_b_16 and convnext_tiny are the fake torch's models, logits of 1000 classes."""
import types

import torch


def _classifier(kind):
    def build(weights=None):
        assert weights is None, "the workloads train from random weights"
        return torch.FakeModel(kind, lambda images: torch.Tensor((images.shape[0], 1000)))
    return build


models = types.SimpleNamespace(vit_b_16=_classifier("vit"), convnext_tiny=_classifier("convnext"))
