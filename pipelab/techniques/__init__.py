"""Floor 5, the techniques: the neighbours of pipeline parallelism, each plugged into the
runtime in one place (its kinds, handlers, checks and runtime hooks: runtime/techniques.py).

    expert.py          experts over the dp group     expert_routing.py   routers' counts, costs
    data_parallel.py   gradient all-reduces (AR)     tensor.py           blocks split over t ranks
    tensor_braid.py    STP's braided steps           vocab.py            vocabulary layer shards
    vocab_passes.py    the vocabulary passes' handlers
    recompute.py       activation recomputation (R)  recompute_placement.py  where R goes
    async_versions.py  weight versions on a rank (U) async_staleness.py  the one-process emulation
    straggler.py       one process made slower (pl.with_slowdown)

Importing this package registers them all, in the order their prepare hooks run: experts first
(they set the data-parallel degree), then data, tensor and vocabulary parallelism,
recomputation, and weight updates inside the schedule."""
from ..runtime.mesh import Mesh
from . import expert      # noqa: F401  (the all-to-all kinds Ed and Ec; experts' hooks)
from .data_parallel import allreduce_time, reduction_of, with_data_parallel
from .tensor import (ColumnParallelLinear, RowParallelLinear, TensorParallel, TensorParallelBlock,
                     unshard)
from . import tensor_braid    # noqa: F401  (the braided F, B, I and W)
from . import vocab_passes    # noqa: F401  (the vocabulary passes' handlers and hook)
from . import recompute       # noqa: F401  (the R kind, its handler and hooks)
from . import async_versions  # noqa: F401  (the U and V handlers and the versions' hooks)
from .straggler import with_slowdown   # a straggler's hooks (registered last: it reads the final schedule)

__all__ = ["Mesh", "allreduce_time", "reduction_of", "with_data_parallel",
           "ColumnParallelLinear", "RowParallelLinear", "TensorParallel", "TensorParallelBlock",
           "unshard", "with_slowdown"]
