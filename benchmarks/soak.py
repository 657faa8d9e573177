"""Soak: many runs on one LocalCluster, across mesh and schedule shapes; nothing may grow.

Every `--every` runs prints the number of processes (the parent's live children), open file
descriptors and resident memory (RSS, MiB) of the parent and of the workers, and the threads of
the workers. A leak shows as a column that keeps climbing; a restart of the workers (a new pid)
is counted too. Reads /proc only (Linux), so it needs no extra package.

    python benchmarks/soak.py --runs 200 --processes 4

With 4 processes the runs cycle through the meshes 4 pipeline ranks × 1 replica, 2 × 2 and
1 × 4 (data parallelism, `cluster.run(..., data_parallel=dp)`), each with several schedules.
"""
from __future__ import annotations

import argparse
import itertools
import os
import time
from pathlib import Path

import pipelab as pl

CFG = pl.ModelConfig(n_layers=6, d_model=32, n_heads=2, seq_len=16)   # 8 layers: 8 stages fit


def shapes(processes: int) -> list[tuple[str, pl.Schedule, int, int]]:
    """(label, schedule, steps, data_parallel): every mesh pp × dp of the processes, several
    families, microbatch counts and step counts."""
    out = []
    meshes = [(processes // dp, dp) for dp in range(1, processes + 1) if processes % dp == 0]
    for (pp, dp), (name, options), (m, steps) in itertools.product(
            meshes, [("gpipe", {}), ("1f1b", {}), ("interleaved-1f1b", {"chunks": 2}),
                     ("zb-h1", {}), ("zb-v", {})], [(2, 1), (4, 2), (8, 1)]):
        try:
            sched = pl.schedule(name, ranks=pp, microbatches=m, **options)
        except ValueError:
            continue            # a shape this family does not take
        if sched.stages > CFG.total_layers:
            continue            # more stages than the toy model has layers
        out.append((f"{name} pp={pp} dp={dp} m={m} steps={steps}", sched, steps, dp))
    return out


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid and stat[0] != "Z":
                out.append(int(entry))
    return out


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def sample(cluster) -> dict:
    me, workers = os.getpid(), cluster.pids
    return {"procs": len(children(me)),
            "parent fds": fds(me), "worker fds": sum(fds(p) for p in workers),
            "parent MiB": status(me, "VmRSS") / 1024,
            "worker MiB": sum(status(p, "VmRSS") for p in workers) / 1024,
            "threads": sum(status(p, "Threads") for p in workers)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=150)
    parser.add_argument("--processes", type=int, default=4,
                        help="worker processes; every mesh pp × dp of them is used")
    parser.add_argument("--every", type=int, default=25)
    args = parser.parse_args()
    shape_list = shapes(args.processes)
    print(f"{len(shape_list)} shapes: " + "; ".join(label for label, *_ in shape_list))
    columns = ["run", "procs", "parent fds", "worker fds", "parent MiB", "worker MiB",
               "threads", "restarts", "s/run"]
    print(" ".join(f"{c:>10}" for c in columns))
    began = time.perf_counter()
    with pl.LocalCluster(ranks=args.processes, timeout=120) as cluster:
        first_pids = cluster.pids
        rows, last = [], time.perf_counter()
        for run, (label, sched, steps, dp) in zip(range(1, args.runs + 1),
                                                  itertools.cycle(shape_list)):
            res = cluster.run(sched, model=CFG, steps=steps, progress=False, check=(run % 3 == 0),
                              data_parallel=dp)
            assert res.loss > 0, label
            if run == 1 or run % args.every == 0:
                row = {"run": run, **sample(cluster), "restarts": cluster.starts - 1,
                       "s/run": (time.perf_counter() - last) / (1 if run == 1 else args.every)}
                last = time.perf_counter()
                rows.append(row)
                print(" ".join(f"{row[c]:>10.1f}" if isinstance(row[c], float) else
                               f"{row[c]:>10}" for c in columns), flush=True)
        same = cluster.pids == first_pids
    print(f"{args.runs} runs in {time.perf_counter() - began:.0f} s; workers "
          f"{'kept' if same else 'CHANGED'} their pids; after close: "
          f"{len(children(os.getpid()))} child process(es) (multiprocessing's resource tracker, "
          f"started once by spawn, stays until exit)")


if __name__ == "__main__":
    main()
