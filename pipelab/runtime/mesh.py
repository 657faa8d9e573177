"""A process mesh: every worker process has coordinates (pp, dp, tp) on a grid.

    mesh = Mesh(pp=2, dp=2)          # 4 processes: 2 pipeline ranks × 2 data-parallel replicas
    mesh.rank(pp=1, dp=1)  -> 3      # the process (its torch.distributed rank)
    mesh.coords(3)         -> (1, 1, 0)
    mesh.dp_group(pp=1)    -> (1, 3) # the replicas of pipeline rank 1: they all-reduce gradients

    mesh = Mesh(pp=2, tp=2)          # 4 processes: each pipeline rank split over 2 (tensor parallel)
    mesh.tp_group(pp=1)    -> (2, 3) # the shards of pipeline rank 1: they all-reduce activations

Tensor parallelism is the innermost axis: the shards of one pipeline rank are neighbours
(process (dp·pp + pp)·tp + tp). Replica d holds processes d·pp·tp … , so a mesh with dp = tp = 1
is the plain pipeline (process r is pipeline rank r) and every existing run keeps its rank
numbers. Point-to-point goes along the pipeline axis only: from (pp=i, dp=d, tp=t) to
(pp=i±1, same dp, same tp): shard t of one stage talks to shard t of the next.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import positive_int


@dataclass(frozen=True)
class Mesh:
    pp: int = 1          # pipeline ranks (the schedule's ranks)
    dp: int = 1          # data-parallel replicas of the whole pipeline
    tp: int = 1          # tensor-parallel shards of each pipeline rank

    def __post_init__(self) -> None:
        positive_int("pp", self.pp)
        positive_int("dp", self.dp)
        positive_int("tp", self.tp)

    @property
    def size(self) -> int:
        """Number of processes."""
        return self.pp * self.dp * self.tp

    def rank(self, pp: int, dp: int = 0, tp: int = 0) -> int:
        """The process (torch.distributed rank) at these coordinates."""
        for name, value, size in (("pp", pp, self.pp), ("dp", dp, self.dp), ("tp", tp, self.tp)):
            if not 0 <= value < size:
                raise ValueError(f"{name}={value} is outside the mesh ({name} < {size})")
        return (dp * self.pp + pp) * self.tp + tp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) of a process."""
        if not 0 <= rank < self.size:
            raise ValueError(f"process {rank} is outside the mesh of {self.size} processes")
        tp = rank % self.tp
        rest = rank // self.tp
        return rest % self.pp, rest // self.pp, tp

    def name(self, rank: int) -> str:
        """How messages name a process: "pp 1 / dp 0" (just "rank 1" on a plain pipeline),
        with "/ tp 1" when the mesh has tensor parallelism."""
        pp, dp, tp = self.coords(rank)
        parts = [f"pp {pp}"] + [f"dp {dp}"] * (self.dp > 1) + [f"tp {tp}"] * (self.tp > 1)
        return f"rank {pp}" if len(parts) == 1 else " / ".join(parts)

    def dp_group(self, pp: int, tp: int = 0) -> tuple[int, ...]:
        """The replicas of pipeline rank `pp` (shard `tp`): the processes that sum its stages'
        gradients."""
        return tuple(self.rank(pp, d, tp) for d in range(self.dp))

    def tp_group(self, pp: int, dp: int = 0) -> tuple[int, ...]:
        """The shards of pipeline rank `pp` in replica `dp`: they sum each block's activations
        (forward) and input gradients (backward)."""
        return tuple(self.rank(pp, dp, t) for t in range(self.tp))

    def pipeline(self, dp: int, tp: int = 0) -> tuple[int, ...]:
        """The processes of replica `dp` (shard `tp`), in pipeline order."""
        return tuple(self.rank(p, dp, tp) for p in range(self.pp))

    def groups(self) -> dict[str, tuple[int, ...]]:
        """Every named process group of the mesh, in the one order all processes create them:
        "dp 0" … (the replicas of each pipeline rank and shard), "pipeline 0" … (each replica
        and shard), then "tp 0 / dp 0" … (the shards of each pipeline rank and replica). With
        tp = 1 the names are the pp × dp mesh's."""
        def tag(t: int) -> str:
            return f" / tp {t}" if self.tp > 1 else ""
        named = {f"dp {p}{tag(t)}": self.dp_group(p, t)
                 for t in range(self.tp) for p in range(self.pp)}
        named.update({f"pipeline {d}{tag(t)}": self.pipeline(d, t)
                      for t in range(self.tp) for d in range(self.dp)})
        if self.tp > 1:
            named.update({f"tp {p} / dp {d}": self.tp_group(p, d)
                          for d in range(self.dp) for p in range(self.pp)})
        return named

    def peer(self, rank: int, pp: int) -> int:
        """The process at pipeline rank `pp` of `rank`'s own replica (point-to-point partner)."""
        _p, dp, tp = self.coords(rank)
        return self.rank(pp, dp, tp)
