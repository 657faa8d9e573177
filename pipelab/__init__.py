"""pipelab: learn pipeline parallelism for transformer training by running it.

The façade: everything a notebook reaches as `pl.*`, gathered floor by floor (the README's
layout section says what each floor holds).
"""
# model
from .model import data, memory
from .model.config import ModelConfig
from .model.data import (ALPHABET, VOCAB_SIZE, decode, encode, get_batch, load_corpus,
                         split_microbatches)
from .model.gpt import ToyGPT, build_layer, build_layers, layer_costs, loss_fn
from .model.train import evaluate, sample, train
from .model.custom import CustomModel
# schedule language
from .schedules import (SCHEDULES, Action, Schedule, ScheduleError, comm_plan, loop_placement,
                        register, schedule, v_placement)
# simulator
from .sim import timeline
from .sim.costs import Costs
from .sim.device import Device
from .sim.shape import ModelShape, shape_profile
from .sim.link import Link
from .sim.partition import Partition, measure_layer_times, partition
from .sim.simulate import simulate
from .sim.timeline import Event, Timeline
# runtime and the techniques that plug into it (importing them registers them)
from .runtime import LocalCluster, PipelineTimeout, RunResult, WorkerError
from .techniques import Mesh, allreduce_time, recompute, with_data_parallel
from .techniques.recompute import with_recompute
from .techniques.straggler import with_slowdown
# planner
from .planner.calibrate import Calibration, calibrate
from .planner.plan import Candidate, Plan, plan
# views (matplotlib and ipywidgets load only when something is drawn) and tools
from .support import noise
from .views import compare, explorer, plots, ui

__all__ = [
    "ModelConfig", "ToyGPT", "build_layer", "build_layers", "layer_costs", "loss_fn",
    "SCHEDULES", "Action", "Schedule", "ScheduleError", "comm_plan", "loop_placement", "register",
    "schedule", "v_placement", "Link", "Costs", "simulate", "Event", "Timeline",
    "Device", "ModelShape", "shape_profile",
    "ALPHABET", "VOCAB_SIZE", "decode", "encode", "get_batch", "load_corpus", "split_microbatches",
    "evaluate", "sample", "train", "CustomModel",
    "Partition", "measure_layer_times", "partition",
    "LocalCluster", "PipelineTimeout", "RunResult", "WorkerError",
    "Mesh", "allreduce_time", "with_data_parallel", "memory", "noise", "recompute", "with_recompute",
    "with_slowdown",
    "Calibration", "calibrate", "Candidate", "Plan", "plan",
]
