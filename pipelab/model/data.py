"""The corpus the toy model trains on, a character tokenizer, batches and microbatches.

The corpus lives in `data/corpus.txt` at the repository root (made by `data/make_corpus.py`).
The alphabet is fixed here rather than read from the file, so every process - a notebook
kernel or a pipeline worker - encodes the same way without touching the corpus.
"""
from __future__ import annotations

import functools
import string
from pathlib import Path

import torch

from ..checks import positive_int, seed as check_seed

#: Every symbol the tokenizer knows: newline, space, punctuation, digits, lowercase letters.
ALPHABET = "\n " + "!'(),-.:;=?*+/" + string.digits + string.ascii_lowercase
VOCAB_SIZE = len(ALPHABET)
assert VOCAB_SIZE <= 64, "the toy model's default vocab_size is 64"

_INDEX = {ch: i for i, ch in enumerate(ALPHABET)}

#: Where the corpus is looked up: the repository's data/ folder, next to the package.
CORPUS_PATH = Path(__file__).resolve().parents[2] / "data" / "corpus.txt"
_VAL_FRACTION = 0.1


def encode(text: str) -> list[int]:
    """Token ids of `text`; raises ValueError naming the first character outside the alphabet."""
    try:
        return [_INDEX[ch] for ch in text]
    except KeyError as err:
        raise ValueError(
            f"character {err.args[0]!r} is not in the alphabet {ALPHABET!r} "
            "(lowercase letters, digits, space, newline and !'(),-.:;=?*+/)") from None


def decode(ids) -> str:
    """The text of a sequence of token ids (a list or a 1-d tensor)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    try:
        return "".join(ALPHABET[i] for i in ids)
    except (IndexError, TypeError):
        raise ValueError(f"token ids must be integers in [0, {VOCAB_SIZE}), got {ids!r}") from None


def load_corpus(path: str | Path | None = None) -> str:
    """The corpus text (default: data/corpus.txt of the repository this package lives in)."""
    path = Path(path) if path is not None else CORPUS_PATH
    if not path.exists():
        raise FileNotFoundError(
            f"corpus not found at {path}; pipelab reads it from the repository's data/ folder "
            "(install with `pip install -e .`), or regenerate it with `python data/make_corpus.py`")
    return path.read_text(encoding="ascii")


@functools.lru_cache(maxsize=4)
def _tokens(path: str | None, split: str) -> torch.Tensor:
    ids = torch.tensor(encode(load_corpus(path)), dtype=torch.long)
    cut = int(len(ids) * (1 - _VAL_FRACTION))
    return ids[:cut] if split == "train" else ids[cut:]


def corpus_tokens(split: str = "train", path: str | Path | None = None) -> torch.Tensor:
    """The corpus as a 1-d LongTensor: the first 90% for "train", the last 10% for "val"."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    return _tokens(None if path is None else str(path), split)


#: The context hash: the CONTEXT characters before a position, read as digits of a polynomial
#: in _CONTEXT_BASE modulo the prime _CONTEXT_PRIME (no int64 overflow), then modulo the number
#: of variants. Six characters: the corpus has ~24k distinct (6 before, 1) strings, enough that
#: a 32k vocabulary is about half used (data/vocab_stats.py prints the table); two would cap
#: it at ~1.2k ids whatever V is.
CONTEXT = 6
_CONTEXT_BASE, _CONTEXT_PRIME = 1_000_003, 2_147_483_647


def context_tokens(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A synthetic large vocabulary over the character stream: the token of position j is its
    character c_j plus VOCAB_SIZE × (a hash of the CONTEXT characters before it, modulo
    vocab_size // VOCAB_SIZE). Each character splits into that many context variants, like
    a sub-word vocabulary whose pieces depend on what precedes them, so ids spread over
    [0, vocab_size) and a model must predict among all of them. Deterministic, nothing
    downloaded; with vocab_size < 2 × VOCAB_SIZE the ids are the characters themselves."""
    positive_int("vocab_size", vocab_size)
    if vocab_size < VOCAB_SIZE:
        raise ValueError(f"vocab_size ({vocab_size}) must be at least the alphabet's {VOCAB_SIZE}")
    variants = vocab_size // VOCAB_SIZE
    ids = ids.to(torch.int64)
    digest = torch.zeros_like(ids)
    for back in range(1, CONTEXT + 1):          # c_{j-1} first; positions before 0 read as 0
        before = torch.cat([ids.new_zeros(back), ids[:-back]])[:len(ids)]
        digest = (digest * _CONTEXT_BASE + before + 1) % _CONTEXT_PRIME
    return ids + VOCAB_SIZE * (digest % variants)


@functools.lru_cache(maxsize=8)
def _context_corpus(path: str | None, split: str, vocab_size: int) -> torch.Tensor:
    return context_tokens(_tokens(path, split), vocab_size)


def get_batch(batch_size: int, seq_len: int, *, seed: int | None = None,
              generator: torch.Generator | None = None, split: str = "train",
              path: str | Path | None = None,
              vocab_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_size` random windows of the corpus: inputs (b, s) and targets shifted by one.

    Deterministic given `seed` (a fresh generator) or `generator` (advanced by the call, so
    successive calls give successive batches); with neither, torch's global RNG is used.
    With `vocab_size`, the ids are `context_tokens` of the characters, spread over
    [0, vocab_size) (the same windows as without it).
    """
    positive_int("batch_size", batch_size)
    positive_int("seq_len", seq_len)
    if seed is not None and generator is not None:
        raise ValueError("pass seed or generator, not both")
    if seed is not None:
        generator = torch.Generator().manual_seed(check_seed("seed", seed))
    data = corpus_tokens(split, path)
    if vocab_size is not None:
        data = _context_corpus(None if path is None else str(path), split, vocab_size)
    if seq_len + 1 > len(data):
        raise ValueError(f"seq_len {seq_len} is longer than the {split} corpus ({len(data)} tokens)")
    starts = torch.randint(0, len(data) - seq_len, (batch_size,), generator=generator)
    offsets = torch.arange(seq_len)
    inputs = data[starts[:, None] + offsets]
    targets = data[starts[:, None] + offsets + 1]
    return inputs, targets


def split_microbatches(inputs: torch.Tensor, targets: torch.Tensor,
                       microbatches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Split a batch along its first dimension into `microbatches` equal (x, y) pairs.

    Each piece is a contiguous view (rows of a contiguous tensor), ready to send point to point.
    """
    positive_int("microbatches", microbatches)
    if inputs.shape[0] != targets.shape[0]:
        raise ValueError(f"inputs and targets must have the same number of rows, "
                         f"got {inputs.shape[0]} and {targets.shape[0]}")
    rows = inputs.shape[0]
    if rows % microbatches:
        divisors = [d for d in range(1, rows + 1) if rows % d == 0]
        raise ValueError(
            f"batch of {rows} rows does not split into {microbatches} microbatches: "
            f"microbatches must divide the batch size (divisors of {rows}: "
            f"{', '.join(map(str, divisors))})")
    size = rows // microbatches
    return [(x.contiguous(), y.contiguous())
            for x, y in zip(inputs.split(size), targets.split(size))]
