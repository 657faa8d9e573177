"""Stage splitting: uniform cuts, exact DP balance, layout strings and their errors, plots."""
from __future__ import annotations

import itertools
import pickle
import random

import matplotlib
import pytest

matplotlib.use("Agg")

import pipelab as pl
from pipelab.sim.partition import balanced_bounds, parse_layout, uniform_bounds


def cfg(n_layers: int = 4, **kw) -> pl.ModelConfig:
    return pl.ModelConfig(n_layers=n_layers, **kw)


def brute_force_max(weights: list[float], stages: int) -> float:
    """Lightest heaviest stage over every contiguous split (all choices of stages-1 cut points)."""
    n = len(weights)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = (0, *cuts, n)
        best = min(best, max(sum(weights[a:b]) for a, b in zip(edges, edges[1:])))
    return best


# --- uniform -------------------------------------------------------------------------------

@pytest.mark.parametrize("n_layers, stages, sizes", [
    (4, 1, [6]), (4, 2, [3, 3]), (4, 3, [2, 2, 2]), (4, 4, [2, 2, 1, 1]), (4, 6, [1] * 6),
    (8, 4, [3, 3, 2, 2]), (1, 3, [1, 1, 1]),
])
def test_uniform_sizes(n_layers: int, stages: int, sizes: list[int]) -> None:
    parts = pl.partition(cfg(n_layers), stages=stages, method="uniform")
    assert parts.stages == stages
    assert [len(parts.layers_of(s)) for s in range(stages)] == sizes
    assert parts.bounds[0][0] == 0 and parts.bounds[-1][1] == n_layers + 2
    assert all(a[1] == b[0] for a, b in zip(parts.bounds, parts.bounds[1:]))


def test_uniform_layout_and_table() -> None:
    parts = pl.partition(cfg(4), 4, "uniform")
    assert parts.bounds == [(0, 2), (2, 4), (4, 5), (5, 6)]
    assert parts.layout == "E+t|t*2|t|L"
    assert parts.layers_of(1) == range(2, 4)
    text = str(parts)
    assert "E+t" in text and "stage" in text and "imbalance" in text
    assert parts.times is None and "time" not in text.splitlines()[1]


def test_per_stage_sums_match_the_model() -> None:
    c = cfg(6, vocab_size=500)
    costs = pl.layer_costs(c, batch_size=4)
    for method in ("uniform", "params", "cost"):
        parts = pl.partition(c, 3, method, batch_size=4)
        assert sum(parts.params) == sum(r["params"] for r in costs) == sum(
            p.numel() for p in pl.ToyGPT(c).parameters())
        assert sum(parts.flops) == sum(r["flops"] for r in costs)
        for s, (a, b) in enumerate(parts.bounds):
            assert parts.params[s] == sum(r["params"] for r in costs[a:b])


# --- dynamic programming ---------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(100))
def test_balanced_bounds_is_optimal_against_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    # a layer may weigh nothing (a shape's embedding lookup): still one layer a stage at least
    weights = [rng.choice([rng.randint(1, 10), rng.random() * 50, 0.0]) for _ in range(n)]
    stages = rng.randint(1, n)
    bounds = balanced_bounds(weights, stages)
    assert len(bounds) == stages and bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(b > a for a, b in bounds) and all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
    loads = [sum(weights[a:b]) for a, b in bounds]
    top = brute_force_max(weights, stages)
    assert max(loads) == pytest.approx(top, rel=1e-12)
    # the tie-break: the least sum of squares among the splits that reach that max
    least = min(sum(x * x for x in split) for split in _splits(weights, stages)
                if max(split) <= top * (1 + 1e-9) + 1e-12)
    assert sum(x * x for x in loads) == pytest.approx(least, rel=1e-9, abs=1e-12)


def _splits(weights: list[float], stages: int):
    """Every contiguous split's stage loads."""
    n = len(weights)
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = (0, *cuts, n)
        yield [sum(weights[a:b]) for a, b in zip(edges, edges[1:])]


def test_min_max_is_not_min_sum_of_squares() -> None:
    # The most even split by sum of squares, [6, 3, 5, 9], has a heavier stage than [6, 8, 7, 2]:
    # balancing the max is a different objective, and the pipeline pays for the max.
    assert balanced_bounds([6, 3, 5, 7, 2], 4) == [(0, 1), (1, 3), (3, 4), (4, 5)]


def test_balanced_bounds_breaks_ties_evenly() -> None:
    # The fat last layer fixes the max at 10 wherever the other cuts go; the tie-break should
    # still spread the light layers evenly instead of leaving one stage with all of them.
    assert balanced_bounds([1, 1, 1, 1, 10], 3) == [(0, 2), (2, 4), (4, 5)]


def test_params_and_cost_balance_the_right_column_optimally() -> None:
    c = cfg(8, vocab_size=2048)        # a wide vocabulary makes embedding and head unlike blocks
    costs = pl.layer_costs(c, batch_size=2)
    for stages in range(1, c.total_layers + 1):
        for method, column in (("params", "params"), ("cost", "flops")):
            parts = pl.partition(c, stages, method, batch_size=2)
            best = brute_force_max([row[column] for row in costs], stages)
            assert parts.max_load(column) == best, (method, stages)


def test_cost_uses_layer_times_when_given() -> None:
    c = cfg(4)
    times = [0.1, 1.0, 1.0, 1.0, 1.0, 5.0]        # a slow head must get a stage to itself
    assert pl.partition(c, 2, "cost").bounds != [(0, 5), (5, 6)]     # FLOPs say otherwise
    parts = pl.partition(c, 2, "cost", layer_times=times)
    assert parts.bounds == [(0, 5), (5, 6)]
    assert parts.times == pytest.approx([4.1, 5.0])
    assert parts.imbalance("times") == pytest.approx(5.0 / 4.55)
    with pytest.raises(ValueError, match="layer_times has 3 entries"):
        pl.partition(c, 2, "cost", layer_times=[1, 2, 3])


def test_measure_layer_times() -> None:
    c = cfg(2, d_model=32, seq_len=16)
    times = pl.measure_layer_times(c, batch_size=2, repeats=2)
    assert len(times) == c.total_layers and all(t > 0 for t in times)
    parts = pl.partition(c, 2, "cost", layer_times=times)
    assert max(parts.times) == pytest.approx(brute_force_max(times, 2), rel=1e-12)


# --- layouts ---------------------------------------------------------------------------------

@pytest.mark.parametrize("layout, bounds", [
    ("E|t*3|t*3|L", [(0, 1), (1, 4), (4, 7), (7, 8)]),
    ("E+t|t*2|t*2|t+L", [(0, 2), (2, 4), (4, 6), (6, 8)]),
    ("E t t | t t t t+L", [(0, 3), (3, 8)]),
    ("E t*6 L", [(0, 8)]),
    ("Et*3|t*2|tL", [(0, 4), (4, 6), (6, 8)]),          # Megatron-Core's compact spelling
    ("E, tt | t*2, t*2 + L", [(0, 3), (3, 8)]),
])
def test_layouts_parse(layout: str, bounds: list[tuple[int, int]]) -> None:
    parts = pl.partition(cfg(6), method=layout)
    assert parts.bounds == bounds
    assert parse_layout(cfg(6), parts.layout) == bounds      # the canonical form round-trips


def test_layout_with_matching_stages() -> None:
    assert pl.partition(cfg(6), stages=4, method="E|t*3|t*3|L").stages == 4
    with pytest.raises(ValueError, match="4 stages but stages=3"):
        pl.partition(cfg(6), stages=3, method="E|t*3|t*3|L")


@pytest.mark.parametrize("layout, message", [
    ("E|t*3|L", r"layout 'E\|t\*3\|L' has 3 blocks but the model has 4 \(n_layers=4\)"),
    ("E|t*5|L", "has 5 blocks but the model has 4"),
    ("E|t*4", "L .* exactly once, last"),
    ("t*4|L", "E .* exactly once, first"),
    ("t|E|t*3|L", "E .* first"),
    ("E|t*2|L|t*2", "L .* last"),
    ("E|E|t*4|L", "E .* exactly once"),
    ("E||t*4|L", "stage 1 is empty"),
    ("E|t*4|x|L", "unknown token 'x' in stage 2"),
    ("E|t*0|t*4|L", "bad count"),
    ("E*2|t*4|L", "bad count"),
    ("E|t*4|t*|L", r"unknown token '\*' in stage 2"),
    ("balanced", "unknown partition method 'balanced'"),
    ("cost2", "unknown partition method 'cost2'"),
])
def test_bad_layouts(layout: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pl.partition(cfg(4), method=layout)


# --- errors ----------------------------------------------------------------------------------

def test_more_stages_than_layers() -> None:
    with pytest.raises(ValueError, match=r"stages=7 .* only 6 layers.*stages must be <= 6"):
        pl.partition(cfg(4), stages=7, method="uniform")
    for method in ("params", "cost"):
        with pytest.raises(ValueError, match="stages=7"):
            pl.partition(cfg(4), stages=7, method=method)


@pytest.mark.parametrize("stages", [0, -1, 2.0])
def test_bad_stage_counts(stages) -> None:
    with pytest.raises(ValueError, match="stages must be a positive integer"):
        pl.partition(cfg(4), stages=stages)


def test_named_method_needs_stages() -> None:
    with pytest.raises(ValueError, match="needs stages"):
        pl.partition(cfg(4), method="params")


def test_tied_embeddings_need_one_stage() -> None:
    tied = cfg(4, tie_embeddings=True)
    assert pl.partition(tied, 1).bounds == [(0, 6)]
    with pytest.raises(ValueError, match="tie_embeddings"):
        pl.partition(tied, 2)


def test_partition_pickles() -> None:
    # The runtime ships partitions to spawned workers.
    parts = pl.partition(cfg(4), 3, "params")
    again = pickle.loads(pickle.dumps(parts))
    assert again.bounds == parts.bounds and again.layout == parts.layout and again.cfg == parts.cfg


@pytest.mark.parametrize("bounds", [[], [(0, 3)], [(0, 3), (2, 6)], [(0, 3), (3, 3), (3, 6)], [(0, 7)]])
def test_partition_rejects_bad_bounds(bounds) -> None:
    with pytest.raises(ValueError, match="must be non-empty"):
        pl.Partition(cfg(4), bounds, "custom")


def test_uniform_bounds_direct() -> None:
    assert uniform_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]


# --- plots -----------------------------------------------------------------------------------

def test_plots_run_and_are_labelled() -> None:
    import matplotlib.pyplot as plt
    from pipelab.views.plots import plot_layer_costs
    c = cfg(4)
    parts = pl.partition(c, 3, "cost", layer_times=[0.1, 1, 1, 1, 1, 2])
    ax = parts.plot()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("measured, one process" in label for label in labels)
    assert any("perfect balance" in label for label in labels)
    assert len(ax.patches) == 3 * parts.stages            # params, FLOPs, time per stage
    assert parts.layout in ax.get_title()
    axes = plot_layer_costs(c, batch_size=2, layer_times=[0.1, 1, 1, 1, 1, 2])
    assert len(axes) == 3 and "measured" in axes[2].get_title()
    plt.close("all")


def test_balance_explorer_redraws(capsys) -> None:
    import matplotlib.pyplot as plt
    from pipelab.views.explorer import balance_explorer
    box = balance_explorer(cfg(4))
    slider, dropdown = box.children[:2]       # one control per row, then the output
    assert (slider.min, slider.max) == (1, 6) and tuple(dropdown.options) == ("uniform", "params", "cost")
    capsys.readouterr()
    dropdown.value = "uniform"
    slider.value = 6                      # one layer per stage
    assert "partition 'uniform': E|t|t|t|t|L" in capsys.readouterr().out
    plt.close("all")
