"""Techniques plug into the runtime (runtime/techniques.py): the runtime's modules import no
technique, and a live run passes through each technique it uses once per phase — prepare and
assemble in the parent, setup and each step's hook in every worker."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

import pipelab as pl
import pipelab_test_technique  # noqa: F401 - registers the probe technique (and the SY kind)
from pipelab.runtime.spec import prepare_run
from pipelab.runtime.techniques import TECHNIQUES, Technique, register_technique
from pipelab.schedules import Schedule

pytestmark = pytest.mark.timeout(300)

RUNTIME = Path(pl.__file__).parent / "runtime"
ABOVE = ("pipelab.techniques", "pipelab.planner", "pipelab.views", "pipelab.chapters",
         "pipelab.bench")


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (function bodies too), as absolute names."""
    package = "pipelab.runtime"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module
            if node.module:
                found.add(module)
            # `from .. import techniques` names a module too
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def test_the_runtime_imports_nothing_from_the_floors_above_it():
    files = sorted(RUNTIME.glob("*.py"))
    assert len(files) > 20                  # the walk read the runtime, not an empty folder
    upward = {f"{path.name}: {name}" for path in files for name in imports_of(path)
              if name.startswith(ABOVE) or name == "pipelab"}
    assert not upward, sorted(upward)


def test_the_reader_sees_function_level_and_relative_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom . import p2p\n\n\ndef f():\n"
                      "    from ..techniques.tensor import unshard\n    from .. import views\n")
    assert imports_of(module) == {"os", "pipelab.runtime.p2p", "pipelab.techniques.tensor",
                                  "pipelab.techniques.tensor.unshard", "pipelab.views"}


CFG = pl.ModelConfig(n_layers=2, d_model=16, n_heads=2, seq_len=8, n_experts=4, top_k=2,
                     capacity_factor=1.0, aux_loss_coef=0.05)
DENSE = pl.ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=16)


@pytest.fixture(scope="module")
def walked(clusters):
    """One live run with three techniques: experts (EP 2, so data_parallel 2) and full
    recomputation, on 2 pipeline ranks × 2 replicas."""
    res = clusters(4).run(pl.schedule("1f1b", ranks=2, microbatches=4), model=CFG,
                          expert_parallel=2, recompute="full")
    return res


def test_a_run_passes_through_each_technique_once_per_phase(walked):
    res = walked
    assert res.spec.techniques == ("experts", "data_parallel", "recompute")
    # the parent: every registered technique's prepare once (each decides whether the run
    # uses it), then the assemble hook of each used technique that has one, once
    assert res.walk[-1] == [("prepare", name) for name in TECHNIQUES
                            if TECHNIQUES[name].prepare is not None] + [("assemble", "experts")]
    # every worker: the used techniques' setup once, and their step hooks once per step
    for process in range(4):
        assert res.walk[process] == [("setup", "experts"), ("step", "experts"),
                                     ("step", "recompute")], process
    # and the run is still the unsplit model's
    assert res.max_grad_error <= 1e-5, res.grad_errors
    assert res.routing[0].routed.shape == (4, 2, 4)       # the experts' assemble hook ran


def test_a_technique_registered_in_a_user_module_runs_in_the_workers(clusters):
    sched = Schedule.from_text("0F0 0B0 0SY\n1F0 1B0 0SY", placement=[0, 1]).validate()
    res = clusters(2).run(sched, model=DENSE)
    assert "pipelab_test_technique" in res.spec.plugins
    assert res.spec.techniques == ("probe",)
    # the setup hook ran in each worker process (its pid is not this one's), once
    assert len(set(res.probed)) == 2 and os.getpid() not in res.probed
    assert res.walk[0] == res.walk[1] == [("setup", "probe"), ("step", "probe")]
    assert res.max_grad_error <= 1e-5
    # a run that uses no technique enters none in its workers, and assembles without one
    plain = clusters(2).run(pl.schedule("1f1b", ranks=2, microbatches=2), model=DENSE)
    assert plain.spec.techniques == ()
    assert plain.walk[0] == plain.walk[1] == [] and ("assemble", "probe") not in plain.walk[-1]


def test_a_technique_defined_in_main_is_refused_before_any_process_starts():
    def prepare(draft):
        return True
    prepare.__module__ = "__main__"            # as if defined in a notebook cell
    register_technique(Technique("from_a_cell", prepare=prepare))
    try:
        with pytest.raises(ValueError, match="technique 'from_a_cell' is defined in '__main__'"):
            prepare_run(pl.schedule("1f1b", ranks=2, microbatches=2), ranks=2)
    finally:
        del TECHNIQUES["from_a_cell"]


def test_a_second_registration_of_a_name_is_refused_unless_replacing():
    recompute = TECHNIQUES["recompute"]
    with pytest.raises(ValueError, match="technique 'recompute' is already registered"):
        register_technique(Technique("recompute"))
    assert TECHNIQUES["recompute"] is recompute
    assert register_technique(recompute, replace=True) is recompute
    assert list(TECHNIQUES).index("recompute") > list(TECHNIQUES).index("data_parallel")


def test_one_registry_policy_for_kinds_handlers_schedules_and_techniques():
    """Another module replacing a built-in name is refused without replace=True; the module
    that registered a name may register it again (a notebook cell run twice)."""
    from pipelab.runtime.handlers import HANDLERS, register_handler
    from pipelab.schedules.kinds import register_kind
    from pipelab.schedules.registry import SCHEDULES, register

    def not_a_forward(state, a, inputs):
        return None
    forward = HANDLERS["F"]
    with pytest.raises(ValueError, match="handler of kind 'F' is already registered by "
                                         "pipelab.runtime.handlers; pass replace=True"):
        register_handler("F")(not_a_forward)
    assert HANDLERS["F"] is forward

    def not_1f1b(ranks, microbatches):
        raise AssertionError("never built")
    one_f_one_b = SCHEDULES["1f1b"]
    with pytest.raises(ValueError, match="schedule '1f1b' is already registered by "
                                         "pipelab.schedules.one_f_one_b"):
        register("1f1b")(not_1f1b)
    assert SCHEDULES["1f1b"] is one_f_one_b
    with pytest.raises(ValueError, match="action kind 'F' is already registered"):
        register_kind("F", "not a forward")

    # the same module twice: accepted, and the second registration is the one kept
    register("policy-probe")(not_1f1b)
    register("policy-probe")(not_a_forward)
    assert SCHEDULES.pop("policy-probe").__wrapped__ is not_a_forward
    register_technique(Technique("policy_probe"))
    again = register_technique(Technique("policy_probe"))
    assert TECHNIQUES.pop("policy_probe") is again
