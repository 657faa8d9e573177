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
from pipelab.schedules import register_kind
from pipelab.schedules.graph import members_of

register_kind("SY", "step-wide sync (test collective)", per_microbatch=False,
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
