"""Pictures and comparisons for the tensor-parallel chapter (notebook 09b)."""
from __future__ import annotations

import numpy as np

from ..model.gpt import ModelConfig
from ..sim.costs import Costs
from ..sim.simulate import simulate
from ..sim.tensor_overlap import bubbles as measure
from ..techniques.tensor import head_features, hidden_features
from ..schedules import schedule

#: The schedules STP is compared with, by the paper's names (1F1B-I: interleaved 1F1B, 2 chunks).
TP_SCHEDULES = {"STP": "stp", "ZB-V": "zb-v", "1F1B-I": "interleaved-1f1b"}


def owners(cfg: ModelConfig, size: int) -> dict[str, np.ndarray]:
    """For each weight of a block (rows = output features, columns = input features), which
    tensor-parallel process holds each entry: column-parallel layers split rows, row-parallel
    ones columns."""
    d, ffn = cfg.d_model, cfg.ffn_width
    qkv, proj = np.zeros((3 * d, d), int), np.zeros((d, d), int)
    up, down = np.zeros((ffn, d), int), np.zeros((d, ffn), int)
    for t in range(size):
        cols = head_features(d, cfg.n_heads, size, t).numpy()
        for third in range(3):
            qkv[third * d + cols] = t
        proj[:, cols] = t
        hidden = hidden_features(ffn, size, t).numpy()
        up[hidden] = t
        down[:, hidden] = t
    return {"qkv (column-parallel)": qkv, "proj (row-parallel)": proj,
            "up (column-parallel)": up, "down (row-parallel)": down}


def draw_shards(cfg: ModelConfig, size: int):
    """The four weight matrices of a block, coloured by the process that holds each part."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    mats = owners(cfg, size)
    fig, axes = plt.subplots(1, 4, figsize=(11, 3.2), width_ratios=[1, 1, 1, 2.2])
    cmap = ListedColormap(plt.get_cmap("tab10").colors[:size])
    for ax, (name, owner) in zip(axes, mats.items()):
        ax.imshow(owner, cmap=cmap, vmin=-0.5, vmax=size - 0.5, aspect="auto",
                  interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("input features", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0].set_ylabel("output features", fontsize=8)
    fig.suptitle(f"Which process holds which weights: a block over {size} processes "
                 f"(layout, not measured); colour = process", fontsize=10)
    fig.tight_layout()
    return fig


def compare_tp(ranks: int, microbatches: int, t_ar: float, costs: Costs | None = None) -> dict:
    """STP, ZB-V and 1F1B-I simulated with a tensor-parallel all-reduce of `t_ar` per pass:
    {name: timeline}. `costs`: F, I, W per chunk, as the STP paper gives them (default
    pl.Costs.per_stage(F=1, I=1, W=1); a pl.Costs(...) is a rank's worth, divided)."""
    from dataclasses import replace
    base = costs or Costs.per_stage(F=1, I=1, W=1)
    priced = replace(base, tp_allreduce=t_ar)
    out = {}
    for label, name in TP_SCHEDULES.items():
        tl = simulate(schedule(name, ranks=ranks, microbatches=microbatches), priced)
        tl.title = f"{label}, T_AR = {t_ar:g} (simulated)"
        out[label] = tl
    return out


def bubbles(timeline, costs: Costs | None = None) -> dict[int, dict[str, float]]:
    """Per rank, the TP bubble ("tp"), the PP bubble ("pp") and the span of a simulated
    timeline (tensor_overlap.bubbles), for unit costs per chunk (F = I = W = 1) unless `costs`
    is given."""
    return measure(timeline, costs or Costs.per_stage(F=1, I=1, W=1))
