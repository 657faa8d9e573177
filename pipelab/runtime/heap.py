"""Keep freed memory in the process, as a GPU framework's caching allocator does.

glibc returns large freed blocks to the kernel (and serves big ones with fresh mmaps), so the
next allocation of the same size pays first-touch page faults. A split backward makes that
visible: `I` keeps each Linear's input and output gradient for `W`, where a full `B` would
reuse that memory at once, so `I` alone paid ~6% of its time in page faults (measured on the
toy model at d_model 256; benchmarks/weight_grad.py `--keep-heap`). Workers therefore ask glibc
to keep what they free. The activation meter counts saved tensors, not RSS, so it is unaffected.
"""
from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3


def keep_freed_memory() -> bool:
    """No trimming and no mmap for big blocks (glibc only; returns False elsewhere)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    ok = True
    for option, value in ((M_TRIM_THRESHOLD, 1 << 30), (M_TOP_PAD, 1 << 28),
                          (M_MMAP_THRESHOLD, 1 << 30)):
        ok = libc.mallopt(option, value) == 1 and ok
    return ok
