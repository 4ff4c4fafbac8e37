"""Part 3, the simulated cluster: 8 Ray workers with fake GPUs score the known problem (no model) with a window's
latency, and the workers' utilisation is compared between the schedules, with and without racing."""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import known_problem
import numpy as np
import ray
from rich.console import Console

from longrope.search.config.job_config import JobConfig
from longrope.search.optimizers.factory import make_searcher
from longrope.search.run.coordinator import Coordinator
from longrope.search.run.run_store import RunDir
from longrope.workers.pool import WorkerPool
from longrope.workers.scorer import CandidateScore
from longrope.workers.specs import ModelSpec, PoolSpec
from search_cost_parts.variants import WIDTH

LATENCY_PER_WINDOW_S = 0.02
JITTER = 0.3
SIM_WINDOWS = 8  # the known problem (bench/known_problem.py) on 8 windows of different difficulty


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
            nll = tuple(known_problem.window_nll(factors, j, SIM_WINDOWS) for j in range(start, stop))
            results.append((key, CandidateScore(nll=nll, tokens=(1,) * len(nll))))
        return results


def simulate(schedule: str, racing: bool, seed: int, work: Path) -> dict:
    config = JobConfig.model_validate(
        {
            "target_length": known_problem.TARGET,
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
    problem = known_problem.problem(SIM_WINDOWS)
    optimizer = make_searcher(config.search, pairs=problem.pairs, scale=problem.scale, seeds=problem.seeds)
    coordinator = Coordinator(config.search, problem, run_dir, pool, optimizer)
    workers = len(pool.workers)
    try:
        started = time.perf_counter()
        best = coordinator.run()
        wall = time.perf_counter() - started
        busy = sum(ray.get([w.actor.busy.remote() for w in pool.workers]))
    finally:
        pool.shutdown()
    return {"utilisation": busy / (workers * wall), "wall_s": wall, "best_nll": best.mean_nll}


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
