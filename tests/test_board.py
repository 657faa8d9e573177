"""The progress board read while a rank writes it: a row never looks like something it was not.

Regression: `struct.pack_into` into the shared row zeroes it before filling it, so the parent
could read "setting up since time 0" and the watchdog raised "no progress for <uptime> s" at
the start of a run on a loaded machine.
"""
import multiprocessing as mp
import time

from pipelab.runtime.board import RUN, Board

WRITES = 50_000


def _hammer(array, ready) -> None:
    """A rank changing state as fast as it can (in a process of its own, like a worker)."""
    board = Board(array, 1)
    ready.set()
    for i in range(WRITES):
        board.set(0, 1, i, RUN)


def test_rows_read_during_writes_are_never_torn_to_zero():
    ctx = mp.get_context("spawn")
    board = Board.create(ctx, 1)
    board.reset()
    start = board.read()[0].since
    ready = ctx.Event()
    writer = ctx.Process(target=_hammer, args=(board.array, ready), daemon=True)
    writer.start()
    try:
        assert ready.wait(60), "the writer process did not start"
        reads, torn = 0, []
        deadline = time.perf_counter() + 20       # a bound, not the expected time
        while writer.is_alive() and time.perf_counter() < deadline:
            row = board.read()[0]
            reads += 1
            if row.since < start:                  # older than the reset: never written so
                torn.append(row)
    finally:
        writer.join(30)
        if writer.is_alive():
            writer.kill()
            writer.join()
    assert reads > 0
    assert not torn, (f"{len(torn)} of {reads} reads saw a row older than the reset, e.g. "
                      f"{torn[0]}: a write passes through zero")
    assert board.read()[0].position == WRITES - 1
