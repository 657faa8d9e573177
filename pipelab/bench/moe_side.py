"""One expert-parallel MoE layer, timed inside LocalCluster workers:

    cluster.call("pipelab.bench.moe_side:layer_times", job)     # one dict per rank

Every rank builds the same MoE MLP, keeps its share of the experts (techniques/expert.py, over
the whole group) and runs forward and backward on its own tokens, `repeats` times. The layer's
own records (moe.recording) give, per repeat, the dispatch and combine all-to-alls and the
expert compute of the forward; the backward's all-to-alls and the whole backward are timed too.
Returns the medians in seconds.
"""
from __future__ import annotations

import statistics
import time

from ..model import moe
from ..techniques.expert import place_experts


def layer_times(job: dict) -> dict:
    import torch
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(job.get("seed", 0))
    layer = moe.MoEMLP(job["d_model"], job["d_ff"], job["n_experts"], job["top_k"],
                       job["capacity_factor"], 0.0, layer=1)
    place_experts([layer], dist.group.WORLD, rank, world)
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(job["rows"], job["seq_len"], job["d_model"], generator=gen)
    samples: dict[str, list[float]] = {}
    for i in range(job["warmup"] + job["repeats"]):
        inp = x.clone().requires_grad_()
        dist.barrier()
        with moe.recording() as fwd:
            out = layer(inp)
        t = time.perf_counter()
        with moe.recording() as bwd:
            out.backward(torch.ones_like(out))
        backward = time.perf_counter() - t
        if i < job["warmup"]:
            continue
        took = {"dispatch": 0.0, "combine": 0.0, "experts": 0.0, "a2a backward": 0.0,
                "backward": backward}
        for rec in fwd:
            if rec[0] == "a2a":
                took["dispatch" if rec[3] == "Ed" else "combine"] += rec[2] - rec[1]
            elif rec[0] == "experts":
                took["experts"] += rec[2] - rec[1]
        took["a2a backward"] = sum(r[2] - r[1] for r in bwd if r[0] == "a2a")
        for key, value in took.items():
            samples.setdefault(key, []).append(value)
    return {key: statistics.median(v) for key, v in samples.items()}
