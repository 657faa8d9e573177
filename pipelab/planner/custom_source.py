"""The planner's source for a `pl.CustomModel`: costs and bytes from its layers' calibration
(calibrate_custom.py), the third source beside calibrated.py (a config) and shaped.py (a shape).

What a stack pipelab did not write allows: pipeline and data parallelism (no tensor or expert
parallelism, no vocabulary sharding: they need the GPT's inside), the schedules of forwards and
backwards, and the recomputation policies the runtime runs on it ("none", and "full" with each
layer one segment; "selective" needs the GPT's attention core).

Bytes per stage, each rule as (added, released) — with `kept` what the forward keeps (all it
saves under "none", the layers' inputs under "full"): F adds `kept`; R adds what the forward
saves and releases the checkpoints; B releases what was saved; I adds the stash for W and
releases what was saved; W releases the stash. Static: parameters, gradients and AdamW's two
moments, 4 × the parameter bytes (2 × with SGD).
"""
from __future__ import annotations

from ..model.memory_rules import FREES, FREES_BUT_STASH, FREES_STASH, KEEPS, RESTORES
from ..sim.costs import Costs
from ..sim.partition import balanced_bounds
from ..techniques.recompute import RECOMPUTE
from .calibrate_custom import CustomCalibration
from .candidate import MiB, Candidate
from .mesh import meshes

CUSTOM_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v")
CUSTOM_POLICIES = ("none", "full")
STATE_COPIES = {"adamw": 4, "sgd": 2}     # parameter, gradient (and Adam's two moments)


class CustomPlanned:
    """A custom model on this machine: `cal`'s measured layer costs and bytes."""
    schedules = CUSTOM_SCHEDULES
    policy_names = CUSTOM_POLICIES
    recompute_actions = True          # recomputations are R actions, as run
    unit = ("MiB", MiB)
    tensor_rule = "be 1 (a custom model's layers are not split)"

    def __init__(self, cal: CustomCalibration, optimizer: str = "adamw"):
        if optimizer not in STATE_COPIES:
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
        self.calibration, self.custom, self.optimizer = cal, cal.model, optimizer
        self.cfg = None               # not a ModelConfig (Plan reads it)
        self._splits: dict = {}       # what a plan's candidates share, by what it depends on
        self._models: dict = {}

    def max_stages(self, vocab: bool) -> int:
        return self.calibration.layers

    def meshes(self, devices: int, batch_size: int):
        for p, dp, tp in meshes(devices, batch_size, self.calibration.layers, lambda t: t == 1):
            yield p, dp, tp, 1

    def shards_vocabulary(self, p: int, dp: int, tp: int) -> bool:
        return False

    def policies(self, asked, tp: int):
        return asked

    def bounds(self, stages: int, rows: int, vocab: bool = False) -> list[tuple[int, int]]:
        """The contiguous split balancing the measured F + I + W at `rows` rows."""
        if (stages, rows) not in self._splits:
            cal = self.calibration
            weights = [cal.forward_time(i, i + 1, rows) + sum(cal.backward_time(i, i + 1, rows))
                       for i in range(cal.layers)]
            self._splits[stages, rows] = balanced_bounds(weights, stages)
        return self._splits[stages, rows]

    def model(self, c: Candidate, sched) -> tuple[Costs, list[float], dict]:
        """(stage costs, static bytes per rank, byte rule → [(added, released)] per stage)."""
        key = (tuple(c.bounds), c.rows, c.recompute, tuple(sched.placement), c.data_parallel)
        if key not in self._models:          # candidates of other families share it
            self._models[key] = self._model(c, sched)
        costs, static, table = self._models[key]
        return costs, list(static), table

    def _model(self, c: Candidate, sched) -> tuple[Costs, list[float], dict]:
        cal, rows = self.calibration, c.rows
        F, I, W, R, table = [], [], [], [], {rule: [] for rule in
                                             (KEEPS, RESTORES, FREES, FREES_BUT_STASH, FREES_STASH)}
        for a, b in c.bounds:
            F.append(cal.forward_time(a, b, rows))
            i, w = cal.backward_time(a, b, rows)
            I.append(i)
            W.append(w)
            R.append(cal.recompute_time(a, b, rows, c.recompute))
            saved, stash = cal.bytes("saved", a, b, rows), cal.bytes("stash", a, b, rows)
            full = c.recompute != "none"
            kept = cal.bytes("inputs", a, b, rows) if full else saved
            table[KEEPS].append((kept, 0.0))
            table[RESTORES].append((saved, kept) if full else (0.0, 0.0))
            table[FREES].append((0.0, saved))
            table[FREES_BUT_STASH].append((stash, saved))
            table[FREES_STASH].append((0.0, stash))
        copies = STATE_COPIES[self.optimizer]
        static = [0.0] * sched.ranks
        for stage, rank in enumerate(sched.placement):
            static[rank] += copies * self.custom.parameter_bytes(*c.bounds[stage])
        costs = Costs.per_stage(F=F, I=I, W=W, B=[i + w for i, w in zip(I, W)],
                                kinds={RECOMPUTE: R}, unit="s",
                                comm=cal.latency + cal.message_bytes(rows) / cal.bandwidth,
                                bandwidth=cal.bandwidth, latency=cal.latency,
                                parameter_bytes=[self.custom.parameter_bytes(a, b)
                                                 for a, b in c.bounds],
                                replicas=c.data_parallel)
        return costs, static, table
