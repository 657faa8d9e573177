"""The toy model's shape: `ModelConfig`, checked when it is made, and how a vocabulary is split
into shards. Its own module so that the byte model (memory.py, footprint.py) can read a shape
without importing the layers that gpt.py builds from it."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..checks import positive_int, seed as check_seed
from .moe import check_config


LAYER_SEED_STRIDE = 1_000_003


@dataclass(frozen=True)
class ModelConfig:
    n_layers: int = 4
    d_model: int = 64
    n_heads: int = 4
    d_ff: int | None = None          # None means 4 * d_model
    vocab_size: int = 64
    seq_len: int = 32
    seed: int = 0
    tie_embeddings: bool = False
    # "chars": token ids are the corpus's characters (52 symbols, whatever vocab_size is);
    # "contexts": each character is split into vocab_size // 52 variants by its context
    # (data.context_tokens), so a large vocabulary is used by the data, not just allocated.
    tokens: str = "chars"
    n_experts: int | None = None     # None or 0: dense MLPs; E > 0: mixture-of-experts MLPs
    top_k: int = 1                   # experts per token
    capacity_factor: float = 1.25    # an expert takes ⌈c · tokens · k / E⌉ tokens of a sequence
    aux_loss_coef: float = 0.01      # α of the load-balancing loss α · E · Σ fᵢ·Pᵢ

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "vocab_size", "seq_len"):
            positive_int(f"ModelConfig.{name}", getattr(self, name))
        if self.d_ff is not None:
            positive_int("ModelConfig.d_ff", self.d_ff)      # or None, meaning 4 * d_model
        # Each layer draws its weights from seed * LAYER_SEED_STRIDE + layer index, which
        # torch's generator must accept (64 bits): bound the seed so every derived one fits.
        check_seed("ModelConfig.seed", self.seed, -(2**63 // LAYER_SEED_STRIDE),
                   (2**64 - self.total_layers) // LAYER_SEED_STRIDE + 1,
                   f"layer i's weights are seeded with seed × {LAYER_SEED_STRIDE} + i, "
                   f"which must fit in 64 bits")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"ModelConfig.tie_embeddings must be True or False, "
                             f"got {self.tie_embeddings!r}")
        if self.tokens not in ("chars", "contexts"):
            raise ValueError(f"ModelConfig.tokens must be 'chars' or 'contexts', got {self.tokens!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"ModelConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        check_config(self)
        if not self.moe and self.top_k != 1:
            raise ValueError(f"ModelConfig.top_k={self.top_k!r} needs a mixture of experts: it is "
                             f"the experts each token goes to, so a dense model (n_experts None "
                             f"or 0) keeps top_k=1; set n_experts to use it")

    @property
    def moe(self) -> bool:
        """Whether the blocks' MLPs are mixtures of experts."""
        return bool(self.n_experts)

    @property
    def ffn_width(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def token_vocab(self) -> int | None:
        """The vocabulary the batches are drawn over (data.get_batch's vocab_size): None for
        the characters themselves."""
        return self.vocab_size if self.tokens == "contexts" else None

    @property
    def total_layers(self) -> int:
        """Embedding + blocks + head: the length of the flat layer list."""
        return self.n_layers + 2

    def as_dict(self) -> dict:
        return asdict(self)


def shard_rows(vocab_size: int, ranks: int, rank: int) -> tuple[int, int]:
    """[first, stop) rows of shard `rank` of the vocabulary (vocabulary parallelism; the byte
    model counts them too): contiguous, sizes differing by at most one."""
    base, extra = divmod(vocab_size, ranks)
    first = rank * base + min(rank, extra)
    return first, first + base + (1 if rank < extra else 0)
