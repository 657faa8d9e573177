"""pl.Device: an accelerator as the cost model sees it — how fast it multiplies, how fast it talks.

A device turns FLOPs into seconds at `peak_flops × efficiency` (the share of the datasheet's
dense 16-bit peak that a transformer's matmuls reach), and bytes into seconds on two links: the
pipeline's point-to-point link (`link_latency`, `link_bandwidth`) and the tensor-parallel group's
link (`tp_latency`, `tp_bandwidth`; the same link unless given — tensor parallelism usually stays
inside a node, on NVLink). Between nodes a cluster talks over another, slower link (InfiniBand):
`inter_node_latency`, `inter_node_bandwidth` (None: the pipeline link's, one link for
everything). `p2p_time` and `allreduce_time` take `inter_node=True` for traffic that crosses
nodes; the planner says which does (planner/shaped.py). `memory_bytes` is what a rank may hold; `memory_bandwidth` prices the
output layer's elementwise passes (softmax, cross-entropy), which are bound by memory traffic,
not by FLOPs.

Named devices (`Device.named("A100-80GB")`, or a usual spelling: "H100-80GB", "H100-SXM",
"A100-SXM4-80GB", "nvidia h100") carry their datasheet figures; the efficiency (0.5), the
latencies (10 µs in a node, 20 µs between nodes) and the inter-node links (one InfiniBand
adapter a GPU, as in NVIDIA's DGX systems) are assumptions of this model, stated as such.
`Device.fit_cpu()` measures a CPU instead: its peak is a large matmul timed here, its
efficiency what the toy model's forward and backward reach of it.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
import time
from dataclasses import dataclass

import torch

from ..model.config import ModelConfig
from ..model.gpt import ToyGPT, loss_fn
from ..schedules.reductions import allreduce_time
from ..support.threads import one_thread
from .flops import model_flops

GB = 1e9                    # datasheets count memory and bandwidth in powers of ten
DEFAULT_EFFICIENCY = 0.5    # assumed share of the peak a Megatron GPT's matmuls reach
DEFAULT_LATENCY = 1e-5      # assumed seconds per message (NCCL inside a node, order of magnitude)
INTER_NODE_LATENCY = 2e-5   # assumed seconds per message between nodes (InfiniBand, order of magnitude)


def _positive(name: str, value, what: str, allow_inf: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0 \
        and not math.isnan(value) and (allow_inf or math.isfinite(value))
    if not ok:
        raise ValueError(f"Device.{name} must be {what} > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Device:
    """One accelerator: `peak_flops` (dense 16-bit FLOP/s), the `efficiency` its transformer
    matmuls reach (0 < e ≤ 1), the pipeline link (`link_latency` s, `link_bandwidth` bytes/s,
    one direction), `memory_bytes`, and optionally the tensor-parallel link and the memory
    bandwidth (bytes/s; math.inf: elementwise work is free), and the link between nodes
    (`inter_node_latency`, `inter_node_bandwidth`; None: the pipeline link's)."""
    name: str
    peak_flops: float
    efficiency: float = DEFAULT_EFFICIENCY
    link_latency: float = DEFAULT_LATENCY
    link_bandwidth: float = 25 * GB
    memory_bytes: float = 80 * GB
    tp_latency: float | None = None
    tp_bandwidth: float | None = None
    memory_bandwidth: float = math.inf
    source: str = ""
    inter_node_latency: float | None = None
    inter_node_bandwidth: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Device.name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.source, str):
            raise ValueError(f"Device.source must be a string (where the figures come from), "
                             f"got {self.source!r}")
        _positive("peak_flops", self.peak_flops, "a number of FLOP/s")
        eff = self.efficiency
        if not (isinstance(eff, numbers.Real) and not isinstance(eff, bool) and 0 < eff <= 1):
            raise ValueError(f"Device.efficiency must be a share of the peak, 0 < efficiency "
                             f"<= 1, got {eff!r}")
        for name in ("link_latency", "tp_latency", "inter_node_latency"):
            value = getattr(self, name)
            if value is None and name != "link_latency":
                continue
            if not (isinstance(value, numbers.Real) and not isinstance(value, bool)
                    and math.isfinite(value) and value >= 0):
                raise ValueError(f"Device.{name} must be a finite number of seconds >= 0, "
                                 f"got {value!r}")
        _positive("link_bandwidth", self.link_bandwidth, "a number of bytes/s", allow_inf=True)
        if self.tp_bandwidth is not None:
            _positive("tp_bandwidth", self.tp_bandwidth, "a number of bytes/s", allow_inf=True)
        if self.inter_node_bandwidth is not None:
            _positive("inter_node_bandwidth", self.inter_node_bandwidth, "a number of bytes/s",
                      allow_inf=True)
        _positive("memory_bytes", self.memory_bytes, "a number of bytes", allow_inf=True)
        _positive("memory_bandwidth", self.memory_bandwidth, "a number of bytes/s",
                  allow_inf=True)

    @property
    def flops(self) -> float:
        """FLOP/s the model's matmuls run at: peak × efficiency."""
        return self.peak_flops * self.efficiency

    def compute_time(self, flops: float) -> float:
        """Seconds for `flops` of matmul work."""
        return flops / self.flops

    def memory_time(self, nbytes: float) -> float:
        """Seconds to stream `nbytes` through memory (elementwise, bandwidth-bound work)."""
        return nbytes / self.memory_bandwidth

    def link(self, inter_node: bool = False) -> tuple[float, float]:
        """(latency, bandwidth) of the pipeline link, or of the link between nodes."""
        if inter_node:
            return (self.link_latency if self.inter_node_latency is None
                    else self.inter_node_latency,
                    self.link_bandwidth if self.inter_node_bandwidth is None
                    else self.inter_node_bandwidth)
        return self.link_latency, self.link_bandwidth

    def p2p_time(self, nbytes: float, inter_node: bool = False) -> float:
        """Seconds of one point-to-point message on the pipeline link (or, `inter_node`, on
        the link between nodes): α + bytes/β."""
        latency, bandwidth = self.link(inter_node)
        return latency + nbytes / bandwidth

    def allreduce_time(self, nbytes: float, processes: int, tensor: bool = False,
                       inter_node: bool = False) -> float:
        """Seconds of a ring all-reduce of `nbytes` over `processes`, on the tensor-parallel
        link when `tensor`, else on the pipeline link, or the link between nodes when the ring
        crosses them (`inter_node`: its slowest hop sets a ring's pace)."""
        latency, bandwidth = self.link(inter_node)
        if tensor:
            latency = self.tp_latency if self.tp_latency is not None else latency
            bandwidth = self.tp_bandwidth if self.tp_bandwidth is not None else bandwidth
        return allreduce_time(nbytes, processes, bandwidth, latency)

    def with_efficiency(self, efficiency: float) -> "Device":
        """This device at another efficiency (a slider, or a fit)."""
        return dataclasses.replace(self, efficiency=efficiency)

    @classmethod
    def named(cls, name: str, **changes) -> "Device":
        """A named device (`NAMED`, or a usual spelling of one: `ALIASES`), with any field
        replaced by `changes`."""
        key = _spelling(name) if isinstance(name, str) else None
        found = NAMED.get(name) or NAMED.get(ALIASES.get(key, ""))
        if found is None:
            hint = f"; {AMBIGUOUS[key]}" if key in AMBIGUOUS else ""
            raise ValueError(f"Device.named: unknown device {name!r}{hint}; named ones: "
                             f"{', '.join(sorted(NAMED))} (also spelt e.g. 'H100-80GB', "
                             f"'H100-SXM', 'A100-SXM4-80GB'; or build pl.Device(...) yourself)")
        return dataclasses.replace(found, **changes) if changes else found

    @classmethod
    def fit_cpu(cls, cfg: ModelConfig | None = None, rows: int = 4, repeats: int = 3,
                gemm: int = 512) -> "Device":
        """This CPU, measured on one thread (as a worker runs): the peak is the FLOP/s of a
        `gemm`×`gemm` float32 matmul, the efficiency the share of it that one forward and
        backward of the toy model (`cfg`, `rows` sequences) reaches, its FLOPs counted by
        flops.py's formulas. The best of `repeats` of each (timing noise only slows)."""
        cfg = cfg if cfg is not None else ModelConfig()
        if not isinstance(cfg, ModelConfig):
            raise ValueError(f"cfg must be a pl.ModelConfig, got {type(cfg).__name__}")
        for name, value in (("rows", rows), ("repeats", repeats), ("gemm", gemm)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Device.fit_cpu: {name} must be a positive integer, "
                                 f"got {value!r}")
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(gemm, gemm, generator=gen)
        model = ToyGPT(cfg)
        idx = torch.randint(cfg.vocab_size, (rows, cfg.seq_len), generator=gen)
        with one_thread():
            peak = 2 * gemm ** 3 / _best(lambda: a @ a, repeats)

            def step():
                model.zero_grad(set_to_none=True)
                loss_fn(model(idx), idx).backward()
            work = model_flops(cfg.d_model, cfg.n_layers, cfg.seq_len, cfg.vocab_size, rows,
                               ffn=cfg.ffn_width)
            reached = work / _best(step, repeats)
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") \
            if hasattr(os, "sysconf") else 8 * GB
        return cls(name="this CPU (fitted)", peak_flops=peak, efficiency=min(1.0, reached / peak),
                   link_latency=2e-4, link_bandwidth=1 * GB, memory_bytes=float(pages),
                   source=f"Device.fit_cpu: {gemm}² matmul and ToyGPT({cfg.d_model}×"
                          f"{cfg.n_layers}) timed on one thread")


def _best(work, repeats: int) -> float:
    """The shortest thread-CPU time of `repeats` runs of `work` (after one warm-up)."""
    work()
    took = []
    for _ in range(repeats):
        t0 = time.thread_time()
        work()
        took.append(time.thread_time() - t0)
    return max(min(took), 1e-9)


def _spelling(name: str) -> str:
    """A device name as ALIASES keys it: upper case, words joined by '-', no vendor prefix."""
    key = "-".join(name.upper().replace("_", " ").replace("-", " ").split())
    return key.removeprefix("NVIDIA-")


# Datasheet figures: dense BF16/FP16 tensor-core peak (no sparsity), HBM size and bandwidth,
# NVLink bandwidth per direction (half the bidirectional figure NVIDIA quotes). Between nodes:
# one InfiniBand adapter a GPU, as NVIDIA's DGX systems have (DGX A100: 200 Gb/s HDR, 25 GB/s;
# DGX H100: 400 Gb/s NDR, 50 GB/s) — an assumption for the H20 and the A800, whose clusters
# vary.
_IB_HDR = dict(inter_node_latency=INTER_NODE_LATENCY, inter_node_bandwidth=25 * GB)
_IB_NDR = dict(inter_node_latency=INTER_NODE_LATENCY, inter_node_bandwidth=50 * GB)
NAMED: dict[str, Device] = {d.name: d for d in (
    Device("A100-40GB", 312e12, link_bandwidth=300 * GB, memory_bytes=40 * GB,
           memory_bandwidth=1555 * GB, **_IB_HDR,
           source="NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TFLOPS BF16 dense, 40 GB "
                  "HBM2 at 1,555 GB/s, NVLink 600 GB/s bidirectional (SXM)"),
    Device("A100-80GB", 312e12, link_bandwidth=300 * GB, memory_bytes=80 * GB,
           memory_bandwidth=2039 * GB, **_IB_HDR,
           source="NVIDIA A100 datasheet: 312 TFLOPS BF16 dense, 80 GB HBM2e at 2,039 GB/s, "
                  "NVLink 600 GB/s bidirectional (SXM); the zero-bubble paper's GPUs "
                  "(A100 SXM 80GB) and the vocabulary artifact's 312 TFLOPS (quick_exp.sh)"),
    Device("H100", 989e12, link_bandwidth=450 * GB, memory_bytes=80 * GB,
           memory_bandwidth=3350 * GB, **_IB_NDR,
           source="NVIDIA H100 SXM datasheet: 989 TFLOPS BF16 dense, 80 GB HBM3 at 3.35 TB/s, "
                  "NVLink 900 GB/s bidirectional"),
    Device("H20", 148e12, link_bandwidth=450 * GB, memory_bytes=96 * GB,
           memory_bandwidth=4000 * GB, **_IB_NDR,
           source="NVIDIA H20 product brief: 148 TFLOPS BF16 dense, 96 GB HBM3 at 4.0 TB/s, "
                  "NVLink 900 GB/s bidirectional; one of STP's clusters (arXiv 2510.27257)"),
    Device("A800", 312e12, link_bandwidth=200 * GB, memory_bytes=80 * GB,
           memory_bandwidth=2039 * GB, **_IB_HDR,
           source="NVIDIA A800 SXM (the A100 with NVLink cut to 400 GB/s bidirectional): "
                  "312 TFLOPS BF16 dense, 80 GB; one of STP's clusters (arXiv 2510.27257)"),
)}
# Usual spellings of the named devices (keys as `_spelling` writes them). Only the SXM boards:
# a PCIe H100 has another peak (756 TFLOPS) and no NVLink switch, so it is not an alias.
ALIASES: dict[str, str] = {
    **{k: "H100" for k in ("H100", "H100-80GB", "H100-SXM", "H100-SXM5", "H100-SXM-80GB",
                           "H100-SXM5-80GB", "H100-80GB-HBM3", "H100-SXM5-80GB-HBM3")},
    **{k: "A100-80GB" for k in ("A100-80GB", "A100-SXM-80GB", "A100-SXM4-80GB",
                                "A100-80GB-SXM", "A100-SXM4-80GB-HBM2E")},
    **{k: "A100-40GB" for k in ("A100-40GB", "A100-SXM-40GB", "A100-SXM4-40GB",
                                "A100-40GB-SXM")},
    **{k: "H20" for k in ("H20", "H20-96GB")},
    **{k: "A800" for k in ("A800", "A800-80GB", "A800-SXM", "A800-SXM4-80GB")},
}
AMBIGUOUS = {"A100": "an A100 comes with 40 or 80 GB: say 'A100-40GB' or 'A100-80GB'",
             "A100-SXM": "an A100 comes with 40 or 80 GB: say 'A100-40GB' or 'A100-80GB'",
             "A100-SXM4": "an A100 comes with 40 or 80 GB: say 'A100-40GB' or 'A100-80GB'",
             "H100-PCIE": "the PCIe H100 (756 TFLOPS, no NVLink switch) is not named: build "
                          "pl.Device('H100-PCIe', 756e12, ...) with its figures"}
