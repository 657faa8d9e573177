"""Kinds and handlers defined outside pipelab reach the workers by module name, or are refused.

A worker is a fresh process: it knows the kinds and handlers pipelab registers on import, and
nothing else. A schedule that uses a kind registered in a user module names that module in the
run spec, and every worker imports it (which registers the kind and its handler there too)
before building its plan. A kind or handler defined in `__main__` — a notebook cell or the
script itself — cannot be imported by another process, so the run is refused up front with a
message saying how to fix it, instead of the workers silently running something else.
"""
from __future__ import annotations

import importlib
import importlib.util

from ..schedules.graph import members_of
from ..schedules.kinds import KIND_SPECS
from .techniques import TECHNIQUES
from .handlers import HANDLERS


def plugins_for(schedule, techniques=()) -> tuple[str, ...]:
    """Modules the workers must import for this schedule and these registered techniques (by
    name); ValueError for ones they cannot."""
    kinds = sorted(schedule.kinds())
    missing = [k for k in kinds if k not in HANDLERS]
    if missing:
        raise ValueError(f"schedule: the runtime has no handler for action kind(s) {missing}; "
                         f"register one with pipelab.runtime.register_handler")
    wanted = [(f"the kind for action kind {kind!r}", KIND_SPECS[kind].module) for kind in kinds]
    wanted += [(f"the handler for action kind {kind!r}", HANDLERS[kind].module) for kind in kinds]
    wanted += [(f"technique {name!r}", TECHNIQUES[name].module) for name in techniques]
    modules = []
    for what, module in wanted:
        if module is None or module == "pipelab" or module.startswith("pipelab."):
            continue
        if module == "__main__" or importlib.util.find_spec(module) is None:
            raise ValueError(
                f"schedule: {what} is defined in {module!r}, which the worker processes cannot "
                f"import (each is a fresh Python process). Put register_kind/register_handler/"
                f"register_technique in a module file (e.g. my_kinds.py next to the notebook), "
                f"import it, and run again")
        if module not in modules:
            modules.append(module)
    return tuple(modules)


def import_plugins(modules) -> None:
    for module in modules:
        importlib.import_module(module)


def collective_groups(schedule) -> list[tuple[int, ...]]:
    """Every distinct set of ranks that runs a collective of this schedule, in a fixed order."""
    groups = {members_of(schedule, part) for acts in schedule.actions for item in acts
              for part in item.parts if KIND_SPECS[part.kind].collective}
    return sorted(groups)


_GROUPS: dict[tuple[int, ...], object] = {}


def process_group(members: tuple[int, ...]):
    """The process group of `members`, made once per worker process. Every rank of the world
    must make the same groups in the same order (torch's rule), so the executor makes all of a
    schedule's groups on every rank before it starts, members or not."""
    group = _GROUPS.get(members)
    if group is None:
        import torch.distributed as dist
        group = _GROUPS[members] = dist.new_group(list(members))
    return group
