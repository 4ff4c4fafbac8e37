"""Search cost: the official GA against racing, racing + steady-state and CMA-ES, side by side in one run.

1. model: on the shipped reference model at the demo's scale (configs/demo.yaml: 128 -> 1024 tokens, population
   32, 20 generations, 8 search windows, 2 CPU workers), over several seeds, each variant is run as
   `longrope search` runs it:
     official_ga    generational, every candidate on every window (the release's search)
     racing         + search.racing (z 2, after 3 windows, then window by window)
     racing_steady  + search.schedule steady
     cmaes          search.optimizer cmaes (same evaluation budget)
   For each: window evaluations (and forward tokens) until the official GA's final search-split NLL of the same seed
   is reached, and their ratio to the GA's whole spend; the best candidate's test-split perplexity (24 windows at
   1024) with a paired 95% interval against the GA's best; wall time. Writes search_cost.json and
   search_cost.png (best search NLL against window evaluations).
2. cluster: 8 Ray workers with fake GPUs score a synthetic objective (no model) whose latency is 20 ms per window,
   jittered uniformly by +-30%; worker utilisation = busy time / (workers x wall), generational vs steady (each
   with and without racing), at the demo's search sizes.

Run: .venv/bin/python bench/search_cost.py [--seeds 0 1 2] [--only model|cluster] [--out bench/results]
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

import numpy as np
import ray
import torch
from rich.console import Console

from longrope.encodings import LongRope, NtkRope, YarnRope
from longrope.search.compare import paired_difference, score_all, window_means
from longrope.search.coordinator import Coordinator, SearchProblem
from longrope.search.genome import Seed
from longrope.search.job_config import JobConfig, load_job_config
from longrope.search.job_context import JobContext
from longrope.search.jobs import run_search
from longrope.search.optimizers import make_optimizer
from longrope.search.run_store import RunDir
from longrope.workers.pool import WorkerPool
from longrope.workers.scorer import CandidateScore
from longrope.workers.specs import ModelSpec, PoolSpec

ROOT = Path(__file__).resolve().parent.parent
GA = ["search.optimizer=dim_mono", "search.schedule=generational"]
VARIANTS = {  # explicit, whatever configs/demo.yaml ships with
    "official_ga": [*GA, "search.racing.enabled=false"],
    "racing": [*GA, "search.racing.enabled=true"],
    "racing_steady": ["search.optimizer=dim_mono", "search.racing.enabled=true", "search.schedule=steady"],
    "cmaes": ["search.optimizer=cmaes", "search.schedule=generational", "search.racing.enabled=false"],
}


# ---- 1. the reference model ----


def history_trajectory(run_dir: Path) -> list[tuple[int, float]]:
    """(window evaluations so far, best fully scored NLL so far) after each history line, in the order written."""
    done: dict[str, int] = {}
    evaluations, best, points = 0, math.inf, []
    for line in (run_dir / "history.jsonl").read_text().splitlines():
        record = json.loads(line)
        evaluations += len(record["nll"]) - done.get(record["key"], 0)
        done[record["key"]] = len(record["nll"])
        if record.get("status", "scored") == "scored" and record["mean_nll"] is not None:
            best = min(best, record["mean_nll"])
        points.append((evaluations, best))
    return points


def evaluations_to_reach(points: list[tuple[int, float]], target: float) -> int | None:
    return next((evaluations for evaluations, best in points if best <= target + 1e-12), None)


def run_variant(name: str, seed: int, work: Path) -> dict:
    out = work / f"{name}-seed{seed}"
    config = load_job_config(ROOT / "configs/demo.yaml", [*VARIANTS[name], f"search.seed={seed}", f"output_dir={out}"])
    started = time.perf_counter()
    best = run_search(config, show_progress=False, console=Console(quiet=True))
    wall = time.perf_counter() - started
    points = history_trajectory(out)
    return {"best": best, "wall_s": wall, "points": points, "evaluations": points[-1][0], "config": config}


def score_on_test_split(context: JobContext, bests: dict[str, dict]) -> dict[str, np.ndarray]:
    """Per-window test NLL (nats per token) of each run's best, all on the same test windows."""
    methods = {
        label: context.longrope(torch.tensor(b["factors"]), attention_factor=b["attention_factor"], n_hat=b["n_hat"])
        for label, b in bests.items()
    }
    data = context.config.data
    scores = score_all(context, methods, data.test_source, context.target_length, data.test_windows)
    return {label: window_means(score) for label, score in scores.items()}


def model_benchmark(seeds: list[int], out_dir: Path) -> dict:
    console = Console()
    runs: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory() as work:
        for seed in seeds:
            for name in VARIANTS:
                console.print(f"model: {name}, seed {seed} ...")
                runs[name, seed] = run_variant(name, seed, Path(work))
                console.print(
                    f"  best search ppl {runs[name, seed]['best']['perplexity']:.4f}, "
                    f"{runs[name, seed]['evaluations']} window evaluations, {runs[name, seed]['wall_s']:.0f} s"
                )
        context = JobContext.resolve(runs["official_ga", seeds[0]]["config"])
        test = score_on_test_split(context, {f"{name}/{seed}": run["best"] for (name, seed), run in runs.items()})
    tokens_per_window = context.target_length
    rows = []
    for seed in seeds:
        ga = runs["official_ga", seed]
        target = ga["best"]["mean_nll"]
        ga_to_reach = evaluations_to_reach(ga["points"], target)
        for name in VARIANTS:
            run = runs[name, seed]
            reach = evaluations_to_reach(run["points"], target)
            mean, low, high = paired_difference(test[f"{name}/{seed}"], test[f"official_ga/{seed}"])
            rows.append(
                {
                    "variant": name,
                    "seed": seed,
                    "search_ppl": run["best"]["perplexity"],
                    "window_evaluations": run["evaluations"],
                    "evaluations_to_ga_final": reach,
                    "forward_tokens_to_ga_final": None if reach is None else reach * tokens_per_window,
                    "ratio_to_ga_spend": None if reach is None else reach / ga["evaluations"],
                    "ratio_to_ga_reach": None if reach is None else reach / ga_to_reach,
                    "test_ppl": math.exp(float(np.mean(test[f"{name}/{seed}"]))),
                    "test_dnll_vs_ga": [mean, low, high],
                    "wall_s": run["wall_s"],
                    "wall_ratio_to_ga": run["wall_s"] / ga["wall_s"],
                }
            )
    plot_trajectories(runs, seeds, out_dir / "search_cost.png")
    return {"rows": rows, "seeds": seeds}


def plot_trajectories(runs: dict, seeds: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(seeds), figsize=(5 * len(seeds), 4), squeeze=False)
    for axis, seed in zip(axes[0], seeds, strict=True):
        for name in VARIANTS:
            points = [(e, b) for e, b in runs[name, seed]["points"] if math.isfinite(b)]
            axis.step([e for e, _ in points], [math.exp(b) for _, b in points], where="post", label=name)
        ga_final = runs["official_ga", seed]["best"]["perplexity"]
        axis.axhline(ga_final, color="grey", linestyle=":", linewidth=1, label="GA final")
        lowest = min(run["best"]["perplexity"] for (_, s), run in runs.items() if s == seed)
        axis.set_ylim(0.99 * lowest, 1.10 * ga_final)  # the end game; generation 0 starts far above
        axis.set(title=f"seed {seed}", xlabel="window evaluations", ylabel="best search perplexity")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def print_model_table(result: dict) -> None:
    console = Console()
    console.print(
        "\n[bold]1. reference model, demo scale[/bold] (ratio: window evaluations until the GA's final "
        "search NLL / the GA's whole spend; 'reach': / the GA's own evaluations to get there)"
    )
    console.print(
        f"{'variant':14s} {'seed':>4s} {'evals':>6s} {'to GA final':>11s} {'ratio':>6s} {'reach':>6s} "
        f"{'test ppl':>8s} {'test dNLL vs GA [95%]':>28s} {'wall s':>7s} {'wall x':>6s}"
    )
    for row in result["rows"]:
        reach = row["evaluations_to_ga_final"]
        mean, low, high = row["test_dnll_vs_ga"]
        console.print(
            f"{row['variant']:14s} {row['seed']:4d} {row['window_evaluations']:6d} "
            f"{reach if reach is not None else 'never':>11} "
            f"{_fmt(row['ratio_to_ga_spend'])} {_fmt(row['ratio_to_ga_reach'])} {row['test_ppl']:8.4f} "
            f"{mean:+9.4f} [{low:+8.4f}, {high:+8.4f}] {row['wall_s']:7.0f} {row['wall_ratio_to_ga']:6.2f}"
        )
    for name in list(VARIANTS)[1:]:
        rows = [r for r in result["rows"] if r["variant"] == name]
        ratios = [r["ratio_to_ga_spend"] for r in rows]
        same_test = all(r["test_dnll_vs_ga"][1] <= 0 for r in rows)  # interval includes 0 or favours us
        worst = "never" if None in ratios else f"{max(ratios):.2f}"
        console.print(
            f"{name}: worst ratio {worst} (target <= 0.6, stretch 0.5) "
            f"-> {'met' if None not in ratios and max(ratios) <= 0.6 else 'missed'} on every seed; "
            f"test perplexity same or better on every seed: {'yes' if same_test else 'no'}"
        )


def _fmt(value: float | None) -> str:
    return f"{value:6.2f}" if value is not None else "  none"


# ---- 2. the simulated cluster ----

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
        for key, method, windows, *_ in batch:  # workers/pool.py Task (key, method, windows, gradient)
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
    coordinator = Coordinator(
        config.search, problem, run_dir, pool, optimizer, console=Console(quiet=True), show_progress=False
    )
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
    console = Console()
    console.print("\n[bold]2. simulated cluster[/bold]: 8 workers (fake GPUs), 20 ms/window +-30%, demo sizes")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", choices=["model", "cluster"])
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    if args.only in (None, "cluster"):
        results["cluster"] = cluster_benchmark(args.seeds)
        print_cluster_table(results["cluster"])
    if args.only in (None, "model"):
        results["model"] = model_benchmark(args.seeds, args.out)
        print_model_table(results["model"])
    (args.out / "search_cost.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
