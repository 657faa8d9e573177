"""What can be checked of a user's model before any worker starts, and what makes a split run
differ from the unsplit stack by design.

A pipeline is exact only when every worker builds the same weights, every layer is its own
object, step k's batch is the same wherever it is drawn, and the loss of the batch is the mean
of its microbatches' losses. Each of these broke quietly (a gradient error of 0.9-3.9 in the
result table, nothing else): here each is checked once, in the parent, by running the user's
functions — the weights even in a second process, where a pid-seeded layer shows.

Layers that differ by design (Dropout with p > 0 in training mode, BatchNorm) are not refused:
`inexact_layers` names them, and the run is marked NOT EXACT.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import torch
from torch import nn

DIGEST_TIMEOUT = 300.0       # seconds the second process may take (imports torch; a busy machine)
_DIGESTS: dict = {}          # (names, seed) -> the second process's digests: paid once per model


def layer_digests(layers: list[nn.Module]) -> list[str]:
    """A sha256 of each layer's parameters and buffers (names, shapes, dtypes and values)."""
    out = []
    for layer in layers:
        h = hashlib.sha256()
        for name, t in list(layer.named_parameters()) + list(layer.named_buffers()):
            h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
            h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
        out.append(h.hexdigest())
    return out


def digests_in_another_process(names: dict, seed: int) -> list[str]:
    """The layer digests of layers(seed) built by a fresh Python process, as a worker builds
    them (cached per model: it costs a torch import)."""
    key = (names["layers"], seed)
    if key not in _DIGESTS:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p) or ".")
        code = "from pipelab.model.custom_checks import _child; _child()"
        done = subprocess.run([sys.executable, "-c", code, json.dumps([names, seed])],
                              capture_output=True, text=True, timeout=DIGEST_TIMEOUT, env=env,
                              cwd=os.getcwd())
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ValueError(f"CustomModel(layers=...): {names['layers']}(seed) failed in a "
                             f"second process, as a worker would build it: {last}")
        _DIGESTS[key] = json.loads(done.stdout.strip().splitlines()[-1])
    return _DIGESTS[key]


def _child() -> None:
    """The second process: print the digests of layers(seed) as one JSON line."""
    from .custom import CustomModel
    names, seed = json.loads(sys.argv[1])
    model = CustomModel(names["layers"], names["loss"], names["batch"], seed=seed)
    print(json.dumps(layer_digests(model.layers())))


def check_same_weights(model) -> None:
    """ValueError naming the first layer whose weights differ between two calls of layers(seed)
    here, or between this process and another (each worker builds its own copy)."""
    name = model.names["layers"]
    here = layer_digests(model.layers())
    again = layer_digests(model.layers())
    fix = ("every worker builds its own copy, so draw them from a torch.Generator (or "
           "torch.manual_seed) seeded by `seed` alone, never by the time or the process id")
    for i, (a, b) in enumerate(zip(here, again)):
        if a != b:
            raise ValueError(f"CustomModel(layers=...): {name}(seed) built different weights for "
                             f"layer {i} on two calls; {fix}")
    there = digests_in_another_process(model.names, model.seed)
    if len(there) != len(here):
        raise ValueError(f"CustomModel(layers=...): {name}(seed) returned {len(here)} layers here "
                         f"and {len(there)} in another process; {fix}")
    for i, (a, b) in enumerate(zip(here, there)):
        if a != b:
            raise ValueError(f"CustomModel(layers=...): {name}(seed) built different weights for "
                             f"layer {i} in another process (as each worker builds them); {fix}")


def check_distinct(layers: list[nn.Module], name: str) -> None:
    """ValueError if a module object or a parameter appears in two layers: each stage builds its
    own layers, so a module listed twice (or a weight tied across layers) would be two copies,
    each with half the gradient."""
    seen: dict[int, int] = {}
    for i, layer in enumerate(layers):
        if id(layer) in seen:
            raise ValueError(f"CustomModel(layers=...): {name}(seed) lists the same module object "
                             f"as layers {seen[id(layer)]} and {i}; build a new module for each "
                             f"position (stages hold their own copies, so a shared one would "
                             f"train as two)")
        seen[id(layer)] = i
    owner: dict[int, int] = {}
    for i, layer in enumerate(layers):
        for pname, p in layer.named_parameters():
            j = owner.setdefault(id(p), i)
            if j != i:
                raise ValueError(f"CustomModel(layers=...): layers {j} and {i} share the parameter "
                                 f"{pname!r} (a tied weight); pipelab splits layers into stages "
                                 f"that hold their own weights: give each layer its own")


def _tensors(value) -> list[torch.Tensor]:
    return [value] if isinstance(value, torch.Tensor) else [t for t in value
                                                          if isinstance(t, torch.Tensor)]


def _same(a, b) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    return len(ta) == len(tb) and all(x.shape == y.shape and x.dtype == y.dtype and
                                      torch.equal(x, y) for x, y in zip(ta, tb))


def check_batch(model, batch_size: int, seed: int) -> tuple[object, object]:
    """batch(batch_size, seed), after checking it is the same on a second call, different for
    seed + 1 (step k trains on seed + k) and finite. Returns the first call's (inputs, targets)."""
    name = model.names["batch"]
    first = model.batch(batch_size, seed)
    for part, value in zip(("inputs", "targets"), first):
        for t in _tensors(value):
            if t.is_floating_point() and not torch.isfinite(t).all():
                raise ValueError(f"CustomModel(batch=...): {name}({batch_size}, {seed}) returned "
                                 f"{part} with NaN or infinite values")
    second = model.batch(batch_size, seed)
    if not all(_same(a, b) for a, b in zip(first, second)):
        raise ValueError(f"CustomModel(batch=...): {name}({batch_size}, {seed}) returned different "
                         f"data on two calls; every rank draws the batch itself, so draw it from "
                         f"torch.Generator().manual_seed(seed), not the global generator")
    following = model.batch(batch_size, seed + 1)
    if all(_same(a, b) for a, b in zip(first, following)):
        raise ValueError(f"CustomModel(batch=...): {name}(batch_size, seed) ignores its seed: "
                         f"seeds {seed} and {seed + 1} gave the same data, so every step would "
                         f"train on one batch; draw it from torch.Generator().manual_seed(seed)")
    return first


def check_mean_loss(model, layers: list[nn.Module], inputs, targets, parts: int,
                    split_rows) -> None:
    """ValueError if the loss is not finite, or if the batch's loss is not the mean of its
    `parts` microbatches' losses (a summed loss: the pipeline averages its microbatches')."""
    name = model.names["loss"]

    def run(x, y) -> float:
        with torch.no_grad():
            for layer in layers:
                x = layer(x)
            return float(model.loss(x, y))
    whole = run(inputs, targets)
    if not torch.isfinite(torch.tensor(whole)):
        raise ValueError(f"CustomModel(loss=...): {name}(output, targets) is {whole} on the first "
                         f"batch: a NaN or infinite loss would train nothing")
    if parts < 2:
        return
    pieces = [run(x, y) for x, y in zip(split_rows(inputs, parts), split_rows(targets, parts))]
    mean = sum(pieces) / parts
    if abs(whole - mean) > 1e-4 * max(abs(whole), abs(mean)) + 1e-6:
        ratio = whole / mean if mean else float("inf")
        raise ValueError(f"CustomModel(loss=...): {name}(output, targets) is {whole:.6g} on the "
                         f"batch but its {parts} microbatches' losses average {mean:.6g} (ratio "
                         f"{ratio:.3g}); the pipeline averages the microbatches' losses, so the "
                         f"loss must be a mean over the rows (e.g. reduction='mean', not 'sum') "
                         f"and each layer must treat every row alone (no random draws in a "
                         f"forward, no statistics over the batch)")


def inexact_layers(layers: list[nn.Module]) -> list[str]:
    """What makes a split run differ from the unsplit stack by design, one line per layer:
    Dropout with p > 0 in training mode (each rank draws its own masks) and BatchNorm in
    training mode (statistics over a microbatch, not the batch)."""
    out = []
    for i, layer in enumerate(layers):
        for sub_name, sub in layer.named_modules():
            where = f"layer {i}" + (f" ({sub_name}: {type(sub).__name__})" if sub_name
                                    else f" ({type(sub).__name__})")
            p = getattr(sub, "p", None) if isinstance(sub, nn.modules.dropout._DropoutNd) \
                else getattr(sub, "dropout", None) if isinstance(sub, nn.MultiheadAttention) \
                else None
            if sub.training and isinstance(p, (int, float)) and p > 0:
                out.append(f"{where} drops with p={p:g} in training mode: each microbatch draws "
                           f"other masks than the unsplit run; seed the dropout per microbatch, "
                           f"or call .eval() on it (p=0) to compare")
            elif sub.training and isinstance(sub, nn.modules.batchnorm._BatchNorm):
                out.append(f"{where} normalises over each microbatch, not the batch; use "
                           f"GroupNorm or LayerNorm (per row), or .eval() it")
    return out
