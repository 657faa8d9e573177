"""Which forwards the activation meter hooks on one rank: a few per stage, or all of them.

The sampled meter (meter.py) hooks the first forward of each stage in a step and counts the
other microbatches of the stage from what the hooked one did to the live bytes. That is exact
when (1) every microbatch of a stage saves the same tensors, and (2) a microbatch replays an
action only after a hooked one with the same history on that stage has recorded it.
`sampled_forwards` arranges both once per run, from the spec and the rank's communication plan,
and says why it hooks every forward where it cannot promise them:

- (1) holds for the toy GPT without experts: the microbatches have equal shapes (prepare_run
  requires batch_size to divide evenly), its layers save tensors whose sizes follow from the
  shapes alone, and no storage is saved by several forwards (its causal mask and positions are
  made afresh by each one). It is not promised for a custom model (the LLaMA-style stack saves
  its rotary cos/sin buffers in every forward: sampled, they were counted once per microbatch),
  for MoE layers (a router's choices set the bytes: sampled, the peaks came out 0.5–1.5% off),
  nor under a technique that hooks the rank (recomputation counts what it materialises itself,
  tensor parallelism shards and braids the passes, weight versions swap modules).
- (2) is arranged by also hooking any microbatch that is the first to run some sequence of
  kinds on its stage (DualPipe-V splits its last backwards into I and W, not the others). The
  replayed kinds are those of handlers.py's forward and backward handlers; the gradient
  reductions run as they are (they hold no activation); any other kind (offload and reload,
  recomputation, vocabulary passes, updates, a plugin's) hooks every forward.
"""
from __future__ import annotations

from ..model.gpt import ModelConfig
from . import collectives, handlers
from .handlers import HANDLERS
from .techniques import technique

#: Kinds whose handler the sampled meter replays from the hooked microbatch's record.
_REPLAYED = (handlers.forward, handlers.backward, handlers.input_backward,
             handlers.weight_backward)
#: Kinds that run as they are under the sampled meter: they hold no activation.
_NEUTRAL = (collectives.all_reduce_gradients, collectives.sum_replica_gradients)


def sampled_forwards(spec, plan) -> tuple[dict | None, str]:
    """(what the meter does at each part of this rank's `plan`, how), or (None, why every
    forward is hooked). The map takes a part (an Action) to (True, key): hooked, and its effect
    recorded under key; or (False, key): replayed, unhooked, from that record. A part missing
    from it runs live, hooked (a hooked microbatch's other parts, a gradient reduction).

    A record's key is (stage, the kinds the microbatch has run so far on it, this one last), so
    a microbatch replays only what one with the same history did (DualPipe-V splits some
    backwards into I and W and not others). The first microbatch to reach a key records it;
    for that it must be hooked from its forward on, so every part of it runs live."""
    why = _unsafe_run(spec)
    if why is not None:
        return None, f"full: {why}"
    parts = [part for step in plan for part in step.action.parts
             if HANDLERS[part.kind].run not in _NEUTRAL]
    odd = sorted({part.kind for part in parts if HANDLERS[part.kind].run not in _REPLAYED})
    if odd:
        return None, f"full: kind {', '.join(odd)} is not replayed"
    history: dict[tuple[int, int], tuple[str, ...]] = {}
    keys = []
    for part in parts:                 # in the order they run (braided runs hook all)
        unit = (part.stage, part.microbatch)
        history[unit] = history.get(unit, ()) + (part.kind,)
        keys.append((part.stage, history[unit]))
    recorder: dict = {}                # key -> the (stage, microbatch) that records it
    for part, key in zip(parts, keys):
        recorder.setdefault(key, (part.stage, part.microbatch))
    hooked = set(recorder.values())
    todo = {}
    for part, key in zip(parts, keys):
        unit = (part.stage, part.microbatch)
        if recorder[key] == unit:
            todo[part] = (True, key)
        elif unit not in hooked:
            todo[part] = (False, key)
    forwards = sum(part.kind == "F" for part in parts)
    names = " ".join(f"{s}F{mb}" for s, mb in sorted(hooked))
    return todo, f"sampled: {len(hooked)} of {forwards} forwards hooked ({names})"


def _unsafe_run(spec) -> str | None:
    """Why microbatches of one stage may save different tensors in this run, or None."""
    if spec.meter == "full":
        return "asked for (meter='full')"
    if not isinstance(spec.cfg, ModelConfig):
        return "a custom model's layers may save different tensors per microbatch"
    if spec.cfg.moe:
        return "MoE routing sets the bytes each microbatch saves"
    hooking = [name for name in spec.techniques
               if technique(name).setup is not None or technique(name).step is not None]
    if hooking:
        return f"technique {', '.join(hooking)} changes what the passes save"
    if spec.braided:
        return "a braided step interleaves its parts"
    return None
