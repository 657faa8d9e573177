"""Chapter 14's helpers: the vocabulary paper's sweep at its scale, memory per rank in GB, an
explorer, the papers' table drawn (the rows themselves come from pipelab/bench/papers.py,
which the notebook imports: data first, drawing here), and a shape's plan drawn (`plot_plan`).
"""
from __future__ import annotations

from ..planner.plan import Plan
from ..planner.ranked import shown_label
from ..sim.device import Device
from ..sim.scale import GIB, interlaced, mfu, per_rank_bytes, simulate_shape
from ..sim.shape import ModelShape
from ..views import ui

METHODS = ("baseline", "vocab-1", "vocab-2", "interlaced")
A100_80 = Device.named("A100-80GB")         # the artifact's GPUs
COLOURS = {"baseline": "#7F7F7F", "vocab-1": "#8C564B", "vocab-2": "#E377C2",
           "interlaced": "#17BECF"}


def artifact_shape(seq_len: int, vocab: int) -> ModelShape:
    """The vocabulary artifact's ≈4B GPT (32 blocks, hidden 3072, 24 heads, MLP 12288)."""
    return ModelShape(hidden=3072, layers=32, heads=24, seq_len=seq_len, vocab=vocab, ffn=12288)


def methods_at(seq_len: int, vocab: int, ranks: int = 8, microbatches: int = 128,
               device: Device = A100_80) -> dict:
    """{method: (MFU, peak GB per rank list)} simulated for the artifact's model: the baseline
    (1F1B, output layer on the last stage), Vocab-1, Vocab-2 and the interlaced model. Flash
    attention is modelled as selective recomputation (its bytes and FLOPs)."""
    shape = artifact_shape(seq_len, vocab)
    kw = dict(ranks=ranks, microbatches=microbatches, device=device, recompute="selective")
    out = {}
    for method in METHODS:
        if method == "interlaced":
            tl, prof = interlaced(shape, **kw)
        else:
            tl, prof = simulate_shape("1f1b" if method == "baseline" else method, shape, **kw)
        held = 1.5 if method == "interlaced" else 1.0
        out[method] = (mfu(tl, prof, microbatches),
                       [x / GIB for x in per_rank_bytes(tl, prof, held)])
    return out


def vocab_sweep(seq_len: int, vocabs, ranks: int = 8, microbatches: int = 128,
                device: Device = A100_80) -> list[dict]:
    """One row per vocabulary: {"vocab", method: MFU, f"{method} GB": the fullest rank's GB}."""
    rows = []
    for vocab in vocabs:
        at = methods_at(seq_len, vocab, ranks, microbatches, device)
        row = {"vocab": vocab}
        for method, (util, gb) in at.items():
            row[method], row[f"{method} GB"] = util, max(gb)
        rows.append(row)
    return rows


def plot_vocab_sweep(table: list[dict], measured: dict | None = None, seq_len: int = 4096,
                     title: str = ""):
    """MFU against the vocabulary, simulated (lines) and, where given, the artifact's measured
    points (`measured`: {(seq, vocab): {method: (MFU %, GB)}}), plus peak memory."""
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    xs = [row["vocab"] / 1000 for row in table]
    for method in METHODS:
        colour = COLOURS[method]
        left.plot(xs, [100 * row[method] for row in table], "-", color=colour,
                  label=f"{method} (simulated)")
        right.plot(xs, [row[f"{method} GB"] for row in table], "-", color=colour,
                   label=f"{method} (simulated)")
        if measured:
            points = [(v / 1000, figs[method]) for (s, v), figs in measured.items()
                      if s == seq_len and method in figs]
            left.plot([x for x, _ in points], [f[0] for _, f in points], "o", color=colour,
                      label=f"{method} (measured, artifact)")
            right.plot([x for x, _ in points], [f[1] for _, f in points], "o", color=colour)
    left.set(xlabel="vocabulary (thousands)", ylabel="MFU (%)",
             title=title or f"MFU at sequence {seq_len}: simulated (lines), measured (dots)")
    right.set(xlabel="vocabulary (thousands)", ylabel="peak memory, fullest rank (GiB)",
              title="peak memory: simulated (lines), measured (dots)")
    left.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_rows(rows, title: str = "ours (simulated) against the paper (published), per row"):
    """Two panels, 9.6 in wide (960 px at 100 dpi): the ratio rows as ours / published (log
    scale) with their tolerance band, and the rows compared by difference (bubble rates,
    gains, bounds) as ours − published with theirs; coloured by status, a legend for the
    colours. The misses are drawn too: they are the lesson."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    ratios = [r for r in rows if r.compare == "ratio"]
    diffs = [r for r in rows if r.compare == "difference"]
    colour = {"ok": "#2CA02C", "gap": "#D62728"}
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(9.6, 0.13 * (len(ratios) + len(diffs)) + 2.4),
        gridspec_kw={"height_ratios": [len(ratios) + 2, len(diffs) + 2]})
    for k, r in enumerate(ratios):
        top.plot([1 - r.rel_tol, 1 + r.rel_tol], [k, k], "-", color="#DDDDDD", lw=4)
        top.plot(r.ratio, k, "o", ms=4, color=colour.get(r.status, "black"))
    top.axvline(1.0, color="black", lw=0.8)
    top.set_yticks(range(len(ratios)), [f"{r.paper}: {r.figure}" for r in ratios], fontsize=6)
    top.set_xscale("log")
    lo, hi = top.get_xlim()
    ticks = [t / 10 for t in range(1, 40) if lo <= t / 10 <= hi]
    top.set_xticks(ticks, [f"{t:.1f}" for t in ticks], fontsize=8)    # plain ratios
    top.minorticks_off()
    top.invert_yaxis()                             # the table's order, top to bottom
    top.set_xlabel("ours / published", fontsize=8)
    top.set_title(title + "\nratio rows", fontsize=10)
    for k, r in enumerate(diffs):
        if r.kind == "bound":          # allowed: (lower, published + abs_tol]
            low = (r.lower if r.lower is not None else r.ours) - r.published
            band = [low, r.abs_tol]
        else:
            band = [-(r.abs_tol + r.rel_tol * abs(r.published)),
                    r.abs_tol + r.rel_tol * abs(r.published)]
        bottom.plot(band, [k, k], "-", color="#DDDDDD", lw=4)
        bottom.plot(r.ours - r.published, k, "o" if r.kind != "bound" else "s", ms=4,
                    color=colour.get(r.status, "black"))
    bottom.axvline(0.0, color="black", lw=0.8)
    bottom.set_yticks(range(len(diffs)), [f"{r.paper}: {r.figure} [{r.kind}]" for r in diffs],
                      fontsize=6)
    bottom.tick_params(axis="x", labelsize=8)
    bottom.invert_yaxis()
    bottom.set_xlabel("ours − published (bounds: ours − the stated maximum)", fontsize=8)
    bottom.set_title("rows compared by difference (rates near zero, gains, bounds)", fontsize=10)
    legend = [Line2D([], [], color="#DDDDDD", lw=4, label="tolerance"),
              Line2D([], [], marker="o", ls="", color="#2CA02C", label="within tolerance"),
              Line2D([], [], marker="o", ls="", color="#D62728",
                     label="outside, explained under the table"),
              Line2D([], [], marker="s", ls="", color="gray", label="a bound")]
    bottom.legend(handles=legend, fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def explorer(measured: dict | None = None, device: Device = A100_80):
    """Sliders: sequence, vocabulary, pipeline ranks; MFU of each method and GB per rank,
    simulated at the artifact's model on `device` (with the artifact's measured MFU where it
    ran)."""
    import ipywidgets as w
    controls = {
        "seq_len": ui.control(w.Dropdown, "sequence", options=[1024, 2048, 4096, 8192],
                              value=4096),
        "vocab": ui.control(w.SelectionSlider, "vocabulary",
                            options=[32_000, 64_000, 128_000, 256_000, 512_000], value=256_000),
        "ranks": ui.control(w.Dropdown, "pipeline ranks p", options=[4, 8, 16], value=8),
    }

    def draw(seq_len: int, vocab: int, ranks: int) -> None:
        import matplotlib.pyplot as plt
        at = methods_at(seq_len, vocab, ranks=ranks, device=device)
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
        names = list(at)
        left.bar(names, [100 * at[n][0] for n in names], color=[COLOURS[n] for n in names])
        figures = (measured or {}).get((seq_len, vocab)) if ranks == 8 else None
        tops = [100 * at[n][0] for n in names]
        where = "bars: simulated"
        if figures:
            left.plot([n for n in names if n in figures], [figures[n][0] for n in names
                                                           if n in figures], "k_", ms=30,
                      mew=2, label="measured (artifact)")
            tops += [figures[n][0] for n in names if n in figures]
            where += "; black ticks: measured (artifact)"
        # headroom above the tallest bar or tick, so the legend never sits on the data
        left.set_ylim(0, 1.3 * max(tops))
        if figures:
            left.legend(fontsize=8, loc="upper right", markerscale=0.4)
        left.set(ylabel="MFU (%)",
                 title=f"MFU, s={seq_len}, V={vocab // 1000}k, p={ranks}\n{where}")
        for n in names:
            right.plot(range(ranks), at[n][1], "o-", color=COLOURS[n], label=n)
        right.set(xlabel="rank", ylabel="peak memory (GiB)", xticks=list(range(ranks)),
                  title="peak memory per rank, simulated\n(byte model, at the same setting)")
        right.legend(fontsize=8, loc="upper center", ncol=4)
        right.set_ylim(0, 1.25 * max(max(at[n][1]) for n in names))
        fig.tight_layout()
        plt.show()

    return ui.slider_box(controls, draw, min_height="520px")


def plot_plan(plan: Plan, top: int = 12, title: str = ""):
    """The `top` fastest candidates of a plan: predicted step time (left) and the fullest
    rank's memory (right, the budget dashed), those that do not fit greyed. Simulated."""
    import matplotlib.pyplot as plt
    name, size = plan.source.unit
    shown = plan[:top]
    best = plan.best if plan.fitting else None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.32 * len(shown) + 1.4), sharey=True)
    ys = range(len(shown))
    colours = ["#2CA02C" if c is best else "#1F77B4" if c.fits else "#BBBBBB" for c in shown]
    left.barh(ys, [c.step_time for c in shown], color=colours)
    right.barh(ys, [c.peak_memory / size for c in shown], color=colours)
    right.axvline(plan.budget / size, color="black", ls="--", lw=1,
                  label=f"{plan.budget / size:.0f} {name} a device")
    left.set_yticks(list(ys), [shown_label(c) for c in shown], fontsize=7)
    left.invert_yaxis()                                  # fastest on top
    error = getattr(plan.source, "error", 0.0)
    if best is not None and error:     # what the model cannot tell from the best
        left.axvspan(best.step_time, best.step_time * (1 + error), color="#FFE9A8", zorder=0,
                     label=f"within {error:.0%} of the best: the model's own error")
        left.legend(fontsize=7, loc="lower right")
    left.set_xlim(0, 1.05 * max(c.step_time for c in shown))
    left.set(xlabel="predicted step time (s, from zero)", title="step time (simulated)")
    right.set(xlabel=f"peak memory, fullest rank ({name})",
              title="memory per rank (byte model, simulated)")
    right.legend(fontsize=8)
    fig.suptitle((title or "the fastest candidates, simulated")
                 + "\ngreen: the best that fits; blue: fits; grey: does not fit", fontsize=10)
    fig.tight_layout()
    return fig
