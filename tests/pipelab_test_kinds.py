"""A kind registered outside pipelab, as a chapter or a user would: a step-wide collective.

`0SY` ("sync") runs once per training step on every rank together: an all-reduce of a one on
each member, which the handler checks adds up to the group's size. The workers import this
module by name (tests/ is on sys.path under pytest), which registers the kind there too.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipelab.runtime import register_handler
from pipelab.runtime.plugins import process_group
from pipelab.schedules import Action, Input, register_kind
from pipelab.schedules.kinds import COMMUNICATION
from pipelab.schedules.graph import members_of

register_kind("SY", "step-wide sync (test collective)", per_microbatch=False, role=COMMUNICATION,
              members=lambda schedule, action: tuple(range(schedule.ranks)),
              cost=lambda costs, stage: 0.25)


@register_handler("SY")
def sync(state, action, inputs):
    members = members_of(state.schedule, action)
    total = torch.ones(1)
    dist.all_reduce(total, group=process_group(members))
    if int(total.item()) != len(members):
        raise RuntimeError(f"the all-reduce over {members} gave {total.item()}")
    return None


# A message of its own shape and dtype: the last stage sends each microbatch's loss (one
# float64) back to stage 0, which checks what it got. A wrong shape or dtype from the plan
# would hang or garble the transfer.
register_kind("Ls", "send the microbatch's loss back (test)", output="loss copy",
              role=COMMUNICATION,
              inputs=lambda schedule, a: [Input("saved", Action(a.stage, "F", a.microbatch),
                                                carries=False)],
              cost=lambda costs, stage: 0.0)
register_kind("Lr", "receive the microbatch's loss (test)", role=COMMUNICATION,
              inputs=lambda schedule, a: [Input("loss", Action(schedule.stages - 1, "Ls",
                                                               a.microbatch))],
              cost=lambda costs, stage: 0.0)

RECEIVED: dict[int, float] = {}


@register_handler("Ls", output=lambda spec, action: ((1,), torch.float64))
def send_loss(state, action, inputs):
    return torch.tensor([state.losses[action.microbatch]], dtype=torch.float64)


@register_handler("Lr")
def receive_loss(state, action, inputs):
    loss = inputs["loss"]
    if loss.shape != (1,) or loss.dtype != torch.float64 or not 0.0 < loss.item() < 10.0:
        raise RuntimeError(f"got {loss!r} for the loss of microbatch {action.microbatch}")
    return None
