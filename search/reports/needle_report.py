"""Needle retrieval in `longrope compare`: exact-match accuracy and answer NLL per method, length and depth.

Each test needle window hides a 7-digit number at a depth (`workers/needles.py`); the scorer counts, per window,
the answer tokens whose argmax is not the target. Greedy decoding returns the number exactly when that count is
0 (given the true prefix the first token is the argmax; by induction so is every next one), so accuracy needs no
generation, just the forward pass perplexity already pays for. Accuracy intervals are Wilson score intervals
(`intervals.wilson_interval`); answer NLL intervals are normal intervals over windows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from longrope.search.reports.intervals import interval, wilson_interval
from longrope.search.reports.plot_axes import method_colours
from longrope.workers.needles import depth_spread

DEPTH_BINS = (0.0, 0.25, 0.5, 0.75, 1.0)  # the heat-map's rows: each window goes to the nearest


def depth_bin(depth: float) -> float:
    return min(DEPTH_BINS, key=lambda edge: (abs(edge - depth), edge))


def needle_cell(misses: list[int], nll: list[float], tokens: list[int]) -> dict[str, Any]:
    """One method at one length: accuracy overall and per depth bin, answer NLL per token with an interval."""
    depths = depth_spread(len(misses))
    hits = [m == 0 for m in misses]
    per_token = np.asarray(nll, dtype=np.float64) / np.asarray(tokens, dtype=np.float64)
    by_depth = {}
    for edge in DEPTH_BINS:
        rows = [k for k, depth in enumerate(depths) if depth_bin(depth) == edge]
        if rows:
            by_depth[f"{edge:g}"] = list(wilson_interval(sum(hits[k] for k in rows), len(rows)))
    return {
        "accuracy": list(wilson_interval(sum(hits), len(hits))),
        "answer_nll": list(interval(per_token)),
        "accuracy_by_depth": by_depth,
        "windows": len(hits),
    }


def needle_table(result: dict[str, Any]) -> str:
    """Markdown: exact-match accuracy (higher is better) per method and length, with 95% Wilson intervals, under a
    line that says so and how many needles each cell holds; one line when no needle was scored (--no-needles)."""
    lengths = result["lengths"]
    if not any(row.get("needle") for row in result["methods"].values()):
        return "Needle retrieval: no needle windows scored (--no-needles, or no needle fits these lengths)."
    header = ["method", *[f"needle acc @ {n}" for n in lengths]]
    lines = [
        f"Needle retrieval on the test split ({needle_counts(result)}): exact-match accuracy, **higher is better**, "
        "with its 95% Wilson interval.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name, row in result["methods"].items():
        cells = [name]
        for n in lengths:
            cell = row.get("needle", {}).get(str(n))
            cells.append("cannot run" if cell is None else "{:.2f} [{:.2f}, {:.2f}]".format(*cell["accuracy"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def needle_counts(result: dict[str, Any]) -> str:
    """Needles per cell: one count when every length has as many (the usual case), else one per length."""
    counts: dict[int, int] = {}
    for row in result["methods"].values():
        for n in result["lengths"]:
            cell = row.get("needle", {}).get(str(n))
            counts.setdefault(n, cell["windows"] if cell else 0)
    if len(set(counts.values())) == 1:
        return f"{next(iter(counts.values()), 0)} needles per length"
    return "needles per length: " + ", ".join(f"{n}: {count}" for n, count in counts.items())


def plot_needle_heatmap(result: dict[str, Any], path: Path | None = None):
    """One depth x length panel per method, accuracy as colour and written in each cell (the layout of
    needle-in-a-haystack plots); panel titles in the method's colour of the other plots, the original and target
    lengths named under their columns. Returns the Figure (built without pyplot), saved when given a path."""
    from matplotlib.figure import Figure  # matplotlib: only when drawing

    names, lengths = list(result["methods"]), result["lengths"]
    colours = method_colours(names)
    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    fig = Figure(figsize=(3.6 * columns + 1, 3.0 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False)
    image = None
    for ax, name in zip(axes.flat, names, strict=False):
        grid = accuracy_grid(result["methods"][name], lengths)
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
        _write_cells(ax, grid)
        ax.set_xticks(range(len(lengths)), [length_label(n, result) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(DEPTH_BINS)), [f"{edge:.0%}" for edge in DEPTH_BINS], fontsize=7)
        ax.set_title(name, fontsize=9, color=colours[name], fontweight="bold")
        ax.set_xlabel("context length (tokens)", fontsize=7)
        ax.set_ylabel("needle depth", fontsize=7)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="exact-match accuracy (higher is better)")
    fig.suptitle(f"needle retrieval (trained at {result['original_length']}, target {result['target_length']})")
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def accuracy_grid(row: dict[str, Any], lengths: list[int]) -> np.ndarray:
    """Accuracy per depth bin (rows) and length (columns); NaN where a length has no needles or a bin none."""
    grid = np.full((len(DEPTH_BINS), len(lengths)), np.nan)
    for j, n in enumerate(lengths):
        cell = row.get("needle", {}).get(str(n)) or {}
        for i, edge in enumerate(DEPTH_BINS):
            value = cell.get("accuracy_by_depth", {}).get(f"{edge:g}")
            grid[i, j] = value[0] if value else np.nan
    return grid


def _write_cells(ax, grid: np.ndarray) -> None:
    """Each cell's accuracy as text: colour alone does not tell 0.96 from 1.0."""
    for (i, j), value in np.ndenumerate(grid):
        if np.isfinite(value):
            dark = value < 0.2 or value > 0.8  # RdYlGn's ends are dark, its middle light
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color="white" if dark else "black")


def length_label(length: int, result: dict[str, Any]) -> str:
    names = {result["original_length"]: "original", result["target_length"]: "target"}
    return f"{length}\n({names[length]})" if length in names else str(length)
