"""Notebook 15's helpers: your own model brought to the laboratory (the example stack is
llama_stack.py, beside this file; the workers import it by its module name)."""
from __future__ import annotations

from typing import Callable, Sequence

from ...model.custom import CustomModel
from ...sim.partition import Partition
from ...sim.simulate import simulate
from ...sim.timeline import Timeline

LLAMA = "pipelab.chapters.your_own_model.llama_stack"


def llama_model(heavy: bool = False, seed: int = 0) -> CustomModel:
    """The example LLaMA-style stack as a pl.CustomModel; `heavy`: its first block's MLP wide."""
    return CustomModel(layers=f"{LLAMA}:{'heavy_layers' if heavy else 'layers'}",
                       loss=f"{LLAMA}:loss", batch=f"{LLAMA}:batch", seed=seed)


def busy(res) -> list[float]:
    """Seconds each pipeline rank computed in the run's last step: the replay's, whose every
    action costs its measured CPU time (what waiting for the other rank cannot inflate)."""
    table = res.replay.busy()
    return [table[r] for r in range(res.replay.ranks)]


def imbalance(values) -> float:
    """The busiest over the mean: 1.0 is perfect balance."""
    values = list(values)
    return max(values) / (sum(values) / len(values))


def step_timer(cluster, schedule, model: CustomModel, **run) -> Callable[[], float]:
    """A callable for pl.noise.paired_rounds: one unchecked run, its replayed step (s): each
    action's measured CPU time laid on the schedule, what dedicated cores would show (the
    wall-clock step on 2 cores shared by many mostly measures who else is running)."""
    def once() -> float:
        return cluster.run(schedule, model=model, check=False, progress=False,
                           **run).replay.makespan
    return once


def predicted_steps(splits: Sequence[Partition], schedule) -> list[Timeline]:
    """Each split simulated under `schedule`, its stages priced by their measured load
    (`Partition.times`: F + I + W of a microbatch, from the layers timed alone) divided 1 : 2
    between forward and backward: the step the profile predicts, before any run."""
    # costs() makes the forward load/per_unit and the backward twice that: per_unit=3 keeps
    # forward + backward equal to the measured F + I + W.
    return [simulate(schedule, split.costs("times", per_unit=3, unit="s")) for split in splits]
