"""torch.distributed.pipelining's schedule file, written and read back.

The file torch 2.13's `_PipelineScheduleRuntime._load_csv` reads, and so TorchTitan's
`--parallelism.pipeline_parallel_schedule_csv`: a CSV, one row per pipeline rank in rank order,
one cell per step of that rank, in the order it runs them:

    2F0                     stage 2, forward, microbatch 0     (F, B full backward, I, W as ours)
    (0F3;3B1)OVERLAP_F_B    two actions the rank runs as one step, forward then backward
    (empty)                 an idle slot in torch's own tables; it means nothing to the runtime

Torch infers which rank owns each stage from the row its actions are on (a V placement is in
the file), takes the microbatch count from the schedule object, and derives every send and
receive itself. Its "compute+comms" form (what `_dump_csv` writes by default) adds cells such as
`0SEND_F1`, `1RECV_F1`, `0SEND_B2`, `1RECV_B2`, `0UNSHARD`, `0RESHARD`, `0REDUCE_GRAD`: reading
drops them, and pipelab derives its own communication again (comm.py).

Only schedules whose every step torch has a word for export: F, B, I, W on stages of one route,
and a forward paired with a full backward. The rest is refused before anything is written,
saying what to use instead (`torch_refusal`). Schedule.to_csv is pipelab's own lossless format
(any kind, compounds written `0F3+3B1`); this module is the one torch reads.
"""
from __future__ import annotations

import csv
import io
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..checks import positive_int
from .actions import Action, Compound
from .kinds import KIND_SPECS, RECOMPUTE, SHARD_PASS, UPDATE, VERSION_SELECT

if TYPE_CHECKING:
    from .base import Schedule

TORCH_KINDS = ("F", "B", "I", "W")             # the compute actions torch's runtime runs
PAIR = "OVERLAP_F_B"                           # torch's name for a step of two actions
# Torch's communication and sharding cells (the compute+comms form): dropped on reading.
COMM_WORDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD")
_COMPUTE = re.compile(r"^(\d+)([FBIW])(\d+)$")
_COMM = re.compile(r"^(\d+)(" + "|".join(COMM_WORDS) + r")(\d*)$")
_PAIR = re.compile(r"^\((.*)\)" + PAIR + r"$")

# What to do instead, for the kinds torch's runtime has no action for (by kind, then by role).
_INSTEAD_KIND = {
    "R": "recomputation has no action in torch: wrap the stage module's blocks in activation "
         "checkpointing (torch.utils.checkpoint) and export the schedule without R",
    "G": "a replica sum belongs to a two-route schedule (chimera, dualpipe): torch sends every "
         "microbatch down one route of stages 0..N-1; export dualpipe-v, its one-route V form",
    "U": "an in-schedule optimizer update (the asynchronous schedules, PipeDream): torch's "
         "runtime runs one synchronous step and the optimizer after it; export a synchronous "
         "schedule (1f1b, zb-h1, zb-v)",
    "V": "a weight-version switch (the asynchronous schedules): torch keeps one weight version; "
         "export a synchronous schedule (1f1b, zb-h1, zb-v)",
    "AR": "torch reduces gradients itself (its REDUCE_GRAD, FSDP or DDP around the stage "
          "modules): export the schedule without data-parallel all-reduces",
    "Tp": "tensor parallelism lives inside torch's stage modules (torch.distributed.tensor."
          "parallel): export the pipeline schedule without its all-reduces",
    "Off": "activation offload has no action in torch: use torch.autograd.graph.save_on_cpu "
           "inside the stage module",
    "Re": "activation offload has no action in torch: use torch.autograd.graph.save_on_cpu "
          "inside the stage module",
    "Ed": "expert parallelism lives inside torch's stage modules: export the schedule without "
          "expert dispatch and combine",
    "Ec": "expert parallelism lives inside torch's stage modules: export the schedule without "
          "expert dispatch and combine",
}
_VOCAB = ("vocabulary-parallel passes have no action in torch: its stages hold whole layers, "
          "the output layer on the last stage; export the schedule they are built on (1f1b, "
          "v-half)")
_INSTEAD_ROLE = {RECOMPUTE: _INSTEAD_KIND["R"], SHARD_PASS: _VOCAB, UPDATE: _INSTEAD_KIND["U"],
                 VERSION_SELECT: _INSTEAD_KIND["V"]}
_BRAID = ("steps joining {kinds} (STP's braids join a forward with an I or a W to hide "
          "tensor-parallel all-reduces): torch's only two-action step is a forward with a full "
          "backward ({pair}); export zb-v or v-half, and keep tensor parallelism inside the "
          "stage modules")


# --- export ------------------------------------------------------------------------------------
def torch_refusal(schedule: "Schedule") -> str | None:
    """Why torch's runtime cannot run `schedule` as written (None: it can). Read from the
    schedule's structure and kinds, not its name, so a user's schedule is judged the same way."""
    reasons = []
    if schedule.routes is not None or schedule.slices is not None:
        reasons.append(f"{schedule.name} sends microbatches down {len(schedule.routes or ())} "
                       f"routes over replicas of the model's parts (their gradients summed in "
                       f"the schedule): torch's runtime has one route, stages 0..N-1 in order; "
                       f"export dualpipe-v (one route, a V) instead")
    foreign: dict[str, int] = Counter()
    braids: Counter = Counter()
    for acts in schedule.actions:
        for item in acts:
            parts = item.parts
            for part in parts:
                if part.kind not in TORCH_KINDS:
                    foreign[part.kind] += 1
            if len(parts) > 1 and sorted(p.kind for p in parts) != ["B", "F"]:
                braids["+".join(p.kind for p in parts)] += 1
    by_advice: dict[str, list[str]] = defaultdict(list)   # kinds with one advice: one line
    for kind, count in sorted(foreign.items()):
        spec = KIND_SPECS.get(kind)
        advice = _INSTEAD_KIND.get(kind) or _INSTEAD_ROLE.get(spec.role if spec else None) or (
            _VOCAB if spec is not None and spec.owner.endswith(".vocab") else
            "torch's runtime has no counterpart for it: export a schedule of F, B, I and W")
        what = spec.description if spec is not None else "unknown kind"
        by_advice[advice].append(f"{count} {kind} ({what})")
    for advice, kinds in by_advice.items():
        reasons.append(f"{'; '.join(kinds)}: {advice}")
    if braids and schedule.routes is None:    # (a two-route schedule's pairs are said above)
        shown = ", ".join(f"{k} ×{n}" for k, n in sorted(braids.items()))
        reasons.append(_BRAID.format(kinds=shown, pair=f"(0F3;3B1){PAIR}"))
    idle = [r for r, acts in enumerate(schedule.actions) if not acts]
    if idle:
        reasons.append(f"rank(s) {idle} run no action: torch's runtime needs a stage on every "
                       f"rank of the pipeline")
    if not reasons:
        return None
    return (f"torch.distributed.pipelining cannot run schedule {schedule.name!r} as written:\n  - "
            + "\n  - ".join(reasons))


def torch_cell(item: Action | Compound) -> str:
    """One step in torch's words: `2F0`, or a pair `(0F3;3B1)OVERLAP_F_B`."""
    if type(item) is Compound:
        return "(" + ";".join(map(str, item.parts)) + ")" + PAIR
    return str(item)


def to_torch_csv(schedule: "Schedule", path: str | Path | None = None) -> str:
    """torch's compute-only CSV of `schedule` (validated first; refused with ValueError, before
    anything is written, if torch cannot run it); written to `path` when given."""
    reason = torch_refusal(schedule)
    if reason is not None:
        raise ValueError(reason)
    schedule.validate()
    check_counts(schedule.actions, schedule.microbatches, len(schedule.placement))
    from .base import write_rows
    return write_rows(schedule.actions, torch_cell, path)


def check_counts(rows: Sequence[Sequence[Action | Compound]], microbatches: int,
                 stages: int) -> None:
    """Torch's counting rule, in our words: every stage forwards microbatches 0..m-1 once each
    and runs for each a full backward B or both halves I and W (torch asserts this inside
    `_load_csv`; here it is a ValueError naming the stage and microbatches)."""
    seen: dict[str, dict[int, Counter]] = {k: defaultdict(Counter) for k in TORCH_KINDS}
    for acts in rows:
        for item in acts:
            for s, kind, mb in item.parts:
                if kind in seen:
                    seen[kind][s][mb] += 1
    wanted = set(range(microbatches))
    for stage in range(stages):
        forwards = seen["F"][stage]
        twice = sorted(mb for mb, n in forwards.items() if n > 1)
        if twice:
            raise ValueError(f"stage {stage} forwards microbatch(es) {twice[:8]} more than once")
        if set(forwards) != wanted:
            missing, extra = sorted(wanted - set(forwards)), sorted(set(forwards) - wanted)
            raise ValueError(
                f"stage {stage} forwards {len(forwards)} microbatch(es), but the schedule has "
                f"{microbatches} (0..{microbatches - 1})"
                + (f": microbatch(es) {missing[:8]} missing" if missing else "")
                + (f": microbatch(es) {extra[:8]} beyond them" if extra else ""))
        for mb in range(microbatches):
            full, half_i, half_w = (seen[k][stage][mb] for k in ("B", "I", "W"))
            if (full, half_i, half_w) not in ((1, 0, 0), (0, 1, 1)):
                raise ValueError(
                    f"stage {stage} microbatch {mb} has a forward but {full} full backward(s) B, "
                    f"{half_i} I and {half_w} W: it needs one B, or one I and one W")


# --- import ------------------------------------------------------------------------------------
def parse_torch_cell(text: str, where: str) -> Action | Compound | None:
    """One cell of torch's file: an Action, a Compound (a pair), or None (idle, or a
    communication / sharding cell, which pipelab derives itself)."""
    text = text.strip()
    if not text or _COMM.match(text):
        return None
    match = _PAIR.match(text)
    if match:
        parts = [parse_torch_cell(p, where) for p in match.group(1).split(";") if p.strip()]
        if len(parts) < 2 or not all(type(p) is Action for p in parts):
            raise ValueError(f"{where}: cannot read {text[:60]!r}: a pair holds two or more "
                             f"compute actions, e.g. (0F3;3B1){PAIR}")
        return Compound(parts)
    match = _COMPUTE.match(text)
    if not match:
        raise ValueError(f"{where}: cannot read {text[:60]!r} as one of torch's actions: "
                         f"expected e.g. 2F0, 2B0, 2I0, 2W0, (0F3;3B1){PAIR}, or a "
                         f"communication cell ({', '.join(COMM_WORDS)})")
    stage, kind, mb = match.groups()
    return Action(int(stage), kind, int(mb))


def rows_from_torch_text(text: str) -> list[list[Action | Compound]]:
    """Each rank's compute steps, read from torch's CSV text (either form)."""
    rows, blank = [], []
    for rank, cells in enumerate(csv.reader(io.StringIO(text))):
        row = [parse_torch_cell(c, f"row {rank + 1} (rank {rank}), cell {i + 1}")
               for i, c in enumerate(cells)]
        rows.append([item for item in row if item is not None])
        blank.append(not any(c.strip() for c in cells))
    while rows and blank[-1]:
        rows.pop()                # a trailing blank line is not a rank
        blank.pop()
    return rows


def schedule_from_rows(cls, rows: list, microbatches: int | None, name: str | None,
                       renumber: bool = False) -> "Schedule":
    """A validated Schedule from each rank's compute steps, read from torch: the placement
    inferred (torch's own rule: a stage lives where its actions are), the counts checked."""
    if not rows:
        raise ValueError("the torch schedule has no rows (one row per pipeline rank)")
    idle = [r for r, row in enumerate(rows) if not row]
    if idle:
        raise ValueError(f"rank(s) {idle} have no compute action: torch's runtime needs a stage "
                         f"on every rank")
    owner: dict[int, int] = {}
    for rank, row in enumerate(rows):
        for item in row:
            for part in item.parts:
                if owner.setdefault(part.stage, rank) != rank:
                    raise ValueError(f"stage {part.stage} has actions on rank {owner[part.stage]} "
                                     f"and rank {rank} ({part}): torch places each stage on the "
                                     f"one rank whose row holds its actions")
    if renumber:
        rows = _renumbered(rows)
    top = max(part.microbatch for row in rows for item in row for part in item.parts)
    if microbatches is None:
        microbatches = top + 1
    positive_int("microbatches", microbatches)
    stages = max(owner) + 1
    missing = [s for s in range(stages) if s not in owner]
    if missing:
        raise ValueError(f"stage(s) {missing[:8]} have no action on any rank (the file names "
                         f"stages up to {stages - 1})")
    check_counts(rows, microbatches, stages)
    return cls._from_rows(rows, None, microbatches, name or "torch").validate()


def _renumbered(rows: list) -> list:
    """Each rank's microbatches numbered as a single-stage torch runtime counts them: its k-th
    forward is microbatch k, its k-th backward microbatch k (see `from_torch`)."""
    out = []
    for row in rows:
        count: Counter = Counter()
        new = []
        for item in row:
            parts = []
            for s, kind, _ in item.parts:
                parts.append(Action(s, kind, count[kind]))
                count[kind] += 1
            new.append(parts[0] if len(parts) == 1 else Compound(parts))
        out.append(new)
    return out


def rows_from_torch(obj: Any) -> tuple[list, int, bool]:
    """(each rank's compute steps, the microbatch count, whether the rows come from a
    single-stage class) of a torch schedule instance, read from its table, never run."""
    try:
        from torch.distributed.pipelining.schedules import (PipelineScheduleSingle,
                                                            _PipelineSchedule)
    except ImportError as err:                   # pragma: no cover - torch is a dependency
        raise ValueError(f"reading a torch schedule needs torch.distributed.pipelining: {err}")
    if not isinstance(obj, _PipelineSchedule):
        raise ValueError(f"from_torch takes a torch.distributed.pipelining schedule instance "
                         f"(ScheduleGPipe ... ScheduleDualPipeV, or a _PipelineScheduleRuntime "
                         f"after _load_csv), got {type(obj).__name__}")
    order = getattr(obj, "pipeline_order", None) or getattr(obj, "pipeline_order_with_comms",
                                                            None)
    if not order:
        raise ValueError(f"{type(obj).__name__} has no schedule table (pipeline_order is empty): "
                         f"build a torch class that makes one, or call _load_csv on a "
                         f"_PipelineScheduleRuntime first")
    rows = []
    for rank in range(len(order)):
        if rank not in order:
            raise ValueError(f"{type(obj).__name__}'s table has no row for rank {rank}")
        row = [parse_torch_cell(str(a), f"rank {rank}, step {i}")
               for i, a in enumerate(order[rank]) if a is not None]
        rows.append([item for item in row if item is not None])
    return rows, obj._n_microbatches, isinstance(obj, PipelineScheduleSingle)


def torch_instance(cls_or_name: str | type, ranks: int, microbatches: int,
                   stages_per_rank: int | None = None, csv_path: str | Path | None = None):
    """A torch schedule object built without any process group (stand-in stages, as torch's own
    `_schedule_visualizer` builds them): its table is readable, it never runs. `cls_or_name`: a
    class or its name (`"ScheduleZBVZeroBubble"`, or torch's short name `"ZBVZeroBubble"`).
    With `csv_path`, a `_PipelineScheduleRuntime` that loads the file with torch's own
    `_load_csv` (torch's parser and checks; its lowering to sends and receives)."""
    from unittest import mock

    from torch.distributed.pipelining import PipelineStage, schedules
    positive_int("ranks", ranks)
    positive_int("microbatches", microbatches)
    if csv_path is not None:
        cls = schedules._PipelineScheduleRuntime
    elif isinstance(cls_or_name, str):
        cls = getattr(schedules, cls_or_name, None)
        if not isinstance(cls, type):
            cls = schedules.get_schedule_class(cls_or_name)
    else:
        cls = cls_or_name
    single = issubclass(cls, schedules.PipelineScheduleSingle)
    per_rank = stages_per_rank or (1 if single else 2)
    positive_int("stages_per_rank", per_rank)
    if single and per_rank != 1:
        raise ValueError(f"{cls.__name__} runs one stage per rank, not {per_rank}")
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod = 0, ranks, None
    stage.num_stages = ranks * per_rank
    obj = cls(stage, microbatches) if single else cls([stage] * per_rank, microbatches)
    if csv_path is not None:
        obj._load_csv(str(csv_path))
    return obj


# --- TorchTitan ---------------------------------------------------------------------------------
# TorchTitan (checked against its main branch, torchtitan/distributed/pipeline_parallel.py and
# config/configs.py) loads a schedule file into a _PipelineScheduleRuntime, but builds each
# rank's stages from --parallelism.pipeline_parallel_schedule: a single-stage class gives one
# stage per rank; a multi-stage class two per rank (or as pipeline_parallel_layers_per_stage
# makes them), placed in a V for ZBVZeroBubble and DualPipeV and in a loop otherwise. The class
# must therefore place stages as the file does. ZBVZeroBubble is the V class its metrics know
# (they read the loss on rank 0 for it only), so it is named for every V file.
TITAN_SINGLE, TITAN_LOOP, TITAN_V = "1F1B", "Interleaved1F1B", "ZBVZeroBubble"
TITAN_DEFAULT_TOKENS = 16384       # TorchTitan's training.num_tokens_per_microbatch_per_dp_rank


def titan_schedule_class(schedule: "Schedule") -> str | None:
    """The TorchTitan schedule name whose stage placement is `schedule`'s (None: none is)."""
    from .placement import loop_placement, v_placement
    p, placement = schedule.ranks, schedule.placement
    if placement == loop_placement(p, 1):
        return TITAN_SINGLE
    if p > 1 and placement == v_placement(p):
        return TITAN_V
    if len(placement) % p == 0 and placement == loop_placement(p, len(placement) // p):
        return TITAN_LOOP
    return None


def titan_layers_per_stage(stages: int, layers: int) -> int | None:
    """A pipeline_parallel_layers_per_stage L that makes TorchTitan cut `layers` blocks (plus
    one weight each for the embedding and the output layer) into exactly `stages` stages."""
    for per_stage in range(1, layers + 3):
        if -(-(layers + 2) // per_stage) == stages:
            return per_stage
    return None


def torchtitan_flags(schedule: "Schedule", csv_path: str | Path, *,
                     tokens_per_microbatch: int = TITAN_DEFAULT_TOKENS,
                     layers: int | None = None) -> tuple[list[str], list[str]]:
    """(TorchTitan's command-line flags that train with the exported file, notes to print
    beside them). Flag names as in TorchTitan's main branch; older releases took the microbatch
    size as --parallelism.pipeline_parallel_microbatch_size (sequences) instead of tokens."""
    positive_int("tokens_per_microbatch", tokens_per_microbatch)
    flags = [f"--parallelism.pipeline_parallel_degree {schedule.ranks}",
             f"--parallelism.pipeline_parallel_schedule_csv {csv_path}"]
    notes = []
    name = titan_schedule_class(schedule)
    if name is None:
        notes.append(f"no TorchTitan schedule places stages as this file does (placement "
                     f"{','.join(map(str, schedule.placement))}): TorchTitan places them in a "
                     f"loop or a V; load the file with your own _PipelineScheduleRuntime")
    else:
        flags.append(f"--parallelism.pipeline_parallel_schedule {name}")
        shape = {TITAN_SINGLE: "one per rank", TITAN_V: "a V: rank r holds stages r and "
                 f"{2 * schedule.ranks - 1}-r", TITAN_LOOP: "a loop: rank r holds stages r, "
                 f"r+{schedule.ranks}, ..."}[name]
        notes.append(f"--parallelism.pipeline_parallel_schedule {name} only places the stages "
                     f"({shape}); the file decides the order")
    per_rank = schedule.stages // schedule.ranks
    if name == TITAN_LOOP and per_rank != 2:
        if layers is not None:
            positive_int("layers", layers)
            per_stage = titan_layers_per_stage(schedule.stages, layers)
            if per_stage is None:
                notes.append(f"{layers} layers cannot be cut into {schedule.stages} stages")
            else:
                flags.append(f"--parallelism.pipeline_parallel_layers_per_stage {per_stage}")
        else:
            notes.append(f"{per_rank} stages per rank: add --parallelism.pipeline_parallel_"
                         f"layers_per_stage L with ceil((layers + 2) / L) = {schedule.stages} "
                         f"(give --layers and it is computed)")
    flags += [f"--parallelism.num_pp_microbatches {schedule.microbatches}",
              f"--training.num_tokens_per_microbatch_per_dp_rank {tokens_per_microbatch}"]
    return flags, notes


def torchtitan_command(schedule: "Schedule", csv_path: str | Path, *, module: str = "llama3",
                       config: str = "llama3_8b", **options) -> str:
    """TorchTitan's launch line (its run_train.sh) with `torchtitan_flags`, one flag a line;
    NGPU is the pipeline's ranks (multiply it by any other parallel degree you add)."""
    flags, _notes = torchtitan_flags(schedule, csv_path, **options)
    head = f"NGPU={schedule.ranks} MODULE={module} CONFIG={config} ./run_train.sh"
    return " \\\n  ".join([head] + flags)
