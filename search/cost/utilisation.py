"""How busy a search keeps its workers: wall time = device time / (GPUs x utilisation).

A search is not one long queue. A generational GA waits at the end of each generation for its slowest child;
descent scores one point a step and cannot ask the next before it is told. Utilisation is the workers' busy time
over workers x wall time, per optimizer:

- the GA and CMA-ES (whole generations, or the steady GA's queue): measured, since it depends on how unequal the
  candidates' times are. bench/search_cost.py `--parts cluster` runs the search on 8 Ray workers with fake GPUs at
  20 ms a window +-30% on the demo's sizes (3 seeds; bench/results/search_cost_ga_variants.json): generational
  0.807, steady 0.964, with racing 0.725 and 0.885. One worker is never idle (its queue holds the whole
  generation): 1.
- descent (the gradient optimizer; the hybrid's polish, each step `polish_probes` line-search trials): computed,
  generation by generation, the way the coordinator sends it out. A generation of k candidates on W workers cuts
  each candidate's windows into about ceil(W / k) ranges where k < W (`window_ranges.candidate_ranges`: a step's
  gradient windows and the windows around them apart, the pieces shared by weight, the costliest sent first), and
  the pool gives each range to the first free worker (it queues a second call on a worker only while it holds one
  for every worker), so a generation lasts what greedy list scheduling of its ranges says (Graham 1966), a
  window's forward costing 1 and a window with a backward pass 1 + c (c: `budget.backward_cost`). Utilisation =
  the work / (W x the sum of the generations' lengths). bench/search_cost.py `--parts cluster` checks the figure
  against a simulated cluster.
- the hybrid: the GA's generations at the GA's figure and its polishes as descent, weighed by their work.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from longrope.search.config.job_config import JobConfig
from longrope.search.cost.architecture import Frozen
from longrope.search.optimizers.factory import searcher_class
from longrope.search.optimizers.gradient import WindowSplit
from longrope.search.run.window_ranges import candidate_ranges, pieces_per_candidate

# measured: (schedule, racing) -> utilisation on 8 workers (see the module docstring)
MEASURED_GA = {
    ("generational", False): 0.807,
    ("steady", False): 0.964,
    ("generational", True): 0.725,
    ("steady", True): 0.885,
}
MEASURED_SOURCE = "as measured on a simulated 8-worker cluster: bench/search_cost.py --parts cluster"


class Utilisation(Frozen):
    """The workers' expected busy share, and where the figure comes from, in words."""

    value: float
    basis: str


def makespan(pieces: Sequence[float], workers: int) -> float:
    """How long `pieces` (costs, in the order sent) take when each goes to the first free of `workers`."""
    free = [0.0] * max(1, workers)
    for cost in pieces:
        heapq.heappush(free, heapq.heappop(free) + cost)
    return max(free)


def generation_pieces(
    candidates: int, windows: int, workers: int, gradient: tuple[int, int] | None, c: float
) -> list[float]:
    """The costs of the ranges a generation of `candidates` goes out as (`window_ranges.candidate_ranges`, as the
    coordinator cuts them), each candidate scored on `windows` windows; with `gradient`, each a step's point (or a
    line-search trial) with a backward pass on those windows."""
    ranges = candidate_ranges(windows, gradient, pieces_per_candidate(candidates, workers))
    return [(b - a) * ((1 + c) if backward else 1.0) for (a, b), backward in ranges] * candidates


def descent_time(
    config: JobConfig, windows: int, workers: int, c: float, *, seeds: int, steps: int, probes: int = 1
) -> tuple[float, float]:
    """(work, time) of one descent, in window forwards: its seeds (none for a polish), `steps` steps of `probes`
    points each (a polish's line-search trials; the first step, from the start, is one), and its best point
    rounded to the grid."""
    split = WindowSplit.of(config.search.gradient, windows)
    generations = [generation_pieces(seeds, windows, workers, None, c)] if seeds else []
    for step in range(1, steps + 1):
        points = 1 if step == 1 else probes
        generations.append(generation_pieces(points, windows, workers, split.block(step), c))
    generations.append(generation_pieces(1, windows, workers, None, c))
    return sum(map(sum, generations)), sum(makespan(pieces, workers) for pieces in generations)


def utilisation(config: JobConfig, windows: int, c: float) -> Utilisation:
    """The configured search's utilisation on its `workers.num_workers` workers (see the module docstring);
    `windows`: the windows a candidate is scored on, `c`: a backward window's cost beyond its forward."""
    workers, search = config.workers.num_workers, config.search
    kind = searcher_class(search.optimizer)
    if workers == 1:
        return Utilisation(value=1.0, basis="one worker: its queue is never empty")
    ga = MEASURED_GA[(search.schedule, search.racing.enabled)]
    if not kind.descends:
        return Utilisation(value=ga, basis=f"the {search.schedule} GA {MEASURED_SOURCE}")
    if not kind.polishes:
        work, time = descent_time(config, windows, workers, c, seeds=search.most_seeds(), steps=search.gradient.steps)
        return Utilisation(value=work / (workers * time), basis=f"descent's generations scheduled on {workers} workers")
    polishes = search.gradient.polishes(search.generations)
    gradient = search.gradient
    polish = {"seeds": 0, "steps": gradient.polish_steps, "probes": gradient.polish_probes}
    polish_work, polish_time = descent_time(config, windows, workers, c, **polish)
    ga_work = (search.population + search.generations * (search.mutations + search.crossovers)) * windows
    work = ga_work + polishes * polish_work
    time = ga_work / (workers * ga) + polishes * polish_time
    basis = f"descent's polishes scheduled on {workers} workers, the GA's generations {MEASURED_SOURCE}"
    return Utilisation(value=work / (workers * time), basis=basis)
