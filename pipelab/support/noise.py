"""Timing comparisons that know the machine is noisy: paired rounds, a spread, and a verdict.

A learner's laptop is a busy machine. Two timings taken once each can come out in either order;
what a notebook may claim is what *every* round agrees on. `paired_rounds` alternates the two
measurements (A, B, B, A, ...) so a burst of load hits both sides alike, takes the ratio B / A
within each round, and resolves "A faster than B" only when the ratios' whole interval clears a
margin. Otherwise the verdict says "not resolvable at this noise" and a notebook prints the
figures instead of asserting them.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence


def load_average() -> float:
    """The 1-minute load average (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def load_line() -> str:
    """What a live cell prints beside its timings: the load it ran at and the cores it had."""
    return f"load average {load_average():.2f} on {os.cpu_count()} cores"


def in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (a front end shows its output under the cell)."""
    if "ipykernel" in sys.modules:
        try:
            from IPython import get_ipython
            return getattr(get_ipython(), "kernel", None) is not None
        except ImportError:
            pass
    return False


def watched() -> bool:
    """Whether a person may be watching stderr: a terminal, or a Jupyter kernel (its front end
    shows stderr under the cell). Plain pytest and redirected scripts are not: no status lines."""
    if in_kernel():
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class StatusLine:
    """A transient one-line status on stderr, rewritten in place (carriage return) and erased by
    `close()`. It appears only after `delay` seconds (a quick run shows nothing), is rewritten at
    most every `every` seconds, and only where someone watches (`watched()`) unless `enabled`
    says otherwise. Use as a context manager, or call `update(text)` and `close()`."""

    def __init__(self, enabled: bool | None = None, delay: float = 0.5, every: float = 0.25,
                 stream=None):
        self.enabled = watched() if enabled is None else enabled
        self.delay, self.every = delay, every
        self.stream = stream
        self.began = time.perf_counter()
        self._shown_at: float | None = None
        self._width = 0
        # In a notebook the line is a display of its own, replaced in place and emptied at the
        # end: stderr would leave a (pink) box of blanks under the cell once it was erased.
        self._display = None

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.began

    def update(self, text: str, force: bool = False) -> bool:
        """Show `text` (unless too soon, or not enabled); True when it was written."""
        now = time.perf_counter()
        if not self.enabled or (not force and (now - self.began < self.delay or (
                self._shown_at is not None and now - self._shown_at < self.every))):
            return False
        pad = " " * max(self._width - len(text), 0)
        self._write("\r" + text + pad)
        self._shown_at, self._width = now, len(text)
        return True

    def close(self) -> None:
        """Erase the line (when one was shown)."""
        if self._shown_at is not None:
            self._write("\r" + " " * self._width + "\r")
            self._shown_at, self._width = None, 0

    def _write(self, text: str) -> None:
        if self.stream is None and in_kernel():
            from IPython.display import HTML, Pretty, display
            shown = Pretty(text.strip("\r")) if text.strip() else HTML("")
            if self._display is None:
                self._display = display(shown, display_id=True)
            else:
                self._display.update(shown)
            return
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(text)
        stream.flush()

    def __enter__(self) -> "StatusLine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# The progress lines open now, innermost last: a run inside a comparison reports to its line.
_OPEN: list["Progress"] = []


class Progress:
    """A live cell's progress line, shown from its first second and rewritten in place:
    "live_compare: 5/16 runs · 3.2 s · load 2.1 · 1f1b: actions 3/8 5/8".

    `label`: what is running; `total`: how many `unit`s (runs, rounds) it takes (None: no count).
    `advance()` counts one done; `detail(text)` says where the current one is. Opened inside
    another Progress (a run inside `live_compare` or `paired_rounds`), it writes no line of its
    own: its text is shown after the outer line's, so a cell has one line, counted from the
    outermost. Shown only where someone watches (`watched()`; `enabled` overrides) and erased
    at the end. Use as a context manager."""

    def __init__(self, label: str, total: int | None = None, unit: str = "runs",
                 enabled: bool | None = None, stream=None):
        self.label, self.total, self.unit = label, total, unit
        self.done = 0
        self._detail = self._inner = ""
        self._quiet = enabled is False
        self.outer: Progress | None = None
        self.line: StatusLine | None = None
        self._enabled, self._stream = enabled, stream
        self._began = time.perf_counter()

    @property
    def enabled(self) -> bool:
        if self._quiet:
            return False
        if self.outer is not None:
            return self.outer.enabled
        return self.line.enabled if self.line is not None else False

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._began

    def text(self, timed: bool = True) -> str:
        """The line: label, count, (elapsed and load,) where the current unit is."""
        parts = [self.label + (f": {self.done}/{self.total} {self.unit}"
                               if self.total is not None else "")]
        if timed:
            parts += [f"{self.elapsed:.1f} s", f"load {load_average():.1f}"]
        parts += [p for p in (self._detail, self._inner) if p]
        return " · ".join(parts)

    def update(self, force: bool = False) -> None:
        if not self.enabled:
            return
        if self.outer is not None:
            self.outer._nested(self.text(timed=False), force)
        else:
            self.line.update(self.text(), force=force)

    def detail(self, text: str, force: bool = False) -> None:
        """Say where the current unit is (a rank's actions, which side of a round runs)."""
        self._detail = text
        self.update(force)

    def advance(self, n: int = 1) -> None:
        self.done += n
        self.update(force=True)

    def _nested(self, text: str, force: bool) -> None:
        self._inner = text
        self.update(force)

    def open(self) -> "Progress":
        """Show the line (or join the outer one); `close()` ends it."""
        self.outer = _OPEN[-1] if _OPEN else None
        if self.outer is None:
            self.line = StatusLine(enabled=None if self._enabled is None else self._enabled,
                                   delay=0.0, every=0.25, stream=self._stream)
        self._began = time.perf_counter()
        _OPEN.append(self)
        self.update(force=True)            # from the first second, however short the run
        return self

    def close(self) -> None:
        if self in _OPEN:
            _OPEN.remove(self)
        if self.outer is not None:
            if not self._quiet:
                self.outer._nested("", False)
        elif self.line is not None:
            self.line.close()

    def __enter__(self) -> "Progress":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


def _interval(values: Sequence[float]) -> tuple[float, float]:
    """The range the rounds span: every round counts below 7 rounds; from 7 on, the extreme round
    on each side is dropped (one burst of load must not decide the verdict). Dropping them from 5
    rounds let 3 agreeing rounds decide, and at load 20+ on 2 cores that resolved the wrong way
    about one run in ten (chapter 11's race)."""
    ordered = sorted(values)
    if len(ordered) >= 7:
        ordered = ordered[1:-1]
    return ordered[0], ordered[-1]


@dataclass(frozen=True)
class Verdict:
    """The outcome of a paired comparison of two timed quantities (smaller is faster)."""
    label_a: str
    label_b: str
    a: tuple[float, ...]               # per-round values of A (seconds or any time unit)
    b: tuple[float, ...]
    margin: float                      # the ratio must clear 1 ± margin to count
    load: tuple[float, float] = field(default=(0.0, 0.0))   # 1-minute load before and after

    @property
    def ratios(self) -> tuple[float, ...]:
        """B / A in each round: above 1 means A was faster in that round."""
        return tuple(b / a for a, b in zip(self.a, self.b))

    @property
    def ratio(self) -> float:
        """The median of the per-round ratios B / A."""
        return statistics.median(self.ratios)

    @property
    def interval(self) -> tuple[float, float]:
        """Low and high end of the per-round ratios (every round below 7 rounds; from 7 on, the
        extreme round on each side dropped)."""
        return _interval(self.ratios)

    @property
    def faster(self) -> str | None:
        """The label of the side every counted round found faster, or None when unresolved."""
        low, high = self.interval
        if low > 1 + self.margin:
            return self.label_a
        if high < 1 / (1 + self.margin):
            return self.label_b
        return None

    @property
    def resolved(self) -> bool:
        return self.faster is not None

    def median(self, side: str) -> float:
        return statistics.median(self.a if side == self.label_a else self.b)

    def spread(self, side: str) -> float:
        """Half the range of one side's rounds."""
        values = self.a if side == self.label_a else self.b
        return (max(values) - min(values)) / 2

    def summary(self) -> str:
        low, high = self.interval
        sides = ", ".join(f"{s} {self.median(s):.4g} ± {self.spread(s):.2g}"
                          for s in (self.label_a, self.label_b))
        figures = (f"{self.label_b} / {self.label_a} = {self.ratio:.2f} "
                   f"(rounds {low:.2f}–{high:.2f}, n={len(self.a)}); {sides}")
        load = f"load {self.load[0]:.1f} → {self.load[1]:.1f}"
        if self.faster == self.label_a:
            head = f"{self.label_a} faster than {self.label_b}"
        elif self.faster == self.label_b:
            head = f"{self.label_b} faster than {self.label_a}"
        else:
            head = f"{self.label_a} vs {self.label_b}: not resolvable at this noise"
        return f"{head}: {figures}; {load}"

    def __str__(self) -> str:
        return self.summary()


def verdict(a: Sequence[float], b: Sequence[float], labels: tuple[str, str] = ("A", "B"),
            margin: float = 0.05, load: tuple[float, float] | None = None) -> Verdict:
    """A verdict from already-paired samples (round i of A beside round i of B)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"a and b need the same number of rounds, at least one "
                         f"(got {len(a)} and {len(b)})")
    if any(x <= 0 for x in (*a, *b)):
        raise ValueError("timings must be positive")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    here = load_average()
    return Verdict(labels[0], labels[1], tuple(a), tuple(b), margin,
                   load if load is not None else (here, here))


def paired_rounds(a: Callable[[], float], b: Callable[[], float], rounds: int = 5,
                  labels: tuple[str, str] = ("A", "B"), margin: float = 0.05,
                  progress: bool = True) -> Verdict:
    """Time A and B `rounds` times each, alternating which goes first, and judge B / A.

    `a` and `b` run one measurement each and return its time (smaller is faster). With
    `progress`, a line (`Progress`) says from the first second how many rounds are done, the
    time, the load and which side runs (where someone watches: a terminal or a notebook)."""
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    before = load_average()
    xs, ys = [], []
    with Progress(f"{labels[0]} vs {labels[1]}", total=rounds, unit="rounds",
                  enabled=None if progress else False) as line:
        for i in range(rounds):
            if i % 2 == 0:
                x = _side(line, labels[0], a)
                y = _side(line, labels[1], b)
            else:
                y = _side(line, labels[1], b)
                x = _side(line, labels[0], a)
            xs.append(x)
            ys.append(y)
            line.advance()
    return verdict(xs, ys, labels, margin, (before, load_average()))


def _side(line: Progress, label: str, measure: Callable[[], float]) -> float:
    """One side of a round, named on the progress line while it runs."""
    line.detail(label, force=True)
    return measure()
