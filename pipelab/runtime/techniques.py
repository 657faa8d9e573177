"""Techniques plug into the runtime: each registers its hooks here, the runtime calls them.

A technique (data, tensor, expert or vocabulary parallelism, recomputation, asynchronous
updates, or one of a user's) is a `Technique`: a name and up to four hooks, one per phase of a
run. The runtime knows the phases, never the techniques:

    prepare(draft) -> bool      in the parent, before any process starts: check the technique's
                                keywords (ValueError naming the parameter), rewrite the draft's
                                schedule or mesh; True if this run uses the technique
    setup(rank_run)             on each worker, once per run, after its stages are built
    step(rank_run, state)       on each worker, a context manager around every training step
    assemble(assembly)          in the parent, once, when the ranks' reports come back

Only the techniques whose `prepare` said True are in `RunSpec.techniques`; the workers run
those hooks, found here by name (a worker imports pipelab, which registers every built-in
technique; one registered by a user module reaches the workers as a plugin, plugins.py).
What a handler does per action is the handler registry's (handlers.py), not a hook here.

Every hook the runtime enters is noted in `walk` (phase, technique) of the process that
entered it, from the start of its latest run (prepare_run in the parent, run_rank in a worker):
the rank reports carry theirs back (RunResult.walk), so a run shows the path it took.
"""
from __future__ import annotations

import dataclasses
from contextlib import ExitStack, contextmanager
from typing import Callable, Iterator

from ..support.registry import caller_module, claim


@dataclasses.dataclass(frozen=True)
class Technique:
    """A technique's hooks; a run uses it when its prepare hook says so (none: never)."""
    name: str
    prepare: Callable | None = None      # (Draft) -> bool: does this run use it
    setup: Callable | None = None        # (RankRun) -> None
    step: Callable | None = None         # (RankRun, StepState) -> context manager
    assemble: Callable | None = None     # (Assembly) -> None
    # Kinds of the spans it records inside actions that an emulated link's formulas price
    # (result.py drops their measured times from the cost fit): a tensor-parallel all-reduce.
    priced: tuple[str, ...] = ()
    module: str | None = None            # where its hooks are defined: the workers import it
    #                                      from there (register_technique fills it in)


TECHNIQUES: dict[str, Technique] = {}


def register_technique(technique: Technique, replace: bool = False) -> Technique:
    """Add `technique` to the registry (in order: hooks run in registration order). A name
    another module registered is replaced only with `replace=True`; the module that
    registered it may register it again (a notebook cell run twice)."""
    if not isinstance(technique, Technique):
        raise ValueError(f"technique must be a pipelab.runtime.techniques.Technique, "
                         f"got {type(technique).__name__}")
    hooks = [h for h in (technique.prepare, technique.setup, technique.step, technique.assemble)
             if h is not None]
    if technique.module is None:
        technique = dataclasses.replace(
            technique, module=hooks[0].__module__ if hooks else caller_module())
    old = TECHNIQUES.get(technique.name)
    claim("technique", technique.name, technique.module, old and old.module, replace)
    TECHNIQUES[technique.name] = technique
    return technique


def technique(name: str) -> Technique:
    """The registered technique `name`; RuntimeError if this process has none by that name."""
    found = TECHNIQUES.get(name)
    if found is None:
        raise RuntimeError(f"technique {name!r} is not registered in this process "
                           f"(registered: {', '.join(TECHNIQUES) or 'none'})")
    return found


# --- the walk: which hooks this process entered ------------------------------------------------
walk: list[tuple[str, str]] = []


def _enter(phase: str, t: Technique) -> None:
    walk.append((phase, t.name))


def prepare_all(draft) -> tuple[str, ...]:
    """Every registered technique's prepare hook, in order; the names of those the run uses."""
    walk.clear()
    used = []
    for t in list(TECHNIQUES.values()):
        if t.prepare is not None:
            _enter("prepare", t)
            if t.prepare(draft):
                used.append(t.name)
    return tuple(used)


def setup_all(names: tuple[str, ...], rank_run) -> None:
    """The per-rank set-up of the run's techniques, in registration order."""
    for t in _used(names):
        if t.setup is not None:
            _enter("setup", t)
            t.setup(rank_run)


@contextmanager
def around_step(names: tuple[str, ...], rank_run, state) -> Iterator[None]:
    """The run's techniques' step hooks, nested in registration order around one step."""
    with ExitStack() as stack:
        for t in _used(names):
            if t.step is not None:
                _enter("step", t)
                stack.enter_context(t.step(rank_run, state))
        yield


def assemble_all(names: tuple[str, ...], assembly) -> None:
    """The run's techniques' assemble hooks, in registration order."""
    for t in _used(names):
        if t.assemble is not None:
            _enter("assemble", t)
            t.assemble(assembly)


def _used(names: tuple[str, ...]) -> list[Technique]:
    found = [technique(name) for name in names]
    order = list(TECHNIQUES)
    return sorted(found, key=lambda t: order.index(t.name))


def priced_kinds(names: tuple[str, ...]) -> set[str]:
    """The kinds the run's techniques leave to the link's formulas."""
    return {kind for t in _used(names) for kind in t.priced}
