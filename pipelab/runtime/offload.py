"""Activation offload at run time: the store between an `Off` and its `Re` (handlers.py).

A forward whose (stage, microbatch) the schedule offloads saves its tensors for backward in
*boxes* (the meter's `saving(keep=...)`): autograd holds the box, the box holds the tensor, and
unpacking reads whatever the box holds when the backward runs. `Off` copies each storage the
boxes point into to a host store and points the boxes at the copies: the device aliases go, and
the meter lets go of their bytes (as the authors' after-forward hook does with a D2H copy into
pinned memory). `Re` copies them back into fresh storages, counted by the meter again, before
the backward unpacks them. On these CPUs both "devices" are the same memory and the copies run
on the compute thread, costing what a memcpy costs (timelines draw them on the copy lane, where
a GPU's copy stream would run them); what matters here is what the meter counts, and that the
numbers that come back are bit-identical (the gradients match the unsplit model exactly).
"""
from __future__ import annotations

import torch


class OffloadStore:
    """The boxes of the forwards a step offloads, by (stage, microbatch); the meter counts the
    bytes held off the device in `offloaded` (and its peak in `offloaded_peak`)."""

    def __init__(self, meter, chosen: set[tuple[int, int]]):
        self.meter = meter
        self.chosen = chosen
        self.boxes: dict[tuple[int, int], list] = {}

    def keep(self, stage: int, microbatch: int) -> list | None:
        """Where a forward of (stage, microbatch) leaves its boxes; None: it is not offloaded."""
        if (stage, microbatch) not in self.chosen:
            return None
        return self.boxes.setdefault((stage, microbatch), [])

    def offload(self, stage: int, microbatch: int) -> None:
        moved = _move(self.boxes.get((stage, microbatch), []), lambda t: t)
        self.meter.offloaded += moved
        self.meter.offloaded_peak = max(self.meter.offloaded_peak, self.meter.offloaded)

    def reload(self, stage: int, microbatch: int) -> None:
        moved = _move(self.boxes.pop((stage, microbatch), []), self.meter.count_saved)
        self.meter.offloaded -= moved


def _move(boxes: list, wrap) -> int:
    """Copy every storage the boxes point into once (q, k and v are views of one), point each
    box at the same view of the copy (`wrap`ped: the meter counts a reloaded one); the bytes
    copied."""
    copies: dict[int, torch.UntypedStorage] = {}
    moved = 0
    for box in boxes:
        t = box[0]
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in copies:
            copies[key] = storage.clone()
            moved += storage.nbytes()
        view = torch.empty(0, dtype=t.dtype).set_(copies[key], t.storage_offset(), t.size(),
                                                  t.stride())
        box[0] = wrap(view)
    return moved
