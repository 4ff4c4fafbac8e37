"""95% intervals for what `compare` and the benchmarks report: means over windows, paired differences, shares.

Normal intervals over windows (mean +- z sd / sqrt(n)) for per-window NLLs; the paired difference uses the same
windows on both sides, which removes most of the window-to-window variance. Shares of hits (needle retrieval)
use the Wilson score interval (Wilson 1927; what `statsmodels.stats.proportion.proportion_confint(method=
"wilson")` gives), which stays inside [0, 1] and is honest at 0 or all hits, where a normal interval collapses.
"""

from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def interval(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high) with a 95% normal interval over windows."""
    mean = float(values.mean())
    half = Z95 * float(values.std(ddof=1)) / math.sqrt(len(values)) if len(values) > 1 else math.inf
    return mean, mean - half, mean + half


def paired_difference(a, b) -> tuple[float, float, float]:
    """Mean per-window difference a - b with its 95% interval (NLL per token: negative means a is better)."""
    return interval(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))


def wilson_interval(hits: int, count: int, z: float = Z95) -> tuple[float, float, float]:
    """(share, low, high): p~ = (h + z^2/2) / (n + z^2), half = z sqrt(h(n-h)/n + z^2/4) / (n + z^2)."""
    if count == 0:
        return math.nan, math.nan, math.nan
    share = hits / count
    centre = (hits + z * z / 2) / (count + z * z)
    half = z * math.sqrt(hits * (count - hits) / count + z * z / 4) / (count + z * z)
    return share, max(0.0, centre - half), min(1.0, centre + half)
