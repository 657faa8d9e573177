"""Code the benchmarks run inside the workers (through `LocalCluster.call`), kept in the package
so spawned workers can import it: torch.distributed.pipelining on pipelab's stages, and an
instrumented run of pipelab's own executor."""
