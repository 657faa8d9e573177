"""The toy GPT as a `ModelSource`: what the runtime builds, draws and checks for a ModelConfig."""
from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from .config import ModelConfig
from .data import get_batch
from .gpt import ToyGPT, build_layers, loss_fn
from .memory import parameter_bytes
from .source import ModelSource


class GPTSource(ModelSource):
    """`cfg`'s layers (embedding, blocks, head), the corpus' batches, next-token cross-entropy."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.moe = cfg.moe
        self.tie_embeddings = cfg.tie_embeddings

    @property
    def total_layers(self) -> int:
        return self.cfg.total_layers

    def build(self, start: int, stop: int) -> nn.Sequential:
        return build_layers(self.cfg, start, stop)      # its Linears are weight_grad's already

    def loss(self, output, targets) -> torch.Tensor:
        return loss_fn(output, targets)

    def batches(self, batch_size: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # One generator for the whole run: step k's batch is the k-th draw (train.py does so).
        generator = torch.Generator().manual_seed(seed)
        while True:
            yield get_batch(batch_size, self.cfg.seq_len, generator=generator,
                            vocab_size=self.cfg.token_vocab)

    def reference(self, batch_size: int, seed: int) -> tuple[float, dict[str, torch.Tensor]]:
        model = ToyGPT(self.cfg)
        loss = model.loss(*next(self.batches(batch_size, seed)))
        loss.backward()
        return loss.item(), {name: p.grad if p.grad is not None else torch.zeros_like(p)
                             for name, p in model.named_parameters()}

    def parameter_bytes(self, start: int, stop: int) -> int:
        return parameter_bytes(self.cfg, start, stop)


def model_source(model) -> ModelSource:
    """The ModelSource a run uses: `model` itself, or the toy GPT of a ModelConfig."""
    return model if isinstance(model, ModelSource) else GPTSource(model)
