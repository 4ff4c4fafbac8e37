"""Descent's space: an unconstrained vector u whose every point is a valid factor set, and Adam's steps over it.

Descent is plain numpy over u, mapped to factors that always satisfy the official constraints (`Parametrization`):

    lambda_i = 1 + (M - 1) * sum_{k <= i} softmax(u_0..u_P)_k      i = 0 .. P-1   (u_P: the slack logit)
    attention = low + (high - low) * sigmoid(u_{P+1})               (only when the attention factor is searched)

so the factors are non-decreasing across pairs and within [1, M] (M = search.max_factor, 1.25 x scale by default,
the LongRoPE paper's bound), whatever u is; the slack logit lets the last pair stay below M. Adam (Kingma and Ba,
arXiv 1412.6980, with its default betas 0.9 / 0.999 and eps 1e-8) steps u on the chain-ruled gradient
(`Parametrization.pullback`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
SMALLEST_SHARE = 1e-6  # the attention factor's share kept off 0 and 1, where a logit is infinite


@dataclass(frozen=True)
class Parametrization:
    """u (pairs + 1 logits, + 1 for a searched attention factor) <-> factors within the official constraints."""

    pairs: int
    max_factor: float
    attention_bounds: tuple[float, float] | None = None  # (low, high) when the attention factor is searched
    # a seed's zero increments (PI's flat factors, YaRN's flat ends) start at this share of the range, half a grid
    # step by default: a logit moves a share by a factor per step, so one at 1e-6 (ln -14) stays frozen for tens of
    # steps (measured on the demo: 3.607 at the held-out stop with 1e-6, 3.564 with half a step), while an increment
    # below half a grid step is one the grid cannot tell from zero anyway
    smallest_increment: float = 0.005

    @property
    def size(self) -> int:
        return self.pairs + 1 + (self.attention_bounds is not None)

    def factors(self, u: np.ndarray) -> np.ndarray:
        shares = _softmax(u[: self.pairs + 1])
        return 1.0 + (self.max_factor - 1.0) * np.cumsum(shares)[: self.pairs]

    def attention_factor(self, u: np.ndarray) -> float | None:
        if self.attention_bounds is None:
            return None
        low, high = self.attention_bounds
        return float(low + (high - low) * _sigmoid(u[self.pairs + 1]))

    def pullback(self, u: np.ndarray, d_factors: np.ndarray, d_attention: float) -> np.ndarray:
        """d loss / d u from d loss / d factors and d loss / d attention factor (the chain rule, by hand).

        With s = softmax(u_0..u_P), C_i = sum_{m <= i} s_m and g_i = d loss / d lambda_i:
        d lambda_i / d u_k = (M - 1) s_k ([k <= i] - C_i), so d loss / d u_k = (M - 1) s_k (sum_{i >= k} g_i -
        sum_i g_i C_i). The attention factor: d a / d u = (high - low) sigma (1 - sigma)."""
        shares = _softmax(u[: self.pairs + 1])
        cumulative = np.cumsum(shares)[: self.pairs]
        g = np.asarray(d_factors, dtype=np.float64)
        tail = np.concatenate([np.cumsum(g[::-1])[::-1], [0.0]])  # sum_{i >= k} g_i, k = 0..P (none for the slack)
        grad = np.zeros(self.size)
        grad[: self.pairs + 1] = (self.max_factor - 1.0) * shares * (tail - float(g @ cumulative))
        if self.attention_bounds is not None:
            low, high = self.attention_bounds
            sigma = _sigmoid(u[self.pairs + 1])
            grad[self.pairs + 1] = d_attention * (high - low) * sigma * (1.0 - sigma)
        return grad

    def inverse(self, factors: np.ndarray, attention_factor: float | None) -> np.ndarray:
        """A u whose point is `factors` clipped into [1, max_factor] and made non-decreasing, every increment at least
        `smallest_increment` (so no logit is -inf or frozen), and the attention factor clipped into its bounds."""
        clipped = np.maximum.accumulate(np.clip(np.asarray(factors, dtype=np.float64), 1.0, self.max_factor))
        steps = np.diff(np.concatenate([[1.0], clipped, [self.max_factor]])) / (self.max_factor - 1.0)
        shares = np.maximum(steps, self.smallest_increment / (self.max_factor - 1.0))
        u = np.zeros(self.size)
        u[: self.pairs + 1] = np.log(shares / shares.sum())
        if self.attention_bounds is not None:
            low, high = self.attention_bounds
            value = attention_factor if attention_factor is not None else (low + high) / 2
            share = float(np.clip((value - low) / (high - low), SMALLEST_SHARE, 1 - SMALLEST_SHARE))
            u[self.pairs + 1] = math.log(share / (1 - share))
        return u


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / e.sum()


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


@dataclass
class Adam:
    """Adam over a numpy vector; its state (moments, step) round-trips through JSON."""

    learning_rate: float
    m: np.ndarray
    v: np.ndarray
    t: int = 0

    @classmethod
    def fresh(cls, learning_rate: float, size: int) -> Adam:
        return cls(learning_rate, np.zeros(size), np.zeros(size))

    def step(self, u: np.ndarray, grad: np.ndarray) -> np.ndarray:
        b1, b2 = ADAM_BETAS
        self.t += 1
        self.m = b1 * self.m + (1 - b1) * grad
        self.v = b2 * self.v + (1 - b2) * grad * grad
        m_hat, v_hat = self.m / (1 - b1**self.t), self.v / (1 - b2**self.t)
        return u - self.learning_rate * m_hat / (np.sqrt(v_hat) + ADAM_EPS)

    def state_dict(self) -> dict[str, Any]:
        return {"m": self.m.tolist(), "v": self.v.tolist(), "t": self.t}

    @classmethod
    def from_state(cls, learning_rate: float, state: dict[str, Any]) -> Adam:
        return cls(learning_rate, np.asarray(state["m"], float), np.asarray(state["v"], float), int(state["t"]))
