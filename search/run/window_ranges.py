"""The ranges a candidate's search windows go out in, one to a worker: what spreads a small generation (a
descent step, its seeds, its point on the grid) over every worker. The coordinator sends them; the estimate
schedules them to price the workers' idle time (search/cost/utilisation.py)."""

from __future__ import annotations

import itertools
import math

from longrope.search.optimizers.searcher import WindowRange

# what a window with a backward pass weighs against a forward one when the pieces are shared out: 1 + c, with c
# 1.7 (mostly linear layers) to 3.5 (mostly flash attention) by search/cost/budget.py's `backward_cost`
BACKWARD_WEIGHT = 3.0


def pieces_per_candidate(candidates: int, workers: int) -> int:
    """Ranges each of a generation's `candidates` goes out in: ceil(workers / candidates) where the generation is
    smaller than the workers, else 1 (whole: the candidates alone keep every worker busy)."""
    return 1 if candidates >= workers else math.ceil(workers / max(1, candidates))


def cut(windows: WindowRange, pieces: int) -> list[WindowRange]:
    """[start, stop) cut into at most `pieces` contiguous ranges as even as windows allow (none when it is empty):
    (0, 8) in 3 is (0, 2), (2, 5), (5, 8)."""
    start, stop = windows
    count = max(1, min(stop - start, pieces))
    edges = [start + (stop - start) * k // count for k in range(count + 1)]
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]


def candidate_ranges(windows: int, gradient: WindowRange | None, pieces: int) -> list[tuple[WindowRange, bool]]:
    """A candidate's `windows` search windows as at most max(pieces, 3) ranges, each (range, with a backward pass),
    the costliest first. Without `gradient`: `cut` alone. With it (a descent step's point), the gradient windows
    and the forward-only windows before and after them (the held-out ones among them) are separate ranges: each
    part gets one piece, and each further piece goes to the part whose pieces are heaviest (a backward window
    weighing BACKWARD_WEIGHT), so no worker gets a share much above the rest. Sent costliest first, the pool's
    workers take the long ranges before the short ones."""
    if gradient is None:
        return [(piece, False) for piece in cut((0, windows), pieces)]
    first, last = gradient
    spans = [((0, first), False), ((first, last), True), ((last, windows), False)]
    parts = [(span, backward) for span, backward in spans if span[1] > span[0]]
    weights = [(b - a) * (BACKWARD_WEIGHT if backward else 1.0) for (a, b), backward in parts]
    counts = [1] * len(parts)
    for _ in range(pieces - len(parts)):
        open_parts = [i for i, ((a, b), _) in enumerate(parts) if counts[i] < b - a]
        if not open_parts:
            break
        heaviest = max(open_parts, key=lambda i: (weights[i] / counts[i], -i))
        counts[heaviest] += 1
    ranges = [(piece, backward) for ((span, backward), count) in zip(parts, counts, strict=True)
              for piece in cut(span, count)]  # fmt: skip
    return sorted(ranges, key=lambda r: -(r[0][1] - r[0][0]) * (BACKWARD_WEIGHT if r[1] else 1.0))
