"""A candidate's score from its per-window results: one objective, or a weighted mix of several.

Each window belongs to one objective (perplexity, tail or needle; `workers/windows.py` builds them and their
loss masks) and reports summed NLL and counted tokens. An objective's value is its token-weighted mean NLL,
sum(nll_j) / sum(tokens_j) over its windows (the mean NLL per token, whose exp is the perplexity), and a mix is
sum_o w_o * mean_o / sum_o w_o, so a needle's handful of answer tokens weighs what its weight says, not what its
token count says. With one objective this is exactly sum(nll) / sum(tokens), the score the release uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ObjectiveMix:
    """Which objective each window serves, and the objectives' weights."""

    objectives: tuple[str, ...]  # per window, in window order
    weights: tuple[tuple[str, float], ...]  # (objective, weight > 0)

    @classmethod
    def single(cls, windows: int, objective: str = "perplexity") -> ObjectiveMix:
        return cls((objective,) * windows, ((objective, 1.0),))

    @classmethod
    def of(cls, weights: dict[str, float], count: int) -> ObjectiveMix:
        """`count` windows per objective, interleaved (window k of each objective in the order of `weights`, then
        window k + 1, ...), so racing's first windows already hold every objective."""
        return cls(tuple(name for _ in range(count) for name in weights), tuple(weights.items()))

    def racing_weights(self) -> list[float]:
        """Per-window multipliers m_j = (w_o / sum w) * N / n_o for racing's paired differences: the mean of
        m_j d_j over all N windows is then the mix's weighted difference of per-window means, so a child that
        is worse on one objective but better on the mix is not stopped. 1 for every window of one objective."""
        total = sum(weight for _, weight in self.weights)
        weight = dict(self.weights)
        counts = {name: self.objectives.count(name) for name in weight}
        windows = len(self.objectives)
        return [weight[kind] / total * windows / counts[kind] for kind in self.objectives]

    def mean_nll(self, nll: Sequence[float], tokens: Sequence[int]) -> float:
        """The weighted mean of the objectives' mean NLL per token (NaN/inf pass through, to be ranked last)."""
        if len(nll) != len(self.objectives) or len(tokens) != len(self.objectives):
            raise ValueError(f"expected {len(self.objectives)} windows, got {len(nll)} NLLs and {len(tokens)} counts")
        total = sum(weight for _, weight in self.weights)
        value = 0.0
        for name, weight in self.weights:
            rows = [j for j, kind in enumerate(self.objectives) if kind == name]
            value += weight * sum(nll[j] for j in rows) / sum(tokens[j] for j in rows)
        return value / total

    def describe(self) -> str:
        """e.g. "perplexity" or "0.5 perplexity + 0.5 needle" (weights normalised)."""
        if len(self.weights) == 1:
            return self.weights[0][0]
        total = sum(weight for _, weight in self.weights)
        return " + ".join(f"{weight / total:g} {name}" for name, weight in self.weights)


def subset_mix(mix: ObjectiveMix, windows: tuple[int, int]) -> ObjectiveMix:
    """The objective over a range of the search windows: the same objectives and weights, those windows only."""
    objectives = mix.objectives[windows[0] : windows[1]]
    return ObjectiveMix(objectives, tuple((name, w) for name, w in mix.weights if name in objectives))


def objective_gradient(mix: ObjectiveMix, tokens, per_window_gradients) -> np.ndarray:
    """d mix.mean_nll / d parameters from each window's d nll_j / d parameters: the mix is linear in the nll_j,
    mean = sum_o w_o (sum_{j in o} nll_j / T_o) / sum_o w_o, so its gradient is sum_j w_o(j) / (W T_o(j)) grad_j."""
    weights, total = dict(mix.weights), sum(w for _, w in mix.weights)
    counts = {name: sum(t for t, kind in zip(tokens, mix.objectives, strict=True) if kind == name) for name in weights}
    grads = np.asarray(per_window_gradients, dtype=np.float64)
    coefficients = np.array([weights[kind] / (total * counts[kind]) for kind in mix.objectives])
    return coefficients @ grads
