"""The population searches' early stop: no gain of `min_improvement` in the best score for `patience` generations.

The GA and CMA-ES keep the best score after every generation (`best_by_generation`); once the best has gained less
than `min_improvement` (nats per token) over the last `patience` generations, the search stops. The stop is sticky:
in a steady run, candidates still out are told after it and may complete another generation, which must not undo
it. Gradient descent has its own rule on held-out windows (gradient.py).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from longrope.search.config.search_section import EarlyStopConfig
from longrope.search.optimizers.searcher import json_score, rank_score


class EarlyStopState(BaseModel):
    """The early stop's part of an optimizer's state: the best score after each generation (null: none finite)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    best_by_generation: list[float | None] = []
    stopped: bool = False


class EarlyStop:
    """Records the best after each generation and decides the stop (see the module docstring)."""

    def __init__(self, settings: EarlyStopConfig):
        self.settings = settings
        self.best_by_generation: list[float] = []
        self.stopped = False

    @classmethod
    def replayed(cls, settings: EarlyStopConfig, first: list[float], children: list[float], per_generation: int):
        """A steady GA's early stop as its run left it, from the told scores in the order they were told: it records
        the best of everything told when generation 0 is told whole, then each time `per_generation` more children
        are told (the coordinator tells one result at a time, so each generation ends on its child)."""
        early_stop = cls(settings)
        if first:
            best = min(rank_score(score) for score in first)
            early_stop.record(best)
            for told, score in enumerate(children, 1):
                best = min(best, rank_score(score))
                if told % per_generation == 0:
                    early_stop.record(best)
        return early_stop

    def record(self, best: float) -> None:
        """The best score after a generation just ended."""
        self.best_by_generation.append(best)
        patience = self.settings.patience
        if patience and len(self.best_by_generation) > patience:
            gain = self.best_by_generation[-patience - 1] - best
            self.stopped = self.stopped or gain < self.settings.min_improvement

    @property
    def previous_best(self) -> float:
        """The best before the generation just recorded (inf before generation 0's)."""
        return self.best_by_generation[-2] if len(self.best_by_generation) > 1 else math.inf

    def countdown(self) -> str:
        """How close the stop is: "no gain >= 0.001 for k/P generations", k being how many generations back the
        best has gained less than `min_improvement` (the stop comes at k = P). A new best smaller than that gain
        does not reset it, hence "gain", not "new best"."""
        patience, stale = self.settings.patience, self.generations_without_gain()
        if not patience or (not stale and not self.stopped):
            return ""
        minimum = self.settings.min_improvement
        what = f"no gain >= {minimum:g}" if minimum > 0 else "no improvement"
        stop = ": early stop" if self.stopped else ""
        return f"  {what} for {min(stale, patience)}/{patience} generations{stop}"

    def generations_without_gain(self) -> int:
        """How many generations back the best has gained less than `min_improvement` (at most `patience`)."""
        best, stale = self.best_by_generation, 0
        for back in range(1, min(len(best) - 1, self.settings.patience or 0) + 1):
            if best[-1 - back] - best[-1] >= self.settings.min_improvement:
                break
            stale = back
        return stale

    def state(self) -> EarlyStopState:
        return EarlyStopState(best_by_generation=[json_score(v) for v in self.best_by_generation], stopped=self.stopped)

    def load_state(self, state: EarlyStopState) -> None:
        self.best_by_generation = [math.inf if v is None else float(v) for v in state.best_by_generation]
        self.stopped = state.stopped
