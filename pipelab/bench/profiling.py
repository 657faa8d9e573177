"""Where a worker's CPU time goes: a cProfile of one step, folded into a few categories.

The profiler's clock is this thread's CPU time (`time.thread_time`), so time blocked in a
receive counts nothing, as it costs nothing; the profiler's own cost inflates every Python-level
entry, so read the categories relative to each other and take totals from unprofiled steps."""
from __future__ import annotations

import cProfile
import pstats

#: (category, substrings of "file:function" that put a profiled function in it), first match wins.
CATEGORIES = (
    ("activation meter", ("runtime/meter.py",)),
    ("progress board", ("runtime/board.py",)),
    ("clocks", ("time.perf_counter", "time.thread_time")),
    ("p2p python (ours)", ("runtime/p2p.py",)),
    ("gloo send/recv/wait (C++)", ("_distributed_c10d", "ProcessGroup", "'wait' of", "Work")),
    ("c10d python wrappers", ("distributed_c10d.py", "c10d_logger.py", "distributed/utils.py")),
    ("torch pipelining python", ("distributed/pipelining/",)),
    ("executor, handlers, stage", ("runtime/executor.py", "runtime/handlers.py",
                                   "runtime/stage.py", "schedules/")),
    ("autograd engine (backward)", ("run_backward", "autograd/__init__.py", "autograd/graph.py",
                                     "_tensor.py:backward")),
    ("model forward (modules, ops)", ("torch/nn/", "pipelab/model/gpt.py", "built-in method torch.",
                                      "of 'torch._C", "torch/functional.py", "_tensor.py")),
)


def category(label: str) -> str:
    for name, needles in CATEGORIES:
        if any(n in label for n in needles):
            return name
    return "other python"


def _label(func: tuple) -> str:
    filename, line, name = func
    if filename == "~":
        return name                              # a built-in: "<built-in method ...>"
    return f"{filename}:{name}"


def profiler():
    import time
    return cProfile.Profile(time.thread_time)


def summarize(profiler: cProfile.Profile, top: int = 25) -> dict:
    """{'categories': {category: seconds (own time)}, 'top': [(label, calls, own s, cum s)]}."""
    stats = pstats.Stats(profiler).stats
    cats: dict[str, float] = {}
    rows = []
    for func, (_cc, ncalls, tottime, cumtime, _callers) in stats.items():
        label = _label(func)
        cats[category(label)] = cats.get(category(label), 0.0) + tottime
        rows.append((label, ncalls, tottime, cumtime))
    rows.sort(key=lambda r: -r[2])
    return {"categories": cats, "top": rows[:top]}
