"""The coordinator's descent loop: gradient descent's steps, and the hybrid's polish of the evolution's best.

A descent point is scored like any candidate (a history.jsonl record, so status, export, compare and resume need
nothing new), but its gradient windows go out as one backward task per worker (data-parallel, each returning the
gradient summed over its windows) and the other windows forward only; the point is told once every range is
back. `DescentLoop` is a part of `Coordinator` (a mixin): it reads the coordinator's optimizer, evaluator,
problem, run directory and history, and writes history records as the generational loop does.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any

from longrope.encodings import RopeMethod
from longrope.search.optimizers.gradient import objective_gradient, subset_mix
from longrope.search.run.generation_log import polish_position
from longrope.search.run.run_store import FINAL_STATUSES
from longrope.workers.scorer import CandidateScore


@dataclass
class _PointTask:
    """A descent point being scored: its window ranges' results as they come back, by their first window."""

    point: Any
    method: RopeMethod
    parts: dict[int, CandidateScore] = field(default_factory=dict)

    def complete(self, windows: int) -> bool:
        return sum(len(part.nll) for part in self.parts.values()) == windows

    def assembled(self) -> tuple[list[float], list[int], list]:
        """(nll, tokens, per-window gradients or None) in window order."""
        nll, tokens, gradients = [], [], []
        for start in sorted(self.parts):
            part = self.parts[start]
            nll += list(part.nll)
            tokens += list(part.tokens)
            gradients += list(part.gradient) if getattr(part, "gradient", None) else [None] * len(part.nll)
        return nll, tokens, gradients


class DescentLoop:
    """Descent and polish for `Coordinator` (see the module docstring)."""

    def _run_descent(self, descent, end_generation) -> None:
        """Ask, score (a point's gradient windows with a backward pass, split over the workers; the others
        forward), tell, until the descent has rounded its best point to the grid (`gradient.py`)."""
        while not descent.stop():
            started = time.monotonic()
            points = descent.ask()
            records = self._score_points(points, self.optimizer.generation)
            descent.tell(points, records)
            end_generation(descent, time.monotonic() - started)

    def _end_descent_generation(self, descent, seconds: float) -> None:
        self.stopped_early = descent.stopped_early
        self._end_generation(seconds)
        self._write_state()

    def _polish_if_due(self) -> None:
        """Hybrid: polish the evolution's best by gradient steps when a polish is due, then adopt the result."""
        while self.polish_pending():
            polisher = self.optimizer.polisher()
            self._run_descent(polisher, self._end_polish_step)
            adopted = self.optimizer.adopt_polish()
            self._log(f"polish: its best, on the grid, joins the population ({adopted.key})")
            self._write_state()

    def polish_pending(self) -> bool:
        ending = self.stopped_early or self.exhausted
        return getattr(self.optimizer, "kind", None) == "hybrid" and self.optimizer.polish_due(ending)

    def _end_polish_step(self, polisher, seconds: float) -> None:
        """One line per polish step: which polish, which step, the polish's own best (of its points: it starts
        from the evolution's best rounded off the grid, so it may stand above the run's) and the run's best."""
        _, polish_nll = polisher.best()
        what = polish_position(polisher.generation - 2, polisher.steps)  # the step just told
        run_best = self._best_perplexity_text()
        self.polish_seconds.append(seconds)
        self._log(
            f"polish after generation {self.optimizer.generation - 1}, {what}  polish best ppl "
            f"{math.exp(polish_nll):.4f}  run best ppl {run_best}  ({seconds:.1f}s)"
        )
        self.heartbeat.beat()
        self._tell_watcher()
        self._write_state()

    def _score_points(self, points: list, generation: int) -> list[dict[str, Any]]:
        """Each point's history record: found in history.jsonl (a resumed run), or scored now on every search
        window; a point's gradient windows go out in one task per worker with a backward pass (data-parallel),
        the other windows forward."""
        tasks: dict[str, _PointTask] = {}
        for point in points:
            record = self.history.get(point.key)
            if record is not None and record.get("status", "scored") in FINAL_STATUSES:
                continue
            method = self.problem.make_candidate(point.factors, attention_factor=point.attention_factor)
            tasks[point.key] = _PointTask(point, method)
            for windows, gradient in self._point_ranges(point):
                self.evaluator.submit([((point.key, windows[0]), method)], windows=windows, gradient=gradient)
        if tasks:
            for (key, start), score in self.evaluator.as_completed():
                task = tasks[key]
                task.parts[start] = score
                if task.complete(self.problem.windows):
                    self._record_point(task, generation)
        return [self.history[point.key] for point in points]

    def _point_ranges(self, point) -> list[tuple[tuple[int, int], bool]]:
        """[start, stop) ranges covering the search windows: the gradient windows cut into one chunk per worker
        (backward), the windows before and after them whole (forward only)."""
        total = self.problem.windows
        if point.gradient_windows is None:
            return [((0, total), False)]
        first, last = point.gradient_windows
        chunks = max(1, min(last - first, len(getattr(self.evaluator, "workers", ())) or 1))
        edges = [first + (last - first) * k // chunks for k in range(chunks + 1)]
        ranges = [((a, b), True) for a, b in itertools.pairwise(edges)]
        return [((0, first), False)] * (first > 0) + ranges + [((last, total), False)] * (last < total)

    def _record_point(self, task: _PointTask, generation: int) -> None:
        point, nll, tokens, gradients = task.point, *task.assembled()
        mean_nll = self.problem.mix.mean_nll(nll, tokens)
        finite = math.isfinite(mean_nll)
        record = {
            "key": point.key,
            "status": "scored",
            "generation": generation,
            "seed": self.optimizer.seed_names.get(point.key) if point.genome is not None else None,
            "factors": [round(float(f), 6) for f in point.factors],
            "n_hat": 0,
            "attention_factor": task.method.attention_factor,
            "mean_nll": mean_nll if finite else None,
            "perplexity": math.exp(mean_nll) if finite else None,
            "nll": [v if math.isfinite(v) else None for v in nll],
            "tokens": list(tokens),
            **({"windows": self.problem.windows_hash} if self.problem.windows_hash else {}),
        }
        if point.gradient_windows is not None:
            first, last = point.gradient_windows
            objective = subset_mix(self.problem.mix, (first, last))
            step_gradient = objective_gradient(objective, tokens[first:last], gradients[first:last])
            record |= {
                "gradient_windows": [first, last],
                "backward_windows": last - first,
                "gradient": [float(v) if math.isfinite(v) else None for v in step_gradient],
            }
        self.run_dir.append_history(record)
        self.history[point.key] = record
        self.window_evaluations += len(nll)
        self.bar.advance(self._best_perplexity_text())
        self.heartbeat.result()
