"""Actions: the words of the schedule language, written like `1F3` (stage 1, forward, microbatch 3).

Kinds follow PyTorch's convention, which avoids the two meanings of "B" in the papers:
F forward, B full backward (= I + W), I input-gradient backward, W weight-gradient backward.
Later schedules add kinds with `register_kind`; the text form stays <stage><KIND><microbatch>.
"""
from __future__ import annotations

import re
from typing import NamedTuple

KINDS: dict[str, str] = {
    "F": "forward",
    "B": "full backward (I + W)",
    "I": "input-gradient backward",
    "W": "weight-gradient backward",
}

# Kinds that send a gradient to the previous stage (and so end the stage's backward chain).
INPUT_GRAD_KINDS = {"B", "I"}

_ACTION_RE = re.compile(r"^(\d+)([A-Z][A-Za-z]*)(\d+)$")


def register_kind(kind: str, description: str) -> None:
    """Add an action kind (upper-case first letter); later issues use this for new passes."""
    if not re.fullmatch(r"[A-Z][A-Za-z]*", kind):
        raise ValueError(f"an action kind is an upper-case letter followed by letters, got {kind!r}")
    KINDS[kind] = description


class Action(NamedTuple):
    """One compute step; a named tuple because schedules hold hundreds of thousands of them."""
    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    def __repr__(self) -> str:
        return f"Action({self})"

    @classmethod
    def parse(cls, text: str) -> "Action":
        """`Action.parse("1F3") == Action(1, "F", 3)`."""
        match = _ACTION_RE.match(text.strip())
        if not match:
            raise ValueError(f"cannot read action {text!r}: expected <stage><kind><microbatch>, e.g. 1F3")
        stage, kind, microbatch = match.groups()
        if kind not in KINDS:
            raise ValueError(f"unknown action kind {kind!r} in {text!r}; known kinds: {', '.join(KINDS)}")
        return cls(int(stage), kind, int(microbatch))

    @property
    def is_forward(self) -> bool:
        return self.kind == "F"

    @property
    def is_backward(self) -> bool:
        return self.kind in ("B", "I", "W")


def F(stage: int, microbatch: int) -> Action:
    return Action(stage, "F", microbatch)


def B(stage: int, microbatch: int) -> Action:
    return Action(stage, "B", microbatch)


def I(stage: int, microbatch: int) -> Action:  # noqa: E743 - the kind's own letter
    return Action(stage, "I", microbatch)


def W(stage: int, microbatch: int) -> Action:
    return Action(stage, "W", microbatch)
