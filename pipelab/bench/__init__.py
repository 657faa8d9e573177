"""Floor 8, bench: code the benchmarks run inside the workers (through `LocalCluster.call`), kept
in the package so spawned workers can import it.

    torch_side.py   torch.distributed.pipelining on pipelab's stages (benchmarks/vs_torch.py)
    ours_side.py    pipelab's own executor, instrumented, for the same comparison
    profiling.py    a worker's CPU time by category (cProfile), for both sides
    moe_side.py     one expert-parallel MoE layer, timed (benchmarks/moe.py)
    load.py         the load average the benchmark scripts print next to their timings
"""
