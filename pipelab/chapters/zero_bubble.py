"""Notebook 05's helpers: the V schedules' building blocks, and which live round to draw.

Data first, drawing second: `building_blocks` returns the slots that the notebook asserts on and
`plot_building_blocks` draws exactly those slots.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from ..schedules.actions import F, I, W
from ..sim.costs import Costs
from ..sim.compare import simulate_named
from ..views.plots import CHUNK_HATCHES, kind_colour

V_SCHEDULES = ("zb-v", "v-half", "v-min")
PASS_ORDER = ("F", "I", "W")


@dataclass(frozen=True)
class Block:
    """One microbatch's passes on every rank of a V schedule, in chunk slots (a slot is one
    pass of one chunk at F = I = W: half a rank's forward), counted from the microbatch's first
    forward on rank 0. `slots[r][chunk][kind] = (start, end)`; chunk 0 is stage r (going down),
    chunk 1 stage 2p−1−r (coming up). `peaks[r]` is the simulated schedule's peak on rank r."""
    name: str
    ranks: int
    slots: tuple
    peaks: tuple

    def gap(self, rank: int, chunk: int) -> float:
        """Slots from the chunk's F to its I (start to start): how long the I keeps it waiting."""
        s = self.slots[rank][chunk]
        return s["I"][0] - s["F"][0]

    def gaps(self, rank: int) -> float:
        """The two chunks' F→I gaps together, on `rank`."""
        return self.gap(rank, 0) + self.gap(rank, 1)

    def lifespan(self, rank: int, chunk: int) -> float:
        """Slots from the chunk's F starting to its W ending (when its activations are freed)."""
        s = self.slots[rank][chunk]
        return s["W"][1] - s["F"][0]

    def lifespans(self, rank: int) -> float:
        return self.lifespan(rank, 0) + self.lifespan(rank, 1)


def building_blocks(ranks: int, names: Sequence[str] = V_SCHEDULES,
                    microbatches: int | None = None) -> dict[str, Block]:
    """Each V schedule's block: the passes of one microbatch in the middle of a long run
    (m = 6p by default, so the block sits in the steady state), simulated at F = I = W = 1."""
    m = microbatches or 6 * ranks
    if m < 3 * ranks:
        raise ValueError(f"microbatches must be at least 3*ranks for a steady-state block, got {m}")
    unit, mb = Costs(F=1.0, I=1.0, W=1.0), m // 2
    blocks = {}
    for name in names:
        tl = simulate_named(name, ranks, m, unit)
        found = {e.action: e for r in range(ranks) for e in tl.events_of(r)}
        slot = 2.0 / unit.F        # a chunk's pass lasts F/2: two slots a time unit
        t0 = found[F(0, mb)].start
        slots = []
        for r in range(ranks):
            chunks = []
            for stage in (r, 2 * ranks - 1 - r):
                chunks.append({kind: ((found[make(stage, mb)].start - t0) * slot,
                                      (found[make(stage, mb)].end - t0) * slot)
                               for kind, make in zip(PASS_ORDER, (F, I, W))})
            slots.append(tuple(chunks))
        peaks = tl.peak_activations()
        blocks[name] = Block(name, ranks, tuple(slots), tuple(peaks[r] for r in range(ranks)))
    return blocks


def plot_building_blocks(blocks: dict[str, Block], title: str | None = None):
    """One panel per schedule on one shared slot axis: for every rank the two chunks' lifespans
    as pale bars (chunk 0 above, chunk 1 below, hatched) and the F, I and W boxes on them."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle
    names = list(blocks)
    ranks = blocks[names[0]].ranks
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 0.6 + (0.42 * ranks + 0.5) * len(names)),
                             sharex=True, squeeze=False)
    right = max(s[kind][1] for b in blocks.values() for rank in b.slots for s in rank
                for kind in PASS_ORDER)
    for ax, name in zip(axes[:, 0], names):
        block = blocks[name]
        for r in range(ranks):
            for chunk in (0, 1):
                s = block.slots[r][chunk]
                y = r - 0.4 + 0.4 * chunk
                ax.add_patch(Rectangle((s["F"][0], y + 0.04), block.lifespan(r, chunk), 0.32,
                                       facecolor="#DDDDDD", edgecolor="none", zorder=1))
                for kind in PASS_ORDER:
                    a, b = s[kind]
                    ax.add_patch(Rectangle((a, y + 0.04), b - a, 0.32, facecolor=kind_colour(kind),
                                           edgecolor="white", linewidth=0.5, zorder=2,
                                           hatch=CHUNK_HATCHES[chunk] or None))
        ax.set_ylim(ranks - 0.5, -0.5)
        ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
        gaps = sorted({block.gaps(r) for r in range(ranks)})
        life = [block.lifespans(r) for r in range(ranks)]
        ax.set_title(f"{name}: F→I gaps {'/'.join(f'{g:g}' for g in gaps)} slots a rank, "
                     f"lifespans {min(life):g}–{max(life):g}, peak {max(block.peaks):g}",
                     fontsize=9, loc="left")
    axes[-1, 0].set_xlim(0, right + 1)
    axes[-1, 0].set_xlabel("chunk slots from the microbatch's first forward (one slot = one pass "
                           "of half a rank's layers)")
    handles = [Patch(color=kind_colour(k), label=k) for k in PASS_ORDER]
    handles += [Patch(facecolor="#DDDDDD", label="lifespan (F to W)"),
                Patch(facecolor="#999999", hatch=CHUNK_HATCHES[1], edgecolor="white",
                      label="chunk 1 (coming up)")]
    fig.legend(handles=handles, loc="upper right", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(title or f"one microbatch's block, p={ranks}, F=I=W — simulated", fontsize=10,
                 x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return axes[:, 0]


def median_round(base_runs: Sequence, new_runs: Sequence, view: str = "replay") -> int:
    """The round whose saving (base − new on `view`: "replay" or "timeline") is the median of
    the per-round savings (the lower middle one for an even count): drawing that round's pair
    draws the saving the gain check prints, where each side's own median may come from
    different rounds."""
    if len(base_runs) != len(new_runs) or not base_runs:
        raise ValueError(f"base_runs and new_runs must pair up round by round, got "
                         f"{len(base_runs)} and {len(new_runs)}")
    if view not in ("replay", "timeline"):
        raise ValueError(f"view must be 'replay' or 'timeline', got {view!r}")
    savings = [getattr(b, view).makespan - getattr(n, view).makespan
               for b, n in zip(base_runs, new_runs)]
    order = sorted(range(len(savings)), key=savings.__getitem__)
    return order[(len(order) - 1) // 2]


def median_saving(base_runs: Sequence, new_runs: Sequence, view: str = "replay") -> float:
    """statistics.median of the per-round savings (what `compare.gain_check` reports)."""
    return statistics.median(getattr(b, view).makespan - getattr(n, view).makespan
                             for b, n in zip(base_runs, new_runs))
