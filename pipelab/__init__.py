"""pipelab: learn pipeline parallelism for transformer training by running it."""
from .model.gpt import ModelConfig, ToyGPT, build_layer, build_layers, layer_costs, loss_fn
from .schedules import (SCHEDULES, Action, Schedule, ScheduleError, comm_plan, loop_placement,
                        register, schedule, v_placement)
from .sim.link import Link
from .sim.costs import Costs
from .sim.simulate import simulate
from .sim.timeline import Event, Timeline
from .views import compare, explorer, plots   # notebook helpers; matplotlib, ipywidgets lazily
from .model.data import (ALPHABET, VOCAB_SIZE, decode, encode, get_batch, load_corpus,
                         split_microbatches)
from .model.train import evaluate, sample, train
from .sim.partition import Partition, measure_layer_times, partition
from .runtime import LocalCluster, PipelineTimeout, RunResult, WorkerError
from .techniques import Mesh, allreduce_time, with_data_parallel
from .model import memory
from .support import noise
from .techniques import recompute
from .techniques.recompute import with_recompute
from .planner.calibrate import Calibration, calibrate
from .planner.plan import Candidate, Plan, plan
# Modules a notebook reaches as pl.<name> (pl.data.corpus_tokens, pl.timeline.PathSummary,
# pl.ui.slider; pl.model is the model's floor): top-level modules before the package had floors.
from .model import data
from .sim import timeline
from .views import ui

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
