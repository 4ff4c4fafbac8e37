"""Search cost: the official GA against gradient descent and the hybrid (issue 20), side by side in one run.

0. backward cost c, measured first on this CPU: the project's Scorer on the reference model, at each length used,
   one torch thread (what each demo worker gets), alternating rounds of `Scorer.score` (the demo's 4 candidates per
   forward, as the GA's workers score) and `Scorer.score_with_gradient` (one candidate on a worker's share of a
   descent step's gradient windows, as the coordinator sends it). A window with a backward pass costs 1 + c
   window-equivalents (1 = one window's forward): c = (gradient seconds per window) / (forward seconds per window) - 1,
   the median of the rounds' ratios. Every cost below counts forward windows + c x backward windows.
1. model: the shipped reference model at the demo's scale (configs/demo.yaml: 128 -> 1024 tokens, population 32,
   20 generations, 8 search windows, 2 CPU workers), per seed, each variant run as `longrope search` runs it, with its
   shipped settings (nothing tuned per seed):
     official_ga    search.optimizer dim_mono, generational, no racing (the release's search: the reference)
     gradient       search.optimizer gradient (search.gradient.*: 60 steps, lr 0.15, 2 held-out windows, patience 10)
     hybrid         search.optimizer hybrid (the GA untouched, then its final best polished by 10 steps at lr 0.05)
     hybrid_every_5 the hybrid polishing the GA's best every 5 generations too, each result adopted as a child
   and, with --variants, the earlier ones (racing, racing_steady, cmaes; their results are in
   bench/results/search_cost_ga_variants.json). The variants run in a rotated order per seed, so the machine's load
   drifts over all of them alike. Per run: window-equivalents until the GA's final search NLL of the same seed
   (or "not reached"); the test perplexity (24 windows at 1024) of the run's best, and of the best it had found
   within 0.5x and within 1x the GA's whole window-equivalents, each with a paired 95% interval against the GA's
   best; wall time. Targets per seed (issue 20): A, test perplexity within 1% of the GA's at <= 0.5x its
   window-equivalents; B, <= 0.97x the GA's at equal cost. Writes search_cost.json and search_cost.png.
2. 16x: the reference model (trained at 128 tokens) read at 2048 (`target_length=2048`, nothing else changed: the
   search split has 32 documents of at least 2049 bytes for the 8 search windows, the test split 112 for the 24 test
   windows). Every closed form at its nominal setting (none, pi, ntk, dynamic, yarn, llama3); NTK tuned on the search
   split over compare's grid (`ntk_tuned`: scale x 0.5..4, attention factor 1.0..1.3) and over a wider grid
   (`ntk_tuned_wide`: scale x 0.5..16, attention factor 1.0..1.6, the GA's own range); YaRN with its factor and
   attention factor (temperature) tuned the same way (`yarn_tuned`, wide grid); then the GA's, gradient's and
   hybrid's bests per seed. Test perplexity at 2048 (24 windows), paired interval and ratio to the best baseline
   (tuned included); target: <= 0.6x. Writes search_cost_16x.json and search_cost_16x.png.
3. cluster (only with --parts cluster): 8 Ray workers with fake GPUs score a synthetic objective (no model) whose
   latency is 20 ms per window, jittered uniformly by +-30%; worker utilisation = busy time / (workers x wall),
   generational vs steady (each with and without racing), at the demo's search sizes.

Run: .venv/bin/python bench/search_cost.py --seeds 0 1 2 3 4 [--seeds-16x 0 1 2] [--parts model 16x]
     [--variants official_ga gradient hybrid] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from benchlib import CostPoint, cost_trajectory, provenance
from rich.console import Console

from longrope.encodings import LongRope, NtkRope, YarnRope
from longrope.search.config.job_config import JobConfig
from longrope.search.config.loading import load_job_config
from longrope.search.cost.cpu_rates import torch_threads
from longrope.search.optimizers.factory import make_optimizer
from longrope.search.optimizers.genome import Seed
from longrope.search.reports.compare_scoring import score_all, window_means
from longrope.search.reports.intervals import interval, paired_difference
from longrope.search.reports.ntk_tuning import NTK_SCALE_MULTIPLIERS, ntk_grid
from longrope.search.run.coordinator import Coordinator, SearchProblem
from longrope.search.run.job_context import JobContext
from longrope.search.run.jobs import run_search
from longrope.search.run.run_store import RunDir
from longrope.workers.models import load_model
from longrope.workers.pool import WorkerPool
from longrope.workers.scorer import CandidateScore, Scorer
from longrope.workers.specs import ModelSpec, PoolSpec

ROOT = Path(__file__).resolve().parent.parent
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
    "cmaes": ["search.optimizer=cmaes", "search.schedule=generational", "search.racing.enabled=false"],
}
DEFAULT_VARIANTS = ("official_ga", "gradient", "hybrid", "hybrid_every_5")
REFERENCE = "official_ga"
MODEL_TITLE = "demo scale, 128 -> 1024"
LENGTH_16X = 2048
BUDGETS = (0.5, 1.0)  # fractions of the GA's whole window-equivalents at which a run's best so far is tested
TARGET_A = (0.5, 1.01)  # within 1% of the GA's test perplexity at <= 0.5x its window-equivalents
TARGET_B = (1.0, 0.97)  # <= 0.97x the GA's test perplexity at equal cost
TARGET_16X = 0.6  # <= 0.6x the best baseline's test perplexity at 16x
WIDE_ATTENTION_FACTORS = tuple(round(1.0 + 0.05 * k, 2) for k in range(13))  # 1.0 .. 1.6, the GA's searched range
# compare's NTK optimum at 16x sits on its x4 edge, a first wide grid's on x8; a probe (x8..x64) found x12
WIDE_SCALE_MULTIPLIERS = (*NTK_SCALE_MULTIPLIERS, 6.0, 8.0, 12.0, 16.0)
WIDTH = 170  # the tables' console width (rich would wrap them at 80 columns in a log file)


# ---- 0. what a backward pass costs ----


def backward_cost(length: int, rounds: int, work: Path) -> dict[str, Any]:
    """c at `length`: seconds per window of a gradient task over seconds per window of the GA's forward, minus 1.

    Both sides run in the same process, on the same windows, one torch thread (a demo worker's), alternating, so
    the machine's load hits both alike; the median of the per-round ratios is c. A single-candidate forward on
    the same windows (how descent scores its held-out windows) is timed too, to show that the unit does not depend
    on which forward defines it."""
    config = load_job_config(ROOT / "configs/demo.yaml", [f"target_length={length}", f"output_dir={work}"])
    context = JobContext.resolve(config)
    windows = context.windows(config.data.search_source, length, config.data.search_windows)
    spec = context.model_spec()
    model, rope = load_model(
        context.model_dir, device="cpu", dtype=spec.dtype, attn_implementation=spec.attn_implementation
    )
    scorer = Scorer(
        model,
        torch.from_numpy(windows.tokens),
        rope.method.original_inv_freq(),
        candidates_per_forward=spec.candidates_per_forward,
        tokens_per_forward=spec.tokens_per_forward,
        loss_chunk_tokens=spec.loss_chunk_tokens,
    )
    gradient_windows = config.data.search_windows - config.search.gradient.holdout_windows
    share = math.ceil(gradient_windows / config.workers.num_workers)  # one chunk per worker (_point_ranges)
    span = (0, share)
    yarn = next(seed for seed in context.seeds() if seed.name == "yarn")
    candidates = [context.longrope(torch.tensor(yarn.factors), attention_factor=a) for a in (1.10, 1.15, 1.20, 1.25)][
        : spec.candidates_per_forward
    ]
    timings: dict[str, list[float]] = {"forward_batched": [], "forward_one": [], "gradient": []}

    def timed(run, windows_scored: int) -> float:
        start = time.perf_counter()
        run()
        return (time.perf_counter() - start) / windows_scored

    with torch_threads(1):
        scorer.score(candidates, span)  # warm-up: the allocator's pools, the first autograd graph
        scorer.score_with_gradient(candidates[0], span)
        for _ in range(rounds):
            timings["forward_batched"].append(timed(lambda: scorer.score(candidates, span), share * len(candidates)))
            timings["gradient"].append(timed(lambda: scorer.score_with_gradient(candidates[0], span), share))
            timings["forward_one"].append(timed(lambda: scorer.score(candidates[:1], span), share))
    ratios = [g / f for g, f in zip(timings["gradient"], timings["forward_batched"], strict=True)]
    ratios_one = [g / f for g, f in zip(timings["gradient"], timings["forward_one"], strict=True)]
    return {
        "length": length,
        "c": statistics.median(ratios) - 1.0,
        "c_vs_single_candidate_forward": statistics.median(ratios_one) - 1.0,
        "round_ratios": ratios,
        "seconds_per_window": {name: statistics.median(values) for name, values in timings.items()},
        "timings": timings,
        "rounds": rounds,
        "windows_per_task": share,
        "candidates_per_forward": len(candidates),
        "torch_threads": 1,
    }


# ---- trajectories from history.jsonl ----


def evaluations_to_reach(points: list[tuple[int, float]], target: float) -> int | None:
    return next((evaluations for evaluations, best in points if best <= target + 1e-12), None)


def cost_to_reach(points: list[CostPoint], target: float) -> float | None:
    return next((point.cost for point in points if point.best_nll <= target + 1e-12), None)


def best_within(points: list[CostPoint], budget: float) -> dict | None:
    """The run's best record among the lines written within `budget` window-equivalents."""
    within = [point for point in points if point.cost <= budget + 1e-9]
    return within[-1].best if within else None


# ---- 1. the reference model ----


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


def test_nll(context: JobContext, records: dict[str, dict]) -> dict[str, np.ndarray]:
    """Per-window test NLL (nats per token) of each record, all on the same test windows (each distinct
    candidate scored once)."""
    unique = {record["key"]: record for record in records.values()}
    methods = {
        key: context.longrope(torch.tensor(r["factors"]), attention_factor=r["attention_factor"], n_hat=r["n_hat"])
        for key, r in unique.items()
    }
    data = context.config.data
    scores = score_all(context, methods, data.test_source, context.target_length, data.test_windows)
    return {label: window_means(scores[record["key"]]) for label, record in records.items()}


def model_rows(runs: dict, variants: list[str], seeds: list[int], context: JobContext) -> list[dict]:
    """One row per (variant, seed): cost to the GA's final search NLL, test perplexity of the final best and of
    the best within each budget, paired against the GA's best, wall time and the targets' verdicts."""
    records: dict[str, dict] = {}
    budgets: dict[tuple[str, int], dict[float, dict | None]] = {}
    for seed in seeds:
        ga_cost = runs[REFERENCE, seed]["points"][-1].cost
        for name in variants:
            points = runs[name, seed]["points"]
            records[f"{name}/{seed}/final"] = runs[name, seed]["best"]
            budgets[name, seed] = {b: best_within(points, b * ga_cost) for b in BUDGETS}
            for fraction, record in budgets[name, seed].items():
                if record is not None:
                    records[f"{name}/{seed}/{fraction}"] = record
    test = test_nll(context, records)
    rows = []
    for seed in seeds:
        ga, ga_test = runs[REFERENCE, seed], test[f"{REFERENCE}/{seed}/final"]
        ga_points, ga_ppl = ga["points"], math.exp(float(np.mean(ga_test)))
        target = ga["best"]["mean_nll"]
        for name in variants:
            run, points = runs[name, seed], runs[name, seed]["points"]
            reach = cost_to_reach(points, target)
            final = test[f"{name}/{seed}/final"]
            at_budget = {}
            for fraction in BUDGETS:
                label = f"{name}/{seed}/{fraction}"
                if label not in test:
                    at_budget[str(fraction)] = None
                    continue
                ppl = math.exp(float(np.mean(test[label])))
                at_budget[str(fraction)] = {
                    "key": budgets[name, seed][fraction]["key"],
                    "search_ppl": budgets[name, seed][fraction]["perplexity"],
                    "test_ppl": ppl,
                    "test_ppl_ratio_to_ga": ppl / ga_ppl,
                    "test_dnll_vs_ga": list(paired_difference(test[label], ga_test)),
                }
            rows.append(
                {
                    "variant": name,
                    "seed": seed,
                    "search_ppl": run["best"]["perplexity"],
                    "best_key": run["best"]["key"],
                    "forward_windows": points[-1].forward,
                    "backward_windows": points[-1].backward,
                    "window_equivalents": points[-1].cost,
                    "window_equivalents_to_ga_final": reach,
                    "ratio_to_ga_spend": None if reach is None else reach / ga_points[-1].cost,
                    "spend_ratio_to_ga": points[-1].cost / ga_points[-1].cost,
                    "test_ppl": math.exp(float(np.mean(final))),
                    "test_ppl_ratio_to_ga": math.exp(float(np.mean(final))) / ga_ppl,
                    "test_dnll_vs_ga": list(paired_difference(final, ga_test)),
                    "at_ga_budget": at_budget,
                    "target_a_met": _budget_met(at_budget, TARGET_A),
                    "target_b_met": _budget_met(at_budget, TARGET_B),
                    "wall_s": run["wall_s"],
                    "wall_ratio_to_ga": run["wall_s"] / ga["wall_s"],
                    "trajectory": [(round(p.cost, 2), p.best_nll) for p in points],
                }
            )
    return rows


def _budget_met(at_budget: dict, target: tuple[float, float]) -> bool:
    fraction, ratio = target
    cell = at_budget.get(str(fraction))
    return cell is not None and cell["test_ppl_ratio_to_ga"] <= ratio


def verdicts(rows: list[dict], variants: list[str]) -> dict[str, dict]:
    """Per variant: targets A and B on every seed, and whether it wins (A or B) on every seed."""
    result = {}
    for name in variants:
        if name == REFERENCE:
            continue
        mine = [r for r in rows if r["variant"] == name]
        wins = [r["target_a_met"] or r["target_b_met"] for r in mine]
        result[name] = {
            "target_a_every_seed": all(r["target_a_met"] for r in mine),
            "target_b_every_seed": all(r["target_b_met"] for r in mine),
            "wins_every_seed": all(wins),
            "seeds_won": sum(wins),
            "seeds_a": sum(r["target_a_met"] for r in mine),
            "seeds_b": sum(r["target_b_met"] for r in mine),
            "seeds": len(mine),
        }
    return result


def model_benchmark(
    variants: list[str], seeds: list[int], c: float, out_dir: Path, stem: str, settings: list[str]
) -> dict:
    with tempfile.TemporaryDirectory() as work:
        runs = run_all(variants, seeds, Path(work), settings, c, "model")
        context = JobContext.resolve(runs[REFERENCE, seeds[0]]["config"])
        rows = model_rows(runs, variants, seeds, context)
    trajectories = {key: [(p.cost, p.best_nll) for p in run["points"]] for key, run in runs.items()}
    plot_trajectories(trajectories, variants, seeds, out_dir / f"{stem}.png", MODEL_TITLE, c)
    return {
        "rows": rows,
        "seeds": seeds,
        "variants": variants,
        "c": c,
        "verdicts": verdicts(rows, variants),
        "overrides": {f"{name}/{seed}": runs[name, seed]["overrides"][:-1] for name, seed in runs},
    }


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


def print_model_table(result: dict, label: str) -> None:
    console = Console(width=WIDTH)
    console.print(
        f"\n[bold]{label}[/bold] (c = {result['c']:.2f}; WE: window-equivalents = forward + c x backward windows; "
        "'to GA final': WE until the GA's final search NLL, '/GA': over the GA's whole WE)"
    )
    console.print(
        f"{'variant':13s} {'seed':>4s} {'WE':>7s} {'to GA final':>11s} {'/GA':>5s} {'srch ppl':>8s} "
        f"{'test ppl':>8s} {'x GA':>6s} {'test dNLL vs GA [95%]':>29s} {'@0.5x':>6s} {'@1x':>6s} {'wall s':>6s} "
        f"{'A':>2s} {'B':>2s}"
    )
    for row in result["rows"]:
        reach = row["window_equivalents_to_ga_final"]
        mean, low, high = row["test_dnll_vs_ga"]
        cells = [row["at_ga_budget"][str(f)] for f in BUDGETS]
        console.print(
            f"{row['variant']:13s} {row['seed']:4d} {row['window_equivalents']:7.0f} "
            f"{f'{reach:.0f}' if reach is not None else 'not reached':>11} {_fmt(row['ratio_to_ga_spend'])} "
            f"{row['search_ppl']:8.4f} {row['test_ppl']:8.4f} {row['test_ppl_ratio_to_ga']:6.3f} "
            f"{mean:+9.4f} [{low:+8.4f}, {high:+8.4f}] "
            + " ".join(f"{cell['test_ppl_ratio_to_ga']:6.3f}" if cell else "  none" for cell in cells)
            + f" {row['wall_s']:6.0f} {_yes(row, 'target_a_met'):>2s} {_yes(row, 'target_b_met'):>2s}"
        )
    console.print("'@0.5x', '@1x': test ppl / GA's of the run's best within 0.5x / 1x the GA's WE")
    for name, verdict in result["verdicts"].items():
        seeds = verdict["seeds"]
        console.print(
            f"{name}: target A (<= 1.01x the GA's test ppl at <= 0.5x its WE) met on {verdict['seeds_a']}/{seeds} "
            f"seeds, target B (<= 0.97x at equal cost) on {verdict['seeds_b']}/{seeds}; wins (A or B) on "
            f"{verdict['seeds_won']}/{seeds} -> {'wins on every seed' if verdict['wins_every_seed'] else 'missed'}"
        )


def _yes(row: dict, target: str) -> str:
    """y / n for a target; blank for the GA, the reference (it is measured against itself)."""
    return "" if row["variant"] == REFERENCE else "y" if row[target] else "n"


def _fmt(value: float | None) -> str:
    return f"{value:5.2f}" if value is not None else " none"


# ---- 2. 16x: every baseline, tuned ones included, against the searches ----


def baseline_shape(context: JobContext) -> dict[str, Any]:
    return {
        "head_dim": context.method.head_dim,
        "rope_theta": context.method.rope_theta,
        "partial_rotary_factor": context.method.partial_rotary_factor,
        "max_position_embeddings": context.target_length,
    }


def wide_ntk_grid(context: JobContext) -> dict[tuple[float, float], LongRope]:
    """compare's NTK grid widened: the attention factor over the GA's searched range (1.0..1.6), the scale up to 16x
    the nominal (at 16x compare's optimum sits on its x4 edge), since a tuned baseline held at its grid's edge is
    no fair baseline."""
    shape = baseline_shape(context)
    grid = {}
    for multiplier in WIDE_SCALE_MULTIPLIERS:
        factors = NtkRope(factor=context.scale * multiplier, **shape).factors().double()
        for attention in WIDE_ATTENTION_FACTORS:
            grid[(multiplier, attention)] = context.longrope(factors, attention_factor=attention)
    return grid


def yarn_grid(context: JobContext) -> dict[tuple[float, float], YarnRope]:
    """YaRN with its scale (`factor` = scale x multiplier) and temperature (the attention factor, which YaRN sets
    to 0.1 ln(factor) + 1 by default) over the same grid as the wide NTK grid; its ramp (beta_fast 32,
    beta_slow 1) as published."""
    shape = baseline_shape(context)
    return {
        (multiplier, attention): YarnRope(
            factor=context.scale * multiplier,
            original_max_position_embeddings=context.original_length,
            attention_factor=attention,
            **shape,
        )
        for multiplier in WIDE_SCALE_MULTIPLIERS
        for attention in WIDE_ATTENTION_FACTORS
    }


def tune_on_search_split(context: JobContext, grids: dict[str, dict]) -> dict[str, dict]:
    """Each grid's best setting by mean NLL on the search split at the target (the windows the searches use),
    all grids scored by one pool."""
    methods = {f"{name}/{key}": method for name, grid in grids.items() for key, method in grid.items()}
    data = context.config.data
    scores = score_all(context, methods, data.search_source, context.target_length, data.search_windows)
    tuned = {}
    for name, grid in grids.items():
        best = min(grid, key=lambda key: scores[f"{name}/{key}"].mean_nll)
        multiplier, attention = best
        values = sorted({k[0] for k in grid}), sorted({k[1] for k in grid})
        tuned[name] = {
            "method": grid[best],
            "scale_multiplier": multiplier,
            "factor": context.scale * multiplier,
            "attention_factor": attention,
            "search_ppl": scores[f"{name}/{best}"].perplexity,
            "scale_on_grid_edge": multiplier in (values[0][0], values[0][-1]),
            "attention_on_grid_edge": attention in (values[1][0], values[1][-1]),
            "grid": {"scale_multipliers": values[0], "attention_factors": values[1]},
        }
    return tuned


def benchmark_16x(variants: list[str], seeds: list[int], c: float, out_dir: Path, settings: list[str]) -> dict:
    console = Console(width=WIDTH)
    extra = [f"target_length={LENGTH_16X}"]
    with tempfile.TemporaryDirectory() as work:
        runs = run_all(variants, seeds, Path(work), [*extra, *settings], c, "16x") if seeds else {}
        config = load_job_config(ROOT / "configs/demo.yaml", [*extra, f"output_dir={Path(work) / 'baselines'}"])
        context = JobContext.resolve(config)
        console.print("16x: tuning NTK and YaRN on the search split ...")
        started = time.perf_counter()
        tuned = tune_on_search_split(
            context,
            {
                "ntk_tuned": ntk_grid(context),
                "ntk_tuned_wide": wide_ntk_grid(context),
                "yarn_tuned": yarn_grid(context),
            },
        )
        tuning_s = time.perf_counter() - started
        baselines = {**context.baselines(), **{name: t.pop("method") for name, t in tuned.items()}}
        searched = {
            f"{name}/{seed}": context.longrope(
                torch.tensor(run["best"]["factors"]), attention_factor=run["best"]["attention_factor"]
            )
            for (name, seed), run in runs.items()
        }
        console.print("16x: scoring every method on the test split ...")
        data = context.config.data
        scores = score_all(context, {**baselines, **searched}, data.test_source, LENGTH_16X, data.test_windows)
    nll = {name: window_means(score) for name, score in scores.items()}
    best_baseline = min(baselines, key=lambda name: float(np.mean(nll[name])))
    best_ppl = math.exp(float(np.mean(nll[best_baseline])))
    methods = {}
    for name in [*baselines, *searched]:
        mean, low, high = interval(nll[name])
        methods[name] = {
            "kind": "baseline" if name in baselines else "searched",
            "test_ppl": [math.exp(mean), math.exp(low), math.exp(high)],
            "ratio_to_best_baseline": math.exp(mean) / best_ppl,
            "dnll_vs_best_baseline": list(paired_difference(nll[name], nll[best_baseline])),
            "attention_factor": (baselines | searched)[name].attention_factor,
            "factors": (baselines | searched)[name].factors(LENGTH_16X).tolist(),
        }
        if name in searched:
            variant, seed = name.split("/")
            run = runs[variant, int(seed)]
            last = run["points"][-1]
            methods[name] |= {
                "search_ppl": run["best"]["perplexity"],
                "forward_windows": last.forward,
                "backward_windows": last.backward,
                "window_equivalents": last.cost,
                "wall_s": run["wall_s"],
                "target_met": math.exp(mean) / best_ppl <= TARGET_16X,
            }
            ga = runs.get((REFERENCE, int(seed)))
            if ga is not None:
                reach = cost_to_reach(run["points"], ga["best"]["mean_nll"])
                methods[name] |= {
                    "window_equivalents_to_ga_final": reach,
                    "ratio_to_ga_spend": None if reach is None else reach / ga["points"][-1].cost,
                    "dnll_vs_ga": list(paired_difference(nll[name], nll[f"{REFERENCE}/{seed}"])),
                }
    trajectories = {key: [(p.cost, p.best_nll) for p in run["points"]] for key, run in runs.items()}
    if runs:
        plot_16x(trajectories, variants, seeds, methods, best_baseline, out_dir / "search_cost_16x.png", c)
    return {
        "target_length": LENGTH_16X,
        "original_length": context.original_length,
        "scale": context.scale,
        "search_windows": data.search_windows,
        "test_windows": data.test_windows,
        "seeds": seeds,
        "variants": variants,
        "c": c,
        "tuned": tuned,
        "tuning_s": tuning_s,
        "best_baseline": best_baseline,
        "best_baseline_ppl": best_ppl,
        "methods": methods,
        "trajectories": {f"{n}/{s}": [(round(e, 2), b) for e, b in t] for (n, s), t in trajectories.items()},
    }


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


def print_16x_table(result: dict) -> None:
    console = Console(width=WIDTH)
    console.print(
        f"\n[bold]2. 16x[/bold]: reference model read at {LENGTH_16X} ({result['scale']:.0f}x), test ppl on "
        f"{result['test_windows']} windows; best baseline {result['best_baseline']} "
        f"({result['best_baseline_ppl']:.3f}); c = {result['c']:.2f}"
    )
    for name, tuned in result["tuned"].items():
        console.print(
            f"  {name}: factor {tuned['factor']:g} (x{tuned['scale_multiplier']:g}), attention factor "
            f"{tuned['attention_factor']:g}, search ppl {tuned['search_ppl']:.3f}"
            f"{'  (scale on the grid edge)' if tuned['scale_on_grid_edge'] else ''}"
            f"{'  (attention factor on the grid edge)' if tuned['attention_on_grid_edge'] else ''}"
        )
    console.print(f"{'method':18s} {'test ppl [95%]':>26s} {'x best':>7s} {'dNLL vs best [95%]':>29s} {'WE':>7s}")
    for name, row in result["methods"].items():
        ppl, low, high = row["test_ppl"]
        mean, dlow, dhigh = row["dnll_vs_best_baseline"]
        cost = f"{row['window_equivalents']:7.0f}" if "window_equivalents" in row else ""
        console.print(
            f"{name:18s} {ppl:8.3f} [{low:7.3f}, {high:7.3f}] {row['ratio_to_best_baseline']:7.3f} "
            f"{mean:+9.4f} [{dlow:+8.4f}, {dhigh:+8.4f}] {cost}"
        )
    for variant in result["variants"]:
        rows = [r for n, r in result["methods"].items() if n.startswith(f"{variant}/")]
        if rows:
            worst = max(r["ratio_to_best_baseline"] for r in rows)
            console.print(
                f"{variant}: worst ratio to the best baseline {worst:.3f} (target <= {TARGET_16X}) -> "
                f"{'met' if worst <= TARGET_16X else 'missed'} on every seed"
            )


# ---- 3. the simulated cluster ----

LATENCY_PER_WINDOW_S = 0.02
JITTER = 0.3
SIM_HEAD_DIM, SIM_PAIRS, SIM_ORIGINAL, SIM_TARGET, SIM_WINDOWS = 32, 16, 64, 256, 8
SIM_OPTIMUM = 1.0 + 3.6 * np.linspace(0.0, 1.0, SIM_PAIRS) ** 1.5


def synthetic_nll(factors: np.ndarray, window: int) -> float:
    """A known objective on 8 windows of different difficulty (log-distance to SIM_OPTIMUM), with window noise."""
    base = float(np.mean((np.log(factors) - np.log(SIM_OPTIMUM)) ** 2))
    weight = 1.0 + 0.5 * (((window * 0.618) % 1.0) - 0.5)
    return base * weight + 0.1 * window + 0.002 * math.sin(1000.0 * float(np.sum(factors)) + 7.0 * window)


class SyntheticWorker:
    """A scoring actor with ScoringWorker's shape: sleeps LATENCY_PER_WINDOW_S per window (+-JITTER) per task."""

    def __init__(self, spec, windows, loss_mask=None):
        self.busy_s = 0.0
        self.random = random.Random(os.getpid())

    def ready(self) -> dict:
        return {"pid": os.getpid()}

    def busy(self) -> float:
        return self.busy_s

    def score(self, batch):
        results = []
        for key, method, windows, *_ in batch:  # workers/scoring_worker.py Task (key, method, windows, gradient)
            start, stop = windows or (0, SIM_WINDOWS)
            seconds = LATENCY_PER_WINDOW_S * (stop - start) * self.random.uniform(1 - JITTER, 1 + JITTER)
            time.sleep(seconds)
            self.busy_s += seconds
            factors = np.asarray(method.long_factor, dtype=np.float64)
            nll = tuple(synthetic_nll(factors, j) for j in range(start, stop))
            results.append((key, CandidateScore(nll=nll, tokens=(1,) * len(nll))))
        return results


def sim_problem() -> SearchProblem:
    shape = {"head_dim": SIM_HEAD_DIM, "max_position_embeddings": SIM_TARGET}
    seeds = [
        Seed("pi", np.full(SIM_PAIRS, 4.0)),
        Seed("ntk", NtkRope(factor=4.0, **shape).factors().double().numpy()),
        Seed("yarn", YarnRope(factor=4.0, original_max_position_embeddings=SIM_ORIGINAL, **shape).factors().numpy()),
    ]

    def make_candidate(factors, attention_factor=None, n_hat=0):
        return LongRope.from_factors(
            torch.as_tensor(factors),
            head_dim=SIM_HEAD_DIM,
            original_length=SIM_ORIGINAL,
            target_length=SIM_TARGET,
            attention_factor=attention_factor,
            n_hat=n_hat,
        )

    return SearchProblem(SIM_PAIRS, 4.0, seeds, make_candidate, windows=SIM_WINDOWS)


def simulate(schedule: str, racing: bool, seed: int, work: Path) -> dict:
    config = JobConfig.model_validate(
        {
            "target_length": SIM_TARGET,
            "output_dir": str(work / f"{schedule}-{racing}-{seed}"),
            "data": {"search_windows": SIM_WINDOWS},
            "search": {
                "population": 32,
                "parents": 16,
                "mutations": 8,
                "crossovers": 8,
                "generations": 20,
                "seed": seed,
                "schedule": schedule,
                "racing": {"enabled": racing},
            },
        }
    )
    spec = PoolSpec(num_workers=8, num_gpus_per_worker=1, num_cpus_per_worker=0.25, batch_size=1, calls_per_worker=2)
    pool = WorkerPool(ModelSpec(model_dir="synthetic"), np.zeros((SIM_WINDOWS, 2)), spec, worker_class=SyntheticWorker)
    pool.worker_info()  # every actor up before the clock starts
    run_dir = RunDir(config.output_dir)
    run_dir.create(config)
    problem = sim_problem()
    optimizer = make_optimizer(config.search, pairs=problem.pairs, scale=problem.scale, seeds=problem.seeds)
    coordinator = Coordinator(config.search, problem, run_dir, pool, optimizer)
    workers = len(pool.workers)
    try:
        started = time.perf_counter()
        best = coordinator.run()
        wall = time.perf_counter() - started
        busy = sum(ray.get([w.actor.busy.remote() for w in pool.workers]))
    finally:
        pool.shutdown()
    return {"utilisation": busy / (workers * wall), "wall_s": wall, "best_nll": best["mean_nll"]}


def cluster_benchmark(seeds: list[int]) -> dict:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=4, num_gpus=8, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as work:
            for seed in seeds:
                for racing in (False, True):
                    for schedule in ("generational", "steady"):
                        result = simulate(schedule, racing, seed, Path(work))
                        rows.append({"schedule": schedule, "racing": racing, "seed": seed, **result})
    finally:
        ray.shutdown()
    return {"rows": rows}


def print_cluster_table(result: dict) -> None:
    console = Console(width=WIDTH)
    console.print("\n[bold]3. simulated cluster[/bold]: 8 workers (fake GPUs), 20 ms/window +-30%, demo sizes")
    for racing in (False, True):
        utilisation = {}
        for schedule in ("generational", "steady"):
            rows = [r for r in result["rows"] if r["schedule"] == schedule and r["racing"] == racing]
            utilisation[schedule] = statistics.mean(r["utilisation"] for r in rows)
            walls = ", ".join(f"{r['wall_s']:.1f}" for r in rows)
            console.print(
                f"{schedule:12s} racing {'on ' if racing else 'off'}  utilisation "
                f"{utilisation[schedule]:.3f} (min {min(r['utilisation'] for r in rows):.3f})  wall s {walls}"
            )
        console.print(
            f"  steady / generational utilisation: {utilisation['steady'] / utilisation['generational']:.2f}x "
            f"(target: steady >= 0.9 -> {'met' if utilisation['steady'] >= 0.9 else 'missed'})"
        )


# ---- the run ----


def replot(out: Path, stem: str) -> None:
    """The plots again from the saved results (trajectories are saved with them), without running anything."""
    model_file, big_file = out / f"{stem}.json", out / "search_cost_16x.json"
    if model_file.exists():
        model = json.loads(model_file.read_text())["model"]
        trajectories = {(r["variant"], r["seed"]): r["trajectory"] for r in model["rows"]}
        plot_trajectories(trajectories, model["variants"], model["seeds"], out / f"{stem}.png", MODEL_TITLE, model["c"])
    if big_file.exists():
        big = json.loads(big_file.read_text())["x16"]
        trajectories = {(k.split("/")[0], int(k.split("/")[1])): t for k, t in big["trajectories"].items()}
        if trajectories:
            path = out / "search_cost_16x.png"
            plot_16x(trajectories, big["variants"], big["seeds"], big["methods"], big["best_baseline"], path, big["c"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--seeds-16x", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(DEFAULT_VARIANTS))
    parser.add_argument("--parts", nargs="+", choices=["model", "16x", "cluster"], default=["model", "16x"])
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds that measure c")
    parser.add_argument("--stem", default="search_cost", help="the model part's output name (.json, .png)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results")
    parser.add_argument("--replot", action="store_true", help="redraw the plots from the saved JSON, run nothing")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override every search")
    args = parser.parse_args()
    if REFERENCE not in args.variants:
        parser.error(f"--variants: {REFERENCE} is the reference every cost and interval is measured against")
    if args.replot:
        replot(args.out, args.stem)
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console(width=WIDTH)
    meta = provenance()
    costs = {}
    with tempfile.TemporaryDirectory() as work:
        lengths = [1024] * ("model" in args.parts) + [LENGTH_16X] * ("16x" in args.parts)
        for length in lengths:
            costs[length] = backward_cost(length, args.rounds, Path(work) / f"cost-{length}")
            cost = costs[length]
            console.print(
                f"c at {length}: {cost['c']:.3f} "
                f"(vs a one-candidate forward: {cost['c_vs_single_candidate_forward']:.3f}); "
                f"s/window forward {cost['seconds_per_window']['forward_batched']:.4f}, "
                f"forward+backward {cost['seconds_per_window']['gradient']:.4f}"
            )
    if "cluster" in args.parts:
        result = {**meta, "cluster": cluster_benchmark(args.seeds)}
        print_cluster_table(result["cluster"])
        (args.out / f"{args.stem}_cluster.json").write_text(json.dumps(result, indent=1, default=str))
    if "model" in args.parts:
        started = time.perf_counter()
        model = model_benchmark(args.variants, args.seeds, costs[1024]["c"], args.out, args.stem, args.set)
        result = {
            **meta,
            "machine": dict(meta["machine"]),
            "backward_cost": costs[1024],
            "model": model,
            "bench_wall_s": time.perf_counter() - started,
        }
        result["machine"]["load_average_at_end"] = os.getloadavg()
        print_model_table(model, "1. reference model, demo scale (128 -> 1024)")
        (args.out / f"{args.stem}.json").write_text(json.dumps(result, indent=1, default=str))
    if "16x" in args.parts:
        started = time.perf_counter()
        big = benchmark_16x(args.variants, args.seeds_16x, costs[LENGTH_16X]["c"], args.out, args.set)
        result = {
            **meta,
            "machine": dict(meta["machine"]),
            "backward_cost": costs[LENGTH_16X],
            "x16": big,
            "bench_wall_s": time.perf_counter() - started,
        }
        result["machine"]["load_average_at_end"] = os.getloadavg()
        print_16x_table(big)
        (args.out / "search_cost_16x.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
