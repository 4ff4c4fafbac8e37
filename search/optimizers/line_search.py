"""A backtracking line search for the hybrid's polish: a step is taken only where it lowers the search NLL.

The polish starts at the evolution's best, a point the GA has already converged on. Adam's first steps move every
coordinate by about its learning rate whatever the gradient's size (its update is m / sqrt(v), about sign(g)), so a
polish by Adam leaves that optimum's basin at once and spends its steps climbing back. Here instead the polish holds
an anchor, the best point it has scored with its gradient, and tries

    u_trial = u_anchor - alpha * g_anchor / ||g_anchor||

accepting the trial as the new anchor only under the sufficient-decrease (Armijo) condition

    f(u_trial) <= f(u_anchor) - c * alpha * ||g_anchor||,    c = 1e-4

(Nocedal and Wright, Numerical Optimization, 2nd ed., Algorithm 3.1, on the unit direction), after which alpha
doubles; a refused trial halves alpha and the next trial goes from the same anchor. f is the mean NLL on every
search window (what ranks the export); g is the gradient on the step's gradient windows. So the polish's best is
never worse than the point it started from, and every step it keeps has earned its place.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

ARMIJO = 1e-4
GROWTH, SHRINK = 2.0, 0.5
MAX_GROWTH = 8.0  # alpha never exceeds 8 x its first value: a run of gains does not fling the point away


class LineSearchState(BaseModel):
    """state.json's line search: the anchor (u, its search NLL, its gradient in u) and the next trial's alpha."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    anchor: list[float] | None  # None: no point told yet
    anchor_score: float | None
    anchor_gradient: list[float] | None
    alpha: float = Field(gt=0)
    accepted: int = Field(default=0, ge=0)
    refused: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _whole_anchor(self) -> LineSearchState:
        given = [self.anchor is not None, self.anchor_score is not None, self.anchor_gradient is not None]
        if any(given) and not all(given):
            raise ValueError("anchor: its u, anchor_score and anchor_gradient are given together or not at all")
        if self.anchor is not None and len(self.anchor) != len(self.anchor_gradient):
            raise ValueError(f"anchor_gradient: {len(self.anchor_gradient)} values, anchor has {len(self.anchor)}")
        return self


class BacktrackingLineSearch:
    """The anchor and alpha; `next_point` takes a told point's NLL and gradient and gives the next trial's u."""

    def __init__(self, alpha: float):
        self.first_alpha = alpha
        self.alpha = alpha
        self.anchor: np.ndarray | None = None
        self.anchor_score = math.inf
        self.anchor_gradient: np.ndarray | None = None
        self.accepted = 0
        self.refused = 0

    def next_point(self, u: np.ndarray, score: float, gradient: np.ndarray) -> np.ndarray:
        """Judge the point just told (u, its search NLL, its gradient in u), then the next trial from the anchor.
        The first point told becomes the anchor; a non-finite score or gradient is refused."""
        usable = math.isfinite(score) and bool(np.all(np.isfinite(gradient)))
        if self.anchor is None and usable:
            self._accept(u, score, gradient, grow=False)
        elif usable and score <= self.anchor_score - ARMIJO * self.alpha * float(np.linalg.norm(self.anchor_gradient)):
            self._accept(u, score, gradient, grow=True)
        else:
            self.refused += 1
            self.alpha *= SHRINK
        if self.anchor is None:
            return u
        norm = float(np.linalg.norm(self.anchor_gradient))
        if norm == 0.0:
            return self.anchor.copy()  # a stationary anchor: nothing to go down
        return self.anchor - self.alpha * self.anchor_gradient / norm

    def trials(self, count: int) -> list[np.ndarray]:
        """The next `count` trials from the anchor, alpha halved each: what `next_point` gives after each of them
        is refused in turn (the first is the trial `next_point` gave last). Needs an anchor."""
        norm = float(np.linalg.norm(self.anchor_gradient))
        if norm == 0.0:
            return [self.anchor.copy()]
        return [self.anchor - self.alpha * SHRINK**k * self.anchor_gradient / norm for k in range(count)]

    def _accept(self, u: np.ndarray, score: float, gradient: np.ndarray, *, grow: bool) -> None:
        self.anchor, self.anchor_score, self.anchor_gradient = u.copy(), score, gradient.copy()
        if grow:
            self.accepted += 1
            self.alpha = min(self.alpha * GROWTH, MAX_GROWTH * self.first_alpha)

    def state(self) -> LineSearchState:
        told = self.anchor is not None
        return LineSearchState(
            anchor=self.anchor.tolist() if told else None,
            anchor_score=self.anchor_score if told else None,
            anchor_gradient=self.anchor_gradient.tolist() if told else None,
            alpha=self.alpha,
            accepted=self.accepted,
            refused=self.refused,
        )

    def load_state(self, state: LineSearchState) -> None:
        told = state.anchor is not None
        self.anchor = np.asarray(state.anchor, dtype=np.float64) if told else None
        self.anchor_score = float(state.anchor_score) if told else math.inf
        self.anchor_gradient = np.asarray(state.anchor_gradient, dtype=np.float64) if told else None
        self.alpha, self.accepted, self.refused = state.alpha, state.accepted, state.refused
