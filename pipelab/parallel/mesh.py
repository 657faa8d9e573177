"""A process mesh: every worker process has coordinates (pp, dp, tp) on a grid.

    mesh = Mesh(pp=2, dp=2)          # 4 processes: 2 pipeline ranks × 2 data-parallel replicas
    mesh.rank(pp=1, dp=1)  -> 3      # the process (its torch.distributed rank)
    mesh.coords(3)         -> (1, 1, 0)
    mesh.dp_group(pp=1)    -> (1, 3) # the replicas of pipeline rank 1: they all-reduce gradients

Replica d holds processes d·pp … d·pp + pp − 1, so a mesh with dp = 1 is the plain pipeline
(process r is pipeline rank r) and every existing run keeps its rank numbers. Point-to-point
goes along the pipeline axis only: from (pp=i, dp=d) to (pp=i±1, same dp). Tensor parallelism
will add the innermost axis (tp = 1 for now): the numbering leaves room for it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import positive_int


@dataclass(frozen=True)
class Mesh:
    pp: int = 1          # pipeline ranks (the schedule's ranks)
    dp: int = 1          # data-parallel replicas of the whole pipeline
    tp: int = 1          # tensor-parallel shards (1 until tensor parallelism arrives)

    def __post_init__(self) -> None:
        positive_int("pp", self.pp)
        positive_int("dp", self.dp)
        if self.tp != 1:
            raise ValueError(f"tp={self.tp}: tensor parallelism is not implemented yet; use tp=1")

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
        """How messages name a process: "pp 1 / dp 0" (just "rank 1" on a plain pipeline)."""
        pp, dp, _tp = self.coords(rank)
        return f"rank {pp}" if self.dp == 1 else f"pp {pp} / dp {dp}"

    def dp_group(self, pp: int) -> tuple[int, ...]:
        """The replicas of pipeline rank `pp`: the processes that sum its stages' gradients."""
        return tuple(self.rank(pp, d) for d in range(self.dp))

    def pipeline(self, dp: int) -> tuple[int, ...]:
        """The processes of replica `dp`, in pipeline order."""
        return tuple(self.rank(p, dp) for p in range(self.pp))

    def groups(self) -> dict[str, tuple[int, ...]]:
        """Every named process group of the mesh, in the one order all processes create them:
        "dp 0" … (the replicas of each pipeline rank), then "pipeline 0" … (each replica)."""
        named = {f"dp {p}": self.dp_group(p) for p in range(self.pp)}
        named.update({f"pipeline {d}": self.pipeline(d) for d in range(self.dp)})
        return named

    def peer(self, rank: int, pp: int) -> int:
        """The process at pipeline rank `pp` of `rank`'s own replica (point-to-point partner)."""
        _p, dp, tp = self.coords(rank)
        return self.rank(pp, dp, tp)
