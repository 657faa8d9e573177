"""The planner's source for a `pl.ModelConfig`: per-stage costs from a CPU calibration
(calibrate.py, costs.py) and bytes from the toy model's byte model (model/memory.py).

A source tells the search (plan.py) what its model allows — the meshes, the stages, the
recomputation policies, whether the vocabulary can be sharded — and, for one candidate and its
schedule, the three things a prediction reads: the stage costs to simulate, each rank's static
bytes, and each byte rule's (added, released) bytes per stage. shaped.py is the other source.
"""
from __future__ import annotations

from ..model.memory import action_bytes, static_bytes
from ..sim.costs import Costs
from ..sim.partition import balanced_bounds
from ..techniques.recompute import policies
from .calibrate import Calibration
from .candidate import MiB, Candidate
from .costs import stage_costs
from .mesh import meshes

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "vocab-1",
                  "vocab-2")
POLICIES = ("none", "selective", "full", "every-k")
# model/memory.py shards the vocabulary one stage per rank; V-Half's vocabulary puts two
# stages on every rank, so only a model shape (shaped.py) plans it.
UNPLANNABLE = {"v-half-vocab": "model/memory.py's vocabulary bytes assume one stage per rank; "
                               "plan a pl.ModelShape for it"}


class CalibratedModel:
    """A toy model on this machine: `cal`'s measured layer costs, memory.py's bytes."""
    schedules = SCHEDULE_NAMES
    policy_names = POLICIES
    recompute_actions = True          # recomputations are R actions (with_recompute), as run
    unit = ("MiB", MiB)
    tensor_rule = "divide the heads and the MLP's width (and be 1 with experts)"

    def __init__(self, cal: Calibration, optimizer: str = "adamw"):
        self.calibration, self.cfg, self.optimizer = cal, cal.cfg, optimizer
        # What a plan's candidates share, each keyed on what it depends on: a split (stages,
        # rows), and a candidate's costs, bytes and static bytes (schedules of every family
        # and microbatch count that give a stage as many rows share them).
        self._splits: dict = {}
        self._costs: dict = {}
        self._tables: dict = {}
        self._static: dict = {}

    def max_stages(self, vocab: bool) -> int:
        return self.cfg.total_layers

    def meshes(self, devices: int, batch_size: int):
        """(p, dp, tp, ep): tp divides the heads and the MLP's hidden width
        (techniques/tensor.py splits by whole heads; not with experts, as the runtime runs
        it), and ep either 1 or, for a mixture of experts whose count it divides, the replicas
        (techniques/expert.py divides the experts over the dp group)."""
        cfg = self.cfg

        def ok(tp: int) -> bool:
            return not (cfg.n_heads % tp or cfg.ffn_width % tp or (tp > 1 and cfg.moe))
        for p, dp, tp in meshes(devices, batch_size, cfg.total_layers, ok):
            yield p, dp, tp, 1
            if cfg.moe and dp > 1 and cfg.n_experts % dp == 0:
                yield p, dp, tp, dp

    def shards_vocabulary(self, p: int, dp: int, tp: int) -> bool:
        """The runtime shards the vocabulary over 2+ pipeline ranks, without dp, tp or experts."""
        return p > 1 and dp == 1 and tp == 1 and not self.cfg.moe

    def policies(self, asked, tp: int):
        return asked if tp == 1 else ("none",)      # tp runs without recomputation, as run

    def bounds(self, stages: int, rows: int, vocab: bool = False) -> list[tuple[int, int]]:
        """The contiguous split balancing the calibrated forward + backward time (with the
        vocabulary sharded, the embedding and head weigh nothing: every rank runs a shard)."""
        key = (stages, rows, vocab)
        if key not in self._splits:
            cal, n = self.calibration, self.cfg.total_layers
            weights = [0.0 if vocab and i in (0, n - 1) else
                       cal.forward_time(i, i + 1, rows) + sum(cal.backward_time(i, i + 1, rows))
                       for i in range(n)]
            self._splits[key] = balanced_bounds(weights, stages)
        return self._splits[key]

    def model(self, c: Candidate, sched) -> tuple[Costs, list[int], dict]:
        """(stage costs, static bytes per rank, byte rule → [(added, released)] per stage)."""
        cfg = self.cfg
        shard = (tuple(c.bounds), c.vocab, c.tensor, c.expert)      # what every part reads
        held = shard + (tuple(sched.placement),)
        if held not in self._static:
            self._static[held] = static_bytes(cfg, c.bounds, sched.stages_of, sched.ranks,
                                              self.optimizer, c.vocab, c.tensor, c.expert)
        kept = shard + (c.rows, c.recompute)
        if kept not in self._tables:
            self._tables[kept] = action_bytes(cfg, c.bounds, c.rows,
                                              policies(c.recompute, cfg, c.bounds), c.vocab,
                                              c.tensor, c.expert)
        timed = kept + (c.pipeline, c.data_parallel)   # the vocabulary passes, the all-reduce
        if timed not in self._costs:
            self._costs[timed] = stage_costs(c, self.calibration)
        return self._costs[timed], list(self._static[held]), self._tables[kept]

