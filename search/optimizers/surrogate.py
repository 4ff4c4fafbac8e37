"""A surrogate of the search objective that screens the GA's children before any worker scores them.

Scoring a child costs a forward pass over every search window; predicting its score from the candidates already
scored costs microseconds. So a generation breeds more children than it scores, and only those a surrogate ranks
best are scored (pre-selection: Jin, "A comprehensive survey of fitness approximation in evolutionary computation",
Soft Computing 9(1), 2005, section 4; the "generation-based" model management of Jin, Olhofer and Sendhoff,
IEEE TEC 6(5), 2002).

The default surrogate is ridge regression on features of a decoded candidate: each pair's log factor, its square, the
attention factor and n_hat (`candidate_features`). Perplexity is smooth in the log factors and a quadratic in them
is its second-order Taylor model around the population, with the cross terms left out so that the model stays
determined by a few dozen points (2 x pairs + 2 weights). Columns are standardized, then

    w = (Z^T Z + ridge I)^-1 Z^T (y - mean(y)),  prediction = mean(y) + z^T w

(Hoerl and Kennard, Technometrics 12(1), 1970), fitted afresh on every finite told score each time a generation is
bred: a deterministic function of the told scores, so a resumed search screens exactly as the uninterrupted one.

`search.surrogate.model: gaussian_process` is a Gaussian process on the same features instead
(`GaussianProcessSurrogate`). A share of the scored children is drawn at random from the screened-out rest
(`screen`), so a surrogate that is wrong about a region cannot shut the search out of it.
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


def standardization(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each feature's mean and standard deviation over the training rows (1 where a feature is constant, so it
    standardizes to 0 instead of dividing by 0)."""
    scale = features.std(axis=0)
    return features.mean(axis=0), np.where(scale > 1e-12, scale, 1.0)


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
        mean, scale = standardization(features)
        z = (features - mean) / scale
        intercept = float(scores.mean())
        weights = np.linalg.solve(z.T @ z + ridge * np.eye(z.shape[1]), z.T @ (scores - intercept))
        return cls(mean, scale, weights, intercept)

    def predict(self, features: np.ndarray) -> np.ndarray:
        return ((features - self.mean) / self.scale) @ self.weights + self.intercept


@dataclass(frozen=True)
class GaussianProcessSurrogate:
    """A Gaussian process's posterior mean on standardized features (Rasmussen and Williams, Gaussian Processes for
    Machine Learning, 2006, eq. 2.23): zero prior mean on the centred scores, an RBF kernel
    k(a, b) = exp(-|a - b|^2 / (2 l^2)) whose length scale l is the median distance between training points (the
    median heuristic), and `noise` on the kernel's diagonal:

        prediction = mean(y) + k(x, X) (K + noise I)^-1 (y - mean(y))
    """

    mean: np.ndarray
    scale: np.ndarray
    train: np.ndarray  # the standardized training features
    weights: np.ndarray  # (K + noise I)^-1 (y - mean(y))
    intercept: float
    length: float

    @classmethod
    def fit(cls, features: np.ndarray, scores: np.ndarray, noise: float) -> GaussianProcessSurrogate:
        mean, scale = standardization(features)
        train = (features - mean) / scale
        distances = squared_distances(train, train)
        positive = distances[distances > 1e-12]
        length = math.sqrt(float(np.median(positive))) if positive.size else 1.0
        kernel = np.exp(-distances / (2 * length**2))
        intercept = float(scores.mean())
        weights = np.linalg.solve(kernel + noise * np.eye(len(train)), scores - intercept)
        return cls(mean, scale, train, weights, intercept, length)

    def predict(self, features: np.ndarray) -> np.ndarray:
        cross = np.exp(-squared_distances((features - self.mean) / self.scale, self.train) / (2 * self.length**2))
        return cross @ self.weights + self.intercept


def squared_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a_i - b_j|^2 for every pair, as |a|^2 + |b|^2 - 2 a.b (n x m memory, not n x m x features), floored at 0."""
    return np.maximum((a**2).sum(1)[:, None] + (b**2).sum(1)[None, :] - 2 * a @ b.T, 0.0)


def fit_surrogate(model: str, features: np.ndarray, scores: np.ndarray, ridge: float, noise: float):
    """search.surrogate.model's surrogate fitted on the rows of `features` and their (finite) scores."""
    if model == "gaussian_process":
        return GaussianProcessSurrogate.fit(features, scores, noise)
    return RidgeSurrogate.fit(features, scores, ridge)


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
