"""Does a cheaper way of scoring rank candidates as float32 does? The search only compares scores, so what a bfloat16
worker must keep is the order of the candidates, not their exact NLL.

`rank_agreement(reference, other)` compares two lists of mean NLLs per token, one per candidate in the same order:
Kendall's tau between them, whether the best candidate and the best k are the same (and what keeping `other`'s
best costs in `reference`'s score), the largest difference, and the spread of the differences about their
median. A shift common to every candidate (bfloat16 scoring every window a little worse, say) reorders nothing;
only the spread can, and only candidates closer than it.

Used by bench/bf16_ranking.py, bench/gpu_check.py and tests/test_bf16_ranking.py. Plain numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


def kendall_tau(reference: Sequence[float], other: Sequence[float]) -> float:
    """Kendall's tau-a: (concordant pairs - discordant pairs) / (n (n - 1) / 2), over all pairs i < j, a pair being
    concordant when both lists order it alike (M. G. Kendall, "A new measure of rank correlation", Biometrika 30,
    1938). A pair tied in either list counts as neither, so exact ties lower tau rather than raise it."""
    a, b = np.asarray(reference, dtype=np.float64), np.asarray(other, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError(f"two lists of the same length >= 2 expected, got shapes {a.shape} and {b.shape}")
    upper = np.triu_indices(len(a), k=1)
    signs = np.sign(a[:, None] - a[None, :])[upper] * np.sign(b[:, None] - b[None, :])[upper]
    return float(signs.sum() / len(signs))


@dataclass(frozen=True)
class RankAgreement:
    """How `other` scores rank the candidates against `reference` scores (mean NLL per token, lower is better)."""

    candidates: int
    kendall_tau: float
    best_same: bool  # the candidate a search would keep
    best_regret: float  # reference score of the candidate `other` keeps, less the best reference score (0 if same)
    best_k: int
    best_k_same: bool  # the same k best, in any order
    max_abs_difference: float  # max |other - reference|, nats per token
    median_difference: float  # the shift common to all candidates
    difference_spread: float  # standard deviation of (other - reference) about its median: what can reorder
    reference_gap: float  # median gap between neighbouring reference scores: how close the candidates are

    def as_dict(self) -> dict:
        return asdict(self)


def rank_agreement(reference: Sequence[float], other: Sequence[float], best_k: int = 5) -> RankAgreement:
    a, b = np.asarray(reference, dtype=np.float64), np.asarray(other, dtype=np.float64)
    difference = b - a
    median = float(np.median(difference))
    k = min(best_k, len(a))
    return RankAgreement(
        candidates=len(a),
        kendall_tau=kendall_tau(a, b),
        best_same=bool(np.argmin(a) == np.argmin(b)),
        best_regret=float(a[np.argmin(b)] - a.min()),
        best_k=k,
        best_k_same=set(np.argsort(a, kind="stable")[:k]) == set(np.argsort(b, kind="stable")[:k]),
        max_abs_difference=float(np.abs(difference).max()),
        median_difference=median,
        difference_spread=float(np.sqrt(np.mean((difference - median) ** 2))),
        reference_gap=float(np.median(np.diff(np.sort(a)))),
    )
