"""A schedule at the papers' scale: simulate a model shape, and read what the papers report.

    tl, prof = simulate_shape("vocab-2", shape, ranks=8, microbatches=128, device=dev)
    mfu(tl, prof, 128); peak_bytes(tl, prof) / GIB; bubble_rate(tl)

`simulate_shape` builds the per-stage costs (shape.py) for `ranks × chunks` stages and simulates
the named schedule on them. The readers are the papers' own measures: MFU (the model's FLOPs
over time × ranks × peak), the zero-bubble paper's bubble rate (longest per-rank span), and the
peak bytes of the fullest rank (static bytes plus live activations). `balanced_layers` spreads
blocks (fractionally) so every stage costs the same with the output layer on the last;
`interlaced` models the vocabulary paper's interlaced baseline. Used by pipelab/bench/papers.py
(the papers' table) and chapter 14.
"""
from __future__ import annotations

from ..schedules import schedule as make_schedule
from ..model.memory_rules import FREES, FREES_STASH, KEEPS
from ..schedules.kinds import byte_rules, comm_kinds
from .costs import Costs
from .device import Device
from .shape import VOCAB_PASSES, ModelShape, StageProfile, shape_profile
from .simulate import simulate

GIB = 2 ** 30     # Megatron's memory report divides by 1024³


def balanced_layers(shape: ModelShape, stages: int, device: Device | None = None,
                    microbatch: int = 1) -> list[float]:
    """Blocks per stage (fractional) that make every stage's F + I + W equal with the output
    layer on the last stage: what the zero-bubble authors' k·p − 2 layout aims at (their
    embedding and output layer each cost about a block; our embedding is a free lookup)."""
    probe = shape_profile(shape, microbatch, 2, device, layers_per_stage=[shape.layers, 0])
    t = probe.table
    head = t["F"][1] + t["I"][1] + t["W"][1]
    block = (t["F"][0] + t["I"][0] + t["W"][0]) / shape.layers
    share = (shape.layers + head / block) / stages
    last = max(0.0, share - head / block)
    rest = (shape.layers - last) / (stages - 1)
    return [rest] * (stages - 1) + [last]


def simulate_shape(name: str, shape: ModelShape, ranks: int, microbatches: int,
                   device: Device | None = None, chunks: int = 1, microbatch: int = 1,
                   layers_per_stage=None, recompute=None, memory_limit=None,
                   tensor_parallel: int = 1):
    """(timeline, profile) of schedule `name` simulated with `shape`'s costs on `device`."""
    chunks = 2 if name == "v-half-vocab" else chunks      # a V: two stages a rank, always
    stages = ranks * chunks
    vocab = VOCAB_PASSES.get(name)           # v-half-vocab runs Vocab-2's passes
    prof = shape_profile(shape, microbatch, stages, device, tensor_parallel, recompute, vocab,
                         layers_per_stage, ranks=ranks)
    costs = Costs.per_stage(**prof.table)
    options = {"chunks": chunks} if chunks > 1 and name != "v-half-vocab" else {}
    if name == "zb-auto":
        options = {"costs": costs, "memory_limit": memory_limit}
    sched = make_schedule(name, ranks=ranks, microbatches=microbatches, **options)
    return simulate(sched, costs), prof


def bubble_rate(timeline) -> float:
    """The zero-bubble paper's bubble rate (§5.3): (cost − busy) / cost, cost the longest
    per-rank span (first compute start to last compute end), busy that rank's compute."""
    beside, spans, busy = comm_kinds(), {}, {}
    for e in timeline.events:
        if e.action.parts[0].kind in beside:
            continue
        first, last = spans.get(e.rank, (e.start, e.end))
        spans[e.rank] = (min(first, e.start), max(last, e.end))
        busy[e.rank] = busy.get(e.rank, 0.0) + e.duration
    rank = max(spans, key=lambda r: spans[r][1] - spans[r][0])
    cost = spans[rank][1] - spans[rank][0]
    return (cost - busy[rank]) / cost


def per_rank_bytes(timeline, prof: StageProfile, held: float = 1.0) -> list[float]:
    """Each rank's peak bytes: its stages' parameters, gradients and optimizer state, plus its
    peak of live activations (× `held`), plus what a vocabulary pass S keeps for its T (one
    microbatch's). The activations are walked along the rank's events in bytes — a forward
    keeps its stage's, the pass that frees them (W, or a full B) releases them — so a rank
    holding two stages counts each stage's own bytes (the simulator's rank units would not)."""
    sched, rules, out = timeline.schedule, byte_rules(), []
    for rank in range(timeline.ranks):
        live = peak = 0.0
        for e in sorted((e for e in timeline.events if e.rank == rank), key=lambda e: e.start):
            for part in e.action.parts:
                rule = rules.get(part.kind)
                if rule == KEEPS:
                    live += prof.activation_bytes[part.stage]
                    peak = max(peak, live)
                elif rule in (FREES, FREES_STASH):
                    live -= prof.activation_bytes[part.stage]
        out.append(sum(prof.static_bytes[s] for s in sched.stages_of(rank)) + prof.shard_bytes
                   + held * peak)
    return out


def peak_bytes(timeline, prof: StageProfile, held: float = 1.0) -> float:
    """The fullest rank's peak bytes (`per_rank_bytes`)."""
    return max(per_rank_bytes(timeline, prof, held))


def interlaced(shape: ModelShape, ranks: int, microbatches: int, device: Device | None = None,
               recompute=None):
    """(timeline, profile) of the vocabulary paper's interlaced baseline, modelled: the output
    layer split over every rank as Vocab-1 splits it, but run synchronously inside 1F1B — each
    rank's F carries its shard's S and the barrier C0, its backward its T and the barrier C1,
    none of it hidden. (Its memory, 1.5 times 1F1B's activations, is the paper's figure:
    `peak_bytes(..., held=1.5)`.)"""
    prof = shape_profile(shape, 1, ranks, device, recompute=recompute,
                         vocab_schedule="vocab-1")
    table, kinds = dict(prof.table), prof.table["kinds"]
    table["F"] = [f + kinds["S"] + kinds["Cs"] + kinds["Vf"] for f in table["F"]]
    table["I"] = [i + kinds["T"] + kinds["Ct"] + kinds["Vb"] for i in table["I"]]
    table["kinds"] = {}
    costs = Costs.per_stage(**table)
    return simulate(make_schedule("1f1b", ranks=ranks, microbatches=microbatches), costs), prof


def mfu(timeline, prof: StageProfile, microbatches: int) -> float:
    """Model FLOPs utilisation: the model's FLOPs over the step's time × devices (pipeline
    ranks × tensor shards) × peak."""
    devices = timeline.ranks * prof.tensor_parallel
    return microbatches * prof.flops_per_microbatch / (
        timeline.makespan * devices * prof.device.peak_flops)
