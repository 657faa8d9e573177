"""The byte rules: how an action kind changes a stage's live activation memory.

A kind declares one of these names (`register_kind(..., bytes=...)`); the byte model
(memory.action_bytes) gives each rule its bytes per stage, and the simulator its effect in
units of one forward's activations. A kind with no rule keeps its registered constant `memory`
(in those units) and adds no bytes. The model floor holds the names, so that the byte model
needs no schedule module to read them.
"""
from __future__ import annotations

KEEPS = "keeps activations"                    # a forward: what its recompute policy keeps
RESTORES = "restores activations"              # a recomputation: the dropped rest, plus scratch
FREES = "frees activations"                    # a full backward: all of them
FREES_BUT_STASH = "frees all but the weight-gradient stash"   # an input-gradient pass
FREES_STASH = "frees the weight-gradient stash"               # its weight-gradient pass
KEEPS_SHARD = "keeps a vocabulary shard"       # the output layer's forward on one shard
FREES_SHARD = "frees a vocabulary shard"       # and its backward
BYTE_RULES = (KEEPS, RESTORES, FREES, FREES_BUT_STASH, FREES_STASH, KEEPS_SHARD, FREES_SHARD)


def check_rule(rule: str | None) -> str | None:
    """ValueError unless `rule` is None or one of BYTE_RULES; returns it."""
    if rule is not None and rule not in BYTE_RULES:
        raise ValueError(f"bytes must be one of {', '.join(map(repr, BYTE_RULES))} or None, "
                         f"got {rule!r}")
    return rule


def unit_effect(rule: str | None, memory: float, i_frees: float) -> float:
    """A kind's change of live activations in units of one forward's: an input-gradient pass
    frees the share `i_frees` (a property of the model), its weight-gradient pass the rest;
    every other kind its registered constant `memory`."""
    if rule == FREES_BUT_STASH:
        return -i_frees
    if rule == FREES_STASH:
        return -(1.0 - i_frees)
    return memory


def default_memory(rule: str | None) -> float:
    """The constant `memory` a kind gets from its byte rule when it gives none."""
    return {KEEPS: 1.0, FREES: -1.0}.get(rule, 0.0)
