"""Schedule: for each rank, the ordered list of compute actions it runs.

A schedule is plain data. The validator, the simulator, the runtime and the plots all read the
same object; communication is derived from it (see `comm.py`), never written by hand.
"""
from __future__ import annotations

import csv
import io
import operator
import re
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Iterable, Sequence

from ..support.atomic import write_text
from ..checks import MAX_ACTIONS, MAX_MICROBATCHES, MAX_RANKS, MAX_STAGES, at_most, positive_int
from .actions import Action
from .graph import inputs_of, step_dependencies
from .grid import render_grid
from .kinds import DEFAULT_PRODUCER, INPUT_GRADIENT, KIND_SPECS, VERSION
from .routes import route_links
from .validate import validate

IDLE_MARKS = {".", "-", "_"}
# A schedule read from text or CSV: parsing costs ~15 µs and ~400 bytes an action, so 1.5 M
# actions took 20 s and 600 MB before any check. Far above what anyone writes or exports.
MAX_TEXT_ACTIONS = 200_000
_CELL = re.compile(r"[^\s,]+")
_new = tuple.__new__     # builds an Action without the named tuple's slower constructor


@dataclass
class Schedule:
    actions: list[list[Action]]          # actions[rank] in execution order
    placement: tuple[int, ...]           # placement[stage] = rank that owns the stage
    microbatches: int
    name: str = "custom"
    # Where a microbatch goes (routes.py): each route is the stages a microbatch passes through,
    # in order, and slices[stage] the part of the model a stage computes. None: one route
    # through every stage, stage s computing part s. Two stages computing one part are weight
    # replicas (DualPipe, Chimera) whose gradients the schedule must sum.
    routes: tuple[tuple[int, ...], ...] | None = None
    slices: tuple[int, ...] | None = None
    _index: dict = field(default=None, init=False, repr=False, compare=False)
    _checked: tuple = field(default=None, init=False, repr=False, compare=False)
    _links: tuple = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.actions = [list(rank_actions) for rank_actions in self.actions]
        self.placement = tuple(self.placement)
        if self.routes is not None:
            self.routes = tuple(tuple(route) for route in self.routes)
        if self.slices is not None:
            self.slices = tuple(self.slices)

    def __getstate__(self) -> dict:
        # The caches are rebuilt on demand; shipping them to every worker would triple the message.
        return {**self.__dict__, "_index": None, "_checked": None, "_links": None}

    # --- shape -------------------------------------------------------------------------------
    @property
    def ranks(self) -> int:
        return len(self.actions)

    @property
    def stages(self) -> int:
        return len(self.placement)

    @property
    def chunks(self) -> int:
        """Stages per rank (v in the papers); 1 for a plain pipeline."""
        return max(1, self.stages // max(1, self.ranks))

    def stages_of(self, rank: int) -> list[int]:
        return [s for s, r in enumerate(self.placement) if r == rank]

    def rank_of(self, stage: int) -> int:
        return self.placement[stage]

    # --- routes and replicas (routes.py) ----------------------------------------------------
    def links(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(previous, next) stage of each stage on its route; -1 where the route starts / ends."""
        if self._links is None or self._links[0] != (self.routes, len(self.placement)):
            self._links = ((self.routes, len(self.placement)), route_links(self))
        return self._links[1]

    def slice_of(self, stage: int) -> int:
        """The part of the model `stage` computes (itself unless the schedule has replicas)."""
        return stage if self.slices is None else self.slices[stage]

    @property
    def model_slices(self) -> int:
        """How many parts the model is cut into (fewer than stages when stages are replicas)."""
        return len(self.placement) if self.slices is None else max(self.slices) + 1

    def loss_stages(self) -> list[int]:
        """The stages that end a route (and compute the loss of its microbatches)."""
        return [s for s, after in enumerate(self.links()[1]) if after < 0]

    def __len__(self) -> int:
        return sum(len(a) for a in self.actions)

    def kinds(self) -> set[str]:
        """The action kinds the schedule uses (a compound's parts counted one by one)."""
        return {part.kind for acts in self.actions for item in acts for part in item.parts}

    # --- dependencies (read from the kind specs: kinds.py, graph.py) ---------------------------
    def reindex(self) -> None:
        """Recompute which action produces each output where it is not the usual one (the input
        gradient of a stage comes from its B, or from its I when the backward is split)."""
        # Only producers other than the default are indexed: a 1F1B schedule needs no entry.
        output_of = {k: spec.output for k, spec in KIND_SPECS.items()
                     if spec.output and DEFAULT_PRODUCER.get(spec.output) != k}
        index = {}
        for acts in self.actions:
            for item in acts:
                for a in ((item,) if type(item) is Action else item):
                    out = output_of.get(a[1])
                    if out is not None:
                        index[(out, a[0], a[2])] = a
        self._index = index

    def producer_of(self, output: str, stage: int, microbatch: int) -> Action:
        """The action that produces `output` ("activation", "input gradient") of a stage for a
        microbatch; when the schedule has none, the kind that would (for error messages)."""
        index = self._index
        if index is None:
            self.reindex()
            index = self._index
        found = index.get((output, stage, microbatch))
        if found is not None:
            return found
        return _new(Action, (stage, DEFAULT_PRODUCER.get(output, "?"), microbatch))

    def input_grad_action(self, stage: int, microbatch: int) -> Action:
        """The action that produces the gradient of `stage`'s input: its B, or its I when split."""
        return self.producer_of(INPUT_GRADIENT, stage, microbatch)

    def inputs(self, action: Action) -> list:
        """The input edges of one action (graph.py)."""
        return inputs_of(self, action)

    def dependencies(self, action) -> list[Action]:
        """Actions that must finish before `action` (or a compound step) can start."""
        return step_dependencies(self, action)

    def execution_order(self):
        """A validated execution order (graph.py), cached while the schedule is unchanged."""
        key = (self.placement, self.microbatches, tuple(map(tuple, self.actions)), VERSION[0])
        if self._checked is None or self._checked[0] != key:
            self._checked = (key, validate(self))
        return self._checked[1]

    # --- text form ---------------------------------------------------------------------------
    def to_text(self) -> str:
        """One line per rank, actions separated by spaces, after a header that pins the shape."""
        header = (f"# name={self.name} microbatches={self.microbatches} "
                  f"placement={','.join(map(str, self.placement))}")
        if self.routes is not None:
            header += " routes=" + ";".join(",".join(map(str, r)) for r in self.routes)
        if self.slices is not None:
            header += " slices=" + ",".join(map(str, self.slices))
        return "\n".join([header] + [" ".join(map(str, acts)) for acts in self.actions]) + "\n"

    @classmethod
    def from_text(cls, text: str, *, placement: Sequence[int] | None = None,
                  microbatches: int | None = None, name: str | None = None) -> "Schedule":
        """Read one line per rank (`0F0 0F1 0B0 ...`), in rank order, or every line labelled
        `rank N:` (then each line goes to its labelled rank, in any order; every rank from 0
        up must have exactly one line).

        Stages, placement and microbatch count are inferred unless given (or unless the
        `# name=... microbatches=... placement=...` header written by `to_text` is present).
        """
        if not isinstance(text, str):
            raise ValueError(f"text must be a str (one line per rank), got {type(text).__name__}")
        _check_size(text)
        rows: list[list[Action]] = []
        labels: list[int | None] = []
        routing: dict = {}
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if line.startswith("#"):
                meta = dict(tok.split("=", 1) for tok in line[1:].split() if "=" in tok)
                unknown = sorted(set(meta) - set(HEADER_KEYS))
                if unknown:
                    raise ValueError(f"line {number}: unknown header key {unknown[0]!r} in "
                                     f"{_clip(line)!r}; the header's keys are "
                                     f"{', '.join(HEADER_KEYS)}")
                name = name or meta.get("name")
                try:
                    if microbatches is None and "microbatches" in meta:
                        microbatches = int(meta["microbatches"])
                    if placement is None and "placement" in meta:
                        placement = [int(r) for r in meta["placement"].split(",")]
                    if "routes" in meta:
                        routing["routes"] = [[int(st) for st in route.split(",")]
                                             for route in meta["routes"].split(";")]
                    if "slices" in meta:
                        routing["slices"] = [int(st) for st in meta["slices"].split(",")]
                except ValueError:
                    raise ValueError(f"line {number}: cannot read the header {_clip(line)!r}: "
                                     f"expected microbatches=<int> placement=<int>,<int>,...") \
                        from None
                continue
            if not line:
                continue
            label = None
            if ":" in line:
                head, line = line.split(":", 1)
                label = _rank_label(head, number)
            rows.append(_parse_cells(line.replace(",", " ").split()))
            labels.append((label, number))
        result = cls._from_rows(_order_rows(rows, labels), placement, microbatches, name)
        if routing:
            result = replace(result, **routing)
        return result

    def to_csv(self, path: str | Path | None = None) -> str:
        """pipelab's own CSV: one row per rank, one cell per action in pipelab's words (any kind;
        a compound step written `0F3+3B1`). Lossless for the actions, read back by `from_csv`
        (routes and slices are given there). It is NOT torch's format: torch reads `0F3+3B1` as
        `0F3`. For torch.distributed.pipelining and TorchTitan, use `to_torch_csv`."""
        return write_rows(self.actions, str, path)

    @classmethod
    def from_csv(cls, path_or_text: str | Path, *, placement: Sequence[int] | None = None,
                 microbatches: int | None = None, name: str | None = None,
                 routes: Sequence[Sequence[int]] | None = None,
                 slices: Sequence[int] | None = None) -> "Schedule":
        """Read one row per rank. The CSV holds only actions: a bidirectional schedule's
        `routes` and `slices` (routes.py) are given here, as `placement` may be."""
        if not isinstance(path_or_text, (str, Path)):
            raise ValueError(f"from_csv takes a path or the CSV text as a str, got "
                             f"{type(path_or_text).__name__}")
        text = _csv_text(path_or_text)
        _check_size(text)
        rows = [_parse_cells(cells) for cells in csv.reader(io.StringIO(text))]
        result = cls._from_rows(rows, placement, microbatches, name)
        if routes is not None or slices is not None:
            result = replace(result, routes=routes, slices=slices)
        return result

    # --- torch.distributed.pipelining's file (torch_format.py) ------------------------------
    def to_torch_csv(self, path: str | Path | None = None) -> str:
        """torch 2.13's compute-only schedule CSV, the file `_PipelineScheduleRuntime._load_csv`
        and TorchTitan's `--parallelism.pipeline_parallel_schedule_csv` read: one row per rank,
        `2F0`, `2B0`, `2I0`, `2W0`, pairs as `(0F3;3B1)OVERLAP_F_B`. A schedule torch cannot run
        (recomputation, vocabulary passes, braids, in-schedule updates, replica sums) is refused
        with a ValueError saying what to do instead, before anything is written."""
        from .torch_format import to_torch_csv
        return to_torch_csv(self, path)

    @classmethod
    def from_torch_csv(cls, path_or_text: str | Path, *, microbatches: int | None = None,
                       name: str | None = None) -> "Schedule":
        """Read torch's schedule CSV, compute-only or the compute+comms form torch dumps (its
        SEND/RECV/UNSHARD/RESHARD/REDUCE_GRAD cells are dropped; pipelab derives its own). The
        placement is inferred as torch infers it (a stage lives on the row of its actions);
        microbatches, when given, must be exactly those the file forwards on every stage."""
        from .torch_format import rows_from_torch_text, schedule_from_rows
        if not isinstance(path_or_text, (str, Path)):
            raise ValueError(f"from_torch_csv takes a path or the CSV text as a str, got "
                             f"{type(path_or_text).__name__}")
        text = _csv_text(path_or_text)
        _check_size(text)
        return schedule_from_rows(cls, rows_from_torch_text(text), microbatches, name)

    @classmethod
    def from_torch(cls, schedule: object, *, name: str | None = None) -> "Schedule":
        """A torch schedule instance (ScheduleGPipe ... ScheduleDualPipeV, or a
        `_PipelineScheduleRuntime` after `_load_csv`) as a pipelab Schedule, read from its table
        (`pipeline_order`), never run. For the single-stage classes (ScheduleGPipe,
        Schedule1F1B) the table is a drawing: their runtime runs its own loop, counting each
        rank's forwards and backwards 0, 1, 2, ...; torch 2.13's Schedule1F1B table numbers the
        last rank's forwards 1..m. Their microbatches are renumbered in that count, so the
        result is the order their runtime executes."""
        from .torch_format import rows_from_torch, schedule_from_rows
        rows, microbatches, single = rows_from_torch(schedule)
        return schedule_from_rows(cls, rows, microbatches, name or f"torch:{type(schedule).__name__}",
                                  renumber=single)

    @classmethod
    def _from_rows(cls, rows, placement, microbatches, name) -> "Schedule":
        at_most("ranks", len(rows), MAX_RANKS)
        all_actions = [a for row in rows for item in row for a in item.parts]
        at_most("actions", len(all_actions), MAX_ACTIONS)
        if not all_actions:
            raise ValueError("the schedule has no actions")
        if microbatches is not None:
            at_most("microbatches", positive_int("microbatches", microbatches), MAX_MICROBATCHES)
        if placement is not None:
            placement = _placement(placement, len(rows))
        top_stage = max(a.stage for a in all_actions)
        if top_stage >= MAX_STAGES:
            raise ValueError(f"action {_first(all_actions, lambda a: a.stage == top_stage)} "
                             f"names stage {top_stage}, above the limit of {MAX_STAGES:,} stages")
        top_microbatch = max(a.microbatch for a in all_actions)
        if top_microbatch >= MAX_MICROBATCHES:
            raise ValueError(
                f"action {_first(all_actions, lambda a: a.microbatch == top_microbatch)} names "
                f"microbatch {top_microbatch}, above the limit of {MAX_MICROBATCHES:,}")
        if placement is not None:
            _check_placement(placement, rows)
        else:
            owner: dict[int, int] = {}
            for rank, row in enumerate(rows):
                for a in (a for item in row for a in item.parts):
                    if KIND_SPECS[a.kind].collective:
                        continue           # a collective runs on several ranks by design
                    if owner.setdefault(a.stage, rank) != rank:
                        raise ValueError(
                            f"stage {a.stage} appears on rank {owner[a.stage]} and rank {rank}; "
                            "pass placement=[...] to say which rank owns each stage")
            n_stages = max(owner) + 1
            missing = [s for s in range(n_stages) if s not in owner]
            if missing:
                raise ValueError(f"stage(s) {_listed(missing)} appear on no rank; "
                                 f"pass placement=[...]")
            placement = [owner[s] for s in range(n_stages)]
        if microbatches is None:
            microbatches = top_microbatch + 1
        return cls(rows, tuple(placement), microbatches, name or "custom")

    # --- display -----------------------------------------------------------------------------
    def grid(self, mark: Iterable[tuple[int, int]] = (), window: int | None = None) -> str:
        return render_grid(self, mark=mark, window=window)

    def __str__(self) -> str:
        return self.grid()

    def validate(self) -> "Schedule":
        """Raise ScheduleError (with the grid, the bad step marked) unless the schedule is sound."""
        self.execution_order()      # validates, and caches the order that simulate() reuses
        return self


def write_rows(actions, cell, path: str | Path | None = None) -> str:
    """CSV text of one row per rank, `cell(step)` per step; written to `path` when given."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for acts in actions:
        writer.writerow([cell(a) for a in acts])
    text = buf.getvalue()
    if path is not None:
        write_text(path, text)       # beside the target, then renamed: never half a file
    return text


HEADER_KEYS = ("name", "microbatches", "placement", "routes", "slices")   # what to_text writes


def _csv_text(path_or_text: str | Path) -> str:
    """The CSV itself: read from a Path, or from a str naming an existing file; else the str. A
    str that can only be a path (one line, a folder separator or a file suffix, and no file
    there) is refused: read as CSV text it would be misread as actions."""
    if isinstance(path_or_text, Path) or ("\n" not in path_or_text and (
            "/" in path_or_text or "\\" in path_or_text
            or path_or_text.lower().endswith((".csv", ".txt")))):
        path = Path(path_or_text)
        try:
            return path.read_text()
        except FileNotFoundError:
            raise ValueError(f"from_csv: the file {str(path)!r} does not exist") from None
        except OSError as err:
            raise ValueError(f"from_csv: cannot read {str(path)!r}: {err.strerror}") from None
    try:
        if "\n" not in path_or_text and Path(path_or_text).is_file():
            return Path(path_or_text).read_text()
    except OSError:        # a one-line schedule longer than a file name can be
        pass
    return path_or_text


def _check_size(text: str) -> None:
    """Refuse a text of more than MAX_TEXT_ACTIONS cells before parsing any (a cell is at least
    three characters and a separator, so short texts are not even counted)."""
    if (len(text) + 1) // 4 <= MAX_TEXT_ACTIONS:
        return
    # counted up to one past the limit, not stored
    if sum(1 for _ in islice(_CELL.finditer(text), MAX_TEXT_ACTIONS + 1)) > MAX_TEXT_ACTIONS:
        raise ValueError(f"the schedule text holds more than {MAX_TEXT_ACTIONS:,} cells (actions), "
                         f"the limit for a schedule read from text or CSV: build a schedule "
                         f"that large with pl.schedule(...) or pl.Schedule(actions, ...)")


def _parse_cells(cells: Iterable[str]) -> list[Action]:
    return [Action.parse(c) for c in (c.strip() for c in cells) if c and c not in IDLE_MARKS]


_LABEL = re.compile(r"^\s*rank\s*(\d{1,9})\s*$", re.IGNORECASE)


def _rank_label(head: str, number: int) -> int:
    match = _LABEL.match(head)
    if not match:
        raise ValueError(f"line {number}: cannot read the label {_clip(head)!r}: a line may start "
                         f"with 'rank N:' and nothing else")
    return int(match.group(1))


def _order_rows(rows: list, labels: list) -> list:
    """Rows in rank order: as written when no line is labelled, else by their `rank N:` labels
    (`labels` holds (label or None, line number) per row),
    which must then label every line and name each rank 0..R-1 exactly once."""
    if all(label is None for label, _ in labels):
        return rows
    unlabelled = [number for label, number in labels if label is None]
    if unlabelled:
        raise ValueError(f"some lines are labelled 'rank N:' and some are not (line "
                         f"{unlabelled[0]} is not): label every line or none")
    by_rank: dict[int, list] = {}
    for (label, number), row in zip(labels, rows):
        if label in by_rank:
            raise ValueError(f"line {number}: rank {label} has a line already: label each rank "
                             f"once")
        by_rank[label] = row
    missing = [r for r in range(len(rows)) if r not in by_rank]
    if missing:
        raise ValueError(f"the lines are labelled rank {_listed(sorted(by_rank))}: rank "
                         f"{missing[0]} has no line (ranks are numbered 0..{len(rows) - 1}, "
                         f"one line each)")
    return [by_rank[r] for r in range(len(rows))]


def _placement(placement, ranks: int) -> list[int]:
    try:
        values = list(placement)
        at_most("placement (stages)", len(values), MAX_STAGES)
        return [operator.index(r) for r in values]
    except TypeError:
        raise ValueError(f"placement must be a list of integer ranks, one per stage, got "
                         f"{_clip(repr(placement))}") from None


def _check_placement(placement: list[int], rows: list) -> None:
    """A given placement (argument or header) must name exactly the stages the actions use: a
    stage without any action would be reported later as a missing forward, a stage beyond it
    as a bad action. (A stage on the wrong rank is the validator's: it marks it in the grid.)"""
    used = {a.stage for row in rows for item in row for a in item.parts
            if not KIND_SPECS[a.kind].collective}     # a collective may name any stage
    if not used:
        return
    shown, stages = _clip(",".join(map(str, placement))), max(used) + 1
    if stages > len(placement):
        raise ValueError(f"placement {shown} has {len(placement)} stage(s), but the actions use "
                         f"stage {max(used)}: give one rank per stage ({stages} entries)")
    idle = [s for s in range(len(placement)) if s not in used]
    if idle:
        raise ValueError(f"placement {shown} has {len(placement)} stages, but stage(s) "
                         f"{_listed(idle)} have no action on any rank: give one rank per stage "
                         f"the actions use ({stages} entries)")


def _listed(values: list, shown: int = 8) -> str:
    """`[0, 1, 2]`, or `[0, 1, ..., 7] (3,000,000 in all)` for a long list: messages stay short."""
    if len(values) <= shown:
        return str(list(values))
    return f"[{', '.join(map(str, values[:shown]))}, ...] ({len(values):,} in all)"


def _first(actions, test) -> str:
    return str(next(a for a in actions if test(a)))


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
