"""A kind's spec is its whole description: role, completeness rule, byte rule, colour, label.

The validator, the simulator, the byte model and the charts read what a kind declares, so a
kind registered here under a new letter is treated exactly as its role says. And a letter is
registered once: another module replaces it only when it says so."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

import pipelab as pl  # noqa: E402
from pipelab.model import memory  # noqa: E402
from pipelab.schedules import Action, Input, Schedule, ScheduleError, register_kind  # noqa: E402
from pipelab.schedules import kinds  # noqa: E402
from pipelab.schedules.kinds import KIND_SPECS, KINDS, VERSION  # noqa: E402

CFG = pl.ModelConfig(n_layers=2, d_model=24, n_heads=2, d_ff=40, seq_len=12, vocab_size=30)


@pytest.fixture(autouse=True)
def restore_kinds():
    """Every kind as it was before the test (a replaced built-in comes back)."""
    specs, names = dict(KIND_SPECS), dict(KINDS)
    yield
    KIND_SPECS.clear(), KIND_SPECS.update(specs)
    KINDS.clear(), KINDS.update(names)
    VERSION[0] += 1          # schedules validated meanwhile are validated again


def _backward_like(letter: str, **extra):
    """A full backward under another letter: reads its stage's forward, frees what it kept."""
    extra = {"role": "backward", **extra}
    return register_kind(letter, "a full backward (test)", inputs=kinds._backward_inputs,
                         output=kinds.INPUT_GRADIENT, cost=lambda costs, s: 2.0, **extra)


# --- one registration per letter ----------------------------------------------------------------

def test_a_second_registration_of_U_from_another_module_is_refused():
    built_in = KIND_SPECS["U"]
    with pytest.raises(ValueError, match=r"'U' is already registered by pipelab\.schedules\.updates"
                                         r".*replace=True"):
        register_kind("U", "optimizer update", per_microbatch=False, cost=lambda c, s: 0.1)
    assert KIND_SPECS["U"] is built_in


def test_replace_true_replaces_the_kind_and_the_simulator_sees_it():
    sched = pl.schedule("pipedream", ranks=2, microbatches=4)
    before = pl.simulate(sched).makespan
    register_kind("U", "a slow optimizer update (test)", per_microbatch=False,
                  inputs=KIND_SPECS["U"].inputs, cost=lambda costs, stage: 5.0, role="update",
                  replace=True)
    slower = pl.simulate(sched).makespan
    assert slower > before + 5.0 - 1e-9          # each stage's updates now cost 5 more


def test_the_registering_module_may_register_its_kind_again():
    register_kind("Qa", "a test kind", cost=lambda costs, stage: 1.0)
    again = register_kind("Qa", "the same kind, a cell run again", cost=lambda costs, stage: 2.0)
    assert KIND_SPECS["Qa"] is again and again.owner == __name__


@pytest.mark.parametrize("bad, message", [
    (dict(role="optimiser"), r"role must be one of .*'update'.*got 'optimiser'"),
    (dict(completes="update"), r"completes must be one of .*got 'update'"),
    (dict(bytes="frees it all"), r"bytes must be one of .*got 'frees it all'"),
])
def test_a_spec_outside_the_closed_sets_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        register_kind("Qb", "a test kind", **bad)
    assert "Qb" not in KIND_SPECS


# --- a role's completeness rule, byte rule, colour and label --------------------------------------

def test_a_kind_with_the_backward_role_completes_a_microbatch():
    _backward_like("Bq")
    Schedule.from_text("0F0 0F1 0Bq0 0Bq1").validate()              # Bq stands for B
    Schedule.from_text("0F0 0B0 0F1 0Bq1").validate()               # either, per microbatch
    with pytest.raises(ScheduleError, match=r"completes its backward twice \(0B0 and 0Bq0\)"):
        Schedule.from_text("0F0 0B0 0Bq0").validate()
    register_kind("Bq", "a full backward that is not declared one (test)",
                  inputs=kinds._backward_inputs, output=kinds.INPUT_GRADIENT,
                  role="backward", completes=None)
    with pytest.raises(ScheduleError, match="never runs the backward of microbatch 0"):
        Schedule.from_text("0F0 0Bq0").validate()


def test_a_split_backward_under_new_letters_completes_and_frees_by_its_byte_rules():
    register_kind("Iq", "input gradient (test)", inputs=kinds._backward_inputs,
                  output=kinds.INPUT_GRADIENT, role="input gradient", cost=lambda c, s: 1.0)
    register_kind("Wq", "weight gradient (test)", role="weight gradient",
                  inputs=lambda s, a: [Input("saved", Action(a.stage, "Iq", a.microbatch),
                                             carries=False)], cost=lambda c, s: 1.0)
    sched = Schedule.from_text("0F0 0Iq0 0Wq0").validate()
    with pytest.raises(ScheduleError, match="0W0 is missing: a split backward needs both"):
        Schedule.from_text("0F0 0Iq0").validate()    # messages name the built-in letters
    curve = pl.simulate(sched, i_frees=0.25).memory_curve(0)
    assert [level for _t, level in curve] == [1.0, 0.75, 0.0]


def test_a_kinds_byte_rule_reaches_the_simulator_and_the_byte_model():
    _backward_like("Bq")
    tl = pl.simulate(Schedule.from_text("0F0 0F1 0Bq0 0Bq1").validate())
    assert tl.peak_activations()[0] == 2.0 and tl.memory_curve(0)[-1][1] == 0.0
    bounds = [(0, CFG.total_layers)]
    kept = memory.activation_bytes(CFG, 0, CFG.total_layers, 1)
    curve = memory.byte_curves(tl, CFG, bounds, 1)[0]
    assert max(level for _t, level in curve) == 2 * kept and curve[-1][1] == 0
    # A kind with no byte rule frees nothing, in either model.
    register_kind("Bq", "a backward that keeps its activations (test)", role="backward",
                  inputs=kinds._backward_inputs, output=kinds.INPUT_GRADIENT, bytes=None,
                  cost=lambda costs, s: 2.0)
    tl = pl.simulate(Schedule.from_text("0F0 0F1 0Bq0 0Bq1").validate())
    assert tl.memory_curve(0)[-1][1] == 2.0
    assert memory.byte_curves(tl, CFG, bounds, 1)[0][-1][1] == 2 * kept


def test_a_kinds_colour_and_label_reach_the_chart():
    _backward_like("Bq", colour="#123456", label="test backward")
    ax = pl.simulate(Schedule.from_text("0F0 0Bq0").validate()).plot()
    colours = {str(e.action): bar.get_facecolor() for e, bar in ax.pipelab_bars.items()}
    assert colours["0Bq0"] == to_rgba("#123456")
    assert colours["0F0"] == to_rgba(KIND_SPECS["F"].colour)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:2] == ["F forward", "Bq test backward"]     # by role: forward first
    plt.close("all")
