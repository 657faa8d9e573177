"""The sampled activation meter (runtime/meter.py, runtime/sampling.py): one hooked forward per
stage, the other microbatches counted from its record, and the same bytes as hooking them all."""
from __future__ import annotations

import re

import pytest

import pipelab as pl
from pipelab.chapters.your_own_model import llama_model
from pipelab.runtime.sampling import sampled_forwards
from pipelab.runtime.spec import prepare_run
from pipelab.schedules import comm_plan

CFG = pl.ModelConfig(n_layers=4, d_model=32, n_heads=4, seq_len=16)
FAMILIES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "v-half",
            "dualpipe-v", "chimera")


def _levels(res) -> dict[int, list[int]]:
    """The live bytes after each action (the memory samples), per rank."""
    return {r: [level for _t, level in curve] for r, curve in res.timeline.memory.items()}


def _hooked(how: str) -> tuple[int, int]:
    hooked, total = re.match(r"sampled: (\d+) of (\d+) forwards hooked", how).groups()
    return int(hooked), int(total)


def test_the_sampled_meter_counts_what_the_full_one_counts():
    with pl.LocalCluster(2, timeout=60) as cluster:
        def both(sched, **run):
            return [cluster.run(sched, model=CFG, batch_size=8, check=False, progress=False,
                                _meter=meter, **run) for meter in ("sampled", "full")]
        for name in FAMILIES:
            sampled, full = both(pl.schedule(name, ranks=2, microbatches=4))
            for how in sampled.meter.values():        # it did sample: most forwards unhooked
                hooked, total = _hooked(how)
                assert 2 * hooked <= total, (name, how)
            assert all(how.startswith("full: asked") for how in full.meter.values())
            assert sampled.action_peaks == full.action_peaks, name
            assert _levels(sampled) == _levels(full), name
            assert sampled.peak_activations == full.peak_activations, name
            assert all(peak > 0 for peak in sampled.peak_activations.values())
        # Recomputation materialises activations inside backwards (count_saved): every forward
        # is hooked, by default too, and the figures are the full meter's.
        sampled, full = both(pl.schedule("1f1b", ranks=2, microbatches=4), recompute="full")
        assert all(how.startswith("full: technique recompute") for how in sampled.meter.values())
        assert sampled.action_peaks == full.action_peaks
        assert _levels(sampled) == _levels(full)


def _decisions(name: str, model=CFG, microbatches: int = 4, **run) -> list:
    sched = pl.schedule(name, ranks=2, microbatches=microbatches)
    spec = prepare_run(sched, ranks=2, model=model, batch_size=2 * microbatches, **run)
    return [(plan, *sampled_forwards(spec, plan)) for plan in comm_plan(spec.schedule)]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_replayed_part_is_recorded_first(name):
    for plan, todo, how in _decisions(name):
        assert todo is not None, how
        recorded = set()
        for part in (p for step in plan for p in step.action.parts):
            if part not in todo:
                continue                     # a hooked microbatch's part, counted live
            record, key = todo[part]
            if record:
                assert key not in recorded   # recorded once, by the first to get there
                recorded.add(key)
            else:
                assert key in recorded, (name, part)


def test_dualpipe_v_hooks_the_first_microbatch_of_each_backward_shape():
    # Rank 0 of DualPipe-V at m=4 runs 0F0..0F2, 3F0 3I0 3W0 3F1, then 3B1 (a full backward,
    # first on stage 3 with microbatch 1) ... 0I2 0W2 (stage 0's first split backward).
    (_p0, todo, how), _rank1 = _decisions("dualpipe-v")
    assert how == "sampled: 4 of 8 forwards hooked (0F0 0F2 3F0 3F1)"
    assert todo[pl.Action(0, "I", 3)] == (False, (0, ("F", "I")))
    assert todo[pl.Action(0, "B", 1)] == (False, (0, ("F", "B")))


@pytest.mark.parametrize("name,model,run,why", [
    ("1f1b", CFG, {"_meter": "full"}, "asked for"),
    ("1f1b", pl.ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=16, n_experts=4),
     {}, "MoE routing"),
    ("1f1b", CFG, {"recompute": "selective"}, "technique recompute"),
    ("1f1b", CFG, {"tensor_parallel": 2}, "technique tensor"),
    ("v-half-vocab", CFG, {}, "kind C, S, T, Vb, Vf is not replayed"),
    ("pipedream", CFG, {}, "technique versions"),
    ("1f1b", llama_model(), {}, "a custom model"),
])
def test_where_sampling_is_not_exact_every_forward_is_hooked(name, model, run, why):
    tp = run.get("tensor_parallel", 1)
    sched = pl.schedule(name, ranks=2, microbatches=4)
    spec = prepare_run(sched, ranks=2 * tp, model=model, batch_size=8, **run)
    for plan in comm_plan(spec.schedule):
        todo, how = sampled_forwards(spec, plan)
        assert todo is None and how.startswith("full: ") and why in how, how


def test_an_unknown_meter_is_refused_naming_the_parameter():
    with pytest.raises(ValueError, match=r"_meter='half'.*'sampled'.*'full'"):
        prepare_run(pl.schedule("1f1b", ranks=2, microbatches=4), ranks=2, model=CFG,
                    _meter="half")
