"""Notebook 07's helpers: what a block saves (measured), byte curves, policy tables and plots.

Data first, drawing second: `policy_table` returns rows that the notebook asserts on and
`plot_policies` draws exactly those rows.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from ..model import memory
from ..model.gpt import ModelConfig, build_layer, layer_costs
from ..views.plots import kind_colour
from ..sim.costs import Costs
from ..sim.simulate import simulate
from ..sim.timeline import Timeline
from ..techniques.recompute import policies, prepare, recompute_flops

# Names of what one block saves, in the order its forward saves them (memory.block_saved
# merges each LayerNorm's mean and 1/std into one entry).
SAVE_ORDER = ["block input", "LayerNorm 1 mean", "LayerNorm 1 1/std", "qkv input", "q", "k",
              "causal mask", "attention probabilities", "v", "proj input", "LayerNorm 2 input",
              "LayerNorm 2 mean", "LayerNorm 2 1/std", "up input", "GELU input", "down input"]
CORE_NAMES = {"q", "k", "causal mask", "attention probabilities", "v"}


def measure_block_saved(cfg: ModelConfig, rows: int) -> list[tuple[str, tuple, int]]:
    """(name, shape, bytes) of each storage one block's forward saves, in order, measured with
    a saved-tensors hook on a real forward (parameters excluded, each storage once)."""
    block = build_layer(cfg, 1)
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    seen: dict[int, tuple[tuple, int]] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), (tuple(t.shape), storage.nbytes()))
        return t
    x = torch.randn(rows, cfg.seq_len, cfg.d_model, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    if len(seen) != len(SAVE_ORDER):
        raise RuntimeError(f"the block saved {len(seen)} tensors, not the {len(SAVE_ORDER)} "
                           f"this picture names: model.Block changed")
    return [(name, shape, nbytes) for name, (shape, nbytes) in zip(SAVE_ORDER, seen.values())]


def plot_block_saved(saved: Sequence[tuple[str, tuple, int]], title: str, ax=None):
    """Horizontal bars, one per saved tensor, labelled with its shape and size; the attention
    core's (what selective recomputation drops) in red."""
    import matplotlib.pyplot as plt
    if ax is None:
        _fig, ax = plt.subplots(figsize=(10, 4.6))
    names = [n for n, _, _ in saved][::-1]
    sizes = [b / 2**10 for _, _, b in saved][::-1]
    colours = ["#C44E52" if n in CORE_NAMES else "#4C72B0" for n in names]
    ax.barh(names, sizes, color=colours)
    for y, (n, shape, b) in enumerate(list(saved)[::-1]):
        ax.text(b / 2**10, y, f"  {tuple(shape)}  {b / 2**10:.3g} KiB", va="center", fontsize=8)
    ax.set_xlim(0, max(sizes) * 1.6)
    ax.set_xlabel("KiB")
    ax.set_title(f"{title} — measured (red: the attention core, dropped by selective)", fontsize=10)
    ax.figure.subplots_adjust(left=0.22, right=0.97)
    return ax


def with_action_peaks(res) -> Timeline:
    """The run's measured timeline with each action's own peak in its memory curve: the level
    before it, its peak while it ran, the level after it (the meter's per-action record)."""
    tl = res.timeline
    curves = {}
    for rank, peaks in res.action_peaks.items():
        samples = tl.memory[rank]        # the step's start, then the level after each action
        curve = samples[:1]
        for e, (_a, peak), (_t, after) in zip(tl.events_of(rank), peaks, samples[1:]):
            curve += [(e.start, peak), (e.end, after)]
        curves[rank] = curve
    return Timeline(tl.events, tl.ranks, source="measured", memory=curves, memory_unit="bytes",
                    title=tl.title, time_unit=tl.time_unit, schedule=tl.schedule)


def simulate_bytes(schedule, cfg: ModelConfig, bounds, rows: int, recompute=None,
                   costs: Costs | None = None) -> Timeline:
    """`simulate` with memory curves in bytes from the byte model (memory.py), with R actions
    added (recompute.with_recompute) for the stages whose policy drops activations."""
    schedule, policies = prepare(schedule, recompute, cfg, bounds)
    tl = simulate(schedule, costs)
    tl.memory = memory.byte_curves(tl, cfg, bounds, rows, policies or None)
    tl.memory_unit = "bytes"
    return tl


def r_cost_shares(cfg: ModelConfig, bounds, rows: int, recompute) -> list[float]:
    """Per stage, the FLOPs its R repeats over its forward's FLOPs: an R's cost in units of the
    stage's F (the simulator's default charges a whole F, right for `full` only on a stage of
    blocks, far too much for `selective`)."""
    layers = layer_costs(cfg, rows)
    return [recompute_flops(cfg, a, b, rows, p.name) / sum(r["flops"] for r in layers[a:b])
            for (a, b), p in zip(bounds, policies(recompute, cfg, bounds))]


def policy_table(runs: dict, cfg: ModelConfig) -> list[dict]:
    """One row per policy from {policy label: RunResult}: measured and modelled peak bytes per
    rank, the replayed step time (measured CPU time per action, on dedicated cores), its
    overhead over `none`, and the CPU time spent in R."""
    base = runs["none"].replay.makespan
    rows = []
    for label, res in runs.items():
        spec = res.spec
        model = memory.peak_bytes(res.timeline, cfg, spec.bounds, spec.rows_per_microbatch,
                                  spec.recompute or None)
        rows.append(dict(policy=label, measured=dict(res.peak_activations), model=model,
                         step=res.replay.makespan, overhead=res.replay.makespan / base - 1,
                         r_share=r_cpu_share(res), flop_share=recompute_share(res),
                         error=res.max_grad_error))
    return rows


def r_cpu_share(res) -> float:
    """The share of a run's measured CPU time (all actions, all ranks) spent in its R actions."""
    r_time = sum(e.cpu for e in res.timeline.events if e.action.kind == "R")
    return r_time / sum(e.cpu for e in res.timeline.events)


def recompute_share(res) -> float:
    """The share of a step's FLOPs that its R actions repeat, counting F + B as three forwards
    (model.layer_costs; recompute.recompute_flops)."""
    spec = res.spec
    rows = spec.rows_per_microbatch
    forward = sum(r["flops"] for r in layer_costs(spec.cfg, rows))
    again = sum(recompute_flops(spec.cfg, a, b, rows, p.name)
                for (a, b), p in zip(spec.bounds, spec.recompute)) if spec.recompute else 0
    return again / (3 * forward + again)


def format_policy_table(rows: list[dict]) -> str:
    lines = [f"{'policy':12}{'peak rank 0 (KiB)':>19}{'peak rank 1 (KiB)':>19}"
             f"{'model r0/r1':>16}{'step (ms)':>11}{'R CPU':>8}{'R FLOPs':>9}"]
    for r in rows:
        m, p = r["measured"], r["model"]
        lines.append(f"{r['policy']:12}{m[0] / 2**10:19.1f}{m[1] / 2**10:19.1f}"
                     f"{p[0] / 2**10:8.1f}/{p[1] / 2**10:<7.1f}{r['step'] * 1e3:11.2f}"
                     f"{r['r_share']:8.1%}{r['flop_share']:9.1%}")
    return "\n".join(lines)


def plot_policies(rows: list[dict], title: str):
    """Peak bytes per rank (measured bars, model ticks) and R's share of the step: measured CPU
    time beside the FLOP count."""
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    labels = [r["policy"] for r in rows]
    xs = range(len(rows))
    for rank, shift in ((0, -0.2), (1, 0.2)):
        left.bar([x + shift for x in xs], [r["measured"][rank] / 2**10 for r in rows], 0.38,
                 label=f"rank {rank} measured")
        left.scatter([x + shift for x in xs], [r["model"][rank] / 2**10 for r in rows],
                     marker="_", s=300, color="black", zorder=3,
                     label="byte model" if rank == 0 else None)
    left.set_xticks(list(xs), labels, fontsize=8)
    left.set_ylabel("peak activations (KiB)")
    left.set_title("peak per rank — measured", fontsize=10)
    left.legend(fontsize=7, frameon=False)
    right.bar([x - 0.2 for x in xs], [r["r_share"] * 100 for r in rows], 0.38, color=kind_colour("R"),
              label="R's share of CPU time (measured)")
    right.bar([x + 0.2 for x in xs], [r["flop_share"] * 100 for r in rows], 0.38, color="#CCB974",
              label="R's share of FLOPs (model)")
    right.set_xticks(list(xs), labels, fontsize=8)
    right.set_ylabel("share of the step (%)")
    right.set_title("what recomputing costs — measured and modelled", fontsize=10)
    right.legend(fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(left=0.08, right=0.98, wspace=0.3, top=0.82, bottom=0.15)
    return fig


def chen_peak(n: int, k: int, checkpoint: float, block: float) -> float:
    """Segment-by-segment checkpointing of n blocks, keeping every k-th input: the other
    segments' checkpoints plus one segment of k blocks back at once, (⌈n/k⌉ − 1)·c + k·a."""
    return (math.ceil(n / k) - 1) * checkpoint + k * block


def best_k(n: int, checkpoint: float, block: float) -> int:
    """The k with the lowest `chen_peak`: √n when a block keeps what its checkpoint does, and
    √(n·c/a) in general (so 1, full recomputation, when a block keeps far more)."""
    return min(range(1, n + 1), key=lambda k: (chen_peak(n, k, checkpoint, block), k))
