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

from longrope.search.intervals import interval, wilson_interval
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
    """Markdown: exact-match accuracy (higher is better) per method and length, with 95% Wilson intervals."""
    lengths = result["lengths"]
    header = ["method", *[f"needle acc @ {n}" for n in lengths]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in result["methods"].items():
        cells = [name]
        for n in lengths:
            cell = row.get("needle", {}).get(str(n))
            cells.append("cannot run" if cell is None else "{:.2f} [{:.2f}, {:.2f}]".format(*cell["accuracy"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_needle_heatmap(result: dict[str, Any], path: Path) -> None:
    """One depth x length panel per method, accuracy as colour (the layout of needle-in-a-haystack plots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names, lengths = list(result["methods"]), result["lengths"]
    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(3.6 * columns + 1, 3.0 * rows + 0.6), squeeze=False, layout="constrained"
    )
    image = None
    for ax, name in zip(axes.flat, names, strict=False):
        grid = np.full((len(DEPTH_BINS), len(lengths)), np.nan)
        for j, n in enumerate(lengths):
            cell = result["methods"][name].get("needle", {}).get(str(n)) or {}
            for i, edge in enumerate(DEPTH_BINS):
                value = cell.get("accuracy_by_depth", {}).get(f"{edge:g}")
                grid[i, j] = value[0] if value else np.nan
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(DEPTH_BINS)), [f"{edge:.0%}" for edge in DEPTH_BINS], fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("context length (tokens)", fontsize=7)
        ax.set_ylabel("needle depth", fontsize=7)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="exact-match accuracy")
    fig.suptitle(f"needle retrieval (trained at {result['original_length']}, target {result['target_length']})")
    fig.savefig(path, dpi=110)
    plt.close(fig)
