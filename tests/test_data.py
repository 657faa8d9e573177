"""Corpus, tokenizer, batches and microbatches."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pipelab as pl
from pipelab.model import data

REPO = Path(__file__).resolve().parent.parent


def test_alphabet_fits_the_model_and_covers_the_corpus():
    assert len(set(pl.ALPHABET)) == len(pl.ALPHABET) == pl.VOCAB_SIZE <= 64
    text = pl.load_corpus()
    assert set(text) <= set(pl.ALPHABET)
    assert 100_000 < len(text.encode()) <= 2_000_000


def test_corpus_regenerates_byte_for_byte(tmp_path):
    out = tmp_path / "corpus.txt"
    subprocess.run([sys.executable, str(REPO / "data" / "make_corpus.py"), "--out", str(out)],
                   check=True, capture_output=True, timeout=120)
    assert out.read_bytes() == (REPO / "data" / "corpus.txt").read_bytes()


def test_corpus_found_from_any_working_directory(tmp_path):
    result = subprocess.run([sys.executable, "-c", "import pipelab; print(len(pipelab.load_corpus()))"],
                            cwd=tmp_path, check=True, capture_output=True, text=True, timeout=120)
    assert int(result.stdout) == len(pl.load_corpus())


def test_missing_corpus_says_how_to_make_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="make_corpus.py"):
        pl.load_corpus(tmp_path / "nope.txt")


def test_tokenizer_round_trip():
    text = pl.load_corpus()[:5000]
    ids = pl.encode(text)
    assert len(ids) == len(text) and all(0 <= i < pl.VOCAB_SIZE for i in ids)
    assert pl.decode(ids) == text
    assert pl.decode(torch.tensor(ids)) == text
    assert pl.decode(pl.encode(pl.ALPHABET)) == pl.ALPHABET
    assert pl.encode(pl.ALPHABET) == list(range(pl.VOCAB_SIZE))


def test_tokenizer_rejects_unknown_symbols():
    with pytest.raises(ValueError, match="'Q'"):
        pl.encode("the Quick fox")
    with pytest.raises(ValueError, match="token ids"):
        pl.decode([0, pl.VOCAB_SIZE])


def test_batch_shapes_and_shift():
    x, y = pl.get_batch(5, 24, seed=0)
    assert x.shape == y.shape == (5, 24)
    assert x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert int(x.max()) < pl.VOCAB_SIZE and int(x.min()) >= 0
    # every row is a real window of the corpus
    text = pl.load_corpus()
    for row_x, row_y in zip(x, y):
        window = pl.decode(row_x) + pl.decode(row_y)[-1]
        assert window in text


def test_batches_are_deterministic():
    a, b, c = (pl.get_batch(8, 16, seed=s) for s in (3, 3, 4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    first, second = pl.get_batch(4, 16, generator=g1), pl.get_batch(4, 16, generator=g1)
    assert not torch.equal(first[0], second[0])          # the generator advances
    assert torch.equal(pl.get_batch(4, 16, generator=g2)[0], first[0])
    assert torch.equal(pl.get_batch(4, 16, generator=g2)[0], second[0])


def test_validation_split_is_held_out():
    text = pl.load_corpus()
    train, val = data.corpus_tokens("train"), data.corpus_tokens("val")
    cut = int(len(text) * 0.9)                     # the first 90% trains, the last 10% validates
    assert pl.decode(train) == text[:cut] and pl.decode(val) == text[cut:]
    x, y = pl.get_batch(64, 16, seed=0, split="val")
    assert x.shape == (64, 16)
    for row_x, row_y in zip(x, y):                 # every window lies inside the held-out tail
        assert pl.decode(row_x) + pl.decode(row_y)[-1] in text[cut:]
    with pytest.raises(ValueError, match="split"):
        pl.get_batch(4, 16, seed=0, split="test")


@pytest.mark.parametrize("kwargs,name", [
    (dict(batch_size=0, seq_len=8), "batch_size"),
    (dict(batch_size=2.0, seq_len=8), "batch_size"),
    (dict(batch_size=2, seq_len=-1), "seq_len"),
    (dict(batch_size=2, seq_len=10**9), "seq_len"),
    (dict(batch_size=2, seq_len=8, seed=1, generator=torch.Generator()), "seed or generator"),
    (dict(batch_size=2, seq_len=8, seed=0.5), "seed must be an integer"),
])
def test_bad_batch_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        pl.get_batch(**kwargs)


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_split_microbatches(m):
    x, y = pl.get_batch(8, 16, seed=0)
    pieces = pl.split_microbatches(x, y, m)
    assert len(pieces) == m
    for px, py in pieces:
        assert px.shape == py.shape == (8 // m, 16)
        assert px.is_contiguous() and py.is_contiguous()
    assert torch.equal(torch.cat([p for p, _ in pieces]), x)
    assert torch.equal(torch.cat([q for _, q in pieces]), y)


def test_split_microbatches_rejects_a_batch_that_does_not_divide():
    x, y = pl.get_batch(6, 8, seed=0)
    with pytest.raises(ValueError) as err:
        pl.split_microbatches(x, y, 4)
    message = str(err.value)
    assert message.startswith("batch of 6 rows does not split into 4 microbatches: ")
    assert "microbatches must divide the batch size" in message and "1, 2, 3, 6" in message


@pytest.mark.parametrize("m", [0, -1, 2.0, True, None])
def test_split_microbatches_rejects_bad_counts(m):
    x, y = pl.get_batch(4, 8, seed=0)
    with pytest.raises(ValueError, match="microbatches must be a positive integer"):
        pl.split_microbatches(x, y, m)


def test_split_microbatches_rejects_mismatched_rows():
    x, y = pl.get_batch(4, 8, seed=0)
    with pytest.raises(ValueError, match="same number of rows"):
        pl.split_microbatches(x, y[:2], 2)
