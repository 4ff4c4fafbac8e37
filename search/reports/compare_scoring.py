"""Scoring for compare: the window sets it reads, and one worker pool that scores every method on all of them.

Each worker loads the model once and holds every window set compare scores (the search split at the target length
for NTK tuning; per length the test split's perplexity and needle windows), so ten methods at five lengths cost one
model load per worker, not fifty.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from longrope.encodings import RopeMethod
from longrope.search.job.job_context import JobContext
from longrope.search.job.validation_checks import data_source_checks
from longrope.workers.errors import DataError
from longrope.workers.windows import Windows

Progress = Callable[[str, int, int], None]  # (phase, results done, results in the phase)


def no_progress(phase: str, done: int, total: int) -> None:
    """The default: compare says nothing between its log lines."""


def window_means(score) -> np.ndarray:
    return np.asarray(score.nll, dtype=np.float64) / np.asarray(score.tokens, dtype=np.float64)


def score_all(
    context: JobContext,
    methods: dict[str, RopeMethod],
    source: str,
    length: int,
    count: int,
    objective: str = "perplexity",
) -> dict:
    """Every method on one window set, with a pool of its own (benches that score one set)."""
    from longrope.workers.pool import WorkerPool  # Ray: only when a pool starts (summarize & co. run without Ray)

    windows = context.windows(source, length, count, objective)
    pool = WorkerPool(context.model_spec(), windows.tokens, context.pool_spec(), loss_mask=windows.loss_mask)
    try:
        return dict(pool.imap(methods.items()))
    finally:
        pool.shutdown()


def compare_window_sets(
    context: JobContext, lengths: list[int], log, *, needles: bool = True
) -> dict[tuple[str, int], Windows]:
    """Every window set compare scores, read before any worker starts (a bad source fails here): the search
    split at the target length (to tune NTK and YaRN), and per length the test split's perplexity and needle
    windows (none where a needle cannot fit, or with `needles` False)."""
    data = context.config.data
    data_source_checks(context.config)  # as validate checks them: a bad source stops here, before any cache write
    sets = {
        ("tuning", context.target_length): context.windows(
            data.search_source, context.target_length, data.search_windows
        )
    }
    for length in lengths:
        sets[("perplexity", length)] = context.windows(data.test_source, length, data.test_windows)
        if not needles:
            continue
        try:
            sets[("needle", length)] = context.windows(data.test_source, length, data.test_windows, "needle")
        except DataError as exc:
            log(f"compare: no needle retrieval at {length} tokens ({exc})")
    return sets


class ComparePool:
    """One worker pool for all of compare's window sets: each worker loads the model once, not once per length
    and objective."""

    def __init__(self, context: JobContext, sets: dict[tuple[str, int], Windows]):
        from longrope.workers.pool import WorkerPool  # Ray: only when a pool starts (summarize & co. run without Ray)

        self.pool = WorkerPool(
            context.model_spec(),
            [w.tokens for w in sets.values()],
            context.pool_spec(),
            loss_mask=[w.loss_mask for w in sets.values()],
        )
        self.spans = dict(zip(sets, self.pool.spans, strict=True))

    def score(
        self, methods: dict, set_names: list[tuple[str, int]], progress: Progress = no_progress, phase: str = "scored"
    ) -> dict[tuple[str, int], dict]:
        """Each method on each named set: {set: {method: CandidateScore}}, methods in the order given; `progress`
        hears (phase, results done, results in all) as each result arrives."""
        return self.score_sets({set_name: methods for set_name in set_names}, progress, phase)

    def score_sets(
        self, methods_by_set: dict[tuple[str, int], dict], progress: Progress = no_progress, phase: str = "scored"
    ) -> dict[tuple[str, int], dict]:
        """Each set's own methods, all submitted at once so that every worker stays busy."""
        for set_name, methods in methods_by_set.items():
            self.pool.submit((((set_name, name), method) for name, method in methods.items()), self.spans[set_name])
        scores: dict = {set_name: {} for set_name in methods_by_set}
        total = sum(len(methods) for methods in methods_by_set.values())
        for done, ((set_name, name), score) in enumerate(self.pool.as_completed(), start=1):
            scores[set_name][name] = score
            progress(phase, done, total)
        return {
            set_name: {name: scores[set_name][name] for name in methods} for set_name, methods in methods_by_set.items()
        }

    def shutdown(self) -> None:
        self.pool.shutdown()
