"""95% intervals for what `compare` and the benchmarks report: means over windows, paired differences, shares.

Student-t intervals over windows, mean +- t(0.975; n - 1) sd / sqrt(n), for per-window NLLs (the textbook interval
for a mean whose variance is estimated from the same n values). A real model's table reads 4 to 16 windows, where
the normal quantile 1.96 would be too narrow: t(0.975; 5) = 2.571, t(0.975; 15) = 2.131, so a normal interval over
6 windows covers about 89%, not 95%. The paired difference uses the same windows on both sides, which removes most
of the window-to-window variance. Shares of hits (needle retrieval)
use the Wilson score interval (Wilson 1927; what `statsmodels.stats.proportion.proportion_confint(method=
"wilson")` gives), which stays inside [0, 1] and is honest at 0 or all hits, where a normal interval collapses.
"""

from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def interval(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high) with a 95% Student-t interval over windows (infinite for one window)."""
    mean, count = float(values.mean()), len(values)
    if count < 2:
        return mean, -math.inf, math.inf
    half = student_t_quantile(0.975, count - 1) * float(values.std(ddof=1)) / math.sqrt(count)
    return mean, mean - half, mean + half


def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile (0.5 < p < 1) of Student's t with an integer `df` >= 1: the t where P(T <= t) = p.

    Exact, from the t distribution's finite series for integer degrees of freedom (Abramowitz & Stegun, Handbook of
    Mathematical Functions, 26.7.3 and 26.7.4): with theta = atan(t / sqrt(df)), A(t | df) = P(|T| <= t) is
    - df odd:  (2 / pi) (theta + sin(theta) (cos(theta) + 2/3 cos^3 + 2*4/(3*5) cos^5 + ... + cos^(df-2)))
    - df even: sin(theta) (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ... + cos^(df-2)),
    which rises with theta in (0, pi/2); the theta where A = 2p - 1 is found by bisection (relative error under 1e-10
    for p up to 0.9999, checked against mpmath; the intervals ask for 0.975; the cost grows with df, 0.3 s at 10^5).
    Written out rather than taken from scipy, which the GPU machine's bundle cannot carry (64 MiB a run)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"student_t_quantile: needs 0.5 < p < 1 and df >= 1, got p={p!r}, df={df!r}")
    low, high = 0.0, math.pi / 2
    for _ in range(200):
        theta = (low + high) / 2
        if theta in (low, high):
            break
        low, high = (theta, high) if _two_sided_probability(theta, df) < 2 * p - 1 else (low, theta)
    return math.sqrt(df) * math.tan((low + high) / 2)


def _two_sided_probability(theta: float, df: int) -> float:
    """A(t | df) = P(|T| <= t) at theta = atan(t / sqrt(df)) (`student_t_quantile`'s series)."""
    cos2 = math.cos(theta) ** 2
    odd = df % 2 == 1
    term = math.cos(theta) if odd else 1.0  # the series' first term: cos(theta) (odd df), 1 (even df)
    total = term if (df >= 3 or not odd) else 0.0
    power = 1 if odd else 0
    while power + 2 <= df - 2:
        power += 2
        term *= (power - 1) / power * cos2
        total += term
    if odd:
        return 2 / math.pi * (theta + math.sin(theta) * total)
    return math.sin(theta) * total


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
