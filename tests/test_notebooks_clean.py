"""Notebooks are committed without outputs: nbval then runs them in lax mode, asserts do the checking."""
from __future__ import annotations

from pathlib import Path

import json

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert any(p.name.startswith("00_") for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
             and (cell.outputs or cell.execution_count is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_an_id(path):
    # Read the raw JSON: nbformat.read quietly adds missing ids (and warns that it will stop).
    cells = json.loads(path.read_text())["cells"]
    missing = [i for i, cell in enumerate(cells) if not cell.get("id")]
    assert not missing, f"{path.name}: cells {missing} have no id; save it from JupyterLab"
