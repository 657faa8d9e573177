"""Action kinds, each registered once with everything the rest of pipelab needs to know about it.

A kind says what it consumes (its input edges to other actions), what it produces for others,
how it changes live activation memory, what it costs when the cost model has no entry for it,
and, for a collective, which ranks run it together. The dataflow graph (graph.py) is built from
these specs and feeds the validator, the communication plan, the simulator, the watchdog and
the runtime alike: a new kind is one `register_kind` call (plus a runtime handler), not an edit
of six files.

A spec also carries its role (ROLES: forward, backward, input gradient, ...), which part of a
microbatch's training it completes (the validator's completeness rule), its byte rule (the
byte model's and the simulator's memory effect, model/memory_rules.py), and the colour and
label charts draw it with. Nothing downstream tests a kind's letter for these.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from ..model import memory_rules
from ..support.registry import caller_module, claim
from ..model.memory_rules import BYTE_RULES, FREES, FREES_BUT_STASH, FREES_STASH, KEEPS, RESTORES
from .actions import KIND_SPECS, Action

ACTIVATION = "activation"
INPUT_GRADIENT = "input gradient"
SAVED = "saved activations"       # what a backward reads on its own stage: F's, or a recomputation's
# The pipeline's two ends, when another kind feeds them (vocabulary parallelism shards the
# embedding and the output layer over every rank): what the first stage reads instead of the
# token ids, and where the last stage's backward starts instead of a loss computed on it.
EMBEDDED = "embedded input"
OUTPUT_GRADIENT = "output gradient"


# --- roles: what a kind does in a training step (a small closed set) -----------------------------
FORWARD = "forward"                  # a stage's forward pass
BACKWARD = "backward"                # a full backward: input and weight gradients at once (I + W)
INPUT_GRAD = "input gradient"        # the half of a split backward that feeds the stage before
WEIGHT_GRAD = "weight gradient"      # the other half: the stage's weight gradients
RECOMPUTE = "recompute"              # a forward run again to restore dropped activations
SHARD_PASS = "shard pass"            # compute on a shard of a layer outside the stages (vocabulary)
COMMUNICATION = "communication"      # moves activations or gradients between ranks
REDUCTION = "reduction"              # sums gradients over replicas of the same weights
UPDATE = "update"                    # an optimizer step inside the schedule
VERSION_SELECT = "version select"    # switches the weight version later forwards read
OTHER = "other"                      # anything else (the default)
ROLES = (FORWARD, BACKWARD, INPUT_GRAD, WEIGHT_GRAD, RECOMPUTE, SHARD_PASS, COMMUNICATION,
         REDUCTION, UPDATE, VERSION_SELECT, OTHER)

# Completeness: every (stage, microbatch) runs one kind that completes its forward and either
# one that completes its backward or one of each half of a split backward. A kind declares
# which of these it completes (`completes=`); by default, the training roles complete
# themselves and no other role completes anything.
COMPLETES = (FORWARD, BACKWARD, INPUT_GRAD, WEIGHT_GRAD)
# The byte rule a role follows unless the kind declares another (memory_rules).
_ROLE_BYTES = {FORWARD: KEEPS, BACKWARD: FREES, INPUT_GRAD: FREES_BUT_STASH,
               WEIGHT_GRAD: FREES_STASH, RECOMPUTE: RESTORES}
_UNSET = object()


class Input(NamedTuple):
    """An edge into an action: `name` is how the handler receives it; `producer` the action whose
    output it is. With `carries=False` the edge only orders the two (state kept on one stage,
    such as the graph a W pass reuses from its I), and never becomes a message."""
    name: str
    producer: Action
    carries: bool = True


@dataclass(frozen=True)
class KindSpec:
    kind: str
    description: str
    inputs: Callable[["object", Action], list[Input]]    # (schedule, action) -> edges in
    output: str | None = None          # what it produces for other actions, e.g. "activation"
    memory: float = 0.0                # live activations added (+, at start) or freed (−, at end),
    #                                    in units of one forward's activations of its stage
    cost: Callable[["object", int], float] | None = None  # (costs, stage) -> time, if not in Costs
    per_microbatch: bool = True        # False: written `1U`, runs once per training step
    members: Callable[["object", Action], tuple[int, ...]] | None = None   # a collective's ranks
    module: str = "pipelab"            # where it was defined: the workers import it from there
    lane: str = "compute"              # one of LANES: "comm" (a gradient all-reduce) and "copy"
    #                                    (an offload) run beside the rank's compute, each on a
    #                                    lane of its own in the simulator and plots
    tp_reduce: bool = False            # under tensor parallelism, ends in an all-reduce of its
    #                                    output (forward) or input gradient (backward)
    role: str = OTHER                  # one of ROLES
    completes: str | None = None       # which part of a (stage, microbatch) it completes: COMPLETES
    bytes: str | None = None           # its byte rule (memory_rules.BYTE_RULES), or None
    colour: str | None = None          # its colour in charts (None: the charts' colour for others)
    label: str = ""                    # a short name for legends and sliders ("forward")
    owner: str = "__main__"            # the module that registered it: only it may replace it
    bulk_inputs: Callable | None = None  # `inputs` over arrays (bulk.py): (schedule, table,
    #                                    stages, microbatches) -> one array of producer keys
    #                                    per edge, in `inputs`' order; -1 where it has none
    stage_costs: Callable | None = None  # `cost` over arrays: (costs, stages) -> the cost on
    #                                    every stage < stages, the same numbers (Costs.of_stages)

    @property
    def collective(self) -> bool:
        return self.members is not None


KIND_SPECS: dict[str, KindSpec]     # (the dict lives in actions.py: see there)
# Where a kind runs on its rank: the compute, the communication lane (a side stream for
# collectives) or the copy lane (a copy engine moving activations off the device and back).
LANES = ("compute", "comm", "copy")
KINDS: dict[str, str] = {}         # kind -> description, for messages and docs
# Bumped by every registration: a schedule validated before a kind changed (a notebook cell
# run again with other inputs) must be validated again, so its cache key includes this.
VERSION = [0]


def register_kind(kind: str, description: str, *, inputs: Callable | None = None,
                  output: str | None = None, memory: float | None = None,
                  cost: Callable | None = None, per_microbatch: bool = True,
                  members: Callable | None = None, module: str | None = None,
                  lane: str = "compute", tp_reduce: bool = False, role: str = OTHER,
                  completes: str | None | object = _UNSET, bytes: str | None | object = _UNSET,
                  colour: str | None = None, label: str = "", replace: bool = False,
                  bulk_inputs: Callable | None = None,
                  stage_costs: Callable | None = None) -> KindSpec:
    """Add an action kind. `inputs(schedule, action)` lists its `Input` edges (default: none);
    `members(schedule, action)` makes it a collective of those ranks; `lane="comm"` runs it
    beside the rank's compute (the simulator gives each rank a communication lane, so a
    reduction overlaps the actions after it), `lane="copy"` on the rank's copy lane (a copy
    engine: offloads and reloads queue there, apart from the all-reduces); `tp_reduce=True`: with tensor parallelism it ends
    in an all-reduce (the simulator charges `Costs.tp_allreduce`).

    `role` (one of ROLES) says what it does; `completes` which part of a (stage, microbatch)'s
    training it stands for in the validator's completeness check (default: its role, if a
    training role); `bytes` its byte rule (memory_rules; default: its role's); `memory` its
    constant change of live activations in forwards' units (default: its byte rule's);
    `colour` and `label` how charts show it. `bulk_inputs`, optional, is `inputs` over arrays
    for schedules of 10^5 actions (bulk.py; see the built-in kinds' below); without it, the
    schedules that use the kind are ordered step by step. `stage_costs`, optional, is `cost`
    over arrays, `(costs, stages) -> array` (the planner reads thousands of tables).

    A kind another module registered is replaced only with `replace=True`; the module that
    registered it (a notebook cell run again, a module reloaded) may register it again."""
    if lane not in LANES:
        raise ValueError(f"lane must be one of {', '.join(map(repr, LANES))}, got {lane!r}")
    if not re.fullmatch(r"[A-Z][A-Za-z]*", kind):
        raise ValueError(f"an action kind is an upper-case letter followed by letters, got {kind!r}")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, float))):
        raise ValueError(f"memory must be a number (units of one forward's activations), got {memory!r}")
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(map(repr, ROLES))}, got {role!r}")
    if completes is _UNSET:
        completes = role if role in COMPLETES else None
    if completes is not None and completes not in COMPLETES:
        raise ValueError(f"completes must be one of {', '.join(map(repr, COMPLETES))} or None, "
                         f"got {completes!r}")
    rule = memory_rules.check_rule(_ROLE_BYTES.get(role) if bytes is _UNSET else bytes)
    owner = caller_module()
    old = KIND_SPECS.get(kind)
    claim("action kind", kind, owner, old and old.owner, replace,
          f"choose another letter ({kind} is: {old and old.description})")
    if module is None:          # the registering module: workers import it from there
        module = owner
    spec = KindSpec(kind, description, inputs or (lambda schedule, action: []), output,
                    float(memory_rules.default_memory(rule) if memory is None else memory),
                    cost, per_microbatch, members, module, lane, tp_reduce, role, completes,
                    rule, colour, label, owner, bulk_inputs, stage_costs)
    KIND_SPECS[kind] = spec
    KINDS[kind] = description
    VERSION[0] += 1
    return spec


# --- the four kinds every pipeline uses ---------------------------------------------------------
# (Edges are built with tuple.__new__: schedules hold 10^5 actions, and the named tuples'
# constructor would double the time of a validation. The schedule's index holds only the
# producers that are not the usual ones, DEFAULT_PRODUCER below: an I instead of a B.)
_new = tuple.__new__


def _index(schedule) -> dict:
    """The schedule's index of unusual producers (built on first use, e.g. in a worker)."""
    index = schedule._index
    if index is None:
        schedule.reindex()
        index = schedule._index
    return index


def _forward_inputs(schedule, a: Action) -> list[Input]:
    stage, _, mb = a
    before = schedule.links()[0][stage] if schedule.routes is not None else stage - 1
    if before < 0:       # the first stage of a route reads the microbatch's tokens, unless fed
        found = _index(schedule).get((EMBEDDED, stage, mb))
        return [_new(Input, ("x", found, True))] if found else []
    found = _index(schedule).get((ACTIVATION, before, mb))
    return [_new(Input, ("x", found or _new(Action, (before, "F", mb)), True))]


def _backward_inputs(schedule, a: Action) -> list[Input]:
    stage, _, mb = a
    own = _new(Input, ("saved", _index(schedule).get((SAVED, stage, mb))
                       or _new(Action, (stage, "F", mb)), False))
    if schedule.routes is not None:
        after = schedule.links()[1][stage]
    else:
        after = -1 if stage == len(schedule.placement) - 1 else stage + 1
    if after < 0:        # the last stage of a route starts from its loss, unless fed
        found = _index(schedule).get((OUTPUT_GRADIENT, stage, mb))
        return [own, _new(Input, ("grad", found, True))] if found else [own]
    found = _index(schedule).get((INPUT_GRADIENT, after, mb))
    return [own, _new(Input, ("grad", found or _new(Action, (after, "B", mb)), True))]


def _weight_inputs(schedule, a: Action) -> list[Input]:
    return [_new(Input, ("saved", _new(Action, (a[0], "I", a[2])), False))]


# The same three rules over arrays of stages and microbatches (bulk.py's `Table` reads the
# keys, the index and the routes): one array of producer keys per edge, -1 where none.
def _forward_bulk(schedule, table, stage, mb) -> list:
    before = table.before(stage)
    fed = table.made(EMBEDDED, stage, mb)                     # a route's first stage, if fed
    return [np.where(before < 0, fed, table.made(ACTIVATION, before, mb, "F"))]


def _backward_bulk(schedule, table, stage, mb) -> list:
    after = table.after(stage)
    fed = table.made(OUTPUT_GRADIENT, stage, mb)              # a route's last stage, if fed
    return [table.made(SAVED, stage, mb, "F"),
            np.where(after < 0, fed, table.made(INPUT_GRADIENT, after, mb, "B"))]


def _weight_bulk(schedule, table, stage, mb) -> list:
    return [table.of("I", stage, mb)]


register_kind("F", "forward", inputs=_forward_inputs, output=ACTIVATION, role=FORWARD,
              module="pipelab", tp_reduce=True, colour="#4C72B0", label="forward",
              bulk_inputs=_forward_bulk)
register_kind("B", "full backward (I + W)", inputs=_backward_inputs, output=INPUT_GRADIENT,
              role=BACKWARD, cost=lambda costs, s: costs.of("I", s) + costs.of("W", s),
              stage_costs=lambda costs, n: costs.of_stages("I", n) + costs.of_stages("W", n),
              module="pipelab", tp_reduce=True, colour="#DD8452", label="backward",
              bulk_inputs=_backward_bulk)
# How much of a forward's activations I frees (and W the rest) is a property of the model: the
# simulator takes it as `i_frees` (the byte rules FREES_BUT_STASH and FREES_STASH); the
# runtime measures it.
register_kind("I", "input-gradient backward", inputs=_backward_inputs, output=INPUT_GRADIENT,
              role=INPUT_GRAD, module="pipelab", tp_reduce=True, colour="#C44E52",
              label="input gradient", bulk_inputs=_backward_bulk)
register_kind("W", "weight-gradient backward", inputs=_weight_inputs, role=WEIGHT_GRAD,
              module="pipelab", colour="#55A868", label="weight gradient",
              bulk_inputs=_weight_bulk)

# --- activation offload (STP's memory variant): copies beside the compute ---------------------
# OFFLOAD moves a forward's saved activations off the metered device memory once the forward
# is done; RELOAD brings them back, issued one compute step before their backward, which waits
# for it (RELOAD produces what the backward reads). Both run on the rank's copy lane, as
# asynchronous copies do on a GPU's copy engine: the compute goes on meanwhile, and the copies
# queue among themselves, not behind the all-reduces of the communication lane.
OFFLOAD, RELOAD = "Off", "Re"


def _offload_inputs(schedule, a: Action) -> list[Input]:
    return [_new(Input, ("saved", _new(Action, (a[0], "F", a[2])), False))]


def _reload_inputs(schedule, a: Action) -> list[Input]:
    edges = [_new(Input, ("saved", _new(Action, (a[0], OFFLOAD, a[2])), False))]
    issued = cached_with_index(schedule, "_reload_issue", _reload_issue).get(a)
    if issued is not None:      # issued when the compute before it in the rank's order is done
        edges.append(_new(Input, ("issued", issued, False)))
    return edges


def _reload_issue(schedule) -> dict[Action, Action]:
    """{reload: the last part of the compute step before it on its rank}: the copy starts only
    when the rank's compute reaches it, as a prefetch issued in program order does."""
    out, beside = {}, {k for k, spec in KIND_SPECS.items() if spec.lane != "compute"}
    for acts in schedule.actions:
        before = None
        for item in acts:
            if item.parts[0][1] == RELOAD and len(item.parts) == 1:
                if before is not None:
                    out[item] = before
            elif item.parts[0][1] not in beside:
                before = item.parts[-1]
    return out


def _copy_time(costs, stage: int) -> float:
    return costs.offload_time(stage)


register_kind(OFFLOAD, "offload: move a forward's saved activations off the device",
              inputs=_offload_inputs, memory=-1.0, lane="copy", cost=_copy_time,
              module="pipelab", bytes=None, colour="#8C8C8C", label="offload")
register_kind(RELOAD, "reload: bring offloaded activations back before their backward",
              inputs=_reload_inputs, output=SAVED, memory=1.0, lane="copy", cost=_copy_time,
              module="pipelab", bytes=None, colour="#B8860B", label="reload")

# The kind a (stage, microbatch) uses when its producer of `output` is missing: for messages.
DEFAULT_PRODUCER = {ACTIVATION: "F", INPUT_GRADIENT: "B", SAVED: "F"}


def comm_kinds() -> set[str]:
    """Kinds that run on a rank's communication lane, beside its compute."""
    return {k for k, spec in KIND_SPECS.items() if spec.lane == "comm"}


def side_lanes() -> dict[str, str]:
    """{kind: its lane} for the kinds that run beside a rank's compute (not on it)."""
    return {k: spec.lane for k, spec in KIND_SPECS.items() if spec.lane != "compute"}


def collective_kinds() -> set[str]:
    """Kinds that several ranks run together (registered with `members`)."""
    return {k for k, spec in KIND_SPECS.items() if spec.collective}


def gradient_passes(schedule) -> dict[tuple[int, int], str]:
    """{(stage, microbatch): the kind that finishes its weight gradient}: W where the backward
    is split, else B (absent: B). Cached with the schedule's index; read by the actions that
    consume accumulated gradients (an all-reduce, an optimizer update)."""
    return cached_with_index(schedule, "_weight_pass", _gradient_passes)


def kinds_with_role(*roles: str) -> set[str]:
    """The registered kinds whose role is one of `roles`."""
    return {k for k, spec in KIND_SPECS.items() if spec.role in roles}


def byte_rules() -> dict[str, str]:
    """{kind: its byte rule} for every kind that has one (read by the byte model)."""
    return {k: spec.bytes for k, spec in KIND_SPECS.items() if spec.bytes is not None}


def unit_effects(i_frees: float) -> dict[str, float]:
    """{kind: its change of live activations, in forwards' units} for every kind (0: none); an
    input-gradient pass frees the share `i_frees`, its weight-gradient pass the rest."""
    return {k: memory_rules.unit_effect(spec.bytes, spec.memory, i_frees)
            for k, spec in KIND_SPECS.items()}


def _gradient_passes(schedule) -> dict[tuple[int, int], str]:
    finishing = kinds_with_role(BACKWARD, WEIGHT_GRAD)   # the passes that leave .grad complete
    kinds = {}
    for acts in schedule.actions:
        for item in acts:
            for part in item.parts:
                if part[1] in finishing:
                    kinds[(part[0], part[2])] = part[1]
    return kinds


def cached_with_index(schedule, name: str, build: Callable):
    """`build(schedule)`, kept on the schedule as attribute `name` until its index of producers
    is rebuilt (`Schedule.reindex`)."""
    index = _index(schedule)
    cached = getattr(schedule, name, None)
    if cached is not None and cached[0] is index:
        return cached[1]
    value = build(schedule)
    setattr(schedule, name, (index, value))
    return value


def gradient_edges(schedule, pairs) -> list[Input]:
    """Ordering edges to the pass that finishes the weight gradient of each (stage, microbatch)
    in `pairs` (`gradient_passes`): the accumulated .grad is local state, never a message."""
    passes = gradient_passes(schedule)
    return [_new(Input, ("grads", _new(Action, (s, passes.get((s, mb), "B"), mb)), False))
            for s, mb in pairs]
