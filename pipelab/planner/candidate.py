"""One configuration the planner weighs, and what it predicts for it (`pl.Candidate`). Its own
module: the cost table (costs.py) reads a candidate, and the search (plan.py) makes them."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields

from ..schedules import schedule as make_schedule

# schedules with several stages per rank, as many as `chunks` says (the V's: exactly 2)
CHUNKED = {"interleaved-1f1b", "zb-v", "looped-bfs", "v-half", "v-min"}
# schedules whose stages per rank are fixed, with no `chunks` option
FIXED_CHUNKS = {"v-half-vocab": 2}
VOCAB = {"vocab-1", "vocab-2", "v-half-vocab"}   # the vocabulary sharded over the pipeline ranks
MiB = 2**20            # the calibrated (toy) plans' unit
GB = 1e9               # a model shape's plans' unit, as datasheets count memory


@dataclass(repr=False)
class Candidate:
    """One configuration and what the planner predicts for it. Its memory is always computed;
    its step time, when the search pruned it (`pl.plan(prune=True)`, the default), only when
    first read: `predicted` says whether it has been, `bound` is a lower bound on it (bound.py)
    known from the start."""
    schedule: str
    pipeline: int                 # pipeline ranks (p)
    data_parallel: int            # replicas (dp); devices = p × dp × tp
    microbatches: int
    chunks: int                   # stages per pipeline rank
    recompute: str
    rows: int                     # sequences per microbatch
    bounds: list[tuple[int, int]]  # [start, stop) of each stage (shown in the repr)
    tensor: int = 1               # tensor-parallel shards of every block (tp)
    expert: int = 1               # processes the experts are divided over (ep: 1 or dp)
    _time: float | None = 0.0     # predicted seconds per training step (None: not yet)
    memory_by_rank: list[int] = field(default_factory=list, repr=False)   # bytes, peak
    activation_peak: list[int] = field(default_factory=list, repr=False)  # of which activations
    static: list[int] = field(default_factory=list, repr=False)   # parameters, grads, optimizer
    fits: bool = False
    reason: str = ""              # why it does not fit ("" when it does)
    bound: float = 0.0            # seconds the step cannot beat (0: no bound computed)
    _simulate: Callable[[], float] | None = field(default=None, compare=False)

    @property
    def step_time(self) -> float:
        """Predicted seconds per training step: simulated now if the search left it for later."""
        if self._time is None:
            self._time, self._simulate = self._simulate(), None
        return self._time

    @step_time.setter
    def step_time(self, seconds: float) -> None:
        self._time, self._simulate = seconds, None

    def defer(self, simulate: Callable[[], float]) -> None:
        """Leave the step time to `simulate()`, called when it is first read."""
        self._time, self._simulate = None, simulate

    @property
    def predicted(self) -> bool:
        """Whether the step time has been simulated (or set)."""
        return self._time is not None

    def __repr__(self) -> str:
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if f.repr and not f.name.startswith("_")]
        time = f"step_time={self._time!r}" if self.predicted else \
            f"step_time=(not simulated yet, >= {self.bound!r})"
        return f"Candidate({', '.join(shown[:9] + [time] + shown[9:])})"

    @property
    def peak_memory(self) -> int:
        """Predicted peak bytes on the fullest device."""
        return max(self.memory_by_rank)

    @property
    def vocab(self) -> bool:
        """Whether the embedding and output layer are sharded over the pipeline ranks."""
        return self.schedule in VOCAB

    @property
    def devices(self) -> int:
        return self.pipeline * self.data_parallel * self.tensor

    def label(self) -> str:
        chunks = f", v={self.chunks}" if self.chunks > 1 else ""
        tensor = f" tp={self.tensor}" if self.tensor > 1 else ""
        tensor += f" ep={self.expert}" if self.expert > 1 else ""
        return (f"{self.schedule} p={self.pipeline} dp={self.data_parallel}{tensor} "
                f"m={self.microbatches}{chunks}, recompute {self.recompute}")

    def build(self):
        """The schedule to run (without the all-reduces: cluster.run adds them)."""
        options = {"chunks": self.chunks} if self.schedule in CHUNKED else {}
        return make_schedule(self.schedule, ranks=self.pipeline, microbatches=self.microbatches,
                             **options)
