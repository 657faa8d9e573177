"""Notebook 10's helpers: route a toy batch, draw the tokens-per-expert histogram, explore
experts / top-k / capacity, train with and without the load-balancing loss, and turn routing
into pipeline bubbles. Data first (functions that return counts), then the pictures."""
from __future__ import annotations

from dataclasses import replace

import torch

from ..model import moe
from ..model.data import get_batch
from ..model.gpt import ModelConfig, ToyGPT
from ..techniques.expert_routing import Routing, balanced, routed_costs
from ..sim.costs import Costs
from ..sim.simulate import simulate
from ..support.threads import one_thread
from ..views import ui
from ..model.train import train

KEPT, DROPPED = "#4C72B0", "#C44E52"


def route(model: ToyGPT, inputs: torch.Tensor, microbatches: int = 1) -> Routing:
    """Run the single-process model on `inputs` split into `microbatches` and count, per
    microbatch, MoE layer and expert, the assignments routed and dropped."""
    with torch.no_grad(), moe.recording() as log:
        for part in inputs.chunk(microbatches):
            model(part)
    records = [rec for rec in log if rec[0] == "route"]
    layers = sorted({rec[2] for rec in records})
    per = len(layers)
    routed = torch.tensor([rec[3] for rec in records]).view(microbatches, per, -1)
    dropped = torch.tensor([rec[4] for rec in records]).view(microbatches, per, -1)
    return Routing(layers, routed, dropped)


def toy_batch(cfg: ModelConfig, rows: int = 16, seed: int = 0) -> torch.Tensor:
    return get_batch(rows, cfg.seq_len, generator=torch.Generator().manual_seed(seed))[0]


def all_to_all_bytes(routing: Routing, d_model: int, expert_parallel: int) -> int:
    """Bytes one forward moves between processes, every MoE layer, dispatch + combine: the
    kept rows whose expert lives on another process (float32 rows of d_model), when the
    batch is split evenly over `expert_parallel` replicas holding E/ep experts each. A
    microbatch of `routing` is taken as one replica's share."""
    if expert_parallel == 1:
        return 0
    kept = routing.kept                                    # (replicas, layers, E)
    n = kept.shape[-1]
    home = torch.arange(kept.shape[0]) % expert_parallel
    owner = torch.arange(n) // (n // expert_parallel)
    remote = home.view(-1, 1, 1) != owner.view(1, 1, -1)
    return int((kept * remote).sum()) * d_model * 4 * 2


class _CountingExchange(moe.LocalExchange):
    """Every expert stays in this process, but the rows an expert-parallel run would send away
    are counted from the tensors themselves: the rows bound for experts that process `size`
    groups would hold elsewhere (dispatch), and their results coming back (combine)."""

    def __init__(self, home: int, size: int, n_experts: int):
        self.home, self.local = home, n_experts // size
        self.sent = 0

    def _count(self, rows: torch.Tensor, away: torch.Tensor) -> None:
        self.sent += rows[away].numel() * rows.element_size()

    def dispatch(self, counts: torch.Tensor, rows: torch.Tensor, layer: int):
        owner = torch.arange(counts.numel()).repeat_interleave(counts) // self.local
        away = owner != self.home
        self._count(rows, away)
        return counts.view(1, -1), rows, away

    def combine(self, rows: torch.Tensor, away, layer: int) -> torch.Tensor:
        self._count(rows, away)
        return rows


def sent_bytes(model: ToyGPT, inputs: torch.Tensor, expert_parallel: int) -> int:
    """Bytes an expert-parallel forward would move, counted from the tensors: `inputs` split
    into `expert_parallel` replicas, replica h on process h, each process holding E/ep
    consecutive experts of every MoE layer. A second way to get `all_to_all_bytes`."""
    layers = [m for m in model.modules() if isinstance(m, moe.MoEMLP)]
    total = 0
    try:
        with torch.no_grad():
            for home, part in enumerate(inputs.chunk(expert_parallel)):
                counters = [_CountingExchange(home, expert_parallel, m.n_experts) for m in layers]
                for layer, counter in zip(layers, counters):
                    layer.exchange = counter
                model(part)
                total += sum(c.sent for c in counters)
    finally:
        for layer in layers:
            layer.exchange = moe.LOCAL
    return total


def plot_routing(routing: Routing, title: str, ax=None, layer: int = 0, ymax: float | None = None):
    """Tokens per expert of one MoE layer: kept (blue) and dropped (red) stacked, the
    capacity-free even share as a dashed line."""
    import matplotlib.pyplot as plt
    if ax is None:
        _fig, ax = plt.subplots(figsize=(6, 2.8))
    kept = routing.kept.sum(0)[layer]
    dropped = routing.dropped.sum(0)[layer]
    experts = range(kept.numel())
    ax.bar(experts, kept, color=KEPT, label="kept")
    ax.bar(experts, dropped, bottom=kept, color=DROPPED, label="dropped (over capacity)")
    even = routing.routed.sum(0)[layer].sum().item() / kept.numel()
    ax.axhline(even, color="k", ls="--", lw=1, label="even share")
    ax.set_xlabel("expert")
    ax.set_ylabel("assignments")
    ax.set_xticks(list(experts))
    ax.set_ylim(0, ymax if ymax is not None else 1.35 * float((kept + dropped).max()))
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper center", ncol=3, handlelength=1.2, columnspacing=0.8)
    return ax


def layer_imbalance(routing: Routing) -> list[float]:
    """Per MoE layer: the busiest expert's assignments over the mean, over the whole step (1 =
    perfectly even)."""
    per = routing.routed.sum(0).double()                   # (layers, E)
    return (per.max(-1).values / per.mean(-1)).tolist()


def load_imbalance(routing: Routing) -> float:
    """`layer_imbalance` averaged over the layers."""
    per = layer_imbalance(routing)
    return sum(per) / len(per)


def routing_explorer(cfg: ModelConfig, rows: int = 8, expert_parallel: int = 2):
    """Sliders for experts, top-k and capacity factor: the tokens-per-expert histogram of the
    first MoE layer on a toy batch, the dropped tokens and the all-to-all volume. Displays it."""
    import matplotlib.pyplot as plt

    inputs = toy_batch(cfg, rows)
    controls = {
        "n_experts": ui.slider("int", "experts E", value=cfg.n_experts, min=2, max=16, step=2),
        "top_k": ui.slider("int", "top-k", value=cfg.top_k, min=1, max=4),
        "capacity_factor": ui.slider("float", "capacity factor c", value=cfg.capacity_factor,
                                     min=0.25, max=3.0, step=0.25),
    }

    def draw(n_experts, top_k, capacity_factor):
        k = min(top_k, n_experts)
        c = replace(cfg, n_experts=n_experts, top_k=k, capacity_factor=capacity_factor)
        r = route(ToyGPT(c), inputs, expert_parallel)
        room = moe.capacity(cfg.seq_len, n_experts, k, capacity_factor)
        plot_routing(r, f"layer {r.layers[0]}, E={n_experts}, k={k}, c={capacity_factor:g}: "
                        f"capacity {room} per sequence — measured, one process")
        plt.show()
        total = int(r.routed.sum())
        print(f"capacity ⌈{capacity_factor:g} · {cfg.seq_len} · {k} / {n_experts}⌉ = {room} "
              f"per expert per sequence; dropped {r.dropped_tokens()} of {total} assignments "
              f"({r.dropped_tokens() / total:.1%}); all-to-all per forward over "
              f"{expert_parallel} processes: {all_to_all_bytes(r, cfg.d_model, expert_parallel) / 1024:.1f} KiB")

    return ui.slider_box(controls, draw, min_height="360px")


def train_with_aux(cfg: ModelConfig, coefs, steps: int = 40, batch_size: int = 8,
                   rows: int = 16, lr: float = 1e-2) -> dict:
    """Train the MoE model once per load-balancing coefficient α (tqdm bars); return, per α,
    {"before", "after": Routing on a toy batch, "losses": [...]}."""
    inputs = toy_batch(cfg, rows, seed=123)
    out = {}
    with one_thread():              # tiny matrices: a second thread only waits for a core
        for coef in coefs:
            c = replace(cfg, aux_loss_coef=coef)
            model = ToyGPT(c)
            before = route(model, inputs)
            losses = train(c, steps=steps, batch_size=batch_size, lr=lr, model=model)
            out[coef] = {"before": before, "after": route(model, inputs), "losses": losses}
    return out


def skewed(routing: Routing, hot_share: float, seed: int = 0) -> Routing:
    """`routing` with `hot_share` of each microbatch's assignments, in each layer, moved to one
    "hot" expert drawn at random per microbatch and layer (no capacity: nothing dropped): a
    router that favours a different expert at each moment, as an unbalanced one does."""
    gen = torch.Generator().manual_seed(seed)
    routed = routing.kept.double() * (1 - hot_share)
    m, layers, n = routed.shape
    hot = torch.randint(n, (m, layers), generator=gen)
    total = routing.kept.sum(-1).double()
    routed.scatter_add_(-1, hot.unsqueeze(-1), (total * hot_share).unsqueeze(-1))
    routed = routed.round().long()
    return Routing(routing.layers, routed, torch.zeros_like(routed))


def bubble_from_routing(schedule, cfg: ModelConfig, bounds, routing: Routing,
                        expert_parallel: int, costs: Costs | None = None):
    """(routed, balanced) simulated timelines: every F/B of a stage re-timed by its
    microbatch's busiest expert process (routing.routed_costs), and the balanced router's."""
    costs = costs or Costs(F=1.0, I=1.0, W=1.0)
    tokens = int(routing.routed[0, 0].sum()) // cfg.top_k
    even = balanced(routing, cfg.top_k, tokens)
    out = []
    for r, name in ((routing, "measured routing"), (even, "balanced router")):
        tl = simulate(schedule, routed_costs(schedule, costs, cfg, bounds, r, expert_parallel,
                                             reference=even))
        tl.title = f"{schedule.name}, {name} — simulated"
        out.append(tl)
    return tuple(out)


def idle_share(timeline, balanced_timeline) -> float:
    """Share of all ranks' time not spent on the balanced router's work: the pipeline bubble
    plus, inside each action, the wait for the busiest expert process (the work itself is the
    same, only spread unevenly)."""
    work = sum(balanced_timeline.busy().values())
    total = timeline.ranks * timeline.makespan
    return 1.0 - work / total if total else 0.0


def imbalance_sweep(schedule, cfg: ModelConfig, bounds, counts: Routing, hot_shares,
                    expert_parallel: int = 2) -> tuple[list[dict], object]:
    """Per hot share (see `skewed`): the load imbalance, and the simulated makespan, pipeline
    bubble and idle share of `schedule` re-timed by that routing; and the balanced router's
    timeline."""
    table = []
    for h in hot_shares:
        skew = skewed(counts, h)
        routed, even = bubble_from_routing(schedule, cfg, bounds, skew, expert_parallel)
        table.append(dict(hot=h, imbalance=load_imbalance(skew), makespan=routed.makespan,
                          bubble=routed.bubble_fraction(), idle=idle_share(routed, even),
                          timeline=routed))
    return table, even


def format_sweep(table: list[dict]) -> str:
    lines = [f"{'hot share':>10}{'load max/mean':>15}{'makespan':>10}{'pipeline bubble':>17}"
             f"{'idle share':>12}"]
    lines += [f"{r['hot']:10.1f}{r['imbalance']:15.2f}{r['makespan']:10.2f}{r['bubble']:17.3f}"
              f"{r['idle']:12.3f}" for r in table]
    return "\n".join(lines)


def plot_sweep(table: list[dict], even, title: str, ax=None):
    """Idle share and pipeline bubble against the load imbalance (what `imbalance_sweep` found)."""
    import matplotlib.pyplot as plt
    if ax is None:
        _fig, ax = plt.subplots(figsize=(7, 3))
    x = [r["imbalance"] for r in table]
    ax.plot(x, [r["idle"] for r in table], "o-",
            label="idle share (bubble + waiting for the busiest expert process)")
    ax.plot(x, [r["bubble"] for r in table], "s--", label="pipeline bubble (idle between actions)")
    ax.axhline(even.bubble_fraction(), color="k", ls=":", lw=1, label="balanced router's bubble")
    ax.set_ylim(0, 1.3 * max(r["idle"] for r in table))
    ax.set_xlabel("load imbalance (busiest expert / mean)")
    ax.set_ylabel("share of the step")
    ax.set_title(title, fontsize=10)
    # Below the axes: inside, it would sit on the flat bubble line the text points at.
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    return ax


def plot_aux_runs(runs: dict, steps: int):
    """Histograms per MoE layer (rows): before training, and after `steps` steps with each α of
    `train_with_aux`'s result (columns), on one y scale."""
    import matplotlib.pyplot as plt
    first = next(iter(runs.values()))
    panels = [("before training", first["before"])] + [
        (f"{steps} steps, α = {coef:g}", r["after"]) for coef, r in runs.items()]
    layers = first["after"].layers
    fig, axes = plt.subplots(len(layers), len(panels), figsize=(4 * len(panels), 2.8 * len(layers)),
                             sharey=True, squeeze=False)
    top = 1.3 * max(int(r.routed.sum(0).max()) for _what, r in panels)
    for row, layer in enumerate(layers):
        for ax, (what, r) in zip(axes[row], panels):
            plot_routing(r, f"layer {layer}, {what} — measured", ax=ax, layer=row, ymax=top)
    fig.tight_layout()
    return fig
