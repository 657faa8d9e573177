"""The neighbours of pipeline parallelism: a process mesh and data parallelism (later: tensor,
expert and vocabulary parallelism)."""
from .mesh import Mesh
from .data_parallel import allreduce_time, reduction_of, with_data_parallel
from .tensor import (ColumnParallelLinear, RowParallelLinear, TensorParallel, TensorParallelBlock,
                     unshard)
from . import expert      # noqa: F401  (registers the all-to-all kinds Ed and Ec)

__all__ = ["Mesh", "allreduce_time", "reduction_of", "with_data_parallel",
           "ColumnParallelLinear", "RowParallelLinear", "TensorParallel", "TensorParallelBlock",
           "unshard"]
