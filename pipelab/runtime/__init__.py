"""Floor 4, the multi-process runtime: worker pool, rank executor, point-to-point, stages, results.

    pool.py      worker processes: spawn, pin, reap      worker.py    the worker's command loop
    cluster.py   LocalCluster: run, wait, watchdog       executor.py  one rank's actions in order
    spec.py      argument checks → RunSpec               handlers.py  what F, B, I, W compute
    stage.py     a rank's stages and step state          p2p.py       sends and receives
    meter.py     live activation bytes                   board.py     progress in shared memory
    watchdog.py  explaining a stall                      result.py    RunResult, reference check
    meshwatch.py explaining a stall on a pp × dp mesh    collectives.py  the gradient all-reduce AR
    plugins.py   outside kinds reach the workers         calls.py     a named function on every worker
    rendezvous.py where the workers meet (this machine)  startup.py   why workers could not start
    heap.py      keep freed memory, as a caching allocator  errors.py  how a run fails
    mesh.py      the processes' (pp, dp, tp) coordinates    techniques.py  where techniques plug in
    link.py      waiting out an emulated link (pl.Link)  boundary.py  tuples, integer tensors across stages
    sampling.py  which forwards the meter hooks (a few per stage, or all)
"""
from .cluster import LocalCluster
from .errors import PipelineTimeout, WorkerError
from .executor import run_rank
from .handlers import HANDLERS, register_handler
from .result import RunResult, assemble
from .spec import RunSpec, prepare_run
from .techniques import TECHNIQUES, Technique, register_technique

__all__ = ["LocalCluster", "PipelineTimeout", "WorkerError", "run_rank", "HANDLERS",
           "register_handler", "RunResult", "assemble", "RunSpec", "prepare_run", "TECHNIQUES",
           "Technique", "register_technique"]
