"""Racing: stop scoring a child once, paired on the same windows, it is clearly worse than the acceptance threshold.

The threshold is the worst current parent: with elitist (mu + lambda) selection a child worse than it can never
become a parent, so the rest of its windows would be spent for nothing. Windows are scored in their fixed order
(drawn by the data seed), `min_windows` first, then `group_windows` at a time. With d_j = (child NLL - threshold
NLL) / tokens on window j, after k >= min_windows windows the child is stopped when the one-sided paired bound

    mean(d) - z * sd(d) / sqrt(k) > 0      (sd with k - 1 degrees of freedom)

holds (a paired z-test at level Phi(-z); the racing idea is Maron & Moore's Hoeffding races, 1994, and irace's
F-race). A stopped candidate keeps its partial NLLs in history.jsonl with status "stopped".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from longrope.search.config.search_section import RacingConfig
from longrope.search.optimizers.searcher import WindowRange


def window_groups(count: int, racing: RacingConfig) -> list[WindowRange]:
    """The groups a candidate is scored in: all windows at once without racing; else the first `min_windows`
    (no decision is possible before), then `group_windows` at a time."""
    if not racing.enabled or racing.min_windows >= count:
        return [(0, count)]
    edges = [0, *range(racing.min_windows, count, racing.group_windows), count]
    return list(itertools.pairwise(edges))


def clearly_worse(
    nll: Sequence[float],
    tokens: Sequence[int],
    threshold_nll: Sequence[float],
    threshold_tokens: Sequence[int],
    racing: RacingConfig,
    window_weights: Sequence[float] | None = None,
) -> bool:
    """Is the candidate (per-window summed NLL on its first len(nll) windows) clearly worse than the threshold?
    `window_weights` scale each window's difference (an objective mix: `ObjectiveMix.racing_weights`)."""
    k = len(nll)
    if k < racing.min_windows:
        return False
    scale = window_weights or [1.0] * k
    diffs = [scale[j] * (nll[j] / tokens[j] - threshold_nll[j] / threshold_tokens[j]) for j in range(k)]
    if not all(math.isfinite(d) for d in diffs):
        return True  # NaN/inf on a window: its mean would be too, and it would rank last
    mean = sum(diffs) / k
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (k - 1))
    return mean - racing.z * sd / math.sqrt(k) > 0
