"""A stand-in for transformers: LlamaConfig keeps its arguments, LlamaForCausalLM is the fake torch's model
with a loss (and checks that the sequence fits the configured positions)."""
import types

import torch


class LlamaConfig(types.SimpleNamespace):
    pass


def LlamaForCausalLM(config):
    def output(ids):
        assert ids.shape[1] <= config.max_position_embeddings, "sequence longer than the model's positions"
        return types.SimpleNamespace(loss=torch.Tensor(()), logits=torch.Tensor(ids.shape + (config.vocab_size,)))
    return torch.FakeModel("llama", output)
