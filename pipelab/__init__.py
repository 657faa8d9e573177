"""pipelab: learn pipeline parallelism for transformer training by running it."""
from .model import ModelConfig, ToyGPT, build_layer, build_layers, layer_costs, loss_fn
from .schedules import (SCHEDULES, Action, Schedule, ScheduleError, comm_plan, loop_placement,
                        register, schedule, v_placement)
from .link import Link
from .simulate import Costs, simulate
from .timeline import Event, Timeline
from . import compare, explorer, plots   # notebook helpers; matplotlib and ipywidgets load lazily
from .data import (ALPHABET, VOCAB_SIZE, decode, encode, get_batch, load_corpus,
                   split_microbatches)
from .train import evaluate, sample, train
from .partition import Partition, measure_layer_times, partition
from .runtime import LocalCluster, PipelineTimeout, RunResult, WorkerError
from .parallel import Mesh, allreduce_time, with_data_parallel
from . import memory, noise, recompute
from .recompute import with_recompute
from .calibrate import Calibration, calibrate
from .plan import Candidate, Plan, plan

__all__ = [
    "ModelConfig", "ToyGPT", "build_layer", "build_layers", "layer_costs", "loss_fn",
    "SCHEDULES", "Action", "Schedule", "ScheduleError", "comm_plan", "loop_placement", "register",
    "schedule", "v_placement", "Link", "Costs", "simulate", "Event", "Timeline",
    "ALPHABET", "VOCAB_SIZE", "decode", "encode", "get_batch", "load_corpus", "split_microbatches",
    "evaluate", "sample", "train",
    "Partition", "measure_layer_times", "partition",
    "LocalCluster", "PipelineTimeout", "RunResult", "WorkerError",
    "Mesh", "allreduce_time", "with_data_parallel", "memory", "noise", "recompute", "with_recompute",
    "Calibration", "calibrate", "Candidate", "Plan", "plan",
]
