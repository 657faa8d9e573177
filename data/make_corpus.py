"""Write data/corpus.txt: a small, deterministic corpus a tiny character-level GPT visibly learns.

No downloads: every line comes from a procedural grammar driven by `random.Random(SEED)`, so
running this script again gives the same bytes (checked by tests/test_data.py).

Five kinds of line, mixed at random:

    the small cat chases a red ball.       sentences with subject-verb agreement
    the dogs sleep under the old tree.     (plural subject -> plural verb)
    12+7=19.                               addition facts (exact)
    6*4=24.                                multiplication table facts (exact)
    count: 5 6 7 8 9.                      counting runs
    what is 9-3? 6.                        questions with their answer

Usage:  python data/make_corpus.py [--out PATH] [--lines N]
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

SEED = 1811_06965          # GPipe's arXiv number: any fixed integer would do
DEFAULT_LINES = 24_000     # about 0.7 MB

DETERMINERS = ["the", "a", "my", "one", "that"]
ADJECTIVES = ["small", "big", "red", "old", "quick", "lazy", "happy", "green", "quiet", "brave"]
# (singular, plural)
NOUNS = [("cat", "cats"), ("dog", "dogs"), ("bird", "birds"), ("fox", "foxes"),
         ("child", "children"), ("robot", "robots"), ("farmer", "farmers"), ("mouse", "mice")]
OBJECTS = ["ball", "apple", "book", "box", "hat", "stone", "cake", "kite"]
# (third person singular, plural)
TRANSITIVE = [("chases", "chase"), ("sees", "see"), ("finds", "find"), ("likes", "like"),
              ("carries", "carry"), ("eats", "eat")]
INTRANSITIVE = [("sleeps", "sleep"), ("sings", "sing"), ("runs", "run"), ("waits", "wait")]
PLACES = ["under the old tree", "near the river", "in the house", "on the hill", "by the door"]


def subject(rng: random.Random) -> tuple[str, bool]:
    """A noun phrase and whether it is plural."""
    singular, plural = rng.choice(NOUNS)
    adjective = rng.choice(ADJECTIVES) + " " if rng.random() < 0.6 else ""
    if rng.random() < 0.35:
        return f"the {adjective}{plural}", True
    return f"{rng.choice(DETERMINERS)} {adjective}{singular}", False


def sentence(rng: random.Random) -> str:
    noun_phrase, plural = subject(rng)
    if rng.random() < 0.6:
        verb = rng.choice(TRANSITIVE)[1 if plural else 0]
        obj = f"{rng.choice(DETERMINERS)} {rng.choice(ADJECTIVES)} {rng.choice(OBJECTS)}"
        return f"{noun_phrase} {verb} {obj}."
    verb = rng.choice(INTRANSITIVE)[1 if plural else 0]
    return f"{noun_phrase} {verb} {rng.choice(PLACES)}."


def addition(rng: random.Random) -> str:
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    return f"{a}+{b}={a + b}."


def multiplication(rng: random.Random) -> str:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return f"{a}*{b}={a * b}."


def counting(rng: random.Random) -> str:
    start = rng.randint(0, 30)
    return "count: " + " ".join(str(n) for n in range(start, start + rng.randint(3, 7))) + "."


def question(rng: random.Random) -> str:
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    if rng.random() < 0.5:
        return f"what is {a}+{b}? {a + b}."
    a, b = max(a, b), min(a, b)
    return f"what is {a}-{b}? {a - b}."


KINDS = [(sentence, 0.5), (addition, 0.15), (multiplication, 0.1), (counting, 0.1),
         (question, 0.15)]


def make_corpus(lines: int = DEFAULT_LINES, seed: int = SEED) -> str:
    rng = random.Random(seed)
    makers, weights = zip(*KINDS)
    out = [rng.choices(makers, weights)[0](rng) for _ in range(lines)]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "corpus.txt")
    parser.add_argument("--lines", type=int, default=DEFAULT_LINES)
    args = parser.parse_args()
    text = make_corpus(args.lines)
    args.out.write_text(text, encoding="ascii", newline="\n")
    print(f"wrote {args.out}: {len(text):,} characters, {args.lines:,} lines, "
          f"alphabet of {len(set(text))}: {''.join(sorted(set(text)))!r}")


if __name__ == "__main__":
    main()
