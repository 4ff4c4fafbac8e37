"""The ranges a candidate's search windows go out in, one to a worker: what spreads a small generation (a
descent step, its seeds, its point on the grid) over every worker. The coordinator sends them; the estimate
schedules them to price the workers' idle time (search/cost/utilisation.py)."""

from __future__ import annotations

import itertools

from longrope.search.optimizers.searcher import WindowRange


def cut(windows: WindowRange, pieces: int) -> list[WindowRange]:
    """[start, stop) cut into at most `pieces` contiguous ranges as even as windows allow (none when it is empty):
    (0, 8) in 3 is (0, 2), (2, 5), (5, 8)."""
    start, stop = windows
    count = max(1, min(stop - start, pieces))
    edges = [start + (stop - start) * k // count for k in range(count + 1)]
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]
