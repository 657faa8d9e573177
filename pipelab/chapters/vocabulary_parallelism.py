"""The vocabulary imbalance and its four answers, on one cost model: data for chapter 08.

    baseline        1F1B, blocks split evenly, embedding on the first stage, head on the last
    redistribution  1F1B, the layer split that balances measured layer times (fewer blocks
                    where the embedding and the head sit): a layout string like "E+t*3|t+L"
    vocab-1/2       1F1B with the vocabulary layers sharded over every rank (schedules/vocab.py)
    v-half-vocab    V-Half with them (schedules/vocab_vhalf.py): two stages per rank, the V's
                    chunks, so transformer memory is balanced too; not among the four METHODS
                    the explorer draws, but every function here takes it (ALL_METHODS)

`VocabProfile.measure` times one block, the embedding and the head (forward + backward, CPU
time, one process) and the output layer's S and T passes over the whole vocabulary; a shard of
V/p rows costs 1/p of them. `plan` turns a profile into a schedule and a cost table for any
number of ranks (blocks per rank fixed, as the paper grows layers with devices); `method_table`
simulates the four side by side, with memory per rank in bytes.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace

import torch

from ..model.gpt import ModelConfig, build_layer, layer_costs, loss_fn
from ..sim.partition import Partition, balanced_bounds
from ..schedules import Schedule, schedule as make_schedule
from ..sim.costs import Costs
from ..sim.simulate import simulate
from ..techniques.vocab import (parameter_bytes, rescaled_sum, shard_forward, shard_rows,
                                shard_softmax_grad, shifted_target)
from ..views.plots import KIND_COLOURS
from ..support.threads import one_thread
from ..schedules.kinds import KIND_SPECS
from ..views import ui
from ..runtime.meter import ActivationMeter

METHODS = ("baseline", "redistribution", "vocab-1", "vocab-2")
VHALF = "v-half-vocab"
ALL_METHODS = METHODS + (VHALF,)
SHARDED = frozenset({"vocab-1", "vocab-2", VHALF})     # the vocabulary over every rank
# Colours for the vocabulary kinds in every Gantt chart (plots.KIND_COLOURS is the shared table).
VOCAB_COLOURS = {"S": "#8C564B", "T": "#E377C2", "C": "#7F7F7F", "Cs": "#7F7F7F",
                 "Ct": "#595959", "Vf": "#17BECF", "Vb": "#BCBD22"}
for _kind, _colour in VOCAB_COLOURS.items():
    KIND_COLOURS.setdefault(_kind, _colour)
SCHEDULE_OF = {"baseline": "1f1b", "redistribution": "1f1b", "vocab-1": "vocab-1",
               "vocab-2": "vocab-2", VHALF: VHALF}
BYTES = 4          # float32


def _cpu_times(step, repeats: int, warmup: int = 2) -> list[float]:
    """CPU seconds of `repeats` calls of `step`, after `warmup` untimed ones."""
    for _ in range(warmup):
        step()
    samples = []
    for _ in range(repeats):
        t0 = time.thread_time()
        step()
        samples.append(time.thread_time() - t0)
    return samples


@dataclass
class VocabProfile:
    """Measured seconds of one microbatch (`rows` × seq_len tokens), forward + backward."""
    cfg: ModelConfig
    rows: int
    embed: float
    block: float
    head: float          # projection + softmax cross-entropy, the whole vocabulary
    S: float             # the output layer's S pass over the whole vocabulary
    T: float             # its T pass (dW and dX)
    block_bytes: int     # activations one block keeps per microbatch
    # Every repeat behind each median ({"embed"|"block"|"head"|"S"|"T": [seconds, ...]}), for
    # judging a comparison against the machine's noise (pipelab.support.noise.verdict).
    samples: dict = field(default_factory=dict, repr=False)

    @classmethod
    def measure(cls, cfg: ModelConfig, rows: int = 4, repeats: int = 3) -> "VocabProfile":
        with one_thread():
            gen = torch.Generator().manual_seed(cfg.seed)
            n = rows * cfg.seq_len
            idx = torch.randint(cfg.vocab_size, (rows, cfg.seq_len), generator=gen)
            hidden = torch.randn(rows, cfg.seq_len, cfg.d_model, generator=gen)
            embed, block = build_layer(cfg, 0), build_layer(cfg, 1)
            head = build_layer(cfg, cfg.total_layers - 1)

            def run(layer, x, loss=False):
                out = layer(x)
                (loss_fn(out, idx) if loss else out).backward(None if loss else hidden)

            samples = {"embed": _cpu_times(lambda: run(embed, idx), repeats),
                       "block": _cpu_times(lambda: run(block, hidden.clone().requires_grad_()),
                                           repeats),
                       "head": _cpu_times(lambda: run(head, hidden.clone().requires_grad_(), True),
                                          repeats)}
            x, w, t = hidden.reshape(n, -1), head.out.weight.detach(), idx.reshape(-1)
            part = shard_forward(x, w, t, 0)
            grad = torch.full((n,), 1.0 / n)
            share = rescaled_sum(part, part.row_max) / part.row_sum

            def backward():
                d = shard_softmax_grad(part, share, grad)
                return d.t() @ x, d @ w
            samples["S"] = _cpu_times(lambda: shard_forward(x, w, t, 0), repeats)
            samples["T"] = _cpu_times(backward, repeats)
            meter = ActivationMeter(block.parameters())
            with meter.saving():
                kept = block(hidden.clone().requires_grad_())
            del kept
            med = {kind: statistics.median(values) for kind, values in samples.items()}
            return cls(cfg, rows, med["embed"], med["block"], med["head"], med["S"], med["T"],
                       meter.peak, samples)


def model_for(cfg: ModelConfig, ranks: int, blocks_per_rank: int) -> ModelConfig:
    return replace(cfg, n_layers=ranks * blocks_per_rank)


def bounds_for(profile: VocabProfile, method: str, ranks: int,
               blocks_per_rank: int) -> list[tuple[int, int]]:
    """Layer ranges per stage: blocks evenly (embedding first, head last), or balanced.
    V-Half's 2·ranks stages hold half a rank's blocks each."""
    n = ranks * blocks_per_rank
    if method == "redistribution":
        return balanced_bounds([profile.embed] + [profile.block] * n + [profile.head], ranks)
    stages, per_stage = ranks, blocks_per_rank
    if method == VHALF:
        if blocks_per_rank % 2:
            raise ValueError(f"blocks_per_rank must be even for {VHALF} (its two stages per "
                             f"rank hold half of them each), got {blocks_per_rank}")
        stages, per_stage = 2 * ranks, blocks_per_rank // 2
    cuts = [0] + [1 + per_stage * (s + 1) for s in range(stages - 1)] + [n + 2]
    return list(zip(cuts[:-1], cuts[1:]))


def _stages_by_rank(placement, ranks: int) -> list[list[int]]:
    return [[s for s, owner in enumerate(placement) if owner == r] for r in range(ranks)]


def plan(profile: VocabProfile, method: str, ranks: int, microbatches: int,
         blocks_per_rank: int, barrier: float = 0.0) -> tuple[Schedule, Costs, list]:
    """The schedule, its cost table (F : B = 1 : 2 within each layer's time) and the bounds."""
    if method not in ALL_METHODS:
        raise ValueError(f"method must be one of {', '.join(ALL_METHODS)}, got {method!r}")
    bounds = bounds_for(profile, method, ranks, blocks_per_rank)
    last = ranks * blocks_per_rank + 1
    sharded = method in SHARDED

    def stage_time(a: int, b: int) -> float:
        total = 0.0
        for layer in range(a, b):
            if layer == 0:
                total += 0.0 if sharded else profile.embed
            elif layer == last:
                total += 0.0 if sharded else profile.head
            else:
                total += profile.block
        return total
    totals = [stage_time(a, b) for a, b in bounds]
    kinds = {"S": profile.S / ranks, "T": profile.T / ranks, "Cs": barrier, "Ct": barrier,
             "C": barrier, "Vf": barrier, "Vb": barrier} if sharded else None
    costs = Costs.per_stage(F=[t / 3 for t in totals], I=[t / 3 for t in totals],
                            W=[t / 3 for t in totals], kinds=kinds, unit="s")   # by stage bounds
    sched = make_schedule(SCHEDULE_OF[method], ranks=ranks, microbatches=microbatches)
    return sched, costs, bounds


def memory_bytes(profile: VocabProfile, method: str, ranks: int, blocks_per_rank: int,
                 bounds, peaks: dict[int, float], placement=None) -> list[int]:
    """Per rank: parameters (float32) plus the activations at the peak: blocks in flight × the
    block's bytes, the head's log-softmax for one microbatch on the head's rank, or
    each rank's softmax shard and X copy under vocabulary parallelism. (The head keeps one
    n × V table for its backward, the log-softmax: what the activation meter measures.)
    `placement`: each stage's rank (default: stage r on rank r); `peaks` count microbatches
    of all of a rank's blocks, as the simulator does."""
    cfg = model_for(profile.cfg, ranks, blocks_per_rank)
    n = profile.rows * cfg.seq_len
    layers = layer_costs(cfg)
    sharded = method in SHARDED
    vocab = parameter_bytes(cfg, ranks, sharded)
    out = []
    for r, stages in enumerate(_stages_by_rank(placement or range(ranks), ranks)):
        mine = [i for s in stages for i in range(*bounds[s])]
        blocks = [i for i in mine if 0 < i < cfg.total_layers - 1]
        params = sum(layers[i]["params"] for i in blocks)
        acts = peaks[r] * len(blocks) * profile.block_bytes
        if sharded:
            rows = vocab[r] // (BYTES * cfg.d_model * (1 if cfg.tie_embeddings else 2))
            acts += n * (rows + cfg.d_model) * BYTES
        elif cfg.total_layers - 1 in mine:
            acts += n * cfg.vocab_size * BYTES
        out.append(int(params * BYTES + vocab[r] + acts))
    return out


def method_table(profile: VocabProfile, ranks: int, microbatches: int,
                 blocks_per_rank: int, barrier: float = 0.0, methods=METHODS) -> list[dict]:
    """Simulated step time, per-rank busy time, activation peaks (microbatches of a rank's
    blocks) and memory of the four methods (or `methods`, the first being the reference)."""
    rows = []
    for method in methods:
        sched, costs, bounds = plan(profile, method, ranks, microbatches, blocks_per_rank,
                                    barrier)
        tl = simulate(sched, costs, source="simulated")
        peaks = tl.peak_activations()
        busy = tl.busy()
        rows.append(dict(method=method, ranks=ranks, step=tl.makespan, timeline=tl,
                         busy=[busy[r] for r in range(ranks)], bounds=bounds,
                         peaks=[peaks[r] for r in range(ranks)],
                         memory=memory_bytes(profile, method, ranks, blocks_per_rank, bounds,
                                             peaks, sched.placement)))
    base = rows[0]["step"]
    for row in rows:
        row["speedup"] = base / row["step"]
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'method':15}{'p':>3}{'step (ms)':>11}{'vs baseline':>13}"
             f"{'busiest / idlest rank':>23}{'peak memory (MiB), per rank':>30}"]
    for row in rows:
        busy = row["busy"]
        mem = " ".join(f"{m / 2**20:.1f}" for m in row["memory"])
        lines.append(f"{row['method']:15}{row['ranks']:>3}{row['step'] * 1e3:11.2f}"
                     f"{row['speedup']:12.2f}x{max(busy) / max(min(busy), 1e-12):22.2f}   {mem}")
    return "\n".join(lines)


def layout_of(cfg: ModelConfig, bounds) -> str:
    """The bounds as a layout string ("E+t*2|t*2+L")."""
    return Partition(replace(cfg, tie_embeddings=False), bounds, "custom").layout


def live_runs(cluster, profile: VocabProfile, microbatches: int, blocks_per_rank: int,
              batch_size: int | None = None, methods=METHODS, **run) -> dict:
    """Run each method on the cluster (model: the profile's, `blocks_per_rank` blocks on each
    of the cluster's ranks), each gradient-checked against the unsplit model."""
    ranks = cluster.ranks
    cfg = model_for(profile.cfg, ranks, blocks_per_rank)
    rows = batch_size or profile.rows * microbatches
    out = {}
    for method in methods:
        sched = make_schedule(SCHEDULE_OF[method], ranks=ranks, microbatches=microbatches)
        bounds = bounds_for(profile, method, ranks, blocks_per_rank)
        out[method] = cluster.run(sched, model=cfg, partition=bounds, batch_size=rows, **run)
    return out


def measured_rows(runs: dict, profile: VocabProfile, blocks_per_rank: int) -> list[dict]:
    """The live runs as `method_table` rows: measured step (wall clock), replayed step (from
    per-action CPU times), `fitted` step (simulated with the run's median CPU time of each kind
    on each stage: one slow action moves a replay, not a median), per-rank CPU-busy time, and
    memory = parameters + measured peak activations (the output-layer shard's kept softmax
    included, held in the meter)."""
    rows = []
    for method, res in runs.items():
        ranks = res.schedule.ranks
        cfg = model_for(profile.cfg, ranks, blocks_per_rank)
        layers = layer_costs(cfg)
        vocab = parameter_bytes(cfg, ranks, method in SHARDED)
        params = [sum(layers[i]["params"] for s in stages for i in range(*res.spec.bounds[s])
                      if 0 < i < cfg.total_layers - 1) * BYTES + vocab[r]
                  for r, stages in enumerate(_stages_by_rank(res.schedule.placement, ranks))]
        busy = res.replay.busy()
        rows.append(dict(method=method, ranks=ranks, step=res.replay.makespan,
                         measured=res.timeline.makespan, timeline=res.replay,
                         busy=[busy[r] for r in range(ranks)], bounds=res.spec.bounds,
                         memory=[int(params[r] + res.peak_activations[r]) for r in range(ranks)],
                         error=res.max_grad_error, fitted=res.simulated.makespan))
    for row in rows:
        row["speedup"] = rows[0]["step"] / row["step"]
        row["fitted_speedup"] = rows[0]["fitted"] / row["fitted"]
    return rows


def compute_busy(res) -> list[float]:
    """CPU seconds each rank spent computing in a live run: its actions' CPU time, the
    collective barriers left out. On the workers a barrier blocks, and its measured time holds
    the wait for the partner's part of the algebra, which the paper (and our simulator) runs on
    a side lane beside the compute; this is the work the schedule balances."""
    busy = [0.0] * res.schedule.ranks
    for e in res.timeline.events:
        if e.cpu is not None and not any(KIND_SPECS[p.kind].collective for p in e.action.parts):
            busy[e.rank] += e.cpu
    return busy


def plot_methods(rows: list[dict], source: str, axes=None, memory_source: str | None = None):
    """Per-rank busy time and memory of each method, grouped bars; `source` goes in the titles
    ("simulated", "replayed", "measured"), `memory_source` in the memory panel's when the
    memory came from elsewhere (a live run's activation meter)."""
    import matplotlib.pyplot as plt
    if axes is None:
        _fig, axes = plt.subplots(1, 2, figsize=(9.4, 3.4))
    ranks = rows[0]["ranks"]
    width = 0.8 / len(rows)
    for k, row in enumerate(rows):
        xs = [r + (k - (len(rows) - 1) / 2) * width for r in range(ranks)]
        axes[0].bar(xs, [b * 1e3 for b in row["busy"]], width, label=row["method"])
        axes[1].bar(xs, [m / 2**20 for m in row["memory"]], width, label=row["method"])
    for ax, what in zip(axes, ("busy time per step (ms)", "peak memory (MiB)")):
        # bare rank numbers under an axis label: "rank 0" … "rank 7" touch at p = 8
        ax.set_xticks(range(ranks), [str(r) for r in range(ranks)], fontsize=8)
        ax.set_xlabel("rank", fontsize=9)
        ax.set_ylabel(what, fontsize=9)
    axes[0].set_title(f"compute per rank, p={ranks}\n({source})", fontsize=10)
    axes[1].set_title(f"parameters + activations per rank\n({memory_source or source})",
                      fontsize=10)
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))     # off the bars
    axes[0].figure.tight_layout()
    return axes


def vocab_explorer(profiles: dict, ranks: int = 4, microbatches: int = 8,
                   blocks_per_rank: int = 2):
    """A vocabulary-size slider over measured profiles ({V: VocabProfile}): per-rank time and
    memory bars of the four methods, simulated from the measured layer costs."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    sizes = sorted(profiles)
    pick = ui.control(w.SelectionSlider, "vocabulary size V", options=sizes, value=sizes[-1],
                      continuous_update=False)
    ranks_box = ui.slider("int", "pipeline ranks p", min=2, max=8, step=2, value=ranks)

    def draw(vocab: int, ranks: int) -> None:
        rows = method_table(profiles[vocab], ranks, microbatches, blocks_per_rank)
        plot_methods(rows, f"simulated from measured costs, V={vocab}")
        plt.show()
        print(format_rows(rows))

    # Rendered in the kernel (drawn at once, as it is built): no headless hang.
    out = ui.interactive_output(draw, {"vocab": pick, "ranks": ranks_box})
    out.layout.min_height = "420px"
    box = w.VBox([pick, ranks_box, out])
    box.out = out
    return box


def median_round(rounds: list[dict], method: str, reference: str = "baseline") -> int:
    """The index of the round whose replayed step ratio method / reference is the median of
    the rounds (the lower middle one for an even count): the run a chart draws, so that the
    picture and the numbers printed beside it come from one run."""
    ratios = [r[method].replay.makespan / r[reference].replay.makespan for r in rounds]
    order = sorted(range(len(ratios)), key=ratios.__getitem__)
    return order[(len(order) - 1) // 2]


def dataflow(x: torch.Tensor, weight: torch.Tensor, target: int, shards: int) -> dict:
    """One token's way through the output layer, shard by shard, as numbers (the picture's
    data): per shard its rows, its S partials (m_r, s_r, [t ∈ r]·z_t), then C0's max M, the
    rescaled sums c_r, their total and the target's shifted logit, the loss, and T's factor
    α_r = c_r / Σc on each shard. x: (h,), weight: (V, h)."""
    targets = torch.tensor([target])
    bounds = [shard_rows(weight.shape[0], shards, r) for r in range(shards)]
    parts = [shard_forward(x[None, :], weight[a:b], targets, a) for a, b in bounds]
    top = torch.stack([q.row_max for q in parts]).max(dim=0).values                  # C0: MAX
    c = [rescaled_sum(q, top) for q in parts]
    total = torch.stack(c).sum(dim=0)                                                # C0: SUM
    shifted = torch.stack([shifted_target(q, top) for q in parts]).sum(dim=0)
    return dict(bounds=bounds, target=target,
                m=[q.row_max.item() for q in parts], s=[q.row_sum.item() for q in parts],
                z_t=[q.target_logit.item() if q.in_shard.item() else None for q in parts],
                M=top.item(), c=[v.item() for v in c], total=total.item(),
                shifted=shifted.item(), loss=(torch.log(total) - shifted).item(),
                alpha=[(v / total).item() for v in c])


def draw_dataflow(flow: dict):
    """The vocabulary dataflow of one token as a diagram drawn from `dataflow`'s numbers:
    shards → S partials (m_r, s_r, z_t) → C0 max → C0 sums → T on every shard."""
    import matplotlib.pyplot as plt
    p = len(flow["bounds"])
    fig, ax = plt.subplots(figsize=(9.6, 0.9 + 0.8 * p))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.7, p - 0.3)
    ax.invert_yaxis()
    ax.axis("off")
    box = dict(boxstyle="round,pad=0.3", linewidth=0.8)

    def node(x, y, text, colour):
        ax.text(x, y, text, ha="center", va="center", fontsize=8,
                bbox={**box, "facecolor": colour, "edgecolor": "#555555"})

    def arrow(x0, y0, x1, y1):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops=dict(arrowstyle="->", color="#555555", linewidth=0.8))

    mid = (p - 1) / 2
    for r, (a, b) in enumerate(flow["bounds"]):
        node(0.9, r, f"shard {r}\nrows {a}–{b - 1}", "#dbe9f6")
        zt = flow["z_t"][r]
        node(3.0, r, f"S: m={flow['m'][r]:.2f}\ns={flow['s'][r]:.2f}"
             + (f"  z_t={zt:.2f}" if zt is not None else "  (t not here)"), VOCAB_COLOURS["S"] + "55")
        node(8.9, r, f"T: α={flow['alpha'][r]:.3f}\nP_r × α → dW_r", VOCAB_COLOURS["T"] + "55")
        arrow(1.55, r, 2.05, r)
        arrow(3.95, r, 4.65, mid - 0.5)              # every shard's m_r to the MAX
        arrow(3.95, r, 6.2, mid + 0.5)               # and its s_r, z_t to the SUMS
        arrow(7.35, mid + 0.5, 8.1, r)               # the totals back to every shard's T
    node(5.2, mid - 0.5, f"C0 all-reduce MAX\nM = {flow['M']:.2f}", "#eeeeee")
    node(6.75, mid + 0.5, f"C0 all-reduce SUM\nΣc = {flow['total']:.3f}\n"
         f"z_t − M = {flow['shifted']:.2f}", "#eeeeee")
    arrow(5.2, mid - 0.2, 6.3, mid + 0.1)            # M first: c_r = s_r·e^(m_r − M)
    ax.text(6.75, p - 0.45, f"loss = log Σc − (z_t − M) = {flow['loss']:.4f}", ha="center",
            fontsize=9)
    ax.set_title(f"One token through the sharded output layer, p = {p} (computed, not measured): "
                 "three numbers per token cross the barrier", fontsize=10)
    fig.tight_layout()
    return fig
