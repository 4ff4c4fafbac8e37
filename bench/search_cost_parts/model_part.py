"""Part 1, the model: every variant on the shipped reference model at the demo's scale, per seed; each run's cost
to the GA's final search NLL, the test perplexity of its best (final, and within 0.5x / 1x the GA's spend) paired
against the GA's, and the issue's targets A and B."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

from longrope.search.job.job_context import JobContext
from longrope.search.reports.compare_scoring import score_all, window_means
from longrope.search.reports.intervals import paired_difference
from search_cost_parts.plots import plot_trajectories
from search_cost_parts.variants import (
    BUDGETS,
    MODEL_TITLE,
    REFERENCE,
    TARGET_A,
    TARGET_B,
    WIDTH,
    best_within,
    cost_to_reach,
    run_all,
)


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
