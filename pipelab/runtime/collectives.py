"""Runtime handlers of gradient sums: the data-parallel all-reduce `AR` and the weight-replica
sum `G` (schedules/reductions.py).

`sAR` sums stage s's gradients over the replicas of its pipeline rank (its dp group). It is
launched asynchronously (one flat buffer, one `all_reduce(async_op=True)`), so the rank goes on
computing — another stage's backwards, on an interleaved schedule — while gloo reduces in its
own thread; the executor notes when it completes (checking between actions, so a measured end
is rounded up to the end of the action it overlapped), and waits for every reduction at the end
of the training step, before the optimizer reads the gradients.

Under an emulated link (runtime/link.py) a reduction completes no earlier than its ring time,
2(n−1)·α + 2(n−1)/n · bytes/β, after its last member launched it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..schedules import Action
from ..schedules.graph import members_of
from ..schedules.reductions import REPLICA_SUM
from .handlers import register_handler
from .link import collective
from .plugins import process_group
from .stage import StepState, replica_own


class Reduction:
    """One launched all-reduce: its handle, the flat buffer, and where the sums go back."""

    def __init__(self, action: Action, params: list, group, members: int, link=None):
        self.action = action
        self.params = params
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        self.buffer = torch.cat([g.reshape(-1) for g in grads]) if grads else torch.zeros(0)
        seconds = link.allreduce_time(self.nbytes, members) if link is not None else 0.0
        self.handle = collective(lambda: dist.all_reduce(self.buffer, group=group, async_op=True),
                                 group, seconds, link)
        self.finished: float | None = None     # perf_counter() when seen complete
        self.entry: int | None = None          # index of its step in the executor's record

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def done(self) -> bool:
        try:
            return self.handle.is_completed()
        except RuntimeError:
            return False

    def finish(self) -> None:
        """Wait, then write the summed gradients back into the parameters."""
        self.handle.wait()
        offset = 0
        for p in self.params:
            n = p.numel()
            total = self.buffer[offset:offset + n].view_as(p)
            if p.grad is None:
                p.grad = total.clone()
            else:
                p.grad.copy_(total)
            offset += n


# The gradient all-reduce's kind: the data-parallel technique registers its spec (where it sits
# in a schedule, its cost rule: techniques/data_parallel.py); the runtime runs it, explains a
# stall in it (meshwatch.py) and prices it by the ring formula (result.py).
ALL_REDUCE = "AR"


@register_handler(ALL_REDUCE)
def all_reduce_gradients(state: StepState, action: Action, inputs: dict) -> None:
    if state.dp_group is None or state.replicas == 1:
        return None                   # one replica: nothing to sum
    # A replica's own parameters (its experts) are not summed (stage.mark_replica_own).
    params = [p for p in state.module(action.stage).parameters() if not replica_own(p)]
    state.in_flight.append(Reduction(action, params, state.dp_group, state.replicas, state.link))
    return None


@register_handler(REPLICA_SUM)
def sum_replica_gradients(state: StepState, action: Action, inputs: dict) -> None:
    """`sG`: sum this rank's copy of model part `slice_of(s)` with the other replicas' copies
    (routes.py). Launched like `AR`, waited for at the end of the step."""
    sched = state.schedule
    part = sched.slice_of(action.stage)
    params = [p for stage, module in state.stages.modules.items()
              if sched.slice_of(stage) == part for p in module.parameters()]
    members = members_of(sched, action)
    state.in_flight.append(Reduction(action, params, process_group(members), len(members),
                                     state.link))
    return None
