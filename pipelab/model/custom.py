"""Your own model in the laboratory: a layer stack, a loss and data from your module.

    model = pl.CustomModel(layers="mymodel:layers", loss="mymodel:loss", batch="mymodel:batch")
    cluster.run(pl.schedule("1f1b", ranks=2, microbatches=4), model=model)

The three functions live in a module the worker processes can import by name (a .py file on the
path, e.g. next to the notebook), never in a notebook cell:

    layers(seed)             -> list of nn.Module: the flat list a partition cuts into stages,
                                the same weights on every call with the same seed
    loss(output, targets)    -> scalar tensor: the loss of the last layer's output, a mean over
                                the rows (the microbatches' means then average to the batch's)
    batch(batch_size, seed)  -> (inputs, targets): each a tensor or a tuple of tensors with
                                `batch_size` rows first; any shapes and dtypes

Layer i receives what layer i-1 returned (the first layer receives the inputs): a tensor or a
tuple of tensors; integer tensors cross stages too (they carry no gradient), and a layer may
have no parameters. Step k of a run trains on batch(batch_size, seed + k). The weights come
from `CustomModel(seed=...)`, the batches from the run's seed, as with a ModelConfig.

Each worker builds the whole list and keeps its stages' layers; every exact `nn.Linear` in them
is swapped for `weight_grad.Linear` (same parameters), so a zero-bubble schedule's W pass does
its weight GEMMs. Parameters held by other modules get their gradients in the I pass, fused
with the input gradient (`fused_backward()` lists them): exact, only not deferred.
"""
from __future__ import annotations

import types
from typing import Iterator

import torch
from torch import nn

from ..checks import seed as check_seed
from . import custom_checks as checks
from .importable import function_name, resolve
from .source import ModelSource, rows, split_rows
from .weight_grad import Linear

ROLES = ("layers", "loss", "batch")


class CustomModel(ModelSource):
    """A model from three functions named 'module:function' (see the module docstring)."""

    def __init__(self, layers: str, loss: str, batch: str, seed: int = 0):
        given = {"layers": layers, "loss": loss, "batch": batch}
        self.names = {role: function_name(value, f"CustomModel({role}=...)")
                      for role, value in given.items()}
        for role, name in self.names.items():
            if isinstance(resolve(name), types.BuiltinFunctionType):   # e.g. --model os:_exit
                raise ValueError(f"CustomModel({role}=...): {name} is a built-in function, not "
                                 f"your model's {role} function; name one defined in your module")
        self.seed = check_seed("CustomModel seed", seed)
        self._cache: dict = {}

    @classmethod
    def from_module(cls, module: str, seed: int = 0) -> "CustomModel":
        """`module`'s functions named layers, loss and batch (what the CLI's --model names)."""
        return cls(*(f"{module}:{role}" for role in ROLES), seed=seed)

    def __getstate__(self) -> dict:
        # Workers get the names and import the functions themselves.
        return {"names": self.names, "seed": self.seed, "_cache": {}}

    def __repr__(self) -> str:
        return (f"CustomModel(layers={self.names['layers']!r}, loss={self.names['loss']!r}, "
                f"batch={self.names['batch']!r}, seed={self.seed})")

    def _function(self, role: str):
        if role not in self._cache:
            self._cache[role] = resolve(self.names[role], f"CustomModel({role}=...)")
        return self._cache[role]

    # --- the layers -------------------------------------------------------------------------------
    def layers(self) -> list[nn.Module]:
        """A fresh build of the whole list, as `layers(seed)` returns it (checked)."""
        built = self._function("layers")(self.seed)
        name = self.names["layers"]
        if not isinstance(built, (list, tuple)) or not built:
            raise ValueError(f"CustomModel(layers=...): {name}(seed) must return a non-empty list "
                             f"of nn.Module, got {_kind(built)}")
        for i, layer in enumerate(built):
            if not isinstance(layer, nn.Module):
                raise ValueError(f"CustomModel(layers=...): {name}(seed) must return a list of "
                                 f"nn.Module; item {i} is {_kind(layer)}")
        if "bytes" not in self._cache:
            self._cache["bytes"] = [sum(p.numel() * p.element_size() for p in layer.parameters())
                                    for layer in built]
            self._cache["counts"] = [sum(p.numel() for p in layer.parameters()) for layer in built]
        return list(built)

    @property
    def total_layers(self) -> int:
        return len(self.layer_parameter_bytes())

    def layer_parameter_bytes(self) -> list[int]:
        """Bytes of each layer's parameters (measured on a build)."""
        if "bytes" not in self._cache:
            self.layers()
        return list(self._cache["bytes"])

    def layer_parameter_counts(self) -> list[int]:
        """How many parameters each layer has (measured on a build)."""
        if "counts" not in self._cache:
            self.layers()
        return list(self._cache["counts"])

    def parameter_bytes(self, start: int, stop: int) -> int:
        return sum(self.layer_parameter_bytes()[start:stop])

    def build(self, start: int, stop: int) -> nn.Sequential:
        return nn.Sequential(*(with_deferred_linears(layer)
                               for layer in self.layers()[start:stop]))

    def fused_backward(self) -> dict[int, list[str]]:
        """Per layer, the modules holding parameters whose gradient the I pass computes with the
        input gradient (not an nn.Linear: nothing to defer to W), e.g. {1: ['norm (LayerNorm)']}."""
        out = {}
        for i, layer in enumerate(self.build(0, self.total_layers)):
            found = [f"{name or 'the layer'} ({type(m).__name__})" for name, m in layer.named_modules()
                     if not isinstance(m, Linear) and any(True for _ in m.parameters(recurse=False))]
            if found:
                out[i] = found
        return out

    def deferred_share(self) -> tuple[float, list[str]]:
        """(share of the parameters whose weight gradient a zero-bubble W pass computes: those
        of the nn.Linear layers, the modules holding the rest, whose gradients come with I)."""
        if "deferred" not in self._cache:
            built = self.build(0, self.total_layers)
            total = sum(p.numel() for p in built.parameters()) or 1
            deferred = sum(p.numel() for m in built.modules() if isinstance(m, Linear)
                           for p in m.parameters(recurse=False))
            fused = [f"layer {i}: {', '.join(names)}" for i, names in self.fused_backward().items()]
            self._cache["deferred"] = (deferred / total, fused)
        share, fused = self._cache["deferred"]
        return share, list(fused)

    # --- loss and data ----------------------------------------------------------------------------
    def loss(self, output, targets) -> torch.Tensor:
        """loss(output, targets) of the user's module, checked: a scalar tensor (else ValueError,
        not torch's own error at the backward, in a run, a profile or a plan)."""
        loss = self._function("loss")(output, targets)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.dim() > 1:
            raise ValueError(f"CustomModel(loss=...): {self.names['loss']}(output, targets) must "
                             f"return a scalar tensor (the mean loss over the rows), got "
                             f"{_kind(loss)}")
        return loss

    def batch(self, batch_size: int, seed: int) -> tuple[object, object]:
        """batch(batch_size, seed) of the user's module, checked: (inputs, targets) of that many rows."""
        got = self._function("batch")(batch_size, seed)
        name = self.names["batch"]
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise ValueError(f"CustomModel(batch=...): {name}(batch_size, seed) must return "
                             f"(inputs, targets), got {_kind(got)}")
        for part, value in zip(("inputs", "targets"), got):
            try:
                n = rows(value)
            except ValueError as err:
                raise ValueError(f"CustomModel(batch=...): {name} {part}: {err}") from None
            if n != batch_size:
                raise ValueError(f"CustomModel(batch=...): {name}({batch_size}, seed) returned "
                                 f"{part} of {n} rows; they must have batch_size rows first")
        return got[0], got[1]

    def batches(self, batch_size: int, seed: int) -> Iterator[tuple[object, object]]:
        step = 0
        while True:
            yield self.batch(batch_size, seed + step)
            step += 1

    # --- runs: checked once in the parent, and the unsplit reference ------------------------------
    def trace(self, batch_size: int, parts: int, seed: int) -> list:
        """Run the first microbatch of batch(batch_size, seed), cut into `parts`, through the whole
        stack once (no gradients): each layer's output, for the shapes crossing each stage boundary.
        ValueError if a function breaks its contract (custom_checks.py): weights that differ between
        calls or processes, a module listed twice, a batch not fixed by its seed or not finite,
        a loss that is not a finite scalar mean over the rows."""
        layers = self.layers()
        checks.check_distinct(layers, self.names["layers"])
        checks.check_same_weights(self)
        inputs, targets = checks.check_batch(self, batch_size, seed)
        x, y = split_rows(inputs, parts)[0], split_rows(targets, parts)[0]
        outputs = []
        with torch.no_grad():
            for i, layer in enumerate(layers):
                try:
                    x = layer(x)
                except Exception as err:
                    raise ValueError(f"CustomModel: layer {i} ({type(layer).__name__}) raised "
                                     f"{type(err).__name__}: {err}, run once here on the first "
                                     f"microbatch before any worker starts") from err
                outputs.append(x)
            self.loss(x, y)          # a scalar, or ValueError
        if not self.inexact():       # by design a dropout's or BatchNorm's losses differ
            checks.check_mean_loss(self, layers, inputs, targets, parts, split_rows)
        return outputs

    def inexact(self) -> list[str]:
        """Why a split run of this model differs from its unsplit stack by design (Dropout with
        p > 0, BatchNorm, in training mode), one line per layer; empty when it must match."""
        if "inexact" not in self._cache:
            self._cache["inexact"] = checks.inexact_layers(self.layers())
        return list(self._cache["inexact"])

    def layer_inputs(self, batch_size: int, seed: int = 0) -> list:
        """What each layer receives on batch(batch_size, seed), detached: to time the layers one
        by one (the first layer's is the inputs themselves)."""
        x = self.batch(batch_size, seed)[0]
        out = []
        with torch.no_grad():
            for layer in self.layers():
                out.append(x)
                x = layer(x)
        return out

    def reference(self, batch_size: int, seed: int) -> tuple[float, dict[str, torch.Tensor]]:
        """The unsplit stack, as the user wrote it (plain nn.Linear), on the first batch."""
        layers = nn.ModuleList(self.layers())
        inputs, targets = self.batch(batch_size, seed)
        x = inputs
        for layer in layers:
            x = layer(x)
        loss = self.loss(x, targets)
        loss.backward()
        return loss.item(), {f"layers.{name}": p.grad if p.grad is not None else torch.zeros_like(p)
                             for name, p in layers.named_parameters()}


def with_deferred_linears(module: nn.Module) -> nn.Module:
    """`module` with every exact nn.Linear in it (itself included) replaced by weight_grad.Linear
    holding the same Parameters, so the pipeline's I pass can leave their weight GEMMs to W.
    A subclass of nn.Linear is left alone: its forward may not be the plain product."""
    if type(module) is nn.Linear:
        swapped = Linear.__new__(Linear)
        nn.Module.__init__(swapped)
        swapped.in_features, swapped.out_features = module.in_features, module.out_features
        swapped.weight = module.weight
        swapped.register_parameter("bias", module.bias)
        return swapped
    for name, child in list(module.named_children()):
        new = with_deferred_linears(child)
        if new is not child:
            setattr(module, name, new)
    return module


def _kind(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"
