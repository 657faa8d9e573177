"""Single-process training of the toy GPT: the reference every pipeline run is compared with."""
from __future__ import annotations

import torch

from ..checks import integer, positive_int, positive_number
from .data import VOCAB_SIZE, decode, encode, get_batch
from .gpt import ModelConfig, ToyGPT


def train(cfg: ModelConfig, steps: int = 200, batch_size: int = 16, lr: float = 3e-3,
          seed: int = 0, progress: bool = True, model: ToyGPT | None = None) -> list[float]:
    """Train ToyGPT(cfg) on the corpus with AdamW for `steps` steps; return the loss per step.

    Batches of `batch_size` windows of `cfg.seq_len` characters come from a generator seeded
    with `seed`, and the weights from `cfg.seed`: the same arguments give the same losses.
    Pass `model` to train an existing ToyGPT in place (for `sample` afterwards).
    """
    positive_int("steps", steps)
    positive_int("batch_size", batch_size)
    positive_number("lr", lr)
    integer("seed", seed)
    if cfg.vocab_size < VOCAB_SIZE:
        raise ValueError(f"ModelConfig.vocab_size ({cfg.vocab_size}) must be at least the "
                         f"tokenizer's VOCAB_SIZE ({VOCAB_SIZE})")
    if model is None:
        model = ToyGPT(cfg)
    elif model.cfg != cfg:
        raise ValueError("model was built from a different ModelConfig than cfg")
    from tqdm.auto import tqdm   # imported here: pipeline workers import pipelab without IPython

    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses: list[float] = []
    bar = tqdm(range(steps), desc="training", disable=not progress, leave=False)
    for _ in bar:
        inputs, targets = get_batch(batch_size, cfg.seq_len, generator=generator)
        loss = model.loss(inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    bar.close()
    return losses


@torch.no_grad()
def evaluate(model: ToyGPT, batches: int = 8, batch_size: int = 16, seed: int = 0) -> float:
    """Mean loss on held-out text (the last 10% of the corpus)."""
    generator = torch.Generator().manual_seed(seed)
    model.eval()
    total = sum(model.loss(*get_batch(batch_size, model.cfg.seq_len, generator=generator,
                                      split="val")).item() for _ in range(batches))
    return total / batches


@torch.no_grad()
def sample(model: ToyGPT, prompt: str, n: int = 60, temperature: float = 0.0,
           seed: int = 0) -> str:
    """Continue `prompt` by `n` characters; temperature 0 picks the most likely character."""
    if not prompt:
        raise ValueError("prompt must be a non-empty string")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    generator = torch.Generator().manual_seed(seed)
    model.eval()
    ids = torch.tensor([encode(prompt)])
    for _ in range(n):
        logits = model(ids[:, -model.cfg.seq_len:])[0, -1, :VOCAB_SIZE]
        if temperature == 0:
            next_id = logits.argmax()
        else:
            next_id = torch.multinomial((logits / temperature).softmax(-1), 1, generator=generator)[0]
        ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
    return decode(ids[0])
