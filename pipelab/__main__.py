"""Command line: run a pipeline schedule for real and print what was measured.

    python -m pipelab run --schedule 1f1b --ranks 2 --microbatches 8 --trace run.json
    torchrun --nproc-per-node 2 -m pipelab run --schedule 1f1b --microbatches 8
    python -m pipelab run --engine torch --schedule zb-v    # on torch's pipelining runtime
    python -m pipelab run --model mymodel --schedule zb-h1      # your own model (mymodel.py)
    python -m pipelab export --schedule zb-v --ranks 8 --microbatches 24 -o zbv.csv  # torch's file

Without torchrun the ranks are a LocalCluster of spawned workers. Under torchrun (RANK and
WORLD_SIZE set) every process joins the gloo group through env:// and runs its own rank
directly; rank 0 gathers the reports and prints the same table. That is also the way to run on
several machines. Two differences there: a stuck run ends with gloo's own timeout error rather
than a PipelineTimeout with the grid, and measured timelines compare the monotonic clocks of
different processes, exact on one machine but only approximate across machines (the replay
does not depend on clocks).
"""
from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

import pipelab as pl

from . import SCHEDULES
from .support.atomic import check_target, write_text
from .runtime.spec import check_timeout, prepare_run
from .runtime import LocalCluster, PipelineTimeout, WorkerError, assemble, run_rank
from .checks import MAX_LOCAL_RANKS, at_most, check_steps, positive_int
from .runtime.executor import warm_up
from .sim.partition import partition_for_run

EPILOG = """\
The table shows the makespan and bubble fraction measured (wall clock), replayed (the
simulator fed each action's measured CPU time: what dedicated cores would show) and simulated
(one median cost per stage and kind); the loss and the largest relative gradient error against
the unsplit model on the same batch; and the peak live activation bytes per rank.
Under torchrun a stuck run ends with gloo's own timeout error (no grid), and measured times
across machines are only approximate (each machine has its own clock).

Your own model: --model MODULE runs the functions layers(seed), loss(output, targets) and
batch(batch_size, seed) of MODULE (a .py file importable from here, e.g. mymodel.py in the
current directory) instead of the toy GPT; --model MODULE:FUNCTION names the layers function,
and --loss / --batch name the other two ('FUNCTION' in the same module, or 'MODULE:FUNCTION').
--model-seed seeds its weights; the toy GPT's shape options (--layers, --d-model, --heads,
--seq-len) do not apply to it. See pipelab/model/custom.py (pl.CustomModel) for the contract.
Exit codes: 0 success, 1 the run failed (timeout or worker error) or its trace could not be
written, 2 bad arguments."""


def _parser():
    import inspect

    chunked = [name for name, generator in SCHEDULES.items()
               if "chunks" in inspect.signature(generator).parameters]
    parser = argparse.ArgumentParser(prog="python -m pipelab",
                                     description="pipelab: pipeline parallelism, run for real.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "run", help="run a schedule on real processes and print the measured summary",
        description="Run a pipeline schedule on real processes (a LocalCluster, or the "
                    "processes of torchrun) and print measured, replayed and simulated figures.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = run.add_argument
    add("--schedule", default="1f1b", metavar="NAME",
        help=f"schedule name, one of: {', '.join(SCHEDULES)} (default: 1f1b)")
    add("--ranks", type=int, default=None, metavar="P",
        help="pipeline ranks (default: 2, or WORLD_SIZE / --data-parallel under torchrun)")
    add("--data-parallel", type=int, default=1, metavar="D",
        help="replicas of the pipeline, each on its share of the batch, gradients all-reduced "
             "per stage after its last backward: P x D worker processes (default: 1)")
    add("--recompute", default="none", metavar="POLICY",
        help="activation recomputation: none, full, selective, every-k or every-k:K (keep "
             "every K-th block input), or one per stage separated by commas, e.g. "
             "'full,none'; R actions run before each backward that needs one (default: none)")
    add("--microbatches", type=int, default=8, metavar="M",
        help="microbatches per training step (default: 8)")
    add("--chunks", type=int, default=None, metavar="V",
        help=f"stages per rank, for the schedules that take it: {', '.join(chunked)} (default: "
             f"the schedule's own, 2)")
    add("--model", default=None, metavar="MODULE[:FUNCTION]",
        help="run your own model instead of the toy GPT: MODULE's layers, loss and batch "
             "functions (MODULE:FUNCTION names the layers function; see below)")
    add("--loss", default=None, metavar="[MODULE:]FUNCTION",
        help="with --model: the loss function (default: MODULE:loss)")
    add("--batch", default=None, metavar="[MODULE:]FUNCTION",
        help="with --model: the batch function (default: MODULE:batch)")
    add("--layers", type=int, default=4, metavar="N",
        help="transformer blocks of the toy GPT; the model also has an embedding and a head "
             "(default: 4)")
    add("--d-model", type=int, default=64, metavar="D", help="model width (default: 64)")
    add("--heads", type=int, default=4, metavar="H", help="attention heads (default: 4)")
    add("--seq-len", type=int, default=32, metavar="S", help="tokens per sequence (default: 32)")
    add("--batch-size", type=int, default=None, metavar="B",
        help="sequences per step, a multiple of --microbatches (default: 2 x microbatches)")
    add("--partition", default="uniform", metavar="METHOD",
        help="how layers are split into stages: uniform, params, cost, or a layout such as "
             "'E+t*2|t*2+L' (E embedding, t a block, L the head; with --model: each stage's "
             "first-last layers, e.g. '0-2|3-5'; default: uniform)")
    add("--steps", type=int, default=1, metavar="K",
        help="training steps with AdamW; the loss history is printed (default: 1)")
    add("--lr", type=float, default=3e-3, help="AdamW learning rate (default: 3e-3)")
    add("--seed", type=int, default=0, help="seed of the batches (default: 0)")
    add("--model-seed", type=int, default=0, help="seed of the weights (default: 0)")
    add("--timeout", type=float, default=30.0, metavar="SEC",
        help="seconds the pipeline may make no progress before the run fails (at least 1; "
             "default: 30)")
    add("--trace", default=None, metavar="PATH",
        help="write the measured timeline as a Chrome trace (open in ui.perfetto.dev)")
    add("--engine", default="pipelab", choices=("pipelab", "torch"),
        help="the runtime: pipelab's executor (default) or torch's: the schedule exported as "
             "torch's CSV runs on torch.distributed.pipelining's _PipelineScheduleRuntime, "
             "checked and timed the same way")
    add("--torch-trace", default=None, metavar="DIR",
        help="with --engine torch: write each rank's torch.profiler Chrome trace of the last "
             "step to DIR/rank<r>.json")
    add("--no-pin", action="store_true", help="do not pin workers to cores")
    add("--no-check", action="store_true",
        help="skip the comparison with the unsplit model (loss and gradients)")
    _export_parser(commands)
    return parser, run


def _export_parser(commands) -> None:
    export = commands.add_parser(
        "export", help="write a schedule as torch's CSV and print the TorchTitan flags",
        description="Write a schedule as torch.distributed.pipelining's schedule CSV (the file "
                    "_PipelineScheduleRuntime._load_csv and TorchTitan read), check it with "
                    "torch's own parser, and print the TorchTitan flags that train with it.")
    add = export.add_argument
    add("--schedule", required=True, metavar="NAME", help=f"one of: {', '.join(SCHEDULES)}")
    add("--ranks", type=int, default=2, metavar="P", help="pipeline ranks (default: 2)")
    add("--microbatches", type=int, default=8, metavar="M", help="microbatches (default: 8)")
    add("--chunks", type=int, default=None, metavar="V", help="stages per rank, where taken")
    add("-o", "--output", required=True, metavar="PATH", help="the CSV file to write")
    add("--tokens-per-microbatch", type=int, default=None, metavar="T",
        help="TorchTitan's training.num_tokens_per_microbatch_per_dp_rank (default: its 16384)")
    add("--layers", type=int, default=None, metavar="N",
        help="the model's blocks: with more than 2 stages per rank in a loop, computes "
             "TorchTitan's pipeline_parallel_layers_per_stage")


def _export(args) -> int:
    """`python -m pipelab export`: exit 2 with one line on bad input, 1 if torch refuses."""
    import tempfile
    from pathlib import Path

    from .schedules.torch_format import TITAN_DEFAULT_TOKENS, torch_instance, torchtitan_command, \
        torchtitan_flags
    try:
        check_target(args.output, "--output")
        options = {} if args.chunks is None else {"chunks": args.chunks}
        sched = pl.schedule(args.schedule, ranks=args.ranks, microbatches=args.microbatches,
                            **options)
        text = sched.to_torch_csv()
        tokens = args.tokens_per_microbatch
        titan = dict(tokens_per_microbatch=TITAN_DEFAULT_TOKENS if tokens is None else tokens,
                     layers=args.layers)
        _flags, notes = torchtitan_flags(sched, args.output, **titan)
    except ValueError as err:
        print(f"python -m pipelab export: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:       # torch's own parser reads it first
        trial = Path(tmp) / "schedule.csv"
        trial.write_text(text)
        try:
            torch_instance(None, sched.ranks, sched.microbatches, sched.chunks, csv_path=trial)
        except Exception as err:                      # torch's assertion: report, write nothing
            print(f"python -m pipelab export: torch's _load_csv refused the file: {err}",
                  file=sys.stderr)
            return 1
    write_text(args.output, text)
    print(f"wrote {args.output}: {sched.name}, {sched.ranks} ranks, {sched.stages} stages "
          f"(placement {','.join(map(str, sched.placement))}), {sched.microbatches} microbatches, "
          f"{len(sched)} steps; torch's _load_csv reads it")
    print("TorchTitan:\n  " + torchtitan_command(sched, args.output, **titan))
    for note in notes:
        print(f"note: {note}")
    return 0


def _build(args, ranks: int):
    """Schedule, config and checked RunSpec from the arguments (ValueError when bad); `ranks`
    is the pipeline's, the processes are ranks × --data-parallel."""
    check_timeout(args.timeout)
    if args.trace == "":
        raise ValueError("--trace '': give the file to write, e.g. --trace run.json (or drop "
                         "--trace)")
    if args.trace:                    # before the run, not after it: a file we can write
        check_target(args.trace, "--trace")
    check_steps(args.steps, "--steps")
    options = {} if args.chunks is None else {"chunks": args.chunks}
    sched = pl.schedule(args.schedule, ranks=ranks, microbatches=args.microbatches, **options)
    cfg = _model(args) if args.model is not None else \
        pl.ModelConfig(n_layers=args.layers, d_model=args.d_model, n_heads=args.heads,
                       seq_len=args.seq_len, seed=args.model_seed)
    # A custom model's 'params', 'cost' or '0-2|3-5' split, made once (cost profiles the layers)
    args.partition = partition_for_run(cfg, sched, args.partition, args.batch_size,
                                       args.data_parallel)
    spec = prepare_run(sched, ranks=ranks * args.data_parallel, model=cfg, **_run_options(args))
    return sched, cfg, spec


GPT_SHAPE = {"layers": "--layers", "d_model": "--d-model", "heads": "--heads",
             "seq_len": "--seq-len"}


def _model(args) -> pl.CustomModel:
    """--model, --loss and --batch as a pl.CustomModel (ValueError when a name is bad)."""
    defaults = _parser()[1]
    changed = [flag for key, flag in GPT_SHAPE.items()
               if getattr(args, key) != defaults.get_default(key)]
    if changed:
        raise ValueError(f"{', '.join(changed)} shape the toy GPT; with --model your module "
                         f"builds the layers: drop them")
    module, _sep, layers = args.model.partition(":")
    if not module:
        raise ValueError(f"--model {args.model!r}: give a module name, e.g. --model mymodel")

    def named(value: str | None, role: str) -> str:
        if value is None:
            return f"{module}:{role}"
        return value if ":" in value else f"{module}:{value}"
    return pl.CustomModel(layers=f"{module}:{layers or 'layers'}", loss=named(args.loss, "loss"),
                          batch=named(args.batch, "batch"), seed=args.model_seed)


def _run_options(args) -> dict:
    """The keyword arguments that `prepare_run` and `cluster.run` share."""
    return dict(partition=args.partition, seed=args.seed, batch_size=args.batch_size,
                steps=args.steps, lr=args.lr, check=not args.no_check,
                data_parallel=args.data_parallel, recompute=_recompute(args.recompute),
                engine=args.engine, torch_trace=args.torch_trace)


def _recompute(text: str):
    """--recompute's text as `recompute=`: 'every-k:2' -> {'policy': 'every-k', 'k': 2}; a comma
    list -> one per stage. The policies themselves are checked by prepare_run."""
    def one(item: str):
        name, colon, k = item.strip().partition(":")
        if not colon:
            return name
        if not k.isdigit():
            raise ValueError(f"--recompute {text!r}: K in 'every-k:K' must be a whole number, got {k!r}")
        return {"policy": name, "k": int(k)}
    items = [one(item) for item in text.split(",")]
    return items if len(items) > 1 else items[0]


def _report(result, args) -> int:
    """Print the table and write the trace; 1 (one line on stderr) if the trace cannot be
    written, e.g. a full disk: the writer is atomic, so the file that was there survives."""
    print(result.table())
    if args.trace:
        try:
            path = result.timeline.to_chrome_trace(args.trace)
        except OSError as err:
            print(f"python -m pipelab run: the run finished but its trace was not written to "
                  f"{args.trace}: {err.strerror or err}; any file that was there is unchanged",
                  file=sys.stderr)
            return 1
        print(f"wrote the measured timeline to {path} (Chrome trace: open in ui.perfetto.dev)")
    return 0


def _check_model_flags(args) -> None:
    if args.model is None and (args.loss is not None or args.batch is not None):
        raise ValueError("--loss and --batch name functions of your own model: use them with "
                         "--model")


def _local(args, fail) -> int:
    ranks = 2 if args.ranks is None else args.ranks
    try:
        _check_processes(ranks, args.data_parallel)
        _check_model_flags(args)
        sched, cfg, spec = _build(args, ranks)
    except ValueError as err:
        fail(err)
    with LocalCluster(ranks * args.data_parallel, timeout=args.timeout,
                      pin=not args.no_pin) as cluster:
        try:
            result = cluster.run(sched, model=cfg, **_run_options(args))
        except (PipelineTimeout, WorkerError) as err:
            print(f"python -m pipelab run: the run failed: {err}", file=sys.stderr)
            return 1
    return _report(result, args)


def _check_processes(ranks: int, data_parallel: int) -> None:
    """The worker processes a local run would start, refused first when there are too many (the
    schedule, the model and the split are not worth building then)."""
    positive_int("ranks", ranks)
    positive_int("data_parallel", data_parallel)
    at_most("--ranks × --data-parallel (worker processes)", ranks * data_parallel,
            MAX_LOCAL_RANKS, "each is a process of its own on this machine; run on several "
            "machines under torchrun instead")


def _torchrun(args, fail) -> int:
    """One process of a torchrun job: run this rank; rank 0 gathers and reports."""
    import torch.distributed as dist
    import time

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dp = args.data_parallel
    if dp < 1 or world % dp:
        fail(f"--data-parallel {dp} does not divide the {world} processes torchrun started")
    if args.ranks is not None and args.ranks * dp != world:
        fail(f"--ranks {args.ranks} x --data-parallel {dp} = {args.ranks * dp} but torchrun "
             f"started {world} processes (--nproc-per-node x nodes); drop --ranks or make "
             f"them equal")
    try:
        _check_model_flags(args)
        _sched, _cfg, spec = _build(args, world // dp)
    except ValueError as err:
        fail(err)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    try:
        warm_up()
        began = time.perf_counter()
        report = run_rank(spec, rank)
        reports = [None] * world if rank == 0 else None
        dist.gather_object(report, reports, dst=0)
        if rank == 0:
            return _report(assemble(spec, reports, wall_time=time.perf_counter() - began), args)
    finally:
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser, run_parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "export":
        return _export(args)

    def fail(err) -> None:
        run_parser.error(str(err))            # prints usage and the message, exits with 2

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _torchrun(args, fail)
    return _local(args, fail)


if __name__ == "__main__":
    sys.exit(main())
