"""How much of a large vocabulary the corpus really uses (the `tokens="contexts"` option).

    python data/vocab_stats.py                 # V = 256 ... 32768 over the training split
    python data/vocab_stats.py --sizes 1024 65536

For each V: the variants per character, the distinct token ids the whole training text uses,
their share of V, the entropy of the ids' frequencies (bits; log2 V if every id were equally
common) and how many of 8 equal vocabulary shards hold at least one id. Nothing is downloaded:
the ids are computed from data/corpus.txt by pipelab.model.data.context_tokens.
"""
from __future__ import annotations

import argparse

import torch

from pipelab.model.data import VOCAB_SIZE, context_tokens, corpus_tokens


def coverage(vocab_size: int, ids: torch.Tensor) -> dict:
    tokens = context_tokens(ids, vocab_size)
    counts = torch.bincount(tokens, minlength=vocab_size).double()
    used = counts > 0
    freq = counts[used] / counts.sum()
    shards = torch.nonzero(used).squeeze(1) * 8 // vocab_size
    return dict(V=vocab_size, variants=vocab_size // VOCAB_SIZE, used=int(used.sum()),
                share=float(used.double().mean()), bits=float(-(freq * freq.log2()).sum()),
                shards=len(shards.unique()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[256, 1024, 4096, 8192, 16384, 32768])
    args = parser.parse_args()
    ids = corpus_tokens("train")
    print(f"{'V':>7}{'variants':>10}{'ids used':>10}{'of V':>7}{'entropy (bits)':>16}"
          f"{'log2 V':>8}{'shards hit':>12}")
    for v in args.sizes:
        c = coverage(v, ids)
        print(f"{c['V']:>7}{c['variants']:>10}{c['used']:>10}{c['share']:>7.0%}"
              f"{c['bits']:>16.2f}{v.bit_length() - 1:>8}{c['shards']:>10}/8")


if __name__ == "__main__":
    main()
