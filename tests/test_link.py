"""The emulated link (pl.Link): its formulas, its arguments, and live runs that wait it out.

Live runs use a link whose latency (tens of milliseconds) dwarfs both the toy model's compute
and what other programs on a busy machine add, so the assertions hold under load.
"""
from __future__ import annotations

import dataclasses
import math
import os
import threading
import time

import pytest

import pipelab as pl
from pipelab.model.memory import parameter_bytes
from pipelab.support.noise import load_average, load_line

CFG = pl.ModelConfig(n_layers=4, d_model=32, n_heads=4, seq_len=16)
LINK = pl.Link(latency=0.02, bandwidth=1e9)


# --- the value and its formulas ------------------------------------------------------------
@pytest.mark.parametrize("kwargs,word", [
    (dict(latency=-0.001, bandwidth=1e9), "latency"),
    (dict(latency=math.nan, bandwidth=1e9), "latency"),
    (dict(latency="20ms", bandwidth=1e9), "latency"),
    (dict(latency=True, bandwidth=1e9), "latency"),
    (dict(latency=0.01, bandwidth=0), "bandwidth"),
    (dict(latency=0.01, bandwidth=-5.0), "bandwidth"),
    (dict(latency=0.01, bandwidth=math.nan), "bandwidth"),
])
def test_bad_link_arguments_are_refused_naming_the_parameter(kwargs, word):
    with pytest.raises(ValueError, match=word):
        pl.Link(**kwargs)


def test_a_link_is_a_frozen_value():
    link = pl.Link(latency=0, bandwidth=math.inf)        # allowed: no delay at all
    assert link.transfer_time(10**9) == 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        link.latency = 1.0
    assert pl.Link(0.02, 1e9) == pl.Link(latency=0.02, bandwidth=1e9)


def test_the_formulas_count_rounds_and_bytes():
    link = pl.Link(latency=0.5, bandwidth=100.0)
    assert link.transfer_time(1000) == 0.5 + 10.0
    # A ring of 4 processes: a reduce-scatter and an all-gather of 3 rounds each; every round
    # costs one latency and moves a quarter of the 1000 bytes.
    rounds = 3 + 3
    assert link.allreduce_time(1000, 4) == pytest.approx(rounds * (0.5 + 250 / 100))
    assert pl.allreduce_time(1000, 4, 100.0, 0.5) == link.allreduce_time(1000, 4)
    # Pairwise all-to-all: 3 rounds, each sending the quarter of the buffer bound for one peer.
    assert link.all_to_all_time(1000, 4) == pytest.approx(3 * (0.5 + 250 / 100))
    assert link.allreduce_time(1000, 1) == link.all_to_all_time(1000, 1) == 0.0


def test_gpipe_on_a_link_grows_by_2_p_minus_1_messages():
    # docs/formulas.md: with message cost c, GPipe's makespan grows by exactly 2(p-1)c.
    p, m, nbytes = 4, 8, 4000
    s = pl.schedule("gpipe", ranks=p, microbatches=m)
    plain = pl.simulate(s, pl.Costs(F=1.0, I=1.0, W=1.0))
    linked = pl.simulate(s, pl.Costs(F=1.0, I=1.0, W=1.0, link=pl.Link(0.25, 2000.0),
                                     message_bytes=nbytes))
    c = 0.25 + nbytes / 2000.0
    assert linked.makespan == pytest.approx(plain.makespan + 2 * (p - 1) * c)


def test_the_simulator_prices_the_gradient_all_reduce_by_the_link():
    s = pl.with_data_parallel(pl.schedule("1f1b", ranks=2, microbatches=2), 3)
    link = pl.Link(latency=0.5, bandwidth=1000.0)
    tl = pl.simulate(s, pl.Costs(link=link, parameter_bytes=[3000, 6000]))
    spans = {str(e.action): e.duration for e in tl.comm_events()}
    # n=3: 4 rounds of one latency, each moving a third of the stage's bytes.
    assert spans["0AR"] == pytest.approx(4 * 0.5 + 4 * 1000 / 1000)
    assert spans["1AR"] == pytest.approx(4 * 0.5 + 4 * 2000 / 1000)
    with pytest.raises(ValueError, match="link"):
        pl.Costs(link=link, bandwidth=10.0)


# --- refused before any worker moves -------------------------------------------------------
def test_bad_link_is_refused_before_any_worker_starts():
    cluster = pl.LocalCluster(ranks=2, start=False)
    try:
        s = pl.schedule("1f1b", ranks=2, microbatches=2)
        with pytest.raises(ValueError, match="link must be a pl.Link"):
            cluster.run(s, model=CFG, link=0.02)
        with pytest.raises(ValueError, match="link must be a pl.Link"):
            cluster.run(s, model=CFG, link={"latency": 0.02, "bandwidth": 1e9})
        # Collectives whose handlers the link cannot hold are refused, not run at loopback speed.
        with pytest.raises(ValueError, match="link=.* not supported .* Cs"):
            cluster.run(pl.schedule("vocab-1", ranks=2, microbatches=2), model=CFG, link=LINK)
        assert cluster.pids == [] and cluster.starts == 0
    finally:
        cluster.close()


# --- live ----------------------------------------------------------------------------------
# Compute as small as the runtime allows (one row of 8 tokens per microbatch): the lesson is
# the link, and on a loaded machine every millisecond of compute is stretched, the link is not.
TINY = pl.ModelConfig(n_layers=4, d_model=16, n_heads=2, seq_len=8)


@pytest.mark.timing
def test_gpipe_against_1f1b_on_a_20ms_link_measures_what_the_simulator_says(clusters):
    cluster = clusters(4)
    m = 4
    # On a 20 ms link, 1F1B's steady state waits for a message at every turn (docs/formulas.md:
    # a strictly ordered 1F1B exposes communication): it is far slower than GPipe, and the
    # simulator, pricing each message α + bytes/β, says by how much. Best of two runs each,
    # alternated: other programs only ever add time to a run.
    runs, simulated = {"gpipe": [], "1f1b": []}, {}
    for _round in range(2):
        for name in runs:
            res = cluster.run(pl.schedule(name, ranks=4, microbatches=m), model=TINY, seed=1,
                              batch_size=m, link=LINK, progress=False)
            runs[name].append(res.timeline.makespan)
            simulated[name] = res.simulated.makespan
            _assert_exact_and_late_enough(res)
    predicted = simulated["gpipe"] / simulated["1f1b"]
    assert predicted < 0.75         # the link made the difference (without it, about 1)
    measured = min(runs["gpipe"]) / min(runs["1f1b"])
    figures = (f"measured {measured:.3f} (GPipe {runs['gpipe']}, 1F1B {runs['1f1b']} s), "
               f"simulated {predicted:.3f}; {load_line()}")
    if abs(measured / predicted - 1) > 0.15 and load_average() > 4 * (os.cpu_count() or 1):
        # Each message wakes a sleeping rank; with more than 4 runnable programs per core
        # every wake-up waits in the run queue for milliseconds (measured: the ratio 0.86-0.98
        # against 0.45-0.67 simulated at load averages of 16-29 on 2 cores, though each
        # action's own compute was not stretched). The 15% then cannot be resolved: say so.
        pytest.skip(f"not resolvable at this load: {figures}")
    assert abs(measured / predicted - 1) <= 0.15, figures


def _assert_exact_and_late_enough(res: pl.RunResult) -> None:
    assert res.max_grad_error <= 1e-5, res.grad_errors
    assert res.loss == pytest.approx(res.reference_loss, rel=1e-6)
    # Every message arrived no earlier than α + bytes/β after its producer ended.
    nbytes = 4 * res.spec.rows_per_microbatch * res.spec.cfg.seq_len * res.spec.cfg.d_model
    ends = {e.action: e.end for e in res.timeline.events}
    for rank_steps in pl.comm_plan(res.schedule):
        for step in rank_steps:
            for t in step.recv:
                start = next(e.start for e in res.timeline.events_of(t.dst)
                             if t.consumer in e.action.parts)
                assert start - ends[t.producer] >= LINK.transfer_time(nbytes)


def _main_thread(pid: int) -> list[str]:
    """Fields of /proc/PID/task/PID/stat (a process's main thread) after the command name:
    [0] its state (R running or runnable, S sleeping), [11] user and [12] system CPU ticks."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _thread_cpu(pid: int) -> float:
    fields = _main_thread(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task"), reason="needs Linux /proc")
def test_waiting_for_the_link_sleeps_instead_of_burning_a_core(clusters):
    cluster = clusters(2)
    s = pl.schedule("1f1b", ranks=2, microbatches=4)
    slow = pl.Link(latency=0.5, bandwidth=1e9)

    def run(link) -> tuple[float, list[float], list[float]]:
        """Wall time, each worker's main-thread CPU seconds, and the share of 5 ms samples
        that found it running or runnable (state R) rather than asleep."""
        pids = cluster.pids
        before = [_thread_cpu(pid) for pid in pids]
        samples: list[list[str]] = []
        done = threading.Event()

        def watch():
            while not done.wait(0.005):
                samples.append([_main_thread(pid)[0] for pid in pids])
        watcher = threading.Thread(target=watch)
        began = time.perf_counter()
        watcher.start()
        try:
            cluster.run(s, model=CFG, link=link, check=False, progress=False)
        finally:
            done.set()
            watcher.join()
        wall = time.perf_counter() - began
        running = [sum(states[r] == "R" for states in samples) / max(len(samples), 1)
                   for r in range(len(pids))]
        return wall, [_thread_cpu(pid) - b for pid, b in zip(pids, before)], running

    run(None)                                    # warm the workers
    plain = [run(None) for _ in range(2)]
    wall, cpu, running = run(slow)
    base_wall = min(w for w, _c, _r in plain)
    # 1F1B on 2 ranks has at least 2(p-1) = 2 messages on its critical path: 1 s more.
    assert wall >= base_wall + 2 * slow.latency
    for rank in range(2):
        compute = max(c[rank] for _w, c, _r in plain)
        # Each rank's thread uses the CPU of the same run without a link (give or take the
        # 10 ms clock ticks), though it waited a second or more: the wait is slept. (A spinning
        # wait is charged whatever share of a core it gets: under a load of 17 on 2 cores,
        # measured 0.11 s of a 1 s wait.)
        assert cpu[rank] <= compute + 0.05, (rank, compute, cpu[rank], wall)
        # And it sleeps through the wait whatever the load: measured running or runnable in
        # 1-2% of the samples, against 53% for a spinning wait (which shows R throughout its
        # waits; the rest of the run is spent in gloo's own blocking waits and the parent).
        assert running[rank] < 0.25, (rank, running[rank])


@pytest.mark.parametrize("mesh", ["data", "tensor", "expert"])
def test_a_collective_on_the_link_takes_at_least_the_ring_formula(clusters, mesh):
    cluster = clusters(2)
    s = pl.schedule("gpipe", ranks=1, microbatches=2)
    if mesh == "data":
        # 1 pipeline rank × 2 replicas: one gradient all-reduce of the whole model.
        nbytes = parameter_bytes(CFG, 0, CFG.total_layers)
        link = pl.Link(latency=0.03, bandwidth=nbytes / 0.05)    # the bytes alone take 50 ms
        res = cluster.run(s, model=CFG, link=link, data_parallel=2, progress=False)
        ring = 2 * 1 * 0.03 + 2 * 1 / 2 * 0.05
        took = res.reduction_transfer()[0]
        simulated = [e.duration for e in res.simulated.comm_events()]
        assert simulated == [pytest.approx(ring)]
    elif mesh == "tensor":
        # 1 pipeline rank × 2 shards: two all-reduces of one activation per block and pass.
        nbytes = 4 * 2 * CFG.seq_len * CFG.d_model                # 2 rows per microbatch
        link = pl.Link(latency=0.01, bandwidth=nbytes / 0.01)
        res = cluster.run(s, model=CFG, link=link, tensor_parallel=2, progress=False)
        ring = 2 * 1 * 0.01 + 2 * 1 / 2 * 0.01
        spans = [end - start for entries in res.tp_all_reduces.values()
                 for _part, start, end, _what in entries]
        assert len(spans) == 2 * CFG.n_layers * 2 * 2     # blocks × (F, B) × 2 microbatches
        took = min(spans)
    elif mesh == "expert":
        # 1 pipeline rank × 2 expert shards: each MoE block's dispatch and combine all-to-alls
        # (and their backward), on a link of pure latency: one round each between 2 processes.
        moe = pl.ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=16, n_experts=4, top_k=2)
        link = pl.Link(latency=0.02, bandwidth=1e15)
        res = cluster.run(s, model=moe, link=link, expert_parallel=2, progress=False)
        ring = 1 * 0.02
        spans = [e.duration for e in res.timeline.comm_events() if e.action.kind in ("Ed", "Ec")]
        assert len(spans) == moe.n_layers * 2 * 2 * 2     # blocks × (Ed, Ec) × (F, B) × m
        took = min(spans)
    assert took >= ring
    if mesh == "expert":
        # The simulator charges each pass its all-to-alls (3 in a forward, with the split
        # sizes; 2 in a backward) at the link's price: 2 microbatches, 2 MoE blocks.
        assert res.simulated.makespan >= 2 * moe.n_layers * (3 + 2) * ring
    assert res.max_grad_error <= 1e-5, res.grad_errors
