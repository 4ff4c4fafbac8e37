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

from longrope.encodings import LongRope, NtkRope, RopeMethod, from_hf
from longrope.search.export import factors_file_of_run
from longrope.search.factors_file import read_factors_file
from longrope.search.intervals import interval, paired_difference
from longrope.search.job_config import JobConfigError
from longrope.search.job_context import JobContext
from longrope.search.needle_report import needle_cell, needle_table, plot_needle_heatmap
from longrope.search.run_store import RunDir, write_json_atomic
from longrope.workers.documents import read_source
from longrope.workers.errors import DataError
from longrope.workers.pool import WorkerPool
from longrope.workers.windows import Windows

BASELINES = ("none", "pi", "ntk", "dynamic", "yarn", "llama3", "ntk_tuned")
NTK_SCALE_MULTIPLIERS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
NTK_ATTENTION_FACTORS = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3)
VLLM_SUFFIX = "(vLLM)"  # a row as a vLLM engine with max_model_len = the target applies the method


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
    """Every method on one window set, with a pool of its own (benches that score one set)."""
    windows = context.windows(source, length, count, objective)
    pool = WorkerPool(context.model_spec(), windows.tokens, context.pool_spec(), loss_mask=windows.loss_mask)
    try:
        return dict(pool.imap(methods.items()))
    finally:
        pool.shutdown()


def compare_window_sets(context: JobContext, lengths: list[int], log) -> dict[tuple[str, int], Windows]:
    """Every window set compare scores, read before any worker starts (a bad source fails here): the search
    split at the target length (to tune NTK), and per length the test split's perplexity and needle windows
    (none where a needle cannot fit)."""
    data = context.config.data
    for source in (data.search_source, data.test_source):  # a bad source stops here, before any cache is written
        read_source(source, text_field=data.text_field)
    sets = {
        ("tuning", context.target_length): context.windows(
            data.search_source, context.target_length, data.search_windows
        )
    }
    for length in lengths:
        sets[("perplexity", length)] = context.windows(data.test_source, length, data.test_windows)
        try:
            sets[("needle", length)] = context.windows(data.test_source, length, data.test_windows, "needle")
        except DataError as exc:
            log(f"compare: no needle retrieval at {length} tokens ({exc})")
    return sets


class ComparePool:
    """One worker pool for all of compare's window sets: each worker loads the model once, not once per length
    and objective."""

    def __init__(self, context: JobContext, sets: dict[tuple[str, int], Windows]):
        self.pool = WorkerPool(
            context.model_spec(),
            [w.tokens for w in sets.values()],
            context.pool_spec(),
            loss_mask=[w.loss_mask for w in sets.values()],
        )
        self.spans = dict(zip(sets, self.pool.spans, strict=True))

    def score(self, methods: dict, set_names: list[tuple[str, int]]) -> dict[tuple[str, int], dict]:
        """Each method on each named set: {set: {method: CandidateScore}}, methods in the order given."""
        for set_name in set_names:
            self.pool.submit((((set_name, name), method) for name, method in methods.items()), self.spans[set_name])
        scores: dict = {set_name: {} for set_name in set_names}
        for (set_name, name), score in self.pool.as_completed():
            scores[set_name][name] = score
        return {set_name: {name: scores[set_name][name] for name in methods} for set_name in set_names}

    def shutdown(self) -> None:
        self.pool.shutdown()


def ntk_grid(context: JobContext) -> dict[tuple[float, float], RopeMethod]:
    """NTK at several scales and attention factors, each as LongRoPE factors at the target length."""
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
    return grid


def tuned_ntk(context: JobContext, pool: ComparePool) -> tuple[RopeMethod, dict[str, float]]:
    """NTK's scale and attention factor picked on the search split at the target length."""
    grid = ntk_grid(context)
    tuning = ("tuning", context.target_length)
    scores = pool.score({str(key): method for key, method in grid.items()}, [tuning])[tuning]
    best = min(grid, key=lambda key: scores[str(key)].mean_nll)
    multiplier, attention = best
    return grid[best], {"ntk_factor": context.scale * multiplier, "attention_factor": attention}


def factors_method(context: JobContext, path: str) -> RopeMethod:
    """A factors file, or a run directory (its best candidate, as `longrope export` writes it)."""
    factors = factors_file_of_run(RunDir(path)) if Path(path).is_dir() else read_factors_file(path)
    pairs = len(factors.rope_parameters.long_factor)
    if pairs != context.pairs:
        raise JobConfigError(f"--factors {path}: {pairs} factors, but this model has {context.pairs} rotary pairs")
    return from_hf(
        factors.rope_parameters.model_dump(exclude_none=True),
        head_dim=context.method.head_dim,
        max_position_embeddings=factors.max_position_embeddings,
    )


def needle_cell_of(score) -> dict[str, Any]:
    return needle_cell(list(score.misses), list(score.nll), list(score.tokens))


def factors_label(path: str) -> str:
    return f"run:{Path(path).name}" if Path(path).is_dir() else f"file:{Path(path).name}"


def with_vllm_rows(methods: dict[str, RopeMethod]) -> dict[str, RopeMethod]:
    """Each LongRoPE method (searched factors, tuned NTK) once more as a vLLM engine with max_model_len = the
    target applies it: long factors and long_mscale at every length. The other methods have no regimes and
    apply the same in both runtimes."""
    rows = dict(methods)
    for name, method in methods.items():
        if isinstance(method, LongRope):
            rows[f"{name} {VLLM_SUFFIX}"] = method.vllm_regime()
    return rows


def run_compare(
    context: JobContext, *, factors_files: list[str], lengths: list[int], out_dir: Path, log=print
) -> dict[str, Any]:
    bad = [n for n in lengths if n < 2]
    if bad:
        raise JobConfigError(f"--lengths: every length must be >= 2, got {bad[0]}")
    files = {factors_label(path): factors_method(context, path) for path in factors_files}  # bad files stop here
    sets = compare_window_sets(context, lengths, log)
    pool = ComparePool(context, sets)
    try:
        methods: dict[str, RopeMethod] = dict(context.baselines())
        log("compare: tuning NTK's scale and attention factor on the search split ...")
        methods["ntk_tuned"], tuned = tuned_ntk(context, pool)
        methods = with_vllm_rows({**methods, **files})
        scored = [name for name in sets if name[0] != "tuning"]
        log(
            f"compare: scoring {len(methods)} methods at {', '.join(map(str, lengths))} tokens "
            "(perplexity and needles, one worker pool) ..."
        )
        scores = pool.score(methods, scored)
    finally:
        pool.shutdown()
    per_window = {
        name: {n: window_means(scores[("perplexity", n)][name]).tolist() for n in lengths} for name in methods
    }
    result = summarize(context, methods, per_window, lengths, tuned)
    needle_lengths = [n for kind, n in scores if kind == "needle"]
    for name, row in result["methods"].items():
        row["needle"] = {str(n): needle_cell_of(scores[("needle", n)][name]) for n in needle_lengths}
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
            "runtime": "vllm" if name.endswith(VLLM_SUFFIX) else "transformers",
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
    if any(row.get("runtime") == "vllm" for row in result["methods"].values()):
        lines += [
            "",
            f"Rows marked {VLLM_SUFFIX}: the method as a vLLM engine with max_model_len = {target} applies it, "
            "long factors and long_mscale at every length (vLLM fixes the regime per engine; transformers switches "
            "to the long factors only past the original length). The other methods apply the same in both.",
        ]
    return "\n".join(lines)


def plot_perplexity(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, row in result["methods"].items():
        ppl = [row["perplexity"][str(n)][0] for n in result["lengths"]]
        style = "--" if row.get("runtime") == "vllm" else "-"
        width = 2.5 if name.startswith(("file:", "run:")) else 1.2
        ax.plot(result["lengths"], ppl, marker="o", label=name, linewidth=width, linestyle=style)
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
        if name in ("none", "dynamic") or row.get("runtime") == "vllm":  # a vLLM row has its method's factors
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
