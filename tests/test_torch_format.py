"""torch's schedule file: what pipelab exports, torch 2.13's own `_load_csv` reads, and reading
it back (or any torch schedule object) gives the same schedule. No process is started: torch's
runtime object is built on stand-in stages, as torch's own schedule visualizer builds them."""
import pytest

import pipelab as pl
from pipelab.schedules.torch_format import COMM_WORDS, torch_instance

torch = pytest.importorskip("torch")
from torch.distributed.pipelining import schedules as ts  # noqa: E402

EXPORTABLE = ["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v",
              "v-half", "v-min", "zb-auto", "dualpipe-v"]
SHAPES = [(2, 4), (2, 8), (4, 8), (4, 16)]          # p = 2, 4; m = 2p and 4p


def test_torch_is_the_pinned_version():
    # The file format is torch 2.13's private API: a new torch must be checked on purpose.
    assert torch.__version__.startswith("2.13."), torch.__version__


def test_every_registered_schedule_is_exportable_or_refused():
    refused = {"chimera", "dualpipe", "pipedream", "pipedream-2bw", "stp", "vocab-1", "vocab-2",
               "v-half-vocab"}
    assert set(pl.SCHEDULES) == set(EXPORTABLE) | refused, \
        "a new registered schedule: add it to EXPORTABLE or to the refused ones here"


@pytest.mark.parametrize("p, m", SHAPES)
@pytest.mark.parametrize("name", EXPORTABLE)
def test_torch_loads_the_export_and_it_reads_back_identical(name, p, m, tmp_path):
    sched = pl.schedule(name, ranks=p, microbatches=m)
    path = tmp_path / f"{name}.csv"
    text = sched.to_torch_csv(path)
    assert path.read_text() == text
    # torch's own parser and checks, then its lowering to sends and receives
    runtime = torch_instance(None, p, m, sched.chunks, csv_path=path)
    assert runtime.stage_index_to_group_rank == dict(enumerate(sched.placement))
    assert len(runtime.pipeline_order_with_comms) == p
    # torch read every step we wrote, pairs included (its parser once dropped `+B`)
    for rank in range(p):
        assert [str(a) for a in runtime.pipeline_order[rank]] == text.splitlines()[rank].split(",")
    for back in (pl.Schedule.from_torch_csv(path, name=name),
                 pl.Schedule.from_torch(runtime, name=name)):
        assert back == sched        # actions, placement (a V stays a V), microbatches, name


def test_a_pair_is_written_in_torchs_syntax_and_read_by_torchs_parser():
    text = pl.schedule("dualpipe-v", ranks=2, microbatches=4).to_torch_csv()
    cells = [c for row in text.splitlines() for c in row.split(",")]
    pairs = [c for c in cells if c.endswith(")OVERLAP_F_B")]
    assert "(0F3;3B1)OVERLAP_F_B" in pairs and not any("+" in c for c in cells)
    parsed = ts._Action.from_str("(0F3;3B1)OVERLAP_F_B")
    assert parsed.computation_type == ts.OVERLAP_F_B
    assert [str(a) for a in parsed.sub_actions] == ["0F3", "3B1"]


def test_pipelabs_own_csv_is_not_torchs():
    sched = pl.schedule("dualpipe-v", ranks=2, microbatches=4)
    assert "0F3+3B1" in sched.to_csv()                      # lossless, our words
    assert pl.Schedule.from_csv(sched.to_csv(), name=sched.name) == sched
    assert "torch" in pl.Schedule.to_csv.__doc__ and "NOT" in pl.Schedule.to_csv.__doc__


@pytest.mark.parametrize("p, m", [(2, 4), (4, 16)])
def test_the_compute_and_comms_form_torch_dumps_reads_back(p, m, tmp_path):
    sched = pl.schedule("zb-v", ranks=p, microbatches=m)
    sched.to_torch_csv(tmp_path / "in.csv")
    runtime = torch_instance(None, p, m, 2, csv_path=tmp_path / "in.csv")
    runtime._dump_csv(str(tmp_path / "comms.csv"), format="compute_comms")
    dumped = (tmp_path / "comms.csv").read_text()
    assert "SEND_F" in dumped and "RECV_B" in dumped and "REDUCE_GRAD" in dumped
    assert pl.Schedule.from_torch_csv(tmp_path / "comms.csv", name="zb-v") == sched


TORCH_CLASSES = [("ScheduleGPipe", 1, "gpipe"), ("Schedule1F1B", 1, "1f1b"),
                 ("ScheduleInterleaved1F1B", 2, "interleaved-1f1b"),
                 ("ScheduleLoopedBFS", 2, None), ("ScheduleInterleavedZeroBubble", 2, None),
                 ("ScheduleZBVZeroBubble", 2, "zb-v"), ("ScheduleDualPipeV", 2, "dualpipe-v")]


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 16)])
@pytest.mark.parametrize("cls, per_rank, ours", TORCH_CLASSES)
def test_every_torch_class_imports_as_a_valid_schedule(cls, per_rank, ours, p, m):
    sched = pl.Schedule.from_torch(torch_instance(cls, p, m, per_rank))
    assert sched.ranks == p and sched.stages == p * per_rank and sched.microbatches == m
    if cls in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV"):
        assert sched.placement == pl.v_placement(p)
    else:
        assert sched.placement == pl.loop_placement(p, per_rank)
    if ours is not None:              # torch's table and ours agree step for step
        assert sched.actions == pl.schedule(ours, ranks=p, microbatches=m).actions


def test_schedule1f1b_table_is_renumbered_as_its_runtime_counts():
    torch_obj = torch_instance("Schedule1F1B", 2, 4)
    last = [str(a) for a in torch_obj.pipeline_order[1] if a is not None]
    assert last[0] == "1F1"         # torch 2.13's table: the last rank's forwards are 1..m
    sched = pl.Schedule.from_torch(torch_obj)
    assert [str(a) for a in sched.actions[1]][:2] == ["1F0", "1B0"]


def test_from_torch_refuses_what_is_not_a_torch_schedule():
    with pytest.raises(ValueError, match="schedule instance"):
        pl.Schedule.from_torch(pl.schedule("1f1b", ranks=2, microbatches=4))


REFUSED = {
    "chimera": ["routes", "dualpipe-v"], "dualpipe": ["routes", "G", "dualpipe-v"],
    "pipedream": ["U", "synchronous"], "pipedream-2bw": ["U", "V", "synchronous"],
    "stp": ["braids", "F+I", "inside the stage modules"],
    "vocab-1": ["vocabulary", "S", "T"], "vocab-2": ["vocabulary", "C"],
    "v-half-vocab": ["vocabulary", "Vf"],
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_schedules_say_why_before_writing(name, tmp_path):
    sched = pl.schedule(name, ranks=2, microbatches=6)
    path = tmp_path / "never.csv"
    with pytest.raises(ValueError, match="cannot run schedule") as err:
        sched.to_torch_csv(path)
    for word in REFUSED[name]:
        assert word in str(err.value), (word, str(err.value))
    assert not path.exists()


@pytest.mark.parametrize("make, words", [
    (lambda: pl.with_recompute(pl.schedule("1f1b", ranks=2, microbatches=4)),
     ["R (", "activation checkpointing"]),
    (lambda: pl.with_data_parallel(pl.schedule("1f1b", ranks=2, microbatches=4)),
     ["AR (", "REDUCE_GRAD"]),
])
def test_techniques_torch_has_no_action_for_are_refused(make, words, tmp_path):
    with pytest.raises(ValueError) as err:
        make().to_torch_csv(tmp_path / "x.csv")
    for word in words:
        assert word in str(err.value)
    assert not (tmp_path / "x.csv").exists()


def test_a_users_schedule_of_torchs_kinds_exports():
    text = "0F0 0F1 0B0 0B1\n1F0 1B0 1F1 1B1\n"
    mine = pl.Schedule.from_text(text, name="mine")
    assert pl.Schedule.from_torch_csv(mine.to_torch_csv(), name="mine") == mine


GOOD = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"


@pytest.mark.parametrize("text, words", [
    ("0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n", ["stage 0 microbatch 1", "needs one B"]),
    ("0F0,0F1,0B0,0B1,1F0\n1B0,1F1,1B1\n", ["stage 1", "rank 0 and rank 1"]),
    ("0F0,0F1,0I0,0B1\n1F0,1B0,1F1,1B1\n", ["stage 0 microbatch 0", "one I and one W"]),
    ("0F0,0F1,0F2,0B0,0B1,0B2\n1F0,1B0,1F1,1B1\n", ["stage 1 forwards 2", "[2] missing"]),
    ("0F0,0X1\n1F0\n", ["row 1 (rank 0), cell 2", "0X1"]),
    ("0F0,0F1,0B0,0B1\n1SEND_F0\n", ["rank(s) [1]", "no compute action"]),
    ("0F0,0F1,0B0,0B1\n1B0,1F0,1F1,1B1\n", ["1B0"]),        # backward before its forward
])
def test_bad_files_give_a_clear_error(text, words):
    with pytest.raises(ValueError) as err:
        pl.Schedule.from_torch_csv(text)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_given_microbatches_must_match_the_file():
    assert pl.Schedule.from_torch_csv(GOOD, microbatches=2).microbatches == 2
    with pytest.raises(ValueError, match=r"stage 0 forwards 2 microbatch\(es\), but the schedule "
                                         r"has 4 \(0..3\): microbatch\(es\) \[2, 3\] missing"):
        pl.Schedule.from_torch_csv(GOOD, microbatches=4)


def test_comm_cells_are_dropped_on_reading():
    assert set(COMM_WORDS) >= {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE_GRAD"}
    with_comms = "0F0,0SEND_F0,0F1,0SEND_F1,1RECV_B0,0B0,1RECV_B1,0B1,0REDUCE_GRAD\n" \
                 "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1REDUCE_GRAD\n"
    assert pl.Schedule.from_torch_csv(with_comms).actions == \
        pl.Schedule.from_torch_csv(GOOD).actions


# --- python -m pipelab export -------------------------------------------------------------------
@pytest.mark.parametrize("name, extra, titan", [
    ("zb-v", ["--ranks", "8", "--microbatches", "24"], "ZBVZeroBubble"),
    ("dualpipe-v", ["--ranks", "4", "--microbatches", "8"], "ZBVZeroBubble"),
    ("interleaved-1f1b", ["--ranks", "4", "--microbatches", "8"], "Interleaved1F1B"),
    ("zb-h1", ["--ranks", "4", "--microbatches", "8"], "1F1B"),
])
def test_export_cli_writes_the_file_and_the_torchtitan_flags(name, extra, titan, tmp_path,
                                                              capsys):
    from pipelab.__main__ import main
    out = tmp_path / "s.csv"
    assert main(["export", "--schedule", name, *extra, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    ranks, m = int(extra[1]), int(extra[3])
    sched = pl.schedule(name, ranks=ranks, microbatches=m)
    assert pl.Schedule.from_torch_csv(out, name=name) == sched
    for flag in (f"--parallelism.pipeline_parallel_schedule_csv {out}",
                 f"--parallelism.pipeline_parallel_degree {ranks}",
                 f"--parallelism.num_pp_microbatches {m}",
                 "--training.num_tokens_per_microbatch_per_dp_rank 16384",
                 f"--parallelism.pipeline_parallel_schedule {titan} "):
        assert flag in printed, (flag, printed)
    # the class TorchTitan builds stages from places them as the file does
    # (a single-stage class: stage r on rank r; a multi-stage one: its default mapping, which
    # TorchTitan's own placement follows)
    obj = torch_instance(titan, ranks, m)
    stages = getattr(obj, "stage_index_to_group_rank", None) or {s: s for s in range(ranks)}
    assert tuple(stages[s] for s in range(len(stages))) == sched.placement


def test_export_cli_computes_layers_per_stage_for_deep_loops(tmp_path, capsys):
    from pipelab.__main__ import main
    assert main(["export", "--schedule", "interleaved-1f1b", "--chunks", "3", "--ranks", "2",
                 "--microbatches", "4", "--layers", "16", "-o", str(tmp_path / "i.csv")]) == 0
    printed = capsys.readouterr().out
    # TorchTitan: ceil((16 + 2) / 3) = 6 stages = 2 ranks x 3
    assert "--parallelism.pipeline_parallel_layers_per_stage 3 " in printed


@pytest.mark.parametrize("argv, words", [
    (["--schedule", "chimera"], "routes"),
    (["--schedule", "zb-v", "--ranks", "0"], "ranks must be a positive integer"),
    (["--schedule", "nope"], "unknown schedule"),
    (["--schedule", "zb-v", "--tokens-per-microbatch", "0"], "tokens_per_microbatch"),
])
def test_export_cli_bad_input_exits_2_with_one_line(argv, words, tmp_path, capsys):
    from pipelab.__main__ import main
    out = tmp_path / "never.csv"
    assert main(["export", *argv, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and not out.exists()
