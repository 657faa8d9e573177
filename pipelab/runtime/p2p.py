"""Point-to-point messages between ranks, one per `Transfer` of the communication plan.

Gloo traps this module avoids (see docs/platform.md): a non-contiguous send raises on the sender
while the receiver hangs, so every send is made contiguous; and a gloo send completes only
once the receiver has posted the matching receive, so the send handles are kept and waited
at the end of the training step: waiting right after each send would make two ranks that
send to each other deadlock. For the same reason receives are posted one step ahead: the
data then moves while the receiver computes instead of after it asks.

Messages go straight to the default process group's `send`/`recv` (what `dist.isend` and
`dist.irecv` call after their argument checks): the plan already guarantees what those checks
test (a dense tensor, a peer inside the group, whose group rank is its global rank), and on
small microbatches the checks were a measurable share of an action's overhead.

Under an emulated link (`link=pl.Link(...)`, runtime/link.py) each message also carries its post
time in a stamp message, and the receive completes only once the link's time has passed.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..schedules import Transfer
from .link import STAMP_TAG, DelayedMessage, now_stamp


def _group():
    return dist.distributed_c10d._get_default_group()


def post_recv(transfer: Transfer, shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
              link=None):
    """Post the receive of `transfer` into a freshly allocated tensor of known shape.

    Returns (handle, tensor): wait on the handle before reading the tensor. Posting early lets
    gloo move the data while this rank is still computing. A fresh tensor per message, not a
    reused buffer: it becomes the next stage's input and lives until that stage's backward.
    With a `link` the handle's wait also waits out the link (runtime/link.py).
    """
    buffer = torch.empty(shape, dtype=dtype)
    handle = _group().recv([buffer], transfer.src, transfer.tag)
    if link is None:
        return handle, buffer
    stamp = torch.empty(1, dtype=torch.float64)
    stamp_handle = _group().recv([stamp], transfer.src, STAMP_TAG + transfer.tag)
    seconds = link.transfer_time(buffer.numel() * buffer.element_size())
    return DelayedMessage(handle, stamp_handle, stamp, seconds), buffer


def send(transfer: Transfer, tensor: torch.Tensor, pending: list, link=None) -> None:
    """Post the send of `tensor` for `transfer`; its handle (and the tensor, which must stay
    alive until the receiver has it) goes on `pending`. With a `link`, the post time follows
    in a stamp message (the receiver waits out the link from it)."""
    # Handlers already hand over detached outputs; detach (a new tensor object) only if not.
    payload = tensor.detach() if tensor.requires_grad else tensor
    if not payload.is_contiguous():
        payload = payload.contiguous()
    if link is not None:
        stamp = now_stamp()
        pending.append((_group().send([stamp], transfer.dst, STAMP_TAG + transfer.tag), stamp))
    pending.append((_group().send([payload], transfer.dst, transfer.tag), payload))


def wait_all(pending: list) -> None:
    """Wait for every posted send (they complete once the receivers have posted their recvs)."""
    for handle, _payload in pending:
        handle.wait()
    pending.clear()
