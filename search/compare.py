"""Rerunning the baselines: every method on the same test windows at several lengths, with intervals.

Methods: none, PI, NTK-aware, Dynamic NTK, YaRN and Llama 3 at their nominal settings for the job's scale;
NTK with its scale and attention factor tuned on the search split (a fair, strong baseline); and any factors
files given. Perplexity intervals are 95% normal intervals over windows of the per-window mean NLL; the
paired difference to the best baseline uses the same windows on both sides, which removes most of the
window-to-window variance (about 10x tighter than comparing two perplexities). Next to perplexity, needle
retrieval on held-out needles of the test split (`needle_report.py`): exact-match accuracy and answer NLL per
length and depth, and a depth x length heat-map.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from longrope.encodings import NtkRope, RopeMethod, from_hf
from longrope.search.intervals import interval, paired_difference
from longrope.search.job_config import JobConfigError
from longrope.search.job_context import JobContext, read_factors_file
from longrope.search.needle_report import needle_cell, needle_table, plot_needle_heatmap
from longrope.search.run_store import write_json_atomic
from longrope.workers.errors import DataError
from longrope.workers.pool import WorkerPool

BASELINES = ("none", "pi", "ntk", "dynamic", "yarn", "llama3", "ntk_tuned")
NTK_SCALE_MULTIPLIERS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
NTK_ATTENTION_FACTORS = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3)


def default_lengths(original: int, target: int) -> list[int]:
    lengths, length = [], original
    while length < target:
        lengths.append(length)
        length *= 2
    return [*lengths, target]


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
    windows = context.windows(source, length, count, objective)
    pool = WorkerPool(context.model_spec(), windows.tokens, context.pool_spec(), loss_mask=windows.loss_mask)
    try:
        return dict(pool.imap(methods.items()))
    finally:
        pool.shutdown()


def needle_scores(context: JobContext, methods: dict[str, RopeMethod], length: int, log) -> dict[str, dict] | None:
    """Each method's needle retrieval at `length` on the test split; None where a needle cannot fit."""
    data = context.config.data
    try:
        scores = score_all(context, methods, data.test_source, length, data.test_windows, "needle")
    except DataError as exc:
        log(f"compare: no needle retrieval at {length} tokens ({exc})")
        return None
    return {name: needle_cell(list(s.misses), list(s.nll), list(s.tokens)) for name, s in scores.items()}


def tuned_ntk(context: JobContext) -> tuple[RopeMethod, dict[str, float]]:
    """NTK's scale and attention factor picked on the search split at the target length."""
    shape = {
        "head_dim": context.method.head_dim,
        "rope_theta": context.method.rope_theta,
        "partial_rotary_factor": context.method.partial_rotary_factor,
        "max_position_embeddings": context.target_length,
    }
    grid = {}
    for multiplier in NTK_SCALE_MULTIPLIERS:
        factors = NtkRope(factor=context.scale * multiplier, **shape).factors().double()
        for attention in NTK_ATTENTION_FACTORS:
            grid[(multiplier, attention)] = context.longrope(factors, attention_factor=attention)
    data = context.config.data
    scores = score_all(context, grid, data.search_source, context.target_length, data.search_windows)
    (multiplier, attention), _ = min(scores.items(), key=lambda item: item[1].mean_nll)
    return grid[(multiplier, attention)], {"ntk_factor": context.scale * multiplier, "attention_factor": attention}


def factors_method(context: JobContext, path: str) -> RopeMethod:
    factors = read_factors_file(path)
    pairs = len(factors.rope_parameters.long_factor)
    if pairs != context.pairs:
        raise JobConfigError(f"--factors {path}: {pairs} factors, but this model has {context.pairs} rotary pairs")
    return from_hf(
        factors.rope_parameters.model_dump(exclude_none=True),
        head_dim=context.method.head_dim,
        max_position_embeddings=factors.max_position_embeddings,
    )


def run_compare(
    context: JobContext, *, factors_files: list[str], lengths: list[int], out_dir: Path, log=print
) -> dict[str, Any]:
    for path in factors_files:
        factors_method(context, path)  # bad files stop here, before any scoring
    bad = [n for n in lengths if n < 2]
    if bad:
        raise JobConfigError(f"--lengths: every length must be >= 2, got {bad[0]}")
    methods: dict[str, RopeMethod] = dict(context.baselines())
    log("compare: tuning NTK's scale and attention factor on the search split ...")
    methods["ntk_tuned"], tuned = tuned_ntk(context)
    for path in factors_files:
        methods[f"file:{Path(path).name}"] = factors_method(context, path)
    data = context.config.data
    per_window: dict[str, dict[int, list[float]]] = {name: {} for name in methods}
    needles: dict[str, dict[str, dict]] = {name: {} for name in methods}
    for length in lengths:
        log(f"compare: scoring {len(methods)} methods on {data.test_windows} test windows of {length} tokens ...")
        for name, score in score_all(context, methods, data.test_source, length, data.test_windows).items():
            per_window[name][length] = window_means(score).tolist()
        log(f"compare: needle retrieval on {data.test_windows} test needles of {length} tokens ...")
        for name, cell in (needle_scores(context, methods, length, log) or {}).items():
            needles[name][str(length)] = cell
    result = summarize(context, methods, per_window, lengths, tuned)
    for name, row in result["methods"].items():
        row["needle"] = needles[name]
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "compare.json", result)
    (out_dir / "compare.md").write_text(markdown_table(result) + "\n\n" + needle_table(result) + "\n")
    plot_perplexity(result, out_dir / "perplexity_vs_length.png")
    plot_factors(result, out_dir / "factors.png")
    plot_needle_heatmap(result, out_dir / "needle_heatmap.png")
    return result


def summarize(context, methods, per_window, lengths, tuned) -> dict[str, Any]:
    target = context.target_length
    baseline_names = [n for n in methods if n in BASELINES]
    best_baseline = min(
        baseline_names, key=lambda n: np.mean(per_window[n][target]) if target in per_window[n] else math.inf
    )
    rows = {}
    for name, method in methods.items():
        row: dict[str, Any] = {
            "perplexity": {},
            "factors": method.factors(target).tolist(),
            "attention_factor": method.attention_factor,
            "nll_per_window": per_window[name],
        }
        for length in lengths:
            mean, low, high = interval(np.asarray(per_window[name][length]))
            row["perplexity"][str(length)] = [math.exp(mean), math.exp(low), math.exp(high)]
        if target in per_window[name]:
            row["paired_difference_to_best_baseline"] = list(
                paired_difference(per_window[name][target], per_window[best_baseline][target])
            )
        rows[name] = row
    return {
        "target_length": target,
        "original_length": context.original_length,
        "lengths": lengths,
        "best_baseline": best_baseline,
        "ntk_tuned": tuned,
        "methods": rows,
    }


def markdown_table(result: dict[str, Any]) -> str:
    lengths, target = result["lengths"], result["target_length"]
    header = ["method", *[f"ppl @ {n}" for n in lengths], f"Δ NLL vs {result['best_baseline']} @ {target}"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in result["methods"].items():
        cells = [name]
        for n in lengths:
            ppl, low, high = row["perplexity"][str(n)]
            cells.append(f"{ppl:.3f} [{low:.3f}, {high:.3f}]")
        diff = row.get("paired_difference_to_best_baseline")
        cells.append(f"{diff[0]:+.4f} [{diff[1]:+.4f}, {diff[2]:+.4f}]" if diff else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_perplexity(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, row in result["methods"].items():
        ppl = [row["perplexity"][str(n)][0] for n in result["lengths"]]
        ax.plot(result["lengths"], ppl, marker="o", label=name, linewidth=2.5 if name.startswith("file:") else 1.2)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="context length (tokens)",
        ylabel="test perplexity",
        title=f"perplexity vs length (trained at {result['original_length']})",
    )
    ax.axvline(result["original_length"], color="grey", linestyle=":", linewidth=1)
    ax.set_xticks(result["lengths"], [str(n) for n in result["lengths"]])
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_factors(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, row in result["methods"].items():
        if name in ("none", "dynamic"):
            continue
        ax.plot(row["factors"], label=name, linewidth=2.5 if name.startswith("file:") else 1.2)
    ax.set(
        xlabel="rotary pair index i (high frequency -> low)",
        ylabel="factor λ_i (inv_freq divisor)",
        title=f"per-pair factors at {result['target_length']} tokens",
        yscale="log",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
