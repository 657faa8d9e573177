"""How much does a second busy core slow the first? The physical limit of a 2-rank speed-up.

"Two ranks can be at most 2× one process" assumes each core runs as fast beside a busy
neighbour as alone. On a virtual machine (or with two hyperthreads of one core, or one memory
bus) it does not: `core_work` times the same forward and backward of the whole toy model on
every worker of a cluster at once (thread CPU time, which other processes' time slices do not
enter), so a 1-worker and a 2-worker call, alternated, give the slowdown a pipeline's ranks pay
for running side by side.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from ..model.gpt import ModelConfig, ToyGPT


def core_work(cfg: ModelConfig, rows: int, iterations: int = 8) -> float:
    """Median thread CPU seconds of one forward + backward of `rows` sequences through the
    whole model, run on every worker of the call at the same time (a barrier starts them)."""
    torch.manual_seed(0)
    model = ToyGPT(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len))
    for _ in range(2):                                   # warm-up: allocator, kernels
        model(tokens).float().mean().backward()
    if dist.is_initialized():
        dist.barrier()
    times = []
    for _ in range(iterations):
        began = time.thread_time()
        model(tokens).float().mean().backward()
        times.append(time.thread_time() - began)
    return statistics.median(times)
