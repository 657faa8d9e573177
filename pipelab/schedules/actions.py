"""Actions: the words of the schedule language, written like `1F3` (stage 1, forward, microbatch 3).

Kinds follow PyTorch's convention, which avoids the two meanings of "B" in the papers:
F forward, B full backward (= I + W), I input-gradient backward, W weight-gradient backward.
Later chapters register more kinds (kinds.py). Three shapes of words:

    1F3        one action: stage, kind, microbatch
    1U         an action without a microbatch (a gradient reduction, an optimizer update)
    3F5+4B0    a compound: actions one rank runs as one step (DualPipe's overlapped F&B pair)
"""
from __future__ import annotations

import re
from typing import NamedTuple

NO_MICROBATCH = -1      # the microbatch of an action that belongs to the whole step

_ACTION_RE = re.compile(r"^(\d+)([A-Z][A-Za-z]*)(\d*)$")


# Every kind an action may name, with its spec: filled by `kinds.register_kind`, which defines
# what a spec holds. It lives here, with the Action, so that reading "1F3" can check the kind
# without this module importing kinds.py (which builds on the Action).
KIND_SPECS: dict = {}


class Action(NamedTuple):
    """One compute step; a named tuple because schedules hold hundreds of thousands of them."""
    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        if self.microbatch == NO_MICROBATCH:
            return f"{self.stage}{self.kind}"
        return f"{self.stage}{self.kind}{self.microbatch}"

    def __repr__(self) -> str:
        return f"Action({self})"

    @property
    def parts(self) -> tuple["Action", ...]:
        """The actions this step runs: itself (a Compound has several)."""
        return (self,)

    @classmethod
    def parse(cls, text: str) -> "Action | Compound":
        """`Action.parse("1F3") == Action(1, "F", 3)`; `"3F5+4B0"` reads as a Compound."""
        text = text.strip()
        if "+" in text:
            return Compound(tuple(cls.parse(part) for part in text.split("+")))
        match = _ACTION_RE.match(text)
        if not match:
            raise ValueError(f"cannot read action {text!r}: expected <stage><kind><microbatch>, "
                             "e.g. 1F3 (or 1U without a microbatch, or 3F5+4B0 for a pair)")
        stage, kind, microbatch = match.groups()
        spec = KIND_SPECS.get(kind)
        if spec is None:
            raise ValueError(f"unknown action kind {kind!r} in {text!r}; known kinds: "
                             f"{', '.join(KIND_SPECS)}")
        if spec.per_microbatch != bool(microbatch):
            need = "needs a microbatch (e.g. 1F3)" if spec.per_microbatch else \
                "takes no microbatch (e.g. 1U)"
            raise ValueError(f"cannot read action {text!r}: kind {kind} {need}")
        return cls(int(stage), kind, int(microbatch) if microbatch else NO_MICROBATCH)


class Compound(tuple):
    """Actions of one rank scheduled as one step, e.g. an overlapped forward and backward of two
    microbatches. On a CPU the parts run one after the other; the step is drawn as one box."""

    def __new__(cls, parts) -> "Compound":
        parts = tuple(parts)
        if len(parts) < 2 or not all(type(p) is Action for p in parts):
            raise ValueError(f"a compound action joins two or more plain actions, got {parts!r}")
        return super().__new__(cls, parts)

    @property
    def parts(self) -> tuple[Action, ...]:
        return tuple(self)

    @property
    def kind(self) -> str:
        return "+".join(p.kind for p in self)

    @property
    def stage(self) -> int:
        return self[0].stage

    @property
    def microbatch(self) -> int:
        return self[0].microbatch

    def __str__(self) -> str:
        return "+".join(map(str, self))

    def __repr__(self) -> str:
        return f"Compound({self})"

    def __getnewargs__(self):      # pickles (a schedule is shipped to every worker)
        return (tuple(self),)


# Generators call these 10^5 times for a big pipeline: tuple.__new__ skips the named tuple's
# Python-level constructor (a third of a generator's time), with the same Action as result.
_new = tuple.__new__


def F(stage: int, microbatch: int) -> Action:
    return _new(Action, (stage, "F", microbatch))


def B(stage: int, microbatch: int) -> Action:
    return _new(Action, (stage, "B", microbatch))


def I(stage: int, microbatch: int) -> Action:  # noqa: E743 - the kind's own letter
    return _new(Action, (stage, "I", microbatch))


def W(stage: int, microbatch: int) -> Action:
    return _new(Action, (stage, "W", microbatch))
