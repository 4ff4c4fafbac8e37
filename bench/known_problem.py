"""A search problem with a known optimum and no model, for checking an optimizer or a schedule.

Scoring a real model costs seconds a candidate and its best factors are unknown, so neither can say whether an
optimizer converges, or how a schedule keeps workers busy. Here the optimum is a known factor vector (OPTIMUM, in
the factors' bound) and the objective is the mean squared log-distance to it, spread over windows of different
difficulty with a little noise: cheap enough to run a whole search in-process. Two users, one definition: the tests
(tests/search_helpers.py, whose in-process evaluator scores `window_nll` and `window_nll_gradient`) and
bench/search_cost.py's simulated cluster (Ray workers that sleep a window's latency, then score `window_nll`).

The shape is a small RoPE model's: head dim 32 (16 pairs), 64 -> 256 tokens (4x), seeded as a search is (PI, NTK,
YaRN at the scale).
"""

from __future__ import annotations

import numpy as np
import torch

from longrope.encodings import LongRope, NtkRope, YarnRope
from longrope.search.optimizers.genome import Seed
from longrope.search.run.search_problem import SearchProblem

HEAD_DIM, PAIRS, ORIGINAL, TARGET = 32, 16, 64, 256
OPTIMUM = np.round(1.0 + 3.6 * np.linspace(0.0, 1.0, PAIRS) ** 1.5, 2)  # inside the bound [1, 1.25 x 4]


def objective(factors: np.ndarray) -> float:
    """The mean squared log-distance of the factors to OPTIMUM: 0 there, and nowhere else."""
    return float(np.mean((np.log(factors) - np.log(OPTIMUM)) ** 2))


def make_candidate(factors, attention_factor=None, n_hat=0) -> LongRope:
    """SearchProblem.make_candidate for this shape: a genome's factors as the LongRoPE method that is scored."""
    return LongRope.from_factors(
        torch.as_tensor(factors),
        head_dim=HEAD_DIM,
        original_length=ORIGINAL,
        target_length=TARGET,
        attention_factor=attention_factor,
        n_hat=n_hat,
    )


def problem(windows: int = 1) -> SearchProblem:
    """The search problem: PAIRS pairs at scale 4, seeded by PI, NTK and YaRN (float64 factors), on `windows`."""
    shape = {"head_dim": HEAD_DIM, "max_position_embeddings": TARGET}
    seeds = [
        Seed("pi", np.full(PAIRS, 4.0)),
        Seed("ntk", NtkRope(factor=4.0, **shape).factors().double().numpy()),
        Seed(
            "yarn", YarnRope(factor=4.0, original_max_position_embeddings=ORIGINAL, **shape).factors().double().numpy()
        ),
    ]
    return SearchProblem(pairs=PAIRS, scale=4.0, seeds=seeds, make_candidate=make_candidate, windows=windows)


def window_weight(window: int) -> float:
    """Window j's difficulty: a factor in [0.75, 1.25), spread by the golden ratio so neighbours differ."""
    return 1.0 + 0.5 * (((window * 0.618) % 1.0) - 0.5)


def window_nll(factors: np.ndarray, window: int, windows: int, wobble: float = 0.002) -> float:
    """The known objective on one of `windows` windows: window j scales it by w_j and adds an offset o_j (windows
    differ in difficulty, paired differences keep their sign), plus a candidate-and-window term of size `wobble`
    (noise that paired differences do not cancel). One window: `objective` itself."""
    base = objective(factors)
    if windows == 1:
        return base
    noise = wobble * np.sin(1000.0 * float(np.sum(factors)) + 7.0 * window)
    return base * window_weight(window) + 0.1 * window + float(noise) + wobble  # + wobble: an NLL is never below 0


def window_nll_gradient(factors: np.ndarray, window: int, windows: int, wobble: float = 0.002) -> np.ndarray:
    """d window_nll / d (factors, attention factor), by hand: d objective / d f_i = 2 (ln f_i - ln opt_i) / (P f_i),
    times the window's weight, plus the wobble's d/d f_i = 1000 wobble cos(1000 sum f + 7 j); the objective does not
    depend on the attention factor (its entry is 0)."""
    base = 2.0 * (np.log(factors) - np.log(OPTIMUM)) / (len(factors) * factors)
    if windows == 1:
        return np.append(base, 0.0)
    noise = 1000.0 * wobble * np.cos(1000.0 * float(np.sum(factors)) + 7.0 * window)
    return np.append(base * window_weight(window) + noise, 0.0)
