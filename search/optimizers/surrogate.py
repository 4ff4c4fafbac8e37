"""A surrogate of the search objective that screens the GA's children before any worker scores them.

Scoring a child costs a forward pass over every search window; predicting its score from the candidates already
scored costs microseconds. So a generation breeds more children than it scores, and only those a surrogate ranks
best are scored (pre-selection: Jin, "A comprehensive survey of fitness approximation in evolutionary computation",
Soft Computing 9(1), 2005, section 4; the "generation-based" model management of Jin, Olhofer and Sendhoff,
IEEE TEC 6(5), 2002).

The surrogate is ridge regression on features of a decoded candidate: each pair's log factor, its square, the
attention factor and n_hat (`candidate_features`). Perplexity is smooth in the log factors and a quadratic in them
is its second-order Taylor model around the population, with the cross terms left out so that the model stays
determined by a few dozen points (2 x pairs + 2 weights). Columns are standardized, then

    w = (Z^T Z + ridge I)^-1 Z^T (y - mean(y)),  prediction = mean(y) + z^T w

(Hoerl and Kennard, Technometrics 12(1), 1970), fitted afresh on every finite told score each time a generation is
bred: a deterministic function of the told scores, so a resumed search screens exactly as the uninterrupted one.

A share of the scored children is drawn at random from the screened-out rest (`screen`), so a surrogate that is
wrong about a region cannot shut the search out of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from longrope.search.optimizers.searcher import Candidate


def candidate_features(candidate: Candidate) -> np.ndarray:
    """[log f_i for each pair, (log f_i)^2 for each pair, attention factor (0: the encoding's formula), n_hat]."""
    log_factors = np.log(np.asarray(candidate.factors, dtype=np.float64))
    attention = 0.0 if candidate.attention_factor is None else float(candidate.attention_factor)
    return np.concatenate([log_factors, log_factors**2, [attention, float(candidate.n_hat)]])


@dataclass(frozen=True)
class RidgeSurrogate:
    """A fitted ridge regression on standardized features (see the module docstring for the formula)."""

    mean: np.ndarray  # each feature's mean over the training points
    scale: np.ndarray  # each feature's standard deviation (1 where the feature is constant)
    weights: np.ndarray
    intercept: float  # the training scores' mean

    @classmethod
    def fit(cls, features: np.ndarray, scores: np.ndarray, ridge: float) -> RidgeSurrogate:
        """Fit on rows of features and their scores (all finite)."""
        mean = features.mean(axis=0)
        scale = features.std(axis=0)
        scale = np.where(scale > 1e-12, scale, 1.0)
        z = (features - mean) / scale
        intercept = float(scores.mean())
        weights = np.linalg.solve(z.T @ z + ridge * np.eye(z.shape[1]), z.T @ (scores - intercept))
        return cls(mean, scale, weights, intercept)

    def predict(self, features: np.ndarray) -> np.ndarray:
        return ((features - self.mean) / self.scale) @ self.weights + self.intercept


def random_share(keep: int, exploration: float) -> int:
    """How many of `keep` scored children are drawn at random: exploration x keep, rounded half up."""
    return min(keep, math.floor(exploration * keep + 0.5))


def screen(predicted: np.ndarray, keep: int, exploration: float, rng: np.random.Generator) -> list[int]:
    """The proposals to score, as indices in proposal order: the `keep - random_share` best predicted (ties to the
    earlier proposal), then `random_share` drawn uniformly without replacement from the rest with `rng`."""
    if keep >= len(predicted):
        return list(range(len(predicted)))
    order = np.lexsort((np.arange(len(predicted)), predicted))
    drawn = random_share(keep, exploration)
    best, rest = order[: keep - drawn], order[keep - drawn :]
    picked = rng.choice(rest, size=drawn, replace=False) if drawn else np.array([], dtype=int)
    return sorted(int(i) for i in (*best, *picked))
