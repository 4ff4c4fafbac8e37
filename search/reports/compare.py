"""Rerunning the baselines: every method on the same test windows at several lengths, with intervals.

Methods: every closed form of the encodings' registry at its nominal setting for the job's scale (none, PI,
NTK-aware, Dynamic NTK, YaRN and Llama 3: `encodings.baselines`); the tuned ones (NTK and YaRN) also with their
scale and attention factor tuned on the search split (`tuned_baselines.py`: fair, strong baselines, over the `full`
or the `coarse` grid) and with LongRoPE's attention factor; and any factors files given (`compare_rows.py`).
Perplexity intervals are 95% normal intervals over windows of the per-window mean NLL; the paired difference to the
best baseline uses the same windows on both sides, which removes most of the window-to-window variance (about 10x
tighter than comparing two perplexities). Next to perplexity, needle retrieval on held-out needles of the test
split (`needle_report.py`): exact-match accuracy and answer NLL per length and depth, and a depth x length heat-map.

The result is compare.json (its shape: `compare_result.py`), written with compare.md (`compare_tables.py`) and
the plots (`compare_plots.py`, `needle_report.py`) into a directory of its own (`compare_out.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from longrope.encodings import LongRope, RopeMethod
from longrope.encodings.baselines import tuned_names, tuned_row
from longrope.search.config.strict import JobConfigError
from longrope.search.job.job_context import LONGROPE_ATTENTION_ROWS, JobContext
from longrope.search.reports.compare_out import CompareOut
from longrope.search.reports.compare_plots import plot_factors, plot_paired_difference, plot_perplexity
from longrope.search.reports.compare_result import (
    BASELINES,
    SHIPPED,
    VLLM_SUFFIX,
    CompareResult,
    MethodRow,
    base_method,
)
from longrope.search.reports.compare_rows import factors_rows, given_methods
from longrope.search.reports.compare_scoring import (
    ComparePool,
    Progress,
    compare_window_sets,
    no_progress,
    window_means,
)
from longrope.search.reports.compare_tables import markdown_table
from longrope.search.reports.intervals import interval, paired_difference
from longrope.search.reports.needle_report import needle_cell, needle_table, plot_needle_heatmap
from longrope.search.reports.tuned_baselines import tuned_baselines, tuning_grids
from longrope.search.run.run_store import write_json_atomic, write_text_atomic

OUTPUT_FILES = (
    "compare.json",
    "compare.md",
    "perplexity_vs_length.png",
    "paired_difference.png",
    "factors.png",
    "needle_heatmap.png",
)


def default_lengths(original: int, target: int, start: int | None = None) -> list[int]:
    """The original length doubled up to the target, and `start` (where the extension starts: the length a model
    that ships RoPE scaling serves), so the table shows every method where the model already works."""
    lengths, length = [], original
    while length < target:
        lengths.append(length)
        length *= 2
    return sorted({*lengths, target, *([start] if start is not None and start < target else [])})


def check_lengths(lengths: list[int]) -> None:
    bad = [n for n in lengths if n < 2]
    if bad:
        raise JobConfigError(f"--lengths: every length must be >= 2, got {bad[0]}")


def with_vllm_rows(methods: dict[str, RopeMethod]) -> dict[str, RopeMethod]:
    """Each LongRoPE method (searched factors, tuned NTK) once more as a vLLM engine with max_model_len = the
    target applies it: long factors and long_mscale at every length. The other methods have no regimes and
    apply the same in both runtimes; the closed forms read with LongRoPE's attention factor are analysis rows, never
    exported, so they get no twin."""
    rows = dict(methods)
    for name, method in methods.items():
        if isinstance(method, LongRope) and name not in LONGROPE_ATTENTION_ROWS:
            rows[f"{name} {VLLM_SUFFIX}"] = method.vllm_regime()
    return rows


def needle_cell_of(score) -> dict[str, Any]:
    return needle_cell(list(score.misses), list(score.nll), list(score.tokens))


def run_compare(
    context: JobContext,
    *,
    factors_files: Sequence[str | Path | tuple[str, ...]],
    lengths: list[int],
    out_dir: Path | CompareOut,
    log=print,
    progress: Progress = no_progress,
    notes: Sequence[str] = (),
    tuning_grid: str = "full",
    needles: bool = True,
) -> CompareResult:
    """Score every baseline and the given factors (paths, or (label, path) pairs) and write the results;
    `progress(phase, done, total)` hears each result (the CLI draws a bar or prints lines from it).

    Every input is checked before any window is cut or anything scored: lengths, row labels, the factors files
    and their provenance, the output directory, then both data sources (`compare_window_sets`). `notes` (the
    caller's) and what provenance says (another target length, a model not checked) are logged only then, so a
    refusal stays the only line. A plain `out_dir` path is `-o` without --overwrite. The output directory is
    created only when the results are in."""
    check_lengths(lengths)
    rows = factors_rows(factors_files)
    notes = list(notes)  # said once every input has passed its check
    files, searched_lengths = given_methods(context, rows, notes.append)
    out = out_dir if isinstance(out_dir, CompareOut) else CompareOut(Path(out_dir))
    out.check()
    sets = compare_window_sets(context, lengths, log, needles=needles)
    for note in notes:
        log(note)
    methods, scores, tuned = score_methods(context, sets, files, lengths, log, progress, tuning_grid)
    per_window = {
        name: {str(n): window_means(scores[("perplexity", n)][name]).tolist() for n in lengths} for name in methods
    }
    result = summarize(context, methods, per_window, lengths, tuned, searched_lengths)
    needle_lengths = [n for kind, n in scores if kind == "needle"]
    for name, row in result["methods"].items():
        row["needle"] = {str(n): needle_cell_of(scores[("needle", n)][name]) for n in needle_lengths}
    write_outputs(result, out.create())
    return result


def score_methods(
    context: JobContext,
    sets: dict,
    files: dict[str, RopeMethod],
    lengths: list[int],
    log,
    progress: Progress = no_progress,
    tuning_grid: str = "full",
):
    """(methods, scores, the tuned baselines' settings): the baselines, the tuned ones tuned on the search split, the
    given factors and the vLLM twins, each on every test window set, with one worker pool; `progress` hears each
    result. A twin is scored only where it can differ from its transformers row (`same_as_twin`)."""
    pool = ComparePool(context, sets)
    try:
        methods: dict[str, RopeMethod] = dict(context.baselines())
        grids = tuning_grids(context, tuning_grid)
        size = sum(map(len, grids.values()))
        tuned_forms = " and ".join(tuned_names())
        log(f"compare: tuning {tuned_forms} on the search split ({tuning_grid} grid, {size} settings) ...")
        tuned_methods, tuned = tuned_baselines(context, pool, grids, progress)
        methods = with_vllm_rows({**methods, **tuned_methods, **files})
        scored = [name for name in sets if name[0] != "tuning"]
        log(
            f"compare: scoring {len(methods)} methods at {', '.join(map(str, lengths))} tokens "
            f"({' and '.join(sorted({kind for kind, _ in scored}))}, one worker pool) ..."
        )
        to_score = {
            set_name: {n: m for n, m in methods.items() if not same_as_twin(n, set_name[1], context, methods)}
            for set_name in scored
        }
        scores = pool.score_sets(to_score, progress, phase="method x window sets scored")
        scores = {
            set_name: {name: got.get(name) or got[base_method(name)] for name in methods}
            for set_name, got in scores.items()
        }
        return methods, scores, {**tuned, "tuning_grid": {"name": tuning_grid, "settings": size}}
    finally:
        pool.shutdown()


def same_as_twin(name: str, length: int, context: JobContext, methods: dict[str, RopeMethod]) -> bool:
    """A vLLM twin that applies exactly its transformers row at this length, so it takes that row's score instead of
    being scored again: past the original length transformers' LongRoPE picks the long factors too (the sequence
    exceeds original_max_position_embeddings), and the twin scales cos/sin by the same number when its long_mscale
    equals the row's attention factor (what `longrope export` writes) and the row keeps no n_hat positions
    unscaled (vLLM has none). A file without mscales (older exports, Phi-3's config) is scored on its own."""
    if not name.endswith(VLLM_SUFFIX) or length <= context.original_length:
        return False
    row, twin = methods[base_method(name)], methods[name]
    return twin.attention_factor == row.attention_factor and getattr(row, "n_hat_positions", 0) == 0


def write_outputs(result: CompareResult, directory: Path) -> None:
    """OUTPUT_FILES into `directory`; the JSON and the table atomically (a reader never sees half of either)."""
    write_json_atomic(directory / "compare.json", result)
    write_text_atomic(directory / "compare.md", markdown_table(result) + "\n\n" + needle_table(result) + "\n")
    plot_perplexity(result, directory / "perplexity_vs_length.png")
    plot_paired_difference(result, directory / "paired_difference.png")
    plot_factors(result, directory / "factors.png")
    plot_needle_heatmap(result, directory / "needle_heatmap.png")


def summarize(
    context: JobContext,
    methods: dict[str, RopeMethod],
    per_window: dict[str, dict[str, list[float]]],
    lengths: list[int],
    tuned: dict[str, Any],
    searched_lengths: dict[str, int] | None = None,
) -> CompareResult:
    """compare.json (`compare_result.CompareResult`) from each method's per-window mean NLLs, {name: {length:
    values}} keyed by the length as a string, as in the JSON. A given factors row (and its vLLM twin) records
    `factors_target_length`, the length its factors were searched for (`given_methods`)."""
    searched_lengths = searched_lengths or {}
    target, start = str(context.target_length), str(context.start_length)
    baseline_names = [n for n in methods if n in BASELINES]
    best_baseline = min(
        baseline_names, key=lambda n: np.mean(per_window[n][target]) if target in per_window[n] else math.inf
    )
    rows: dict[str, MethodRow] = {}
    for name, method in methods.items():
        row: MethodRow = {
            "runtime": "vllm" if name.endswith(VLLM_SUFFIX) else "transformers",
            "perplexity": {},
            "factors": method.factors(context.target_length).tolist(),
            "attention_factor": method.attention_factor,
            "nll_per_window": per_window[name],
        }
        if base_method(name) in searched_lengths:
            row["factors_target_length"] = searched_lengths[base_method(name)]
        shipped = per_window.get(SHIPPED)
        rows[name] = with_statistics(row, lengths, target, per_window[best_baseline], shipped, start)
    first = next(iter(per_window.values()))
    return {
        "target_length": context.target_length,
        "original_length": context.original_length,
        "start_length": context.start_length,
        "lengths": lengths,
        "windows": {str(n): len(first[str(n)]) for n in lengths},
        "rope": {"rope_theta": context.method.rope_theta, "pairs": context.pairs},
        "best_baseline": best_baseline,
        **{key: tuned[key] for key in (*map(tuned_row, tuned_names()), "tuning_grid")},
        "methods": rows,
    }


def with_statistics(
    row: MethodRow,
    lengths: list[int],
    target: str,
    best: dict[str, list[float]],
    shipped: dict[str, list[float]] | None = None,
    start: str | None = None,
) -> MethodRow:
    """A row with what its per-window NLLs give: perplexity exp(mean NLL) with its 95% interval at each length,
    at the target the paired NLL difference to the best baseline's windows (`best`), and at the start length the
    paired difference to the model as shipped (`shipped`, the `none` row's windows), each with its interval.

    The second is what a method costs where the model already works: an export's short factors reproduce the shipped
    model up to the start length, so for a searched row it is what its attention factor costs there (transformers'
    LongRoPE multiplies cos and sin by it at every length)."""
    row = {**row, "perplexity": {}}
    for length in map(str, lengths):
        mean, low, high = interval(np.asarray(row["nll_per_window"][length]))
        row["perplexity"][length] = [math.exp(mean), math.exp(low), math.exp(high)]
    if target in row["nll_per_window"]:
        difference = paired_difference(row["nll_per_window"][target], best[target])
        row["paired_difference_to_best_baseline"] = list(difference)
    if shipped is not None and start in row["nll_per_window"] and start in shipped:
        row["paired_difference_to_shipped"] = list(paired_difference(row["nll_per_window"][start], shipped[start]))
    return row


def restated(result: CompareResult) -> CompareResult:
    """A saved compare.json's perplexity intervals and paired differences computed again from its per-window NLLs
    (nothing scored): after a change to how an interval is drawn, a saved table reads as today's code would have
    written it. Needle cells keep theirs: their answer NLLs are stored only in aggregate."""
    lengths, target = result["lengths"], str(result["target_length"])
    best = result["methods"][result["best_baseline"]]["nll_per_window"]
    shipped = result["methods"].get(SHIPPED, {}).get("nll_per_window")
    start = str(result.get("start_length", result.get("original_length")))  # an older or partial result may lack both
    methods = {
        name: with_statistics(row, lengths, target, best, shipped, start) for name, row in result["methods"].items()
    }
    return {**result, "methods": methods}
