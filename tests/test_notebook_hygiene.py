"""What a reader of the notebooks relies on without running them: every file a chapter cites
ships in the repository, no chapter is called "planned" any more, and every chapter from 04 on
asks the reader to predict before it shows (at least two predict-then-check questions).

Also the reference pages: every file, test and link `docs/*.md` cites exists."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
DOCS = sorted((ROOT / "docs").glob("*.md"))
SKIPPED_DIRS = {".git", ".venv", "artifacts", "build", "__pycache__", ".ipynb_checkpoints",
                "shared", ".pytest_cache"}


def shipped_files() -> set[str]:
    """Paths (relative to the repository root) of the files that ship: git's tracked files in a
    checkout, else every file outside build and cache folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True, timeout=30).stdout.decode()
        files = {f for f in out.split("\0") if f}
        if files:
            return files
    except (OSError, subprocess.SubprocessError):
        pass
    return {str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
            and not SKIPPED_DIRS & set(p.relative_to(ROOT).parts)}


SHIPPED = shipped_files()
BASENAMES = {Path(f).name for f in SHIPPED}

URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+", re.I)
MD_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FILE_NAME = re.compile(r"(?<![\w./-])((?:\.\.?/)?[\w][\w./-]*\.(?:md|py))\b")


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def text_of(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def cited(text: str) -> set[str]:
    """Targets of markdown links (not web addresses or in-page anchors) and names of .md and .py
    files written in the text; anchors ("#section") cut off."""
    names = set()
    for target in MD_LINK.findall(text):
        if URL.match(target) or target.startswith(("#", "mailto:")):
            continue
        names.add(target.split("#")[0])
    for name in FILE_NAME.findall(URL.sub(" ", text)):
        names.add(name)
    return {n for n in names if n}


def resolves(name: str, base: str) -> bool:
    """Whether `name`, cited from a file in folder `base`, is a shipped file: relative to that
    folder, to the root or to the package (a module named as `runtime/meter.py`), or — for a
    bare name such as `weight_grad.py` — any shipped file of that name."""
    import posixpath
    candidates = [posixpath.normpath(posixpath.join(base, name)), posixpath.normpath(name),
                  posixpath.normpath(posixpath.join("pipelab", name))]
    if any(c in SHIPPED for c in candidates):
        return True
    return "/" not in name and name in BASENAMES


def missing_citations(path: Path) -> list[str]:
    base = str(path.parent.relative_to(ROOT))
    if path.suffix == ".ipynb":
        texts = [(f"cell {i}", text_of(c)) for i, c in enumerate(cells(path))]
    else:
        texts = [("text", path.read_text())]
    return [f"{where}: {name}" for where, text in texts for name in sorted(cited(text))
            if not resolves(name, base)]


# --- the checks themselves, on small texts (they must be able to fail) --------------------------

def test_citations_are_found_in_links_and_in_prose():
    text = ("See [the page](../docs/formulas.md#dualpipe), [torch](https://pytorch.org/x.md), "
            "[below](#part-2), the table in FORMULAS.md and `pipelab/support/noise.py`; "
            "run benchmarks/vocab.py. Not a file: pl.explorer.predict(...).")
    assert cited(text) == {"../docs/formulas.md", "FORMULAS.md", "pipelab/support/noise.py",
                           "benchmarks/vocab.py"}


def test_resolution_accepts_shipped_files_only():
    assert resolves("../docs/formulas.md", "notebooks")
    assert resolves("pipelab/support/noise.py", "notebooks") and resolves("runtime/meter.py", "notebooks")
    assert resolves("weight_grad.py", "notebooks")           # a module named by its file
    assert not resolves("FORMULAS.md", "notebooks")           # lives outside the repository
    assert not resolves("../shared/PLATFORM.md", "notebooks")
    assert not resolves("docs/missing.md", "notebooks") and not resolves("missing.py", "notebooks")


def test_predict_calls_are_counted_not_definitions_or_other_names():
    code = ("q1 = pl.explorer.predict('a?', 1)\nq2 = predict(\n 'b?', 2)\n"
            "def predict(x): pass\nres.predicted(1)\n# predict(3) in a comment\n")
    assert predict_calls(code) == 2


def test_planned_wording_is_caught():
    assert planned_wording("Chapters 04–13 are planned.")
    assert planned_wording("This chapter is not in the workbook yet.")
    assert not planned_wording("The planner (notebook 12) picks a plan.")


# --- every notebook -----------------------------------------------------------------------------

def predict_calls(code: str) -> int:
    """Calls of the predict helper in code (`pl.explorer.predict(`, `explorer.predict(`,
    `predict(`), comments and definitions left out."""
    count = 0
    for line in code.splitlines():
        line = line.split("#", 1)[0]
        if re.match(r"\s*def\s+predict\b", line):
            continue
        count += len(re.findall(r"(?<![\w])(?:[\w.]*\.)?predict\(", line))
    return count


PLANNED = re.compile(r"\bplanned\b|not in the workbook yet|not yet in the workbook", re.I)


def planned_wording(text: str) -> list[str]:
    return PLANNED.findall(text)


def chapter_number(path: Path) -> int:
    match = re.match(r"(\d+)[a-z]?_", path.name)
    assert match, f"{path.name}: a notebook's name starts with its chapter number"
    return int(match.group(1))


def test_there_are_notebooks_and_docs():
    assert len(NOTEBOOKS) >= 14
    assert {p.name for p in DOCS} >= {"formulas.md", "platform.md"}


@pytest.mark.parametrize("path", NOTEBOOKS + DOCS, ids=lambda p: p.name)
def test_every_cited_file_ships_in_the_repository(path):
    missing = missing_citations(path)
    assert not missing, (f"{path.name} cites files that are not in the repository "
                         f"(link the shipped docs/ pages instead): {missing}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_chapter_is_called_planned(path):
    found = [f"cell {i}: {text_of(c)[max(0, m.start() - 60):m.end() + 20]!r}"
             for i, c in enumerate(cells(path)) for m in PLANNED.finditer(text_of(c))]
    assert not found, f"{path.name} still calls a chapter planned or missing: {found}"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if chapter_number(p) >= 4],
                         ids=lambda p: p.name)
def test_each_chapter_from_04_asks_two_predict_questions(path):
    asked = sum(predict_calls(text_of(c)) for c in cells(path) if c["cell_type"] == "code")
    assert asked >= 2, f"{path.name} has {asked} predict-then-check question(s); a chapter needs 2"


def test_docs_cite_tests_that_exist():
    """`test_file.py::test_name` (or `::test_name` after a named file) in docs/*.md names a test
    that is defined in that file."""
    unknown = []
    for doc in DOCS:
        current = None
        for match in re.finditer(r"`(test_\w+\.py)?(?:::(test_\w+))?`", doc.read_text()):
            file, name = match.groups()
            current = file or current
            if name is None:
                continue
            source = ROOT / "tests" / (current or "")
            if current is None or not source.is_file() or \
                    not re.search(rf"^def {name}\(", source.read_text(), re.M):
                unknown.append(f"{doc.name}: {current}::{name}")
    assert not unknown, f"docs cite tests that do not exist: {unknown}"
