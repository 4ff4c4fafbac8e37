"""The figures: the model part's best search perplexity against window-equivalents, 16x's trajectories and test
perplexities, and both redrawn from the saved JSON (`--replot`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from search_cost_parts.variants import BUDGETS, LENGTH_16X, MODEL_TITLE, REFERENCE, TARGET_16X

Trajectory = list[tuple[float, float]]  # (window-equivalents so far, best search NLL so far), one per history line


def best_at(trajectory: Trajectory, cost: float) -> float:
    """The best search perplexity a run had within `cost` window-equivalents (nan before its first score)."""
    within = [best for spent, best in trajectory if spent <= cost and math.isfinite(best)]
    return math.exp(within[-1]) if within else math.nan


def plot_trajectories(
    trajectories: dict[tuple[str, int], Trajectory],
    variants: list[str],
    seeds: list[int],
    path: Path,
    title: str,
    c: float,
) -> None:
    """One panel per seed (the end game: generation 0 starts far above) and one of the median over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 3
    rows = math.ceil((len(seeds) + 1) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.9 * rows), squeeze=False)
    colours = dict(zip(variants, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    panels = [*seeds, "median"]
    for axis, seed in zip(axes.flat, panels, strict=False):
        keys = [(name, s) for name in variants for s in seeds] if seed == "median" else [(n, seed) for n in variants]
        for name in variants:
            if seed == "median":
                # up to this variant's largest spend; a run that ended sooner keeps its final best
                grid = np.linspace(0.0, max(trajectories[name, s][-1][0] for s in seeds), 600)
                curves = [[best_at(trajectories[name, s], x) for x in grid] for s in seeds]
                curve = np.median(np.asarray(curves), axis=0)  # nan until every seed has a score
                axis.plot(grid, curve, color=colours[name], label=name)
            else:
                points = [(e, b) for e, b in trajectories[name, seed] if math.isfinite(b)]
                axis.step(
                    [e for e, _ in points],
                    [math.exp(b) for _, b in points],
                    where="post",
                    color=colours[name],
                    label=name,
                )
        ga = [trajectories[REFERENCE, s] for s in (seeds if seed == "median" else [seed])]
        ga_final = float(np.median([math.exp(t[-1][1]) for t in ga]))
        ga_cost = float(np.median([t[-1][0] for t in ga]))
        axis.axhline(ga_final, color="grey", linestyle=":", linewidth=1, label="GA final")
        for fraction in BUDGETS:
            axis.axvline(fraction * ga_cost, color="grey", linestyle="--", linewidth=0.8)
        finals = [math.exp(trajectories[key][-1][1]) for key in keys]
        axis.set_ylim(0.99 * min(finals), max(1.10 * ga_final, 1.05 * max(finals)))
        label = "median over seeds" if seed == "median" else f"seed {seed}"
        axis.set(title=label, xlabel="window-equivalents", ylabel="best search perplexity")
        axis.legend(fontsize=8)
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    figure.suptitle(
        f"{title}: best search perplexity against window-equivalents (forward + {c:.2f} x backward windows); "
        "dashed: 0.5x and 1x the GA's spend"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def plot_16x(trajectories, variants, seeds, methods, best_baseline, path: Path, c: float) -> None:
    """Left: every run's best search perplexity against window-equivalents; right: every method's test perplexity
    at 2048 with its interval, the best baseline and the 0.6x target marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [1, 1.3]})
    colours = dict(zip(variants, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for (name, seed), trajectory in trajectories.items():
        points = [(e, b) for e, b in trajectory if math.isfinite(b)]
        left.step(
            [e for e, _ in points],
            [math.exp(b) for _, b in points],
            where="post",
            color=colours[name],
            alpha=0.8,
            label=name if seed == seeds[0] else None,
        )
    finals = [math.exp(t[-1][1]) for t in trajectories.values()]
    left.set_ylim(0.97 * min(finals), 1.4 * max(finals))  # the end game: generation 0 starts far above
    left.set(
        title=f"16x (128 -> {LENGTH_16X}): best search perplexity, every seed",
        xlabel=f"window-equivalents (forward + {c:.2f} x backward)",
        ylabel="best search perplexity",
    )
    left.legend(fontsize=8)
    names = list(methods)
    ppl = np.array([methods[n]["test_ppl"] for n in names])
    right.bar(
        range(len(names)),
        ppl[:, 0],
        color=["tab:grey" if methods[n]["kind"] == "baseline" else colours[n.split("/")[0]] for n in names],
    )
    right.errorbar(
        range(len(names)),
        ppl[:, 0],
        yerr=[ppl[:, 0] - ppl[:, 1], ppl[:, 2] - ppl[:, 0]],
        fmt="none",
        ecolor="black",
        capsize=2,
        linewidth=0.8,
    )
    best = methods[best_baseline]["test_ppl"][0]
    right.axhline(best, color="black", linestyle=":", linewidth=1, label=f"best baseline ({best_baseline})")
    right.axhline(TARGET_16X * best, color="tab:red", linestyle="--", linewidth=1, label="0.6x best baseline")
    right.set_yscale("log")
    right.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
    right.set(title=f"test perplexity at {LENGTH_16X} (24 windows, 95% intervals)", ylabel="perplexity")
    right.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def replot(out: Path, stem: str) -> None:
    """The plots again from the saved results (trajectories are saved with them), without running anything."""
    model_file, big_file = out / f"{stem}.json", out / f"{stem}_16x.json"
    if model_file.exists():
        model = json.loads(model_file.read_text())["model"]
        trajectories = {(r["variant"], r["seed"]): r["trajectory"] for r in model["rows"]}
        plot_trajectories(trajectories, model["variants"], model["seeds"], out / f"{stem}.png", MODEL_TITLE, model["c"])
    if big_file.exists():
        big = json.loads(big_file.read_text())["x16"]
        trajectories = {(k.split("/")[0], int(k.split("/")[1])): t for k, t in big["trajectories"].items()}
        if trajectories:
            path = out / f"{stem}_16x.png"
            plot_16x(trajectories, big["variants"], big["seeds"], big["methods"], big["best_baseline"], path, big["c"])
