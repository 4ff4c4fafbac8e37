"""A run's cost trajectory: its best search NLL so far against the window-equivalents it has spent, after each
line of history.jsonl, in the order the lines were written.

A window-equivalent (the unit a search's cost is counted in) is one window's forward pass; a window that also had a
backward pass (a descent step's gradient windows) costs 1 + c, c being what a backward costs in forwards:
`longrope estimate` prices it as a FLOPs ratio (`cost.budget.backward_cost`), bench/backward_cost.py measures it
(2.82 on the demo's CPU). One implementation for `longrope status --plot`, the TensorBoard scalars and the
benchmarks (bench/search_cost.py), so they all count alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.run.run_store import RunDir, best_of


@dataclass(frozen=True)
class CostPoint:
    forward: int  # window forwards so far
    backward: int  # of which also had a backward pass
    cost: float  # window-equivalents so far: forward + c x backward
    best_nll: float  # best fully scored mean NLL so far (inf before the first)
    best: HistoryRecord | None  # its record
    evaluations: int = 0  # candidates done so far: scored on every window, or stopped by racing


def window_equivalents(forward: int, backward: int, backward_cost: float) -> float:
    """The cost of `forward` window passes, `backward` of which also had a backward pass costing `backward_cost`
    forwards each."""
    return forward + backward_cost * backward


def cost_trajectory(run_dir: RunDir | str | Path, backward_cost: float) -> list[CostPoint]:
    """One CostPoint after each complete history line, in the order written (a torn last line, a write still in
    progress, is left out): a line's new windows are its NLLs not counted before (a raced candidate's line may be
    written again with more windows), its backward windows `backward_windows`. The best follows `best_of`'s
    rule: lowest mean NLL of a scored record, ties by key."""
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    counted: dict[str, int] = {}
    forward, backward, evaluations, best = 0, 0, 0, None
    points = []
    for record in run_dir.load_history().lines:
        key = record.key
        forward += len(record.nll) - counted.get(key, 0)
        backward += record.backward_windows if key not in counted else 0
        counted[key] = len(record.nll)
        evaluations += record.final
        best = best_of({r.key: r for r in (best, record) if r is not None})  # the one ranking rule
        best_nll = math.inf if best is None else best.mean_nll
        cost = window_equivalents(forward, backward, backward_cost)
        points.append(CostPoint(forward, backward, cost, best_nll, best, evaluations))
    return points
