"""Fixtures shared by the test modules."""
from __future__ import annotations

import pytest

import pipelab as pl


@pytest.fixture(scope="module")
def clusters():
    """`clusters(ranks)`: one LocalCluster per rank count, shared by the module that asks for it
    (starting workers costs seconds), closed when the module is done."""
    made: dict[int, pl.LocalCluster] = {}

    def get(ranks: int) -> pl.LocalCluster:
        if ranks not in made:
            made[ranks] = pl.LocalCluster(ranks, timeout=60)
        return made[ranks]

    yield get
    for cluster in made.values():
        cluster.close()
