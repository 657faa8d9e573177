"""A custom model's calibration: each layer's F, I and W and its bytes, measured, not modelled.

`calibrate(model)` with a `pl.CustomModel` lands here (calibrate.py dispatches). Each layer is
profiled alone (model/custom_profile.py) at two microbatch sizes and every quantity is fitted
as fixed + per_row × rows, as a config's calibration fits its times. Unlike the toy GPT's, the
I/W split is measured (the deferred Linears' GEMMs are W), and so are the bytes: what each
forward saves, what I leaves for W, what each layer receives (a recomputation's checkpoint,
and at a stage boundary the message).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import positive_int, two_sizes
from ..model.custom import CustomModel
from ..model.custom_profile import profile_layers

DEFAULT_LATENCY = 2e-4       # s per message: loopback gloo between two processes, measured here
DEFAULT_BANDWIDTH = 1e9      # bytes/s of a loopback all-reduce link

Line = tuple[float, float]   # (fixed, per row)


@dataclass(frozen=True)
class CustomCalibration:
    """Per layer of a custom model: (fixed, per row) lines of seconds and bytes."""
    model: CustomModel
    forward: tuple[Line, ...]
    input_grad: tuple[Line, ...]
    weight_grad: tuple[Line, ...]
    saved: tuple[Line, ...]           # bytes the forward keeps for the backward
    stash: tuple[Line, ...]           # bytes I leaves for W
    inputs: tuple[Line, ...]          # bytes the layer receives
    latency: float = DEFAULT_LATENCY
    bandwidth: float = DEFAULT_BANDWIDTH

    @property
    def layers(self) -> int:
        return len(self.forward)

    def forward_time(self, start: int, stop: int, rows: int) -> float:
        """Seconds of one microbatch's forward through layers [start, stop)."""
        return _at(self.forward, start, stop, rows)

    def backward_time(self, start: int, stop: int, rows: int) -> tuple[float, float]:
        """(I, W) seconds of one microbatch's backward through layers [start, stop)."""
        return _at(self.input_grad, start, stop, rows), _at(self.weight_grad, start, stop, rows)

    def recompute_time(self, start: int, stop: int, rows: int, policy: str) -> float:
        """Seconds `R` repeats: every layer's forward under `full` (each layer a segment)."""
        return 0.0 if policy == "none" else self.forward_time(start, stop, rows)

    def bytes(self, what: str, start: int, stop: int, rows: int) -> float:
        """Bytes of `what` ("saved", "stash" or "inputs") of layers [start, stop)."""
        return _at(getattr(self, what), start, stop, rows)

    def message_bytes(self, rows: int) -> float:
        """The largest activation crossing between two layers (what a stage sends)."""
        return max((self.bytes("inputs", i, i + 1, rows) for i in range(1, self.layers)),
                   default=0.0)


def calibrate_custom(model: CustomModel, *, rows: tuple[int, int] = (1, 4), repeats: int = 5,
                     warmup: int = 2, latency: float | None = None,
                     bandwidth: float | None = None) -> CustomCalibration:
    """Profile every layer of `model` at microbatches of rows[0] and rows[1] rows and fit
    each time and byte count as fixed + per_row × rows."""
    if not isinstance(model, CustomModel):
        raise ValueError(f"model must be a pl.CustomModel, got {type(model).__name__}")
    small, large = two_sizes("rows", rows)
    positive_int("repeats", repeats)
    at = {r: profile_layers(model, r, repeats, warmup) for r in rows}

    def fit(field: str) -> tuple[Line, ...]:
        return tuple(_line(small, getattr(a, field), large, getattr(b, field))
                     for a, b in zip(at[small], at[large]))
    return CustomCalibration(model, fit("forward"), fit("input_grad"), fit("weight_grad"),
                             fit("saved_bytes"), fit("stash_bytes"), fit("input_bytes"),
                             DEFAULT_LATENCY if latency is None else float(latency),
                             DEFAULT_BANDWIDTH if bandwidth is None else float(bandwidth))


def _line(x0: int, y0: float, x1: int, y1: float) -> Line:
    """(fixed, slope) through two measurements; neither part negative (timing noise)."""
    slope = max(0.0, (y1 - y0) / (x1 - x0))
    return max(0.0, y0 - slope * x0), slope


def _at(lines, start: int, stop: int, rows: int) -> float:
    return sum(a + b * rows for a, b in lines[start:stop])
