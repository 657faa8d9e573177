"""Sizes that cannot fit, refused before anything is allocated.

A model or a run too large for this machine used to fail late and badly: an empty MemoryError
after seconds of building, or the allocator's error from inside a worker after half a minute.
These checks read the byte model (memory.py, closed forms: no layer is built and nothing is
looped over per layer) and compare a *lower bound* of what is needed with the memory this
machine has available now, so they refuse only what certainly cannot fit, in microseconds,
with both figures in the message.

What a run needs at least: every process holds the token batch it draws (inputs and targets,
int64); each replica holds the model's parameters and their gradients (and AdamW's two moments
when it trains more than one step) and, at the moment the last stage ends the first
microbatch's forward, that microbatch's activations on every stage (fewer under recomputation,
but one block's full set while it is recomputed); the reference check builds the unsplit model
in this process and runs the whole batch through it.
"""
from __future__ import annotations

import os

from .memory import FLOAT, INDEX, activation_bytes, block_bytes, parameter_bytes
from .config import ModelConfig

MEMINFO = "/proc/meminfo"


def available_bytes() -> int | None:
    """Memory this machine can give now without swapping: MemAvailable in /proc/meminfo (Linux),
    else the free physical pages; None when neither can be read (then nothing is refused)."""
    try:
        with open(MEMINFO) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024          # the file counts kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def size(n: float) -> str:
    """Bytes for a message: '3.2 GiB', '512.0 MiB', '1.5 PiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(n) < 1024 or unit == "EiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"


def check_fits(what: str, parts: dict[str, int], remedy: str,
               available: int | None = None) -> None:
    """ValueError when the bytes of `parts` (named components of a lower bound) exceed the
    memory available (`available`, default: available_bytes()); `remedy` says what to shrink."""
    needed = sum(parts.values())
    free = available_bytes() if available is None else available
    if free is None or needed <= free:
        return
    shown = ", ".join(f"{name} {size(b)}" for name, b in parts.items() if b)
    raise ValueError(f"{what} needs at least {size(needed)} ({needed:,} bytes: {shown}), but "
                     f"this machine has {size(free)} ({free:,} bytes) available (MemAvailable "
                     f"in {MEMINFO}): {remedy}")


def check_build(cfg: ModelConfig, start: int, stop: int) -> None:
    """Refuse to build layers [start, stop) of `cfg` whose parameters alone cannot fit."""
    check_fits(f"building layers [{start}, {stop}) of this ModelConfig",
               {"parameters": parameter_bytes(cfg, start, stop)},
               "make the model smaller (its parameters grow with n_layers × d_model × d_ff "
               "and vocab_size × d_model)")


def run_needs(cfg: ModelConfig, *, processes: int, replicas: int, microbatches: int,
              batch_size: int, steps: int = 1, check: bool = True, recompute: bool = False,
              expert: int = 1) -> dict[str, int]:
    """A lower bound of a run's bytes on this machine, by component (see the module doc)."""
    n, rows = cfg.total_layers, max(1, batch_size // (microbatches * replicas))
    weights = parameter_bytes(cfg, 0, n, expert=expert)
    activations = activation_bytes(cfg, 0, n, rows, "full" if recompute else "none")
    if recompute and cfg.n_layers:       # one block's whole set while it is recomputed
        activations += block_bytes(cfg, rows)
    parts = {
        "token batches": processes * 2 * batch_size * cfg.seq_len * INDEX,
        "parameters and gradients": replicas * weights * (2 + 2 * (steps > 1)),
        "one microbatch's activations": replicas * activations,
    }
    if check:
        parts["the reference check's unsplit model"] = (
            2 * parameter_bytes(cfg, 0, n) + activation_bytes(cfg, 0, n, batch_size)
            + batch_size * cfg.vocab_size * cfg.seq_len * FLOAT)      # its logits' gradient
    return parts


def check_run(cfg: ModelConfig, **shape) -> None:
    """Refuse a run (`run_needs`'s arguments) that cannot fit in this machine's memory."""
    check_fits("this run", run_needs(cfg, **shape),
               "make the model, batch_size or seq_len smaller (attention keeps seq_len² "
               "floats a head and a sequence), or recompute activations")
