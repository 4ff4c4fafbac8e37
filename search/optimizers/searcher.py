"""The one interface every optimizer implements: ask for candidates to score, tell their results.

Shaped like pycma's ask/tell (Hansen, `cma.CMAEvolutionStrategy.ask` / `tell`) and Ray Tune's `Searcher`
(`suggest` / `on_trial_complete`). The coordinator keeps its workers' capacity full: it asks for as many candidates
as it has room for and tells each result as it lands. What differs between a generational GA, a steady-state GA,
CMA-ES and gradient descent is only what `ask` returns:

- a generational search returns its whole next generation when nothing of it is out, and nothing until every
  result of it is told (the generation barrier lives here, not in the coordinator);
- a steady-state GA returns up to `count` children bred from the parents of the moment;
- gradient descent returns one point with the windows whose backward pass it needs (`Candidate.gradient_windows`);
- the hybrid is a GA and a descent composed: its asks and tells go to whichever of the two is running.

A candidate comes back decoded (factors and attention factor, as scored and recorded), so the coordinator never
sees an optimizer's genome. Each searcher owns its budget, its generation count, its stopping rule and its state:
`state()` is its own pydantic model, and a run's state.json holds `{"kind": ..., "state": ...}`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
from pydantic import BaseModel

WindowRange = tuple[int, int]  # [start, stop) of the search windows, in their fixed order


@dataclass(frozen=True)
class Candidate:
    """A point to score: its identity, the generation that asked for it, and the values it is scored with."""

    key: str
    generation: int
    factors: np.ndarray
    attention_factor: float | None  # None: the encoding's own formula
    n_hat: int = 0
    seed: str | None = None  # the seed method it is, when it is one
    gradient_windows: WindowRange | None = None  # the search windows whose backward pass is wanted


@dataclass(frozen=True)
class Result:
    """A candidate's outcome, as history.jsonl records it: its score (the objective's mean NLL per token; inf when
    it has none: stopped by racing, or not finite), per-window NLL and tokens, the values it was scored with, and
    for a gradient candidate the objective's gradient over (factors, attention factor) on its gradient windows."""

    key: str
    score: float
    nll: tuple[float | None, ...]
    tokens: tuple[int, ...]
    factors: tuple[float, ...]
    attention_factor: float
    gradient: tuple[float, ...] | None = None

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> Result:
        """A history.jsonl record as a result (a resumed run tells what it finds recorded)."""
        gradient = record.get("gradient")
        return cls(
            key=record["key"],
            score=math.inf if record["mean_nll"] is None else float(record["mean_nll"]),
            nll=tuple(record["nll"]),
            tokens=tuple(int(t) for t in record["tokens"]),
            factors=tuple(float(f) for f in record["factors"]),
            attention_factor=float(record["attention_factor"]),
            gradient=None if gradient is None else tuple(math.nan if g is None else float(g) for g in gradient),
        )


@dataclass(frozen=True)
class GenerationEnd:
    """A generation (or a polish step) that a tell completed: what its log line says about it."""

    label: str  # "generation 3/20", "generation 2/7 (step 2/5)", "polish after generation 20, step 3/10"
    generation: int
    best: float  # the searcher's best score after it
    previous_best: float  # before it (inf at generation 0)
    countdown: str = ""  # the early stop's countdown, when one is in force
    polish: bool = False  # a hybrid's polish step (timed apart from the generations)
    screening: tuple[int, int] | None = None  # search.surrogate: children proposed, screened out (run so far)


@dataclass(frozen=True)
class SearchPlan:
    """What one search of a configured optimizer scores at most (no early stop): its candidates, each on every
    search window, of them the ones with a backward pass, and how the count is made up, in words."""

    candidates: int
    backward_steps: int
    text: str


class Searcher(Protocol):
    """What the coordinator needs of an optimizer (see the module docstring)."""

    kind: ClassVar[str]
    generation: int  # the generation being asked and scored; 0 is the initial population (or the seeds)

    @property
    def total_generations(self) -> int: ...

    @property
    def budget(self) -> int: ...  # candidates it scores at most (`plan(...).candidates`)

    @property
    def stopped_early(self) -> bool: ...  # its own stop rule ended it before its budget

    def ask(self, count: int) -> list[Candidate]: ...

    def tell(self, results: Sequence[Result]) -> list[GenerationEnd]: ...

    def done(self) -> bool: ...

    def best(self) -> tuple[str, float]: ...

    def threshold(self) -> str | None: ...

    def outstanding(self) -> list[Candidate]: ...

    def position(self) -> str: ...

    def state(self) -> BaseModel: ...

    def load_state(self, state: dict[str, Any]) -> None: ...


def best_score(scores: dict[str, float]) -> tuple[str, float]:
    """(key, score) of the lowest score, ties broken by key: the one rule every searcher picks its best by."""
    key = min(scores, key=lambda k: (scores[k], k))
    return key, scores[key]


def json_score(score: float) -> float | None:
    """A score as state.json holds it: null for inf / NaN (ranked last)."""
    return score if math.isfinite(score) else None


def rank_score(score: float) -> float:
    """What an optimizer ranks by: the score, or inf when it is not finite."""
    return score if math.isfinite(score) else math.inf
