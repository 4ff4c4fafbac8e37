"""What the model and 16x parts compare and hold it to: the variants and their reference (the official GA), the
budgets and targets, and running a variant as `longrope search` runs it, with its cost read back from history.jsonl.
"""

from __future__ import annotations

import time
from pathlib import Path

from benchlib import CostPoint, cost_trajectory
from rich.console import Console

from longrope.search.job.jobs import run_search
from longrope.search.optimizers.factory import load_job_config

ROOT = Path(__file__).resolve().parents[2]
GA = ["search.optimizer=dim_mono", "search.schedule=generational"]
VARIANTS = {  # explicit, whatever configs/demo.yaml ships with
    "official_ga": [*GA, "search.racing.enabled=false"],
    "gradient": ["search.optimizer=gradient", "search.schedule=generational", "search.racing.enabled=false"],
    "hybrid": ["search.optimizer=hybrid", "search.schedule=generational", "search.racing.enabled=false"],
    # the memetic variant: the GA's best polished every 5 generations (and its final best), adopted as a child
    "hybrid_every_5": [
        "search.optimizer=hybrid",
        "search.schedule=generational",
        "search.racing.enabled=false",
        "search.gradient.polish_every=5",
    ],
    "racing": [*GA, "search.racing.enabled=true"],
    "racing_steady": ["search.optimizer=dim_mono", "search.racing.enabled=true", "search.schedule=steady"],
    "cmaes": [  # at the GA's budget, as the comparison is made
        "search.optimizer=cmaes",
        "search.cmaes.sizing=ga",
        "search.schedule=generational",
        "search.racing.enabled=false",
    ],
    # search.surrogate at its shipped defaults: half the children scored, each picked from 8 x as many bred
    "surrogate": [*GA, "search.racing.enabled=false", "search.surrogate.enabled=true"],
    # the hybrid's polish by Adam (its steps kept whatever they score), for comparison
    "hybrid_adam": [
        "search.optimizer=hybrid",
        "search.schedule=generational",
        "search.racing.enabled=false",
        "search.gradient.polish_method=adam",
    ],
}
DEFAULT_VARIANTS = ("official_ga", "surrogate", "gradient", "hybrid")
REFERENCE = "official_ga"
MODEL_TITLE = "demo scale, 128 -> 1024"
LENGTH_16X = 2048
BUDGETS = (0.5, 1.0)  # fractions of the GA's whole window-equivalents at which a run's best so far is tested
TARGET_A = (0.5, 1.01)  # within 1% of the GA's test perplexity at <= 0.5x its window-equivalents
TARGET_B = (1.0, 0.97)  # <= 0.97x the GA's test perplexity at equal cost
TARGET_16X = 0.6  # <= 0.6x the best baseline's test perplexity at 16x
WIDTH = 170  # the tables' console width (rich would wrap them at 80 columns in a log file)


# ---- a run's cost, from its history.jsonl ----


def cost_to_reach(points: list[CostPoint], target: float) -> float | None:
    return next((point.cost for point in points if point.best_nll <= target + 1e-12), None)


def best_within(points: list[CostPoint], budget: float) -> dict | None:
    """The run's best record among the lines written within `budget` window-equivalents."""
    within = [point for point in points if point.cost <= budget + 1e-9]
    return within[-1].best if within else None


# ---- running the variants ----


def run_variant(name: str, seed: int, work: Path, extra: list[str], c: float) -> dict:
    out = work / f"{name}-seed{seed}"
    overrides = [*VARIANTS[name], *extra, f"search.seed={seed}", f"output_dir={out}"]
    config = load_job_config(ROOT / "configs/demo.yaml", overrides)
    started = time.perf_counter()
    best = run_search(config)
    wall = time.perf_counter() - started
    points = cost_trajectory(out, c)
    return {"best": best, "wall_s": wall, "points": points, "config": config, "overrides": overrides}


def run_all(variants: list[str], seeds: list[int], work: Path, extra: list[str], c: float, tag: str) -> dict:
    """Every variant on every seed; the order of variants rotates by one per seed (load drift spread alike)."""
    console = Console(width=WIDTH)
    runs: dict[tuple[str, int], dict] = {}
    for index, seed in enumerate(seeds):
        shift = index % len(variants)
        for name in variants[shift:] + variants[:shift]:
            console.print(f"{tag}: {name}, seed {seed} ...")
            run = runs[name, seed] = run_variant(name, seed, work, extra, c)
            last = run["points"][-1]
            console.print(
                f"  best search ppl {run['best']['perplexity']:.4f}, {last.forward} forward + {last.backward} "
                f"backward windows = {last.cost:.0f} window-equivalents, {run['wall_s']:.0f} s"
            )
    return runs
