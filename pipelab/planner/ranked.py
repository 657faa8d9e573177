"""`pl.Plan`: the candidates ranked by predicted step time, fastest first (plan.py searches).

The pruned search hands over every candidate with its memory but simulates only those that
could be the best; each other one's step time is simulated when something reads it
(`Candidate.step_time`). The plan keeps its contract all the same: read in full (iteration,
indexing, `fitting`) it is in rank order with every step time simulated, exactly the
exhaustive search's; what reads a part of it (`best`, `table`, `explain`, `frontier`,
`nothing_fits`) simulates only the candidates that could change that part: those whose lower
bound (bound.py) is not above the times it shows. Ties rank as the search listed them, as a
stable sort of the exhaustive list does.
"""
from __future__ import annotations

from bisect import insort
from collections.abc import Callable

from .candidate import Candidate
from ..sim.simulate import simulate
from ..techniques import with_data_parallel
from ..techniques.recompute import with_recompute


class Plan(list):
    """Candidates ranked by predicted step time (fastest first), fitting or not."""

    def __init__(self, candidates, source, devices: int, budget: float, batch_size: int,
                 headroom: float = 0.0):
        candidates = list(candidates)
        self._place = {id(c): i for i, c in enumerate(candidates)}   # the search's order
        self._known = sorted((c for c in candidates if c.predicted), key=self._rank)
        self._pending = sorted((c for c in candidates if not c.predicted),
                               key=lambda c: (c.bound, self._place[id(c)]))
        super().__init__(self._known + self._pending)
        self.source = source
        self.calibration = getattr(source, "calibration", None)     # a config's plan
        self.cfg = getattr(source, "cfg", None)
        self.shape = getattr(source, "shape", None)                  # a shape's plan
        self.device = getattr(source, "device", None)
        self.devices, self.budget, self.batch_size = devices, budget, batch_size
        self.headroom = headroom        # the share of each device's memory kept free

    def _rank(self, c: Candidate) -> tuple:
        return c.step_time, c.peak_memory, self._place[id(c)]

    def _settle(self, upto: int | None = None,
                among: Callable[[Candidate], bool] | None = None) -> list[Candidate]:
        """The candidates `among` accepts (all: None) in rank order, the first `upto` of them
        exact (all: None): the pending ones that could be among those first simulated, by
        increasing bound, until the next bound is above the `upto`-th time."""
        ok = among or (lambda c: True)
        self._absorb()
        ranked = [c for c in self._known if ok(c)]
        for c in self._pending:
            if ok(c) and (upto is None or len(ranked) < upto
                          or c.bound <= ranked[upto - 1].step_time):
                insort(ranked, c, key=self._rank)          # reading step_time simulated it
        self._absorb()
        return ranked

    def _absorb(self) -> None:
        """Move the candidates simulated since (by whoever read them) into the ranked part."""
        done = [c for c in self._pending if c.predicted]
        if done:
            self._known = sorted(self._known + done, key=self._rank)
            self._pending = [c for c in self._pending if not c.predicted]
            list.__setitem__(self, slice(None), self._known + self._pending)

    # --- reading the whole list: every step time simulated -----------------------------------
    def __iter__(self):
        self._settle()
        return super().__iter__()

    def __reversed__(self):
        self._settle()
        return super().__reversed__()

    def __getitem__(self, index):
        if isinstance(index, int) and index >= 0:
            self._settle(index + 1)
        elif isinstance(index, slice) and (index.start or 0) >= 0 and index.step in (None, 1) \
                and index.stop is not None and index.stop >= 0:
            self._settle(index.stop)
        else:
            self._settle()
        return super().__getitem__(index)

    def index(self, *args):
        self._settle()
        return super().index(*args)

    def _all(self) -> list[Candidate]:
        """Every candidate, in whatever order, without simulating any (their memory is known)."""
        return list(super().__iter__())

    # --- the contract ------------------------------------------------------------------------
    def timeline(self, candidate: Candidate):
        """The simulated step the prediction read (with its all-reduces)."""
        sched = runnable(candidate, self.source)
        return simulate(sched, self.source.model(candidate, sched)[0])

    @property
    def fitting(self) -> list[Candidate]:
        return self._settle(among=_fits)

    @property
    def best(self) -> Candidate:
        """The fastest candidate that fits; ValueError saying what would be needed if none."""
        first = self._settle(1, _fits)
        if not first:
            raise ValueError(self.nothing_fits())
        return first[0]

    def _size(self, nbytes: float) -> str:
        name, size = self.source.unit
        return f"{nbytes / size:.1f} {name}"

    def nothing_fits(self) -> str:
        low = min(c.peak_memory for c in self._all())
        smallest = self._settle(1, lambda c: c.peak_memory == low)[0]
        return (f"nothing fits in memory_per_device={self._size(self.budget)} on "
                f"{self.devices} device(s): the smallest predicted peak is "
                f"{self._size(smallest.peak_memory)} ({smallest.label()}); give each device "
                f"at least that much, or more devices")

    def frontier(self) -> list[Candidate]:
        """The Pareto frontier of (step time, peak memory): no other candidate is at least as
        fast and as small and better in one. By increasing memory. (A pending candidate that a
        simulated one already beats — smaller, and no slower than its bound — is left so.)"""
        self._absorb()
        # By increasing memory: `low` is the least time of the smaller candidates; a pending
        # one no faster than its bound says is beaten if a smaller one is at least as fast, or
        # one as small is faster. Simulating as the sweep goes lowers `low` for the next ones.
        low, group = float("inf"), []
        for c in sorted(self._all(), key=lambda c: (c.peak_memory, c.predicted is False,
                                                     c.bound)) + [None]:
            if group and (c is None or c.peak_memory != group[0].peak_memory):
                low = min([low] + [d.step_time for d in group if d.predicted])
                group = []
            if c is None:
                break
            if not c.predicted:
                same = min((d.step_time for d in group if d.predicted), default=float("inf"))
                if low > c.bound and same >= c.bound:
                    c.step_time                  # it could be on the frontier: simulate
            group.append(c)
        self._absorb()
        out: list[Candidate] = []
        for c in sorted(self._known, key=lambda c: (c.peak_memory, c.step_time,
                                                     self._place[id(c)])):
            if not out or c.step_time < out[-1].step_time:
                out.append(c)
        return out

    def explain(self) -> str:
        """One sentence on the choice: what it is, and what memory ruled out, if anything."""
        fit = sum(c.fits for c in self._all())
        if not fit:
            return self.nothing_fits()
        best, fastest = self.best, self[0]
        name, size = self.source.unit
        kept = (f", {self.headroom:.0%} of each device kept free" if self.headroom else "")
        head = (f"{best.label()} is predicted fastest of the {fit} of {len(self)} "
                f"candidates that fit ({best.step_time * 1e3:.2f} ms per step, peak "
                f"{best.peak_memory / size:.1f} of {self.budget / size:.1f} {name} per "
                f"device{kept})")
        if fastest is best:
            text = head + "; memory does not bind: it is the fastest of all."
        else:
            text = head + (f"; the faster {fastest.label()} ({fastest.step_time * 1e3:.2f} ms) "
                           f"does not fit: {fastest.reason}.")
        assumes = getattr(self.source, "assumes", "")
        return text + (f" Assumed: {assumes}." if assumes else "")

    def shortlist(self, within: float | None = None) -> list[Candidate]:
        """The fitting candidates whose predicted step is within `within` (default: the
        source's own error, `source.error`; 0 where it states none) of the best's: the ones
        the model cannot tell apart."""
        within = getattr(self.source, "error", 0.0) if within is None else within
        best = self.best.step_time
        return [c for c in self.fitting if c.step_time <= best * (1 + within)]

    def table(self, rows: int = 12) -> str:
        """The first `rows` candidates; p = 1 rows named for what they are (no pipeline: data
        and tensor parallelism, m gradient-accumulation steps); under it, for a source that
        states its error, how many fitting candidates it cannot tell from the best."""
        name, size = self.source.unit
        shown = [(c, shown_label(c)) for c in self[:rows]]
        width = max([52] + [len(text) for _, text in shown])
        lines = [f"{'rank':>4}  {'candidate':<{width}} {'ms/step':>8} {'peak ' + name:>9}  fits",
                 *(f"{i:>4}  {text:<{width}} {c.step_time * 1e3:8.2f} "
                   f"{c.peak_memory / size:9.2f}  {'yes' if c.fits else 'no'}"
                   for i, (c, text) in enumerate(shown))]
        error = getattr(self.source, "error", None)
        if error and any(c.fits for c in self._all()):
            close = self.shortlist()
            if len(close) > 1:
                lines.append(f"{len(close)} fitting candidates are within {error:.0%} of the "
                             f"best's step, the cost model's own error: a shortlist to measure, "
                             f"not an answer.")
        return "\n".join(lines)

    @property
    def simulated(self) -> int:
        """How many candidates' step times have been simulated so far (the rest: pruned)."""
        return sum(c.predicted for c in self._all())

    def __repr__(self) -> str:
        return f"Plan({len(self)} candidates, {sum(c.fits for c in self._all())} fit)"

    __str__ = table


def shown_label(c: Candidate) -> str:
    """The candidate as a table shows it: at p = 1 there is no pipeline, only data and tensor
    parallelism with m gradient-accumulation steps (its schedule's name says only whether the
    backward is split into I and W, which costs memory and fills no bubble)."""
    if c.pipeline > 1:
        return c.label()
    return (f"no pipeline (dp={c.data_parallel} × tp={c.tensor}), {c.microbatches} "
            f"accumulation steps [{c.schedule}], recompute {c.recompute}")


def _fits(c: Candidate) -> bool:
    return c.fits


def runnable(c: Candidate, source):
    """The candidate's schedule as the prediction simulates it: its all-reduces, and its
    recomputations where the source places them as actions."""
    sched = with_data_parallel(c.build(), c.data_parallel)
    if c.recompute != "none" and source.recompute_actions:
        sched = with_recompute(sched)
    return sched
