"""Any searcher's whole search in memory: pycma's `optimize(fun)` loop (Hansen, `cma.CMAEvolutionStrategy.optimize`)
for the project's `Searcher` interface. No Ray, no run directory, no model: a way to try an optimizer, or a
setting of one, on a cheap objective in seconds, and the loop the coordinator runs with workers and a history.

The objective scores one candidate (its factors, attention factor and n_hat): a mean NLL (lower is better), or a
whole `HistoryRecord` where the searcher needs more than a score (a descent step's per-window NLL and gradient)."""

from __future__ import annotations

import math
from collections.abc import Callable

from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.optimizers.searcher import Candidate, Searcher, best_score


def optimize(
    objective: Callable[[Candidate], float | HistoryRecord],
    searcher: Searcher,
    *,
    batch: int = 1,
    attention_factor: float = 1.0,
) -> tuple[str, float]:
    """Ask up to `batch` candidates at a time, score each, tell it, until the searcher is done; returns the best
    (key, score) told. `attention_factor`: what a candidate without one of its own (None: the encoding's formula)
    is recorded with. A searcher that asks nothing while it is not done and has nothing out would never end, so
    that is an error."""
    scores: dict[str, float] = {}
    while not searcher.done():
        asked = searcher.ask(batch)
        if not asked:
            raise RuntimeError(f"{searcher.kind}: asked for nothing at {searcher.position()} and is not done")
        for candidate in asked:
            value = objective(candidate)
            record = value if isinstance(value, HistoryRecord) else scored_record(candidate, value, attention_factor)
            scores[record.key] = record.score
            searcher.tell([record])
    return best_score(scores)


def scored_record(candidate: Candidate, score: float, attention_factor: float = 1.0) -> HistoryRecord:
    """The record of `candidate` scored `score` (a mean NLL) on one window of one token: what a searcher is told
    when nothing but the score matters. A score that is not finite is recorded as none (ranked last)."""
    finite = math.isfinite(score)
    return HistoryRecord(
        key=candidate.key,
        generation=candidate.generation,
        seed=candidate.seed,
        factors=[float(f) for f in candidate.factors],
        n_hat=candidate.n_hat,
        attention_factor=attention_factor if candidate.attention_factor is None else candidate.attention_factor,
        mean_nll=float(score) if finite else None,
        perplexity=math.exp(score) if finite else None,
        nll=[float(score) if finite else None],
        tokens=[1],
    )
