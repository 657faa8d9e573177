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
    fig, axes = plt.subplots(1, 4, figsize=(9.6, 3.2), width_ratios=[1, 1, 1, 2.2])
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


def braided_step(t_ar: float, step: str = "3F1+3I0", forward: float = 1.0,
                 backward: float = 1.0) -> dict:
    """One braided step at slot scale, from the simulator's own step model
    (sim.tensor_overlap.step_time): its parts' compute spans, their all-reduce spans on the
    communication lane, the tail that runs on under the next step, and the same parts run
    one after the other without braiding (each waiting for its own sum)."""
    from ..schedules.actions import Action
    from ..sim.tensor_overlap import step_time
    costs = Costs.per_stage(F=forward, I=backward, W=backward, tp_allreduce=t_ar)
    action = Action.parse(step)
    compute, tail, spans = step_time(costs, action)
    parts, t = [], 0.0
    for part in action.parts:
        width = costs.duration(part, 1)
        parts.append((str(part), t, t + width))
        t += width
    alone = [step_time(costs, part) for part in action.parts]
    return dict(step=step, t_ar=t_ar, parts=parts, spans=spans, compute=compute, tail=tail,
                alone=[a[0] for a in alone], alone_spans=[a[2] for a in alone])


def draw_braided_step(data: dict):
    """Two rows: the braided step (compute lane, all-reduce lane, arrows from each sum to the
    compute it runs under) and the same parts one after the other, waiting for their sums."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    colours = ["#1f77b4", "#ff7f0e"]
    ar_colour = "#17BECF"
    fig, ax = plt.subplots(figsize=(9.6, 3.1))

    def lane(y, x0, x1, colour, text, height=0.5, textcolour="white"):
        ax.add_patch(Rectangle((x0, y - height / 2), x1 - x0, height, facecolor=colour,
                               edgecolor="white"))
        ax.text((x0 + x1) / 2, y, text, ha="center", va="center", fontsize=8, color=textcolour)

    # braided: compute at y = 0, its all-reduces at y = 0.55
    for k, (name, a, b) in enumerate(data["parts"]):
        lane(0, a, b, colours[k], f"{name} (microbatch {name[-1]})")
    for begin, end, k in data["spans"]:
        lane(0.6, begin, end, ar_colour, f"AR {data['parts'][k][0]}", height=0.3,
             textcolour="black")
        under = [(n, a, b) for n, a, b in data["parts"] if a < end and b > begin and n != data["parts"][k][0]]
        target = f"hides under {under[0][0]}" if under else "tail: runs on under the next step"
        ax.annotate(target, xy=((begin + end) / 2, 0.27), xytext=((begin + end) / 2 + 0.05, 0.95),
                    fontsize=8, arrowprops=dict(arrowstyle="->", color="#444444", linewidth=0.8))
    ax.axvline(data["compute"], color="black", linestyle="--", linewidth=0.8)
    # the same passes without braiding, at y = 2
    t = 0.0
    for k, ((name, a, b), took, spans) in enumerate(zip(data["parts"], data["alone"],
                                                      data["alone_spans"])):
        lane(2, t, t + (b - a), colours[k], name)
        for begin, end, _ in spans:
            lane(2, t + begin, t + end, "#d62728", "wait AR", textcolour="white")
        t += took
    ax.axvline(t, color="#d62728", linestyle="--", linewidth=0.8)
    ax.set_yticks([0, 0.6, 2], ["braided step:\ncompute", "its all-reduces", "one after the\nother"],
                  fontsize=8)
    ax.set_ylim(2.6, -0.5)
    ax.set_xlim(0, max(t, data["compute"] + data["tail"]) * 1.05)
    ax.set_xlabel("time (units of F)", fontsize=9)
    ax.set_title(f"One braided step `{data['step']}`, T_AR = {data['t_ar']:g} F (simulated step "
                 f"model): compute {data['compute']:g} braided against {t:g} unbraided",
                 fontsize=10)
    fig.tight_layout()
    return fig


_RACES: dict = {}


def race(ranks: int, microbatches: int, t_ar: float) -> dict:
    """compare_tp, simulated once per (p, m, T_AR) and kept: a slider that comes back to a
    value draws without simulating again."""
    key = (ranks, microbatches, round(t_ar, 9))
    if key not in _RACES:
        _RACES[key] = compare_tp(ranks, microbatches, t_ar)
    return _RACES[key]


def draw_race(timelines: dict):
    """The race as light Gantt charts: one broken_barh per rank and kind (a few dozen artists
    instead of a box and a label per step), one shared time axis, each makespan marked."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from ..views.plots import kind_colour
    braided = "#9467bd"
    fig, axes = plt.subplots(len(timelines), 1, figsize=(9.6, 0.8 + 0.75 * len(timelines) *
                                                         max(t.ranks for t in timelines.values()) / 2),
                             sharex=True, squeeze=False)
    seen = {}
    for ax, (label, tl) in zip(axes[:, 0], timelines.items()):
        for r in range(tl.ranks):
            groups: dict = {}
            for e in tl.events_of(r):
                parts = e.action.parts
                key = "braided step" if len(parts) > 1 else parts[0].kind
                groups.setdefault(key, []).append((e.start, e.end - e.start))
            for key, spans in groups.items():
                colour = braided if key == "braided step" else kind_colour(key)
                ax.broken_barh(spans, (r - 0.4, 0.6), facecolors=colour, edgecolor="white",
                               linewidth=0.3)
                seen[key] = colour
            comm = [(e.start, e.end - e.start) for e in tl.comm_events() if e.rank == r]
            if comm:
                ax.broken_barh(comm, (r + 0.22, 0.15), facecolors=kind_colour("Tp"))
                seen["Tp"] = kind_colour("Tp")
        ax.axvline(tl.makespan, color="black", linewidth=0.8)
        ax.text(tl.makespan, -0.6, f"makespan {tl.makespan:.1f} ", fontsize=8, ha="right", va="center")
        ax.set_yticks(range(tl.ranks), [str(r) for r in range(tl.ranks)], fontsize=8)
        ax.set_ylim(tl.ranks - 0.4, -0.8)
        ax.set_ylabel("rank", fontsize=8)
        ax.set_title(tl.title or label, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("time (units of F)", fontsize=9)
    names = {"Tp": "TP all-reduce", "braided step": "braided step"}
    axes[0, 0].legend(handles=[Patch(color=c, label=names.get(k, k)) for k, c in seen.items()],
                      fontsize=8, ncol=len(seen), loc="lower right", bbox_to_anchor=(1, 1.12),
                      frameon=False)
    fig.tight_layout()
    return fig
