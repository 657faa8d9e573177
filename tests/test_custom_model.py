"""pl.CustomModel: a stack nobody in pipelab wrote (tests/pipelab_test_custom.py), run live.

Exact against its own unsplit stack under the schedule families on 2 ranks (one shared
cluster), trains, and every contract breach is refused before any worker starts.
"""
from __future__ import annotations

import pytest
import torch

import pipelab as pl
from pipelab.__main__ import main
from pipelab.runtime.boundary import Boundary
from pipelab.runtime.spec import prepare_run

MOD = "pipelab_test_custom"


def model(**names) -> pl.CustomModel:
    given = {"layers": f"{MOD}:layers", "loss": f"{MOD}:loss", "batch": f"{MOD}:batch"}
    given.update({role: f"{MOD}:{name}" for role, name in names.items()})
    return pl.CustomModel(**given)


MODEL = model()
N_PARAMS = sum(1 for layer in MODEL.layers() for _p in layer.parameters())


@pytest.mark.parametrize("name,chunks", [("1f1b", None), ("zb-h1", None),
                                         ("interleaved-1f1b", 2), ("zb-v", None),
                                         ("dualpipe-v", None)])
def test_exact_under_each_family(clusters, name, chunks):
    """Loss and every parameter's gradient equal the unsplit stack's; the boundaries include a
    tuple holding an integer tensor (the ids the Mix layers read) and, with 4 stages, a plain
    float one; timelines, replay and the meter are filled in."""
    options = {} if chunks is None else {"chunks": chunks}
    sched = pl.schedule(name, ranks=2, microbatches=4, **options)
    res = clusters(2).run(sched, model=MODEL, progress=False)
    assert res.max_grad_error < 1e-5
    assert res.loss == pytest.approx(res.reference_loss, rel=1e-6)
    assert len(res.grad_errors) == N_PARAMS                  # every parameter was compared
    packed = res.spec.crossing()
    assert any(torch.int64 in [dtype for _shape, dtype in b.leaves] for b in packed.values())
    if sched.stages == 4:
        assert any(b.plain for b in res.spec.boundaries.values())
    actions = sum(len(acts) for acts in sched.actions)
    assert len(res.timeline.events) == len(res.replay.events) == actions
    assert all(peak > 0 for peak in res.peak_activations.values())


def test_exact_with_data_parallel(clusters):
    """Two replicas of a one-rank pipeline, each on its half of the batch (the ids and targets
    cut alike), gradients all-reduced: still the unsplit stack's on the whole batch."""
    res = clusters(2).run(pl.schedule("1f1b", ranks=1, microbatches=2), model=MODEL,
                          data_parallel=2, progress=False)
    assert res.max_grad_error < 1e-5
    assert res.loss == pytest.approx(res.reference_loss, rel=1e-6)


def _trained_alone(steps: int, batch_size: int, lr: float) -> list[float]:
    """The loss of each step of the same AdamW training of the unsplit stack, in one process."""
    layers = torch.nn.Sequential(*MODEL.layers())
    optimizer = torch.optim.AdamW(layers.parameters(), lr=lr)
    history = []
    for k in range(steps):
        inputs, targets = MODEL.batch(batch_size, k)
        loss = MODEL.loss(layers(inputs), targets)
        history.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return history


def test_trains(clusters):
    """30 AdamW steps on fresh batches: the loss falls well below its start, step by step as
    the unsplit stack's own training does (float order differs: close, not equal)."""
    res = clusters(2).run(pl.schedule("1f1b", ranks=2, microbatches=2), model=MODEL,
                          steps=30, lr=0.05, progress=False)
    assert res.loss_history[-1] < 0.3 * res.loss_history[0]
    assert res.loss_history == pytest.approx(_trained_alone(30, res.spec.batch_size, 0.05),
                                             rel=1e-3)


def test_linears_swapped_and_fused_layers_named():
    """Every exact nn.Linear becomes the weight-gradient Linear (same Parameter objects'
    values), so W has GEMMs to do; the LayerNorm and the embedding keep a fused backward."""
    built = MODEL.build(0, MODEL.total_layers)
    linears = [m for m in built.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(isinstance(m, pl.model.weight_grad.Linear) for m in linears)
    assert MODEL.fused_backward() == {0: ["table (Embedding)"], 7: ["norm (LayerNorm)"]}


def test_boundary_round_trip():
    """A tuple of a float and an integer tensor packs into one message and back; the gradient
    message carries the float tensor's gradient only."""
    x, ids = torch.randn(2, 3), torch.arange(6).view(2, 3)
    b = Boundary.of((x, ids), "a layer")
    got = b.unpack(b.pack((x, ids)))
    assert torch.equal(got[0], x) and torch.equal(got[1], ids) and got[0].requires_grad
    got[0].grad = torch.full_like(x, 2.0)
    message = b.pack_gradient(got)
    assert tuple(message.shape) == b.gradient()[0] == (x.numel() * 4,)
    out = (x.clone().requires_grad_(), ids)
    tensors, grads = b.backward_pairs(out, message)
    assert len(tensors) == 1 and torch.equal(grads[0], got[0].grad)


def _refused(match: str, **run):
    """prepare_run's ValueError, with a cluster that was never started still without workers."""
    cluster = pl.LocalCluster(2, start=False)
    sched = run.pop("schedule", None) or pl.schedule("1f1b", ranks=2, microbatches=2)
    with pytest.raises(ValueError, match=match):
        cluster.run(sched, **{"model": MODEL, **run})
    assert cluster.pids == []


def test_bad_models_refused_before_workers():
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        pl.CustomModel(layers="no_such_module_xyz:layers", loss=f"{MOD}:loss",
                       batch=f"{MOD}:batch")
    _refused("must return at least 4", model=model(layers="two_layers"),
             schedule=pl.schedule("interleaved-1f1b", ranks=2, microbatches=2))
    _refused("must return a scalar tensor", model=model(loss="vector_loss"))
    _refused("must return a non-empty list of nn.Module|item 0", model=model(layers="not_modules"))


def test_notebook_functions_refused():
    def layers(seed):
        return []
    layers.__module__ = "__main__"              # as a notebook cell's function is
    layers.__qualname__ = "layers"
    with pytest.raises(ValueError, match=r"defined in __main__.*\.py file"):
        pl.CustomModel(layers=layers, loss=f"{MOD}:loss", batch=f"{MOD}:batch")
    with pytest.raises(ValueError, match="local function or a lambda"):
        pl.CustomModel(layers=f"{MOD}:layers", loss=lambda out, y: out.sum(),
                       batch=f"{MOD}:batch")


def test_model_internal_techniques_refused():
    """What splits the GPT's inside is refused with the reason, before any worker starts."""
    _refused("tensor parallelism splits the GPT block", tensor_parallel=2)
    _refused("expert parallelism divides pipelab's own", expert_parallel=2)
    _refused("vocabulary shards", schedule=pl.schedule("vocab-1", ranks=2, microbatches=2))
    _refused("'selective' with a custom model: it drops what the GPT's attention core",
             recompute="selective")
    _refused("updates the weights inside the schedule",
             schedule=pl.schedule("pipedream", ranks=2, microbatches=2))


def test_cli_names_the_three_functions(capsys):
    """--model MODULE[:FUNCTION] with --loss/--batch reach CustomModel (a bad one exits 2
    before any worker starts)."""
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--model", f"{MOD}:two_layers", "--schedule", "interleaved-1f1b",
              "--microbatches", "2"])
    assert exit_.value.code == 2 and "must return at least 4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--model", MOD, "--loss", "vector_loss", "--microbatches", "2"])
    assert "pipelab_test_custom:vector_loss" in capsys.readouterr().err
