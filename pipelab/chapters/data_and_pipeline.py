"""A ring all-reduce played step by step on real numbers: the picture of chapter 09a.

Each of n nodes holds a buffer cut into n chunks. The reduce-scatter's n − 1 steps each send
one chunk to the right-hand neighbour, which adds it to its own copy; after them node i holds
the full sum of chunk (i + 1) mod n. The all-gather's n − 1 steps pass the finished chunks on
around the ring, copying instead of adding. 2(n − 1) steps in all, each moving 1/n of the
buffer per node: the α–β form's 2(n − 1)·α + 2(n − 1)/n · b/β.
"""
from __future__ import annotations

import numpy as np


def ring_allreduce(buffers: np.ndarray) -> list[dict]:
    """Play a ring all-reduce over `buffers` (n nodes × n chunks, one number a chunk). Returns
    one record per step: phase, the (sender, receiver, chunk) sends, the nodes' buffers after
    the step, and which chunks each node holds complete."""
    state = np.array(buffers, dtype=float)
    n = state.shape[0]
    if state.shape != (n, n) or n < 2:
        raise ValueError(f"buffers must be n × n with n >= 2 (a chunk per node), got {state.shape}")
    count = np.ones((n, n), dtype=int)   # count[i, c]: how many nodes' shares chunk c holds on i
    steps = []
    for phase, adds in (("reduce-scatter", True), ("all-gather", False)):
        for k in range(n - 1):
            # node i sends chunk (i − k) mod n in the reduce-scatter, (i + 1 − k) mod n after
            shift = 0 if adds else 1
            sends = [(i, (i + 1) % n, (i - k + shift) % n) for i in range(n)]
            before, held = state.copy(), count.copy()
            for src, dst, c in sends:
                if adds:
                    state[dst, c] += before[src, c]
                    count[dst, c] += held[src, c]
                else:
                    state[dst, c] = before[src, c]
                    count[dst, c] = held[src, c]
            steps.append(dict(phase=phase, sends=sends, state=state.copy(),
                              complete=count == n))
    return steps


def draw_ring(buffers: np.ndarray, steps: list[dict]):
    """One row per step, one column per node: each node's n chunks, the complete ones dark,
    the chunk it receives in that step outlined, its sender named."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    n = len(buffers)
    rows = [dict(phase="start", sends=[], state=np.array(buffers, dtype=float),
                 complete=np.zeros((n, n), bool))] + steps
    fig, ax = plt.subplots(figsize=(9.6, 0.9 + 0.42 * len(rows)))
    width = 0.9 / n
    for y, row in enumerate(rows):
        got = {(dst, c): src for src, dst, c in row["sends"]}
        for node in range(n):
            for c in range(n):
                x = node + c * width
                done = row["complete"][node, c]
                ax.add_patch(Rectangle((x, y - 0.35), width * 0.95, 0.7,
                                       facecolor="#2e7d32" if done else "#c8e6c9",
                                       edgecolor="black" if (node, c) in got else "white",
                                       linewidth=1.4 if (node, c) in got else 0.5))
                ax.text(x + width * 0.47, y, f"{row['state'][node, c]:g}", ha="center",
                        va="center", fontsize=8, color="white" if done else "black")
        label = row["phase"] if row["phase"] == "start" else \
            f"{row['phase']} {1 + (y - 1) % (n - 1)}"
        ax.text(-0.08, y, label, ha="right", va="center", fontsize=8)
    ax.set_xlim(-1.6, n)
    ax.set_ylim(len(rows) - 0.5, -0.9)
    ax.set_xticks([k + 0.45 for k in range(n)], [f"node {k}" for k in range(n)], fontsize=9)
    ax.xaxis.tick_top()
    ax.set_yticks([])
    for side in ("left", "right", "bottom", "top"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"Ring all-reduce on {n} nodes, a chunk per node (played on numbers, not measured):"
                 f" {len(steps)} steps; outlined = received from the left neighbour this step,"
                 " dark = complete sum", fontsize=9, wrap=True)
    fig.tight_layout()
    return fig
