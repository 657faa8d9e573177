"""What a reader of the notebooks relies on without running them: every file a chapter cites
ships in the repository, no chapter is called "planned" any more, and every chapter from 04 on
asks the reader to predict before it shows (at least two predict-then-check questions).

Also the reference pages: every file, test and link `docs/*.md` cites exists."""
from __future__ import annotations

import ast
import copy
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


# --- the entry notebook's table and the pointers between chapters ------------------------------

WELCOME = ROOT / "notebooks" / "00_welcome.ipynb"
NOTEBOOK_LINK = re.compile(r"\]\(\s*<?([\w./-]+\.ipynb)>?\s*\)")


def listed_in_welcome() -> set[str]:
    """The notebook files 00's chapter table links ("| [05](05_zero_bubble.ipynb) | ... |")."""
    table = [c for c in cells(WELCOME) if c["cell_type"] == "markdown"
             and text_of(c).lstrip().startswith("## What's next")]
    assert len(table) == 1, "00 has one 'What's next' cell holding the chapter table"
    return {name.split("/")[-1] for line in text_of(table[0]).splitlines()
            if line.lstrip().startswith("|") for name in NOTEBOOK_LINK.findall(line)}


def test_welcome_lists_every_notebook():
    """00's table and the notebook files are the same set: a chapter added without a row, or a
    row whose file is gone, fails. (Chapter 16 is listed before it is merged: until then this
    test names it as listed but missing.)"""
    files = {p.name for p in NOTEBOOKS} - {WELCOME.name}
    listed = listed_in_welcome()
    assert listed == files, (f"00's chapter table and notebooks/ differ: not listed "
                             f"{sorted(files - listed)}, listed but missing {sorted(listed - files)}")


def pointer_to(text: str, successor: str) -> bool:
    """Whether `text` names the next notebook's file (a link or the bare file name)."""
    return re.search(rf"(?<![\w]){re.escape(successor)}(?![\w])", text) is not None


def test_pointer_check_needs_the_file_name():
    assert pointer_to("Next, [06](06_bidirectional.ipynb): Chimera.", "06_bidirectional.ipynb")
    assert not pointer_to("Notebook 06 turns to bidirectional pipelines.", "06_bidirectional.ipynb")
    assert not pointer_to("see 106_bidirectional.ipynb", "06_bidirectional.ipynb")


@pytest.mark.parametrize("path", NOTEBOOKS[:-1], ids=lambda p: p.name)
def test_each_chapter_ends_with_a_pointer_to_the_next(path):
    """The last markdown cell of every notebook but the last names the next notebook's file, so
    a reader (and Jupyter's link) goes on in order."""
    successor = NOTEBOOKS[NOTEBOOKS.index(path) + 1].name
    last = [text_of(c) for c in cells(path) if c["cell_type"] == "markdown"][-1]
    assert pointer_to(last, successor), (f"{path.name}'s last markdown cell does not point to "
                                         f"the next chapter, {successor}")


# --- asserts that compare a value with what defined it ------------------------------------------

def _code(text: str) -> str:
    """A cell's source with IPython's magics and shell lines commented out, so `ast` parses it."""
    return "\n".join("#" + line if line.lstrip().startswith(("%", "!")) else line
                     for line in text.splitlines())


def _literal_only(node: ast.AST) -> bool:
    """Arithmetic on literals alone: a value no computation can change."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float, complex)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _literal_only(node.operand)
    if isinstance(node, ast.BinOp):
        return _literal_only(node.left) and _literal_only(node.right)
    return False


def _has_call(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) for n in ast.walk(node))


class _Substitute(ast.NodeTransformer):
    """Replaces names with the expressions a cell assigned them (one level deep)."""

    def __init__(self, defined: dict[str, ast.expr]):
        self.defined = defined

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return self.defined.get(node.id, node)


def definitional_asserts(code: str) -> list[str]:
    """Asserts that hold by construction, found in one cell's code:

    - two sides of a comparison that are the same expression without a call (`x == x`; two
      calls written out, `f() == f()`, stay: that is a determinism check);
    - a name compared with the very expression the cell assigned it (`a = f(b)` … `assert a ==
      f(b)`), unless the cell changes it in between (augmented assignment, a method call on it);
    - a comparison of literals alone once the cell's own assignments are put in (`k = 2 + 2`
      … `assert 3 * k == 12`): arithmetic on constants, true whatever the library does.

    Returns 'line N: source' for each."""
    tree = ast.parse(_code(code))
    assigned: dict[str, list[tuple[int, ast.expr]]] = {}
    touched: dict[str, list[int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            assigned.setdefault(node.targets[0].id, []).append((node.lineno, node.value))
        elif isinstance(node, ast.Assign):          # a = b = expr, tuples, subscripts: changes
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        touched.setdefault(name.id, []).append(node.lineno)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For)):
            for name in ast.walk(node.target):
                if isinstance(name, ast.Name):
                    touched.setdefault(name.id, []).append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name):
            touched.setdefault(node.func.value.id, []).append(node.lineno)

    def definition(name: str, line: int) -> ast.expr | None:
        before = [(n, value) for n, value in assigned.get(name, []) if n < line]
        if not before:
            return None
        at, value = before[-1]
        if any(at < t < line for t in touched.get(name, [])):
            return None
        return value

    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)):
            continue
        sides = [node.test.left, *node.test.comparators]
        names = {n.id for side in sides for n in ast.walk(side) if isinstance(n, ast.Name)}
        defined = {n: d for n in names if (d := definition(n, node.lineno)) is not None}
        dumps = [ast.dump(side) for side in sides]
        same = any(dumps[i] == dumps[j] and not _has_call(sides[i])
                   for i in range(len(sides)) for j in range(i + 1, len(sides)))
        restated = any(isinstance(side, ast.Name) and side.id in defined
                       and ast.dump(defined[side.id]) == other
                       for side in sides for other in dumps if other != ast.dump(side))
        folded = [_Substitute({n: d for n, d in defined.items() if _literal_only(d)})
                  .visit(copy.deepcopy(side)) for side in sides]
        constant = all(_literal_only(side) for side in folded)
        if same or restated or constant:
            found.append(f"line {node.lineno}: {ast.get_source_segment(_code(code), node)}")
    return found


def test_definitional_asserts_are_caught():
    assert definitional_asserts("x = f(1)\nassert x == x")
    assert definitional_asserts("a = simulate(s).makespan\nassert a == simulate(s).makespan")
    assert definitional_asserts("bytes_per = 2 + 2 + 3 * 4\nassert 7.5e9 * bytes_per == 120e9")
    assert definitional_asserts("%matplotlib inline\nassert 2 * 3 == 6")


def test_independent_asserts_are_not_flagged():
    ok = ("a = simulate(s).makespan\nassert a == (m + p - 1) * 3 == 33\n"        # a closed form
          "assert train(cfg) == train(cfg)\n"                                      # determinism
          "k = 2 + 2\nk += 1\nassert k == 5\n"                                     # changed on the way
          "runs = []\nruns.append(1)\nassert runs == []\n"                         # mutated
          "for F in (1, 2):\n    assert F * 3 == 3 * F + 0 or True\n"             # loop variable
          "bpp = 2 * half + K\nassert 7.5e9 * bpp == 120e9\n")                    # measured sizes
    assert definitional_asserts(ok) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_assert_compares_a_value_with_what_defined_it(path):
    found = [f"cell {i} {hit}" for i, c in enumerate(cells(path)) if c["cell_type"] == "code"
             for hit in definitional_asserts(text_of(c))]
    assert not found, f"{path.name}: asserts that hold by construction: {found}"
