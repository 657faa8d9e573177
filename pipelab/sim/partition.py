"""Stage splitting: cut the flat layer list (embedding, blocks…, head) into contiguous stages.

Four ways to choose the cuts: `"uniform"` (equal layer counts), `"params"` and `"cost"` (the
contiguous split whose most loaded stage is as light as possible, by parameters or by FLOPs /
measured time, found exactly by dynamic programming), or a hand-written layout string such as
`"E|t*3|t*3|L"`. A partition knows nothing about ranks: an interleaved schedule with `chunks`
stages per rank simply asks for `stages = ranks * chunks`.

A `pl.CustomModel` is split by the same search, on what can be known of a stack pipelab did not
write: its parameters ("params") and its layers' measured F + I + W ("cost",
model/custom_profile.py); it has no FLOP model and no E/t/L layout (its layout names the layer
ranges, "0-2|3-7").
"""
from __future__ import annotations

import math
import numbers
import operator
import re
import statistics
import time
from typing import Sequence

import numpy as np
import torch

from ..checks import MAX_LAYERS, at_most, positive_int
from ..model.custom import CustomModel
from ..model.custom_profile import profile_layers
from ..model.gpt import ModelConfig, build_layer, layer_costs, loss_fn
from ..support.drawers import draw
from ..support.threads import one_thread
from .costs import Costs

METHODS = ("uniform", "params", "cost")
_TOKEN = re.compile(r"(E|L|t)(?:\*(\d+))?")
_SEPARATORS = re.compile(r"[+\s,]*")           # "+", spaces and (as in Megatron) commas are cosmetic
_LAYOUT_CHARS = set("EtL|*+, \t\n0123456789")
MAX_SPLIT_WORK = 10**8      # steps of the exact split (~10-20 s of Python at this size)


class Partition:
    """Contiguous [start, stop) layer ranges, one per stage, with their costs."""

    def __init__(self, cfg: ModelConfig | CustomModel, bounds: Sequence[tuple[int, int]],
                 method: str, batch_size: int = 1, layer_times: Sequence[float] | None = None):
        self.cfg = cfg
        self.bounds = [_layer_range(b) for b in bounds]
        self.method = method
        self.batch_size = batch_size
        _check_bounds(cfg, self.bounds)
        if isinstance(cfg, ModelConfig):
            costs = layer_costs(cfg, batch_size)
            self.layer_params = [c["params"] for c in costs]
            self.layer_flops = [c["flops"] for c in costs]
        else:                                  # a custom model: no FLOP model of its layers
            self.layer_params, self.layer_flops = cfg.layer_parameter_counts(), None
        self.layer_times = list(layer_times) if layer_times is not None else None
        self.params = self._per_stage(self.layer_params)
        self.flops = self._per_stage(self.layer_flops) if self.layer_flops is not None else None
        self.times = self._per_stage(self.layer_times) if self.layer_times is not None else None

    @property
    def stages(self) -> int:
        return len(self.bounds)

    def layers_of(self, stage: int) -> range:
        return range(*self.bounds[stage])

    @property
    def layout(self) -> str:
        """Canonical layout string, e.g. "E+t|t*2|t|t+L"; `partition(cfg, method=layout)`
        rebuilds it. A custom model's names each stage's layers, first-last: "0-2|3-7"."""
        if not isinstance(self.cfg, ModelConfig):
            return "|".join(f"{a}-{b - 1}" if b - a > 1 else f"{a}" for a, b in self.bounds)
        return "|".join(_stage_layout(self.cfg, a, b) for a, b in self.bounds)

    @property
    def default_load(self) -> str:
        """What a load is counted in unless told: FLOPs for the toy GPT; for a custom model
        (no FLOP model) its measured times if any, else its parameters."""
        if self.flops is not None:
            return "flops"
        return "times" if self.times is not None else "params"

    def loads(self, by: str | None = None) -> list:
        """Per-stage load by "params", "flops" or "times" (default: `default_load`)."""
        by = self.default_load if by is None else by
        if by not in ("params", "flops", "times"):
            raise ValueError(f"load must be 'params', 'flops' or 'times', got {by!r}")
        values = getattr(self, by)
        if values is None and by == "flops":
            raise ValueError("this partition has no flops: a custom model has no FLOP model; "
                             "use 'times' (layer_times=, or method 'cost') or 'params'")
        if values is None:
            raise ValueError(f"this partition has no {by}: pass layer_times= to pl.partition")
        return values

    def max_load(self, by: str | None = None) -> float:
        return max(self.loads(by))

    def costs(self, by: str | None = None, *, per_unit: float = 1e6, unit: str = "MFLOP",
              backward_ratio: float = 2.0, comm: float = 0.0):
        """A `pl.Costs` with one forward per stage taken from its load (`by` / `per_unit`:
        MFLOP by default; for measured "times" give per_unit=1, unit="s"), and a full backward of `backward_ratio` × the forward, split evenly between
        I and W: what `pl.simulate` needs to time this split. A table per stage
        (`pl.Costs.per_stage`): each stage's own load, not a rank's worth to divide."""
        forward = [v / per_unit for v in self.loads(by)]
        half = [backward_ratio / 2 * f for f in forward]
        return Costs.per_stage(F=forward, I=half, W=list(half), comm=comm, unit=unit)

    def imbalance(self, by: str | None = None) -> float:
        """Most loaded stage over the mean stage: 1.0 is perfect balance.

        The pipeline runs at the pace of its slowest stage, so this is (roughly) how much longer
        a step takes than with a perfect split.
        """
        loads = self.loads(by)
        return max(loads) / (sum(loads) / len(loads))

    def _per_stage(self, per_layer: Sequence) -> list:
        return [sum(per_layer[a:b]) for a, b in self.bounds]

    def table(self) -> str:
        """One row per stage: its layers, parameters, FLOPs and (if measured) time."""
        head = f"{'stage':>5}  {'layers':<12} {'layout':<10} {'params':>10} {'MFLOP':>9}"
        layouts = self.layout.split("|")
        head += f" {'time ms':>8}" if self.times else ""
        rows = [f"partition {self.method!r}: {self.layout}", head]
        for s, (a, b) in enumerate(self.bounds):
            flops = f"{self.flops[s] / 1e6:>9.2f}" if self.flops is not None else f"{'-':>9}"
            row = (f"{s:>5}  {f'[{a}, {b})':<12} {layouts[s]:<10} "
                   f"{self.params[s]:>10,} {flops}")
            row += f" {self.times[s] * 1e3:>8.3f}" if self.times else ""
            rows.append(row)
        imb = f"imbalance (max/mean): params {self.imbalance('params'):.2f}"
        imb += f", flops {self.imbalance('flops'):.2f}" if self.flops is not None else ""
        imb += f", time {self.imbalance('times'):.2f}" if self.times else ""
        return "\n".join(rows + [imb])

    __str__ = table

    def __repr__(self) -> str:
        return f"Partition({self.layout!r}, method={self.method!r})"

    def plot(self, ax=None, title: str | None = None):
        """Balance bar chart: each stage's share of params, FLOPs and (if measured) time."""
        return draw("balance", self, ax=ax, title=title)


def partition(cfg: ModelConfig | CustomModel, stages: int | None = None, method: str = "uniform",
              *, batch_size: int = 1, layer_times: Sequence[float] | None = None) -> Partition:
    """Split `cfg`'s layers into `stages` contiguous stages by `method` (or a layout string).

    "cost" balances measured `layer_times` (seconds per layer, fwd+bwd) when given, else FLOPs.
    With every method, `layer_times` also gives each stage's measured load (`.times`,
    `loads("times")`), so that splits made by other rules can be compared on them.
    `batch_size` (sequences) scales the FLOP model. With a layout, `stages` may be omitted; if
    given it must match the layout.

    For a `pl.CustomModel`: "uniform", "params" (its parameter bytes) or "cost" (`layer_times`,
    else each layer's F + I + W measured on a microbatch of `batch_size` rows of its batch).
    """
    if isinstance(cfg, CustomModel):
        return _custom_partition(cfg, stages, method, batch_size, layer_times)
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"cfg must be a pl.ModelConfig or a pl.CustomModel (the model to "
                         f"split), got {type(cfg).__name__}: call pl.partition(cfg, stages, method)")
    n = at_most("the model's layers (n_layers + 2)", cfg.total_layers, MAX_LAYERS,
                "a partition lists every layer's parameters and FLOPs")
    positive_int("batch_size", batch_size)
    if layer_times is not None:
        layer_times = _check_layer_times(layer_times, n)
    if method not in METHODS:
        bounds = parse_layout(cfg, method)
        if stages is not None and stages != len(bounds):
            raise ValueError(f"layout {method!r} has {len(bounds)} stages but stages={stages}")
    else:
        if stages is None:
            raise ValueError(f"method {method!r} needs stages=")
        _check_stages(cfg, stages)
        if method == "uniform":
            bounds = uniform_bounds(n, stages)
        elif method == "cost" and layer_times is not None:
            bounds = balanced_bounds(list(layer_times), stages)
        else:
            key = "params" if method == "params" else "flops"
            bounds = balanced_bounds([c[key] for c in layer_costs(cfg, batch_size)], stages)
    if len(bounds) > 1 and cfg.tie_embeddings:
        raise ValueError("tie_embeddings with more than one stage is not supported: the embedding "
                         "and the head share a weight but would live on different stages")
    return Partition(cfg, bounds, method, batch_size, layer_times)


def _custom_partition(model: CustomModel, stages, method: str, batch_size: int,
                      layer_times) -> Partition:
    """`partition` of a custom model: the same balanced search, on parameters or times."""
    n = model.total_layers
    positive_int("batch_size", batch_size)
    if isinstance(method, str) and method not in METHODS and _RANGES.fullmatch(method.strip()):
        bounds = parse_ranges(method, n)
        if stages is not None and stages != len(bounds):
            raise ValueError(f"layout {method!r} has {len(bounds)} stages but stages={stages}")
        return Partition(model, bounds, "custom", batch_size,
                         _check_layer_times(layer_times, n) if layer_times is not None else None)
    if method not in METHODS:
        raise ValueError(f"method={method!r}: a custom model is split by 'uniform', 'params' or "
                         f"'cost', or by layer ranges such as '0-2|3-5' (a layout of E, t and L "
                         f"names the toy GPT's layers)")
    if stages is None:
        raise ValueError(f"method {method!r} needs stages=")
    positive_int("stages", stages)
    if stages > n:
        raise ValueError(f"stages={stages} but the model has only {n} layers (what its layers "
                         f"function returns): every stage needs one, so stages must be <= {n}")
    if layer_times is not None:
        layer_times = _check_layer_times(layer_times, n)
    elif method == "cost":
        layer_times = [p.total for p in profile_layers(model, batch_size)]
    if method == "uniform":
        bounds = uniform_bounds(n, stages)
    elif method == "params":
        bounds = balanced_bounds(model.layer_parameter_bytes(), stages)
    else:
        bounds = balanced_bounds(layer_times, stages)
    return Partition(model, bounds, method, batch_size, layer_times)


_RANGES = re.compile(r"\d+(-\d+)?(\s*\|\s*\d+(-\d+)?)*")


def parse_ranges(text: str, n: int) -> list[tuple[int, int]]:
    """A custom model's layout, each stage's first-last layers: "0-2|3-5" -> [(0, 3), (3, 6)]
    (a stage of one layer may be "3"); ValueError unless they cover layers 0..n-1 in order."""
    if not isinstance(text, str) or not _RANGES.fullmatch(text.strip()):
        raise ValueError(f"layout {text!r}: give each stage's first-last layers, e.g. '0-2|3-5'")
    bounds = []
    for part in text.split("|"):
        first, _sep, last = part.strip().partition("-")
        bounds.append((int(first), int(last or first) + 1))
    if any(b <= a for a, b in bounds) or [a for a, _b in bounds] != [0] + [
            b for _a, b in bounds[:-1]] or bounds[-1][1] != n:
        raise ValueError(f"layout {text!r}: the stages' first-last layers must cover layers "
                         f"0..{n - 1} in order, each exactly once, e.g. '0-{n // 2 - 1}|"
                         f"{n // 2}-{n - 1}'" if n > 1 else f"layout {text!r}: the model has "
                         f"one layer, '0'")
    return bounds


def partition_for_run(model, schedule, given, batch_size, data_parallel):
    """`partition` as cluster.run reads it: for a pl.CustomModel a method other than "uniform"
    ("params", "cost") or layer ranges ("0-2|3-5") become the pl.Partition that
    `pl.partition(model, stages, method, batch_size=rows per microbatch)` gives; anything else
    is returned as given (the run's checks judge it)."""
    from ..schedules.base import Schedule
    if not (isinstance(model, CustomModel) and isinstance(given, str)
            and given != "uniform" and isinstance(schedule, Schedule)):
        return given
    m = schedule.microbatches
    dp = data_parallel if isinstance(data_parallel, int) and data_parallel > 0 else 1
    rows = batch_size // (m * dp) if isinstance(batch_size, int) and batch_size >= m * dp else 2
    try:
        return partition(model, schedule.model_slices, given, batch_size=rows)
    except ValueError as err:
        raise ValueError(f"partition={given!r}: {err}") from None


def _check_layer_times(layer_times, n: int) -> list[float]:
    """One finite, non-negative number of seconds per layer, or a ValueError saying which is not."""
    if isinstance(layer_times, (str, bytes)) or not hasattr(layer_times, "__len__"):
        raise ValueError(f"layer_times must be a list of seconds, one per layer, got "
                         f"{type(layer_times).__name__}")
    if len(layer_times) != n:
        raise ValueError(f"layer_times has {len(layer_times)} entries but the model has {n} layers")
    for i, t in enumerate(layer_times):
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 <= t < math.inf:
            raise ValueError(f"layer_times must be finite numbers of seconds >= 0, one per "
                             f"layer; layer {i} has {t!r}")
    return [float(t) for t in layer_times]


def _check_stages(cfg: ModelConfig, stages: int) -> None:
    positive_int("stages", stages)
    if stages > cfg.total_layers:
        raise ValueError(
            f"stages={stages} but the model has only {cfg.total_layers} layers (embedding + "
            f"{cfg.n_layers} blocks + head): every stage needs at least one layer, so stages "
            f"must be <= {cfg.total_layers}")


def _layer_range(bound) -> tuple[int, int]:
    """(start, stop) as ints; a float or anything else is refused, never truncated."""
    try:
        start, stop = bound
        return operator.index(start), operator.index(stop)
    except (TypeError, ValueError):
        raise ValueError(f"each stage must be a (start, stop) pair of integer layer indices, "
                         f"got {bound!r}") from None


def _check_bounds(cfg: ModelConfig, bounds: list[tuple[int, int]]) -> None:
    """Stages must be non-empty, contiguous, in order, and cover every layer exactly once."""
    covered = [i for a, b in bounds for i in range(a, b)]
    if any(b <= a for a, b in bounds) or covered != list(range(cfg.total_layers)):
        raise ValueError(f"bounds {bounds} must be non-empty [start, stop) ranges covering layers "
                         f"0..{cfg.total_layers - 1} in order, each exactly once")


def uniform_bounds(n_layers: int, stages: int) -> list[tuple[int, int]]:
    """Equal layer counts; the first `n_layers % stages` stages get one layer more."""
    size, extra = divmod(n_layers, stages)
    bounds, start = [], 0
    for s in range(stages):
        stop = start + size + (s < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def balanced_bounds(weights: Sequence[float], stages: int) -> list[tuple[int, int]]:
    """The contiguous split into `stages` non-empty stages minimising the heaviest stage.

    Exact dynamic programming, O(stages · n²). Many splits often tie on the heaviest stage
    (it may be a single fat layer), so a second pass picks, among the optimal ones, the split
    with the smallest sum of squared loads: the others are then as even as they can be.
    """
    n = len(weights)
    if not 1 <= stages <= n:
        raise ValueError(f"need 1 <= stages <= {n} (one layer per stage at least), got {stages}")
    at_most("stages × layers²", stages * n * n, MAX_SPLIT_WORK,
            "the exact balanced split takes that many steps: use method='uniform' or a layout")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    edge = np.array(prefix)
    load = edge[None, :] - edge[:, None]           # load[j, i]: layers [j, i) as one stage
    earlier = np.tri(n + 1, k=-1, dtype=bool).T    # j < i: a stage holds a layer at least
    inf = float("inf")
    # best[k][i]: lightest possible heaviest stage when layers [0, i) form k stages (each
    # row over every i at once: the minimum over j of max(best[k − 1][j], load[j, i])).
    best = np.full((stages + 1, n + 1), inf)
    best[0, 0] = 0.0
    for k in range(1, stages + 1):
        best[k] = np.where(earlier, np.maximum(best[k - 1][:, None], load), inf).min(axis=0)
    limit = best[stages][n] * (1 + 1e-12) + 1e-12    # tolerance for float layer times

    # Second pass: minimum sum of squares subject to every stage <= the optimal max; among
    # equal sums the first cut j (argmin takes the first), as a scan of j upwards would.
    allowed = earlier & (load <= limit)
    square = np.full((stages + 1, n + 1), inf)
    cut = np.zeros((stages + 1, n + 1), int)
    square[0, 0] = 0.0
    for k in range(1, stages + 1):
        sums = np.where(allowed, square[k - 1][:, None] + load * load, inf)
        cut[k] = sums.argmin(axis=0)
        square[k] = sums[cut[k], np.arange(n + 1)]
    cut = cut.tolist()
    bounds, stop = [], n
    for k in range(stages, 0, -1):
        bounds.append((cut[k][stop], stop))
        stop = cut[k][stop]
    return bounds[::-1]


def parse_layout(cfg: ModelConfig, layout: str) -> list[tuple[int, int]]:
    """Bounds of a layout such as "E|t*3|t*3|L", "E+t t|t*2+L" or Megatron's "Et*3|t*3|tL".

    ValueError if it is not a layout or does not fit the model.
    """
    if not isinstance(layout, str) or not ("|" in layout or set(layout) <= _LAYOUT_CHARS):
        raise ValueError(f"unknown partition method {layout!r}: use one of {', '.join(METHODS)} "
                         f"or a layout such as 'E|t*3|t*3|L'")
    short = repr(layout) if len(layout) <= 60 else repr(layout[:57] + "...")
    if layout.count("|") >= cfg.total_layers:
        raise ValueError(f"layout {short} has {layout.count('|') + 1} stages but the model has "
                         f"only {cfg.total_layers} layers (every stage needs one)")
    kinds: list[list[str]] = []           # per stage, "E" / "t" / "L" for each layer in order
    blocks = 0
    for s, text in enumerate(layout.split("|")):
        stage: list[str] = []
        pos = _SEPARATORS.match(text).end()
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if not match:
                token = re.match(r"[^+\s,]+", text[pos:]).group()
                raise ValueError(f"layout {short}: unknown token {token!r} in stage {s} "
                                 f"(use E, L, t or t*N)")
            kind, digits = match.group(1), match.group(2) or "1"
            count = int(digits) if len(digits) <= 18 else 10**18
            if count < 1 or (kind != "t" and match.group(2)):
                raise ValueError(f"layout {short}: bad count in {match.group()!r} in stage {s} "
                                 f"(only t takes a count, and it must be >= 1)")
            blocks += count if kind == "t" else 0
            # Counted, not listed, once there are too many: "t*99999999999" must not fill memory.
            stage += [kind] * (count if blocks <= cfg.n_layers else 1)
            pos = _SEPARATORS.match(text, match.end()).end()
        if not stage:
            raise ValueError(f"layout {short}: stage {s} is empty (every stage needs a layer)")
        kinds.append(stage)
    flat = [k for stage in kinds for k in stage]
    if blocks != cfg.n_layers:
        raise ValueError(f"layout {short} has {blocks} blocks but the model has "
                         f"{cfg.n_layers} (n_layers={cfg.n_layers})")
    if flat.count("E") != 1 or flat[0] != "E":
        raise ValueError(f"layout {short}: E (the embedding, layer 0) must appear exactly once, first")
    if flat.count("L") != 1 or flat[-1] != "L":
        raise ValueError(f"layout {short}: L (the head and loss, the last layer) must appear "
                         f"exactly once, last")
    bounds, start = [], 0
    for stage in kinds:
        bounds.append((start, start + len(stage)))
        start += len(stage)
    return bounds


def _stage_layout(cfg: ModelConfig, start: int, stop: int) -> str:
    """"E+t*2" for layers [0, 3): the embedding, then runs of blocks as t*N, then L."""
    parts = []
    blocks = range(max(start, 1), min(stop, cfg.total_layers - 1))
    if start == 0:
        parts.append("E")
    if len(blocks) > 0:
        parts.append("t" if len(blocks) == 1 else f"t*{len(blocks)}")
    if stop == cfg.total_layers:
        parts.append("L")
    return "+".join(parts)


def measure_layer_times(cfg: ModelConfig, batch_size: int = 8, repeats: int = 5,
                        warmup: int = 5) -> list[float]:
    """Seconds of forward + backward per layer, single process: median thread CPU time of `repeats`.

    Each layer is timed warm and alone. The head includes the loss. Thread CPU time is steadier
    than wall-clock on a busy machine; torch runs on one thread meanwhile so that no work escapes
    into helper threads. `warmup` untimed runs come first: glibc raises its mmap threshold only
    after some large frees, and until then every big tensor costs fresh page faults (the head's
    time halves). Layers are not interleaved, because a layer's frees then make the next one
    fault again.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    gen = torch.Generator().manual_seed(cfg.seed)
    idx = torch.randint(cfg.vocab_size, (batch_size, cfg.seq_len), generator=gen)
    hidden = torch.randn(batch_size, cfg.seq_len, cfg.d_model, generator=gen)
    grad = torch.randn(batch_size, cfg.seq_len, cfg.d_model, generator=gen)
    layers = [build_layer(cfg, i) for i in range(cfg.total_layers)]
    last = cfg.total_layers - 1

    def step(i: int) -> None:
        out = layers[i](idx if i == 0 else hidden.clone().requires_grad_(True))
        if i == last:
            loss_fn(out, idx).backward()
        else:                                        # as in a pipeline: a gradient arrives
            out.backward(grad)

    with one_thread():
        times = []
        for i in range(len(layers)):
            for _ in range(warmup):
                step(i)
            samples = []
            for _ in range(repeats):
                t0 = time.thread_time()
                step(i)
                samples.append(time.thread_time() - t0)
            times.append(statistics.median(samples))
        return times
