"""The table at one target, built from in-process scores with `longrope compare`'s own code: the baselines at their
nominal settings (`JobContext.baselines`), NTK and YaRN tuned on the search windows (`tuned_baselines.tuning_grids`,
`pick_tuned`), the searched rows, and compare.json / compare.md's content (`compare.summarize`,
`compare_tables.markdown_table`: the same intervals, the same paired difference to the best baseline).

A method is scored once per window set: a row whose method equals another's (tuned YaRN is often YaRN itself) takes
its scores, as `bench/real_model.py` and compare do.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpu_table_parts.plan import DESCENT_ROW, GA_ROW, HYBRID_ROW
from longrope.search.config.job_config import JobConfig
from longrope.search.job.job_context import JobContext


class TargetResult(BaseModel):
    """One target's part of the result file, filled as each part lands."""

    model_config = ConfigDict(extra="forbid")

    target_length: int
    test_windows_rule: str
    tuning: dict[str, float] = {}  # mean NLL per token on the search windows, by setting label
    tuned: dict[str, Any] = {}  # pick_tuned's settings, and the grid
    per_window: dict[str, list[float]] = {}  # each row's mean NLL per token on each test window
    searches: dict[str, Any] = {}  # optimizer -> searching.SearchSummary as JSON
    compare: dict[str, Any] | None = None  # compare.json's content
    table: str | None = None  # compare.md's table


def job_context(bundle, target: int, model_dir: Path, rope, search: dict | None = None) -> JobContext:
    """The job `longrope compare` would resolve for this target, built from bundle.json (no tokenizer or corpus is
    read: the windows were cut before the run)."""
    config = JobConfig.model_validate(
        {
            "name": f"gpu-table-{target}",
            "model": {"path": str(model_dir), "dtype": bundle.dtype},
            "original_length": bundle.original_length,
            "target_length": target,
            "data": {
                **bundle.data,
                "search_windows": bundle.count("search", target),
                "test_windows": bundle.count("test", target),
            },
            "search": search or {},
            "output_dir": str(Path(model_dir).parent / f"job-{target}"),
        }
    )
    return JobContext(config, Path(model_dir), bundle.original_length, rope.method, tokenizer=None)


def fingerprint(method) -> str:
    """A method's identity: its class and every field."""
    return hashlib.sha256((type(method).__name__ + method.model_dump_json()).encode()).hexdigest()


class MethodScores:
    """Each method's (NLL sum, tokens) per window of one Scorer's windows, scored once per distinct method."""

    def __init__(self, scorer):
        self.scorer, self.scores = scorer, {}

    def windows(self, method) -> list[tuple[float, int]]:
        key = fingerprint(method)
        if key not in self.scores:
            (score,) = self.scorer.score([method])
            self.scores[key] = list(zip(score.nll, score.tokens, strict=True))
        return self.scores[key]

    def mean_nll(self, method) -> float:
        windows = self.windows(method)
        return sum(n for n, _ in windows) / sum(t for _, t in windows)

    def per_window(self, method) -> list[float]:
        return [n / t for n, t in self.windows(method)]


def tune(context: JobContext, grid: str, search_scores: MethodScores) -> tuple[dict, dict, dict[str, float]]:
    """(tuned methods, their settings with the grid, every setting's mean NLL): compare's tuned rows."""
    from longrope.search.reports.tuned_baselines import pick_tuned, setting_label, tuning_grids

    grids = tuning_grids(context, grid)
    labelled = {setting_label(name, key): method for name, found in grids.items() for key, method in found.items()}
    means = {label: search_scores.mean_nll(method) for label, method in labelled.items()}
    methods, settings = pick_tuned(context, grids, means)
    settings["tuning_grid"] = {"name": grid, "settings": len(labelled)}
    return methods, settings, means


def tuning_size(context: JobContext, grid: str) -> int:
    from longrope.search.reports.tuned_baselines import tuning_grids

    return sum(len(found) for found in tuning_grids(context, grid).values())


def searched_method(context: JobContext, factors, attention_factor: float, n_hat: int = 0):
    """A searched candidate as the LongRoPE method it was scored as."""
    factors = np.asarray(factors, dtype=np.float64)
    return context.candidate(factors, attention_factor=attention_factor, n_hat=n_hat)


def searched_rows(context: JobContext, searches: dict) -> dict:
    """{row: method} of the searches' bests: the hybrid run gives the GA's row (its best before the polish) and the
    hybrid's (its best after), descent its own; a search that found nothing finite gives no row."""
    rows, hybrid, descent = {}, searches.get("hybrid"), searches.get("gradient")
    if hybrid and hybrid.get("before_polish"):
        record = hybrid["before_polish"]
        rows[GA_ROW] = searched_method(context, record["factors"], record["attention_factor"], record.get("n_hat", 0))
    for row, found in ((HYBRID_ROW, hybrid), (DESCENT_ROW, descent)):
        if found and found["best_factors"] is not None:
            factors, attention = found["best_factors"], found["best_attention_factor"]
            rows[row] = searched_method(context, factors, attention, found.get("best_n_hat", 0))
    return rows


def finish(context: JobContext, methods: dict, per_window: dict[str, list[float]], settings: dict):
    """(compare.json's content, compare.md's table) of the rows scored at the target."""
    from longrope.search.reports.compare import summarize
    from longrope.search.reports.compare_tables import markdown_table

    length = str(context.target_length)
    rows = {name: {length: per_window[name]} for name in methods}
    result = summarize(context, methods, rows, [context.target_length], settings)
    return result, markdown_table(result)
