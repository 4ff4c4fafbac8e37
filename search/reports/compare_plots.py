"""compare's plots: test perplexity against context length, and the per-pair factors at the target length."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from longrope.search.reports.compare_result import CompareResult, is_given
from longrope.search.reports.compare_tables import window_counts
from longrope.search.reports.plot_axes import log_axis, method_colours, save_figure

PPL_BAND = 3.0  # the perplexity plot shows every point within this factor of the best method at its length
DODGE_OCTAVES = 0.012  # methods' points at one length sit this far apart, so their error bars do not overlap


def perplexity_band(result: CompareResult) -> tuple[float, float]:
    """(bottom, top) of the perplexity plot: every point within PPL_BAND x the best method at its length, with
    its interval."""
    bottoms, tops = [], []
    for n in result["lengths"]:
        cells = [row["perplexity"][str(n)] for row in result["methods"].values()]
        cells = [cell for cell in cells if math.isfinite(cell[0])]
        if not cells:
            continue
        best = min(cell[0] for cell in cells)
        for ppl, low, high in cells:
            if ppl <= PPL_BAND * best:
                bottoms.append(low if math.isfinite(low) and low > 0 else ppl)
                tops.append(high if math.isfinite(high) else ppl)
    if not tops:
        return 1.0, 10.0
    return min(bottoms) / 1.04, max(tops) * 1.04


def plot_perplexity(result: CompareResult, path: Path | None = None):
    """Test perplexity against context length, log-log, one colour per method ((vLLM) twins dashed in the same
    colour, given factors thicker), 95% intervals as error bars (methods nudged apart along x so that their bars do
    not hide each other), the original and target lengths as dotted lines named on the x axis.

    The y range is clipped to the band that holds every point within PPL_BAND x the best method at its length
    (`perplexity_band`): one method far off (PI at ~30 where the rest sit at 3-6) would otherwise squash the band
    where the methods differ into a sliver. A point above it is drawn as a triangle on the top edge in its
    method's colour with its value written beside it; compare.md has every number. One axis (not a broken or
    second one) keeps every drawn point comparable at a glance."""
    from matplotlib.figure import Figure  # matplotlib: only when drawing

    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.add_subplot()
    lengths, names = result["lengths"], list(result["methods"])
    colours = method_colours(names)
    bottom, top = perplexity_band(result)
    off_scale: dict[int, list] = {n: [] for n in lengths}
    for k, name in enumerate(names):
        row = result["methods"][name]
        ppl, low, high = (np.array([row["perplexity"][str(n)][i] for n in lengths], dtype=float) for i in range(3))
        shown = np.where(np.isfinite(ppl) & (ppl <= top), ppl, np.nan)
        x = np.asarray(lengths, dtype=float) * 2.0 ** ((k - (len(names) - 1) / 2) * DODGE_OCTAVES)
        bars = ax.errorbar(
            x,
            shown,
            yerr=_error_bars(shown, low, high),
            color=colours[name],
            linestyle="--" if row.get("runtime") == "vllm" else "-",
            linewidth=2.4 if is_given(name) else 1.3,
            marker="o",
            markersize=4,
            capsize=3,
            elinewidth=1,
            label=name,
        )
        bars.lines[0].set_gid(name)
        for n, xi, value in zip(lengths, x, ppl, strict=True):
            if not value <= top:
                off_scale[n].append((value, name, xi))
    _mark_off_scale(ax, off_scale, top, colours, last=lengths[-1])
    ax.set_xscale("log")
    ax.set_yscale("log")
    span = [*lengths, result["original_length"], result["target_length"]]
    ax.set_xlim(min(span) / 1.25, max(span) * 1.25)
    ax.set_ylim(bottom, top)
    _mark_lengths(ax, lengths, result["original_length"], result["target_length"])
    log_axis(ax.yaxis, bottom, top)
    ax.set_xlabel("context length (tokens, log scale)")
    ax.set_ylabel("test perplexity (log scale; lower is better)")
    ax.set_title(
        "perplexity = exp(mean NLL per token) vs length; bars: 95% intervals over windows; "
        f"▲: above {top:.3g}, value written",
        fontsize=10,
    )
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="method")
    return save_figure(fig, path)


def _error_bars(shown: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """[below, above] for errorbar; an infinite bound (one window) draws no bar rather than an infinite one."""
    below = np.where(np.isfinite(low), shown - low, 0.0)
    above = np.where(np.isfinite(high), high - shown, 0.0)
    return np.vstack([np.clip(below, 0, None), np.clip(above, 0, None)])


def _mark_off_scale(ax, off_scale: dict[int, list], top: float, colours: dict[str, str], *, last: int) -> None:
    """A triangle on the top edge per point above the band, its method and value beside it, stacked per length
    (the highest first); at the last length the text goes left, into the plot."""
    for n, points in off_scale.items():
        for rank, (value, name, x) in enumerate(sorted(points, key=lambda p: -p[0] if math.isfinite(p[0]) else -1e300)):
            ax.plot([x], [top], marker="^", markersize=8, color=colours[name], linestyle="none", clip_on=False)
            ax.annotate(
                f"{name} {value:.1f}",
                xy=(x, top),
                xytext=(-7 if n == last else 7, -9 - 10 * rank),
                textcoords="offset points",
                ha="right" if n == last else "left",
                va="center",
                fontsize=7,
                color=colours[name],
                gid=f"off-scale:{name}@{n}",
            )


def _mark_lengths(ax, lengths: list[int], original: int, target: int) -> None:
    """Dotted vertical lines at the original (trained) and target lengths, named in their tick labels (always
    ticked, also when --lengths leaves them out); the other ticks are the lengths scored."""
    from matplotlib.ticker import NullLocator  # matplotlib: only when drawing

    names = {original: "original", target: "target"}
    for length, word in names.items():
        ax.axvline(length, color="0.35", linestyle=":", linewidth=1.2, zorder=0, gid=f"{word}_length")
    ticks = sorted({*lengths, original, target})
    ax.set_xticks(ticks, [f"{n}\n({names[n]})" if n in names else str(n) for n in ticks])
    ax.xaxis.set_minor_locator(NullLocator())


def plot_factors(result: CompareResult, path: Path | None = None):
    """Per-pair factors at the target length, one line per method in its perplexity-plot colour, with its
    attention factor in the legend (the cos/sin scale: the same factors with another attention factor score
    differently). Dotted lines mark the pairs whose wavelength equals the original and the target length (from
    compare.json's `rope`): pairs left of the first complete many turns within the trained length, pairs right of
    the second never complete one within the target. Unscaled (all ones) and Dynamic NTK (factors that depend on
    the length) are left out; a (vLLM) row has its method's factors."""
    from matplotlib.figure import Figure  # matplotlib: only when drawing

    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.add_subplot()
    colours = method_colours(result["methods"])
    values: list[float] = []
    for name, row in result["methods"].items():
        if name in ("none", "dynamic") or row.get("runtime") == "vllm":
            continue
        ax.plot(
            row["factors"],
            color=colours[name],
            linewidth=2.4 if is_given(name) else 1.3,
            marker=".",
            label=f"{name} (attn {row['attention_factor']:.3f})",
            gid=name,
        )
        values += [v for v in row["factors"] if math.isfinite(v) and v > 0]
    _mark_wavelengths(ax, result)
    ax.set_yscale("log")
    low, high = (min(values), max(values)) if values else (1.0, 2.0)
    ax.set_ylim(low / 1.1, high * 1.1)
    log_axis(ax.yaxis, low / 1.1, high * 1.1)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("rotary pair index i (high frequency -> low)")
    ax.set_ylabel("factor λ_i (inv_freq divisor, log scale)")
    ax.set_title(factors_title(result), fontsize=10)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="method (attention factor)")
    return save_figure(fig, path)


def factors_title(result: CompareResult) -> str:
    """The factors plot's title: the job's target length, and each other length a given row was searched for
    (its label ends in @LENGTH, see `given_methods`), so no line reads as factors for the target it is not."""
    target = result["target_length"]
    others = sorted({row.get("factors_target_length", target) for row in result["methods"].values()} - {target})
    title = f"per-pair factors at the target length, {target} tokens"
    return title + "".join(f"; @{n}: searched for {n} tokens, applied as they are" for n in others)


def _mark_wavelengths(ax, result: CompareResult) -> None:
    """Pair i has wavelength 2π θ^(i/pairs): a dotted line where it equals the original and the target length."""
    rope = result.get("rope")
    if not rope:
        return
    pairs, theta = rope["pairs"], rope["rope_theta"]
    for length, word in ((result["original_length"], "original"), (result["target_length"], "target")):
        index = pairs * math.log(length / (2 * math.pi)) / math.log(theta)
        if 0 <= index <= pairs - 1:
            ax.axvline(index, color="0.35", linestyle=":", linewidth=1.2, zorder=0, gid=f"{word}_length")
            ax.text(
                index,
                0.98,
                f" wavelength = {word} length ({length})",
                transform=ax.get_xaxis_transform(),
                rotation=90,
                ha="right",
                va="top",
                fontsize=8,
                color="0.25",
            )


DIFFERENCE_SPAN = 0.5  # nats/token: the paired-difference plot's x range reaches at most this far right of 0


def plot_paired_difference(result: CompareResult, path: Path | None = None):
    """Each method's mean paired difference in NLL per token to the best baseline at the target, with its 95%
    interval, one row per method (their order in the result, best baseline included at 0); the top axis reads the
    same positions as a perplexity ratio, exp(difference).

    Why a plot of its own: the perplexity plot's bars are intervals over windows, whose window-to-window spread
    (a factor of 2 between documents) hides differences of 1-3% that the paired intervals, on the same windows,
    resolve. A row beyond DIFFERENCE_SPAN (no scaling, PI at 4x: +2 to +5) is drawn as a triangle on the right
    edge with its value written, so the rows that compete keep the width."""
    from matplotlib.figure import Figure  # matplotlib: only when drawing

    target = result["target_length"]
    rows = {
        name: row["paired_difference_to_best_baseline"]
        for name, row in result["methods"].items()
        if row.get("paired_difference_to_best_baseline") is not None
    }
    names = list(rows)
    colours = method_colours(names)
    finite = [bound for cell in rows.values() for bound in cell if math.isfinite(bound)]
    left = min([0.0, *finite]) - 0.01
    right = min(max([0.0, *finite]) + 0.01, DIFFERENCE_SPAN)
    fig = Figure(figsize=(9, 0.42 * len(names) + 1.6), layout="constrained")
    ax = fig.add_subplot()
    for y, name in enumerate(names):
        mean, low, high = rows[name]
        if mean > right:
            ax.plot([right], [y], marker=">", color=colours[name], gid=name, clip_on=False)
            ax.annotate(f"{mean:+.3f}", (right, y), xytext=(-6, 0), textcoords="offset points", ha="right", va="center")
            continue
        bars = ax.errorbar(
            [mean],
            [y],
            xerr=_error_bars(np.array([mean]), np.array([low]), np.array([high])),
            fmt="o",
            color=colours[name],
            capsize=3,
            label=name,
        )
        bars.lines[0].set_gid(name)
    ax.axvline(0.0, color="0.35", linestyle=":", linewidth=1.2, zorder=0)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(left, right)
    ax.set_xlabel(f"mean paired difference in NLL per token to {result['best_baseline']} (nats/token; lower is better)")
    ratio = ax.secondary_xaxis("top", functions=(np.exp, lambda r: np.log(np.clip(r, 1e-300, None))))
    ratio.set_xlabel("perplexity ratio to the best baseline, exp(difference)")
    fig.suptitle(
        f"at {target} tokens, {window_counts(result).get(str(target), 'no')} test windows; bars: paired 95% intervals",
        fontsize=10,
    )
    ax.grid(True, axis="x", alpha=0.3)
    return save_figure(fig, path)
