"""The load average, as the benchmark scripts print it next to their wall-clock figures."""
from __future__ import annotations

import os


def load_average(digits: int = 2) -> str:
    """The 1-, 5- and 15-minute load averages, space-separated, `digits` decimals each."""
    return " ".join(f"{x:.{digits}f}" for x in os.getloadavg())
