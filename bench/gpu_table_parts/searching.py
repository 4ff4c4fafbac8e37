"""A search in this process, on the GPU run's own Scorer: the project's searcher (built by
`search.optimizers.factory.make_searcher` from a search section, as `longrope search` builds it) asked and told as
`search.optimizers.optimize.optimize` does, with a deadline.

Why not `longrope search`: its workers are Ray actors, and the GPU machine has no Ray (nor room in a run to carry it);
why not `optimize` itself: a lease ends at a fixed time, so the loop stops asking when its share of the time is spent
and keeps the best told so far. Each candidate's record is the one the coordinator writes to history.jsonl
(`search.run.coordinator.history_record`): its NLL per search window, and for a descent step the objective's
gradient on its gradient windows (`objective_gradient`), so the searcher sees what a worker pool would give it.
"""

from __future__ import annotations

import math
import time

from pydantic import BaseModel, ConfigDict

from longrope.search.optimizers.factory import make_searcher
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.optimizers.objective import ObjectiveMix, objective_gradient, subset_mix


class SearchSummary(BaseModel):
    """One search at one target: its settings, what it scored, its best on the search windows, and every record."""

    model_config = ConfigDict(extra="forbid")

    optimizer: str
    search: dict
    scored: int
    backward_steps: int
    seconds: float
    stopped_by_deadline: bool
    best_key: str | None
    best_search_nll: float | None
    best_seed: str | None  # the seed it started from, when the best is one
    best_seed_nll: float | None  # the best seed's, for comparison
    best_factors: list[float] | None
    best_attention_factor: float | None
    best_n_hat: int = 0
    # the hybrid: its best before the polish (the GA's own; a record of history), else None
    before_polish: dict | None = None
    history: list[dict]  # the records, as history.jsonl lines


class WindowObjective:
    """A candidate scored on every search window by `scorer` (a descent step: a gradient pass on its gradient windows,
    a forward on the others), as its HistoryRecord."""

    def __init__(self, context, scorer, windows: int):
        self.context, self.scorer, self.mix = context, scorer, ObjectiveMix.single(windows)
        self.windows = windows

    def __call__(self, candidate) -> HistoryRecord:
        method = self.context.candidate(
            candidate.factors, attention_factor=candidate.attention_factor, n_hat=candidate.n_hat
        )
        if candidate.gradient_windows is None:
            (score,) = self.scorer.score([method])
            return self.record(candidate, method, list(score.nll), list(score.tokens))
        first, last = candidate.gradient_windows
        nll, tokens = [], []
        if first > 0:
            (before,) = self.scorer.score([method], (0, first))
            nll, tokens = list(before.nll), list(before.tokens)
        step = self.scorer.score_with_gradient(method, (first, last))
        nll, tokens = nll + list(step.nll), tokens + list(step.tokens)
        if last < self.windows:
            (after,) = self.scorer.score([method], (last, self.windows))
            nll, tokens = nll + list(after.nll), tokens + list(after.tokens)
        gradient = objective_gradient(subset_mix(self.mix, (first, last)), tokens[first:last], step.gradient)
        descent = {
            "gradient_windows": [first, last],
            "backward_windows": last - first,
            "gradient": [float(v) if math.isfinite(v) else None for v in gradient],
        }
        return self.record(candidate, method, nll, tokens, descent)

    def record(self, candidate, method, nll: list[float], tokens: list[int], descent: dict | None = None):
        mean = self.mix.mean_nll(nll, tokens)
        finite = math.isfinite(mean)
        return HistoryRecord.model_validate(
            {
                "key": candidate.key,
                "generation": int(candidate.generation),
                "seed": candidate.seed,
                "factors": [round(float(f), 6) for f in candidate.factors],
                "n_hat": int(candidate.n_hat),
                "attention_factor": float(method.attention_factor),
                "mean_nll": mean if finite else None,
                "perplexity": math.exp(mean) if finite else None,
                "nll": [float(v) if math.isfinite(v) else None for v in nll],
                "tokens": [int(t) for t in tokens],
                **(descent or {}),
            }
        )


def run_search(context, scorer, windows: int, until: float, log=print) -> SearchSummary:
    """`context.config.search`'s optimizer from the job's seeds, until it is done or the clock passes `until`."""
    settings = context.config.search
    seeds = context.seeds()
    searcher = make_searcher(
        settings, pairs=context.pairs, scale=context.scale, seeds=seeds, mix=ObjectiveMix.single(windows)
    )
    objective, records = WindowObjective(context, scorer, windows), {}
    started, stopped = time.monotonic(), False
    while not searcher.done() and not stopped:
        asked = searcher.ask(8)
        if not asked:
            raise RuntimeError(f"{searcher.kind}: asked for nothing at {searcher.position()} and is not done")
        for candidate in asked:
            if time.monotonic() >= until:
                stopped = True
                break
            record = records.get(candidate.key) or objective(candidate)  # a repeat is told its record, as by the
            records[record.key] = record  # coordinator: nothing is scored twice
            for end in searcher.tell([record]):
                log(f"  {settings.optimizer} {end.label}: best search NLL {end.best:.4f}")
    return summary(settings, records, time.monotonic() - started, stopped)


def best_record(records) -> HistoryRecord | None:
    """The lowest finite score, ties by key (`best_of`'s rule); None where none is finite."""
    ranked = sorted(records, key=lambda r: (r.score, r.key))
    return ranked[0] if ranked and math.isfinite(ranked[0].score) else None


def before_polish(settings, records: dict[str, HistoryRecord]) -> dict | None:
    """A hybrid's best among the GA's own candidates: those told before its first polish step (the first record with
    a gradient; the polish runs once the generation before it is all told, `HybridSearch.ask`, and here only after
    the last). None for any other optimizer."""
    if settings.optimizer != "hybrid":
        return None
    told = list(records.values())
    first_step = next((i for i, r in enumerate(told) if r.gradient is not None), len(told))
    best = best_record(told[:first_step])
    return best.model_dump(mode="json", exclude_unset=True) if best else None


def summary(settings, records: dict[str, HistoryRecord], seconds: float, stopped: bool) -> SearchSummary:
    ranked = sorted(records.values(), key=lambda r: (r.score, r.key))
    best = best_record(ranked)
    seeds = [r for r in ranked if r.seed and math.isfinite(r.score)]
    return SearchSummary(
        optimizer=settings.optimizer,
        search=settings.model_dump(mode="json", exclude_defaults=True),
        scored=len(records),
        backward_steps=sum(1 for r in records.values() if r.gradient is not None),
        seconds=seconds,
        stopped_by_deadline=stopped,
        best_key=best.key if best else None,
        best_search_nll=best.mean_nll if best else None,
        best_seed=best.seed if best else None,
        best_seed_nll=seeds[0].mean_nll if seeds else None,
        best_factors=best.factors if best else None,
        best_attention_factor=best.attention_factor if best else None,
        best_n_hat=best.n_hat if best else 0,
        before_polish=before_polish(settings, records),
        history=[r.model_dump(mode="json", exclude_unset=True) for r in records.values()],
    )
