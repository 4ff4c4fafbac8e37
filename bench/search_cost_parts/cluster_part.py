"""Part 3, the simulated cluster: 8 Ray workers with fake GPUs score the known problem (no model) with a window's
latency, and the workers' utilisation is compared between the schedules, with and without racing; then gradient
descent's (a window with a backward pass sleeping 1 + SIM_C times a forward's), beside what `longrope estimate`
computes for it (search/cost/utilisation.py), on 8 and on 4 search windows."""

from __future__ import annotations

import itertools
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
from longrope.search.cost.utilisation import utilisation
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
SIM_C = 2.0  # a backward window's cost beyond its forward, in the simulation (about c on a GPU: 1.7-3.5)
# descent waits for each step's point: a window's latency must dwarf a generation's fixed cost (Ray's calls, the
# history line's fsync, state.json), as a long window's seconds do on a GPU, or the simulation measures that cost
DESCENT_LATENCY_PER_WINDOW_S = 0.25
DESCENT_WINDOWS = (8, 4)  # descent's search windows (2 held out): a step on 6 or 2 gradient windows over 8 workers


class SyntheticWorker:
    """A scoring actor with ScoringWorker's shape: sleeps LATENCY_PER_WINDOW_S per window (+-JITTER) per task."""

    def __init__(self, spec, windows, loss_mask=None):
        self.busy_s = 0.0
        self.random = random.Random(os.getpid())
        # "synthetic-N-MS-J": N windows, MS ms a window, jittered by +-J
        _, windows, latency_ms, jitter = spec.model_dir.split("-")
        self.windows, self.latency_s, self.jitter = int(windows), float(latency_ms) / 1000, float(jitter)

    def ready(self) -> dict:
        return {"pid": os.getpid()}

    def busy(self) -> float:
        return self.busy_s

    def score(self, batch):
        results = []
        for key, method, windows, *gradient in batch:  # workers/scoring_worker.py Task (key, method, windows, gradient)
            start, stop = windows or (0, self.windows)
            backward = bool(gradient and gradient[0])
            seconds = self.latency_s * (stop - start) * (1 + SIM_C * backward)
            seconds *= self.random.uniform(1 - self.jitter, 1 + self.jitter)
            time.sleep(seconds)
            self.busy_s += seconds
            factors = np.asarray(method.long_factor, dtype=np.float64)
            nll = tuple(known_problem.window_nll(factors, j, self.windows) for j in range(start, stop))
            grads = None
            if backward:
                grads = tuple(
                    tuple(known_problem.window_nll_gradient(factors, j, self.windows)) for j in range(start, stop)
                )
            results.append((key, CandidateScore(nll=nll, tokens=(1,) * len(nll), gradient=grads)))
        return results


def ga_config(schedule: str, racing: bool, seed: int, work: Path) -> JobConfig:
    """The demo's GA sizes on the known problem's 8 windows."""
    ga = {"population": 32, "parents": 16, "mutations": 8, "crossovers": 8, "generations": 20}
    return JobConfig.model_validate(
        {
            "target_length": known_problem.TARGET,
            "output_dir": str(work / f"{schedule}-{racing}-{seed}"),
            "data": {"search_windows": SIM_WINDOWS},
            "workers": {"num_workers": 8},
            "search": {**ga, "seed": seed, "schedule": schedule, "racing": {"enabled": racing}},
        }
    )


def descent_config(windows: int, seed: int, work: Path) -> JobConfig:
    """Descent with its shipped settings (2 held-out windows), 20 steps and no early stop, on `windows` windows."""
    gradient = {"steps": 20, "patience": None}
    return JobConfig.model_validate(
        {
            "target_length": known_problem.TARGET,
            "output_dir": str(work / f"descent-{windows}-{seed}"),
            "data": {"search_windows": windows},
            "workers": {"num_workers": 8},
            "search": {"optimizer": "gradient", "seed": seed, "gradient": gradient, "seeds": ["pi", "ntk", "yarn"]},
        }
    )


def simulate(config: JobConfig, latency_s: float = LATENCY_PER_WINDOW_S, jitter: float = JITTER) -> dict:
    """One search on 8 synthetic workers: the workers' busy share (their own sleeping time over 8 x wall), and the
    pool's own busy clock (what `status` prints) beside it."""
    windows = config.data.search_windows
    spec = PoolSpec(num_workers=8, num_gpus_per_worker=1, num_cpus_per_worker=0.25, batch_size=1, calls_per_worker=2)
    model = ModelSpec(model_dir=f"synthetic-{windows}-{1000 * latency_s:g}-{jitter:g}")
    pool = WorkerPool(model, np.zeros((windows, 2)), spec, worker_class=SyntheticWorker)
    pool.worker_info()  # every actor up before the clock starts
    run_dir = RunDir(config.output_dir)
    run_dir.create(config)
    problem = known_problem.problem(windows)
    optimizer = make_searcher(
        config.search, pairs=problem.pairs, scale=problem.scale, seeds=problem.seeds, mix=problem.mix
    )
    coordinator = Coordinator(config.search, problem, run_dir, pool, optimizer)
    workers = len(pool.workers)
    try:
        started = time.perf_counter()
        best = coordinator.run()
        wall = time.perf_counter() - started
        busy = sum(ray.get([w.actor.busy.remote() for w in pool.workers]))
        clock = pool.busy.reading(time.monotonic()).fraction
    finally:
        pool.shutdown()
    return {"utilisation": busy / (workers * wall), "pool_clock": clock, "wall_s": wall, "best_nll": best.mean_nll}


def cluster_benchmark(seeds: list[int]) -> dict:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=4, num_gpus=8, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as work:
            for seed in seeds:
                for racing in (False, True):
                    for schedule in ("generational", "steady"):
                        result = simulate(ga_config(schedule, racing, seed, Path(work)))
                        rows.append({"schedule": schedule, "racing": racing, "seed": seed, **result})
                for windows, jitter in itertools.product(DESCENT_WINDOWS, (0.0, JITTER)):
                    config = descent_config(windows, seed, Path(work) / f"jitter-{jitter:g}")
                    estimated = utilisation(config, windows, SIM_C).value
                    result = simulate(config, DESCENT_LATENCY_PER_WINDOW_S, jitter)
                    row = {"schedule": "descent", "windows": windows, "jitter": jitter, "seed": seed}
                    rows.append(row | {"estimated": estimated} | result)
    finally:
        ray.shutdown()
    return {"rows": rows, "c": SIM_C}


def print_cluster_table(result: dict) -> None:
    console = Console(width=WIDTH)
    console.print("\n[bold]3. simulated cluster[/bold]: 8 workers (fake GPUs), the GA 20 ms/window +-30%, demo sizes")
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
    for windows, jitter in itertools.product(DESCENT_WINDOWS, (0.0, JITTER)):
        rows = [
            r for r in result["rows"] if r["schedule"] == "descent" and (r["windows"], r["jitter"]) == (windows, jitter)
        ]
        if not rows:
            continue
        measured, estimated = statistics.mean(r["utilisation"] for r in rows), rows[0]["estimated"]
        clock = statistics.mean(r["pool_clock"] for r in rows)
        console.print(
            f"descent, {windows} windows, jitter +-{jitter:.0%}: utilisation {measured:.3f} simulated, {estimated:.3f} "
            f"estimated (ratio {measured / estimated:.2f}); the pool's busy clock {clock:.3f}"
        )
