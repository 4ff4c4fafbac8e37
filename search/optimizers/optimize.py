"""Any searcher's whole search in memory: pycma's `optimize(fun)` loop (Hansen, `cma.CMAEvolutionStrategy.optimize`)
for the project's `Searcher` interface. No Ray, no run directory, no model: a way to try an optimizer, or a
setting of one, on a cheap objective in seconds, and the loop the coordinator runs with workers and a history.

The objective scores one candidate (its factors, attention factor and n_hat): a mean NLL (lower is better), or a
whole `Result` where the searcher needs more than a score (a descent step's per-window NLL and gradient)."""

from __future__ import annotations

from collections.abc import Callable

from longrope.search.optimizers.searcher import Candidate, Result, Searcher, best_score


def optimize(
    objective: Callable[[Candidate], float | Result],
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
            result = _result(candidate, objective(candidate), attention_factor)
            scores[result.key] = result.score
            searcher.tell([result])
    return best_score(scores)


def _result(candidate: Candidate, value: float | Result, attention_factor: float) -> Result:
    if isinstance(value, Result):
        return value
    attention = candidate.attention_factor if candidate.attention_factor is not None else attention_factor
    factors = tuple(float(f) for f in candidate.factors)
    return Result(candidate.key, float(value), (float(value),), (1,), factors, attention)
