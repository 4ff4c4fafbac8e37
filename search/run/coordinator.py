"""The coordinator: the only piece that knows both the searcher (the optimizer) and the evaluator (the worker pool).

One loop for every optimizer: keep the evaluator's capacity full by asking the searcher for as many candidates as
there is room for (`searcher.ask(room)`), tell each result the moment its candidate is complete, and ask again. A
generational search answers an ask with nothing until its generation is told, a steady one with children at once,
descent with one point: the loop is the same (search/optimizers/searcher.py).

How a candidate is scored is decided here, where the workers are:
- its windows go out in groups (`racing.window_groups`: all at once unless racing is on), and with racing a child
  that is clearly worse than the searcher's threshold (its worst parent) is stopped (`racing.clearly_worse`),
  recorded with status "stopped" and told as ranking last;
- a generation with fewer candidates than workers (a descent step, its seeds, its point on the grid, a polish's
  line-search trials) has each candidate's windows cut into ranges over the workers (`window_ranges`), recorded
  once every range is in; a candidate that asks for a gradient (`Candidate.gradient_windows`) sends those windows
  with a backward pass (data-parallel, each range returning its windows' gradients), the others forward only;
- a candidate whose scoring raised on every worker it was retried on (the pool's `TaskFailure`) is recorded with
  status "failed" and its error, and told as ranking last: the run goes on;
- every result is appended to history.jsonl as it arrives (one record type, `history_record`), so a crash loses
  nothing; a resumed run tells the searcher what history.jsonl holds instead of scoring it again, and continues a
  partly raced candidate from its next window.

state.json is written whenever a tell ended a generation or the searcher handed out new candidates, once they are
out: `{"optimizer": {"kind", "state"}}` (the searcher's own model less what history.jsonl records,
`searcher.stored_state`; null for a searcher a replay rebuilds) and the run's timings. One plain line per
generation (and per polish step) goes to the reporter (`generation_log.py`); heartbeat.json says the run is alive
(`heartbeat.py`); a `ProgressWatcher` (TensorBoard scalars) hears where the run stands. None of them feeds back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from longrope.encodings import RopeMethod
from longrope.search.config.search_section import SearchConfig
from longrope.search.optimizers.factory import search_plan
from longrope.search.optimizers.history_record import HistoryRecord, recorded_factors
from longrope.search.optimizers.objective import objective_gradient, subset_mix
from longrope.search.optimizers.saved_state import OptimizerState
from longrope.search.optimizers.searcher import Candidate, GenerationEnd, Searcher, keeps_state
from longrope.search.run.generation_log import generation_line, polish_line
from longrope.search.run.heartbeat import HEARTBEAT, HeartbeatWriter
from longrope.search.run.racing import clearly_worse, window_groups
from longrope.search.run.reporting import Progress, ProgressWatcher, SearchReporter, SilentReporter
from longrope.search.run.run_store import (
    Records,
    RunDir,
    RunState,
    RunStoreError,
    best_of,
    final_count,
    window_passes,
)
from longrope.search.run.search_problem import Evaluator, SearchProblem
from longrope.search.run.tensorboard_scalars import TENSORBOARD_DIR, TensorBoardScalars
from longrope.search.run.window_ranges import candidate_ranges, cut, pieces_per_candidate
from longrope.workers.busy_clock import BusyTime
from longrope.workers.scorer import CandidateScore
from longrope.workers.task_failure import TaskFailure


@dataclass
class _Task:
    """A candidate being scored: its encoding, and its window ranges' results so far, by their first window."""

    candidate: Candidate
    method: RopeMethod
    spread: int = 1  # pieces its windows are cut into, each to its own worker (`Coordinator._spread`)
    parts: dict[int, CandidateScore] = field(default_factory=dict)
    out: int = 0  # ranges sent and not answered: a candidate sent whole is recorded once all are in

    def scored_windows(self) -> int:
        return sum(len(part.nll) for part in self.parts.values())

    def assembled(self) -> tuple[list[float], list[int], list]:
        """(nll, tokens, per-window gradients or None) of the windows scored so far from window 0 on, in window
        order: a failed candidate whose later ranges came back keeps only the windows before its first gap, so
        every value stays at its window's place."""
        nll, tokens, gradients = [], [], []
        for start in sorted(self.parts):
            if start != len(nll):
                break
            part = self.parts[start]
            nll += [math.nan if v is None else float(v) for v in part.nll]
            tokens += [int(t) for t in part.tokens]
            gradients += list(part.gradient) if getattr(part, "gradient", None) else [None] * len(part.nll)
        return nll, tokens, gradients


class Coordinator:
    """Joins a searcher to an evaluator; records every result in the run directory, reports progress, keeps
    heartbeat.json while it runs. `watcher`: told the run's progress after every generation (default: TensorBoard
    scalars when `settings.tensorboard`, a backward pass counting `backward_cost` forwards)."""

    def __init__(
        self,
        settings: SearchConfig,
        problem: SearchProblem,
        run_dir: RunDir,
        evaluator: Evaluator,
        searcher: Searcher,
        *,
        reporter: SearchReporter | None = None,
        heartbeat: HeartbeatWriter | None = None,
        watcher: ProgressWatcher | None = None,
        backward_cost: float | None = None,
        history: Records | None = None,
        state: RunState | None = None,
        outstanding: Sequence[Candidate] = (),
        outstanding_asked: int = 0,
    ):
        self.settings, self.problem, self.run_dir, self.evaluator = settings, problem, run_dir, evaluator
        self.searcher = searcher
        self.heartbeat = heartbeat or HeartbeatWriter(run_dir.file(HEARTBEAT))
        self.reporter = reporter or SilentReporter()
        if watcher is None and settings.tensorboard:  # a forward-only search's window-equivalents need no c
            backward = search_plan(settings, 0).backward_steps > 0
            watcher = TensorBoardScalars(run_dir.file(TENSORBOARD_DIR), backward_cost if backward else 0.0)
        self.watcher = watcher
        self.groups = window_groups(problem.windows, settings.racing)
        self.history: Records = dict(history or {})  # a resumed run's, as read and checked
        self.outstanding = list(outstanding)  # a resumed run's asks out when it stopped (`replay.rebuild`)
        self.outstanding_asked = outstanding_asked or len(self.outstanding)  # the generation they were asked in
        self.tasks: dict[str, _Task] = {}
        self.generation_seconds = list(state.generation_seconds) if state else []
        self.polish_seconds = list(state.polish_seconds) if state else []  # a hybrid's polish steps: status's ETA
        self.window_evaluations = 0  # scored by this process (not what a resumed run found recorded)
        self.started = time.monotonic()
        self.scored_since_line = 0  # candidates this process scored since the last generation line (its eval/s)

    @property
    def finished(self) -> bool:
        return self.searcher.done() and not self.tasks

    def run(self) -> HistoryRecord:
        """Run until the searcher is done; returns the best candidate's history record. heartbeat.json says the run
        is alive meanwhile, and records how it ended (an exception: which one)."""
        done = final_count(self.history)
        try:
            with self.heartbeat.held(), self.reporter.progress(self.searcher.budget, done) as bar:
                self.bar = bar
                if not bar.live:  # no bar: say at once what is being scored, not only when generation 0 ends
                    self.reporter.log(f"search: scoring {self.searcher.position()}, {done} evaluations done")
                self._loop()
        finally:
            if self.watcher is not None:
                self.watcher.close()
        return self.best_record()

    def best_record(self) -> HistoryRecord:
        """The best scored candidate, by the one rule that status and export also use (`run_store.best_of`)."""
        best = best_of(self.history)
        if best is None:
            raise RunStoreError("search: no candidate got a finite score; check the model and the data")
        return best

    # ---- the loop ----

    def _loop(self) -> None:
        # asked before a crash, not told: out again, those history.jsonl holds told first in the order of their
        # lines (the order they landed in, which is how a steady GA's resume reads what it was told)
        landed = {key: place for place, key in enumerate(k for k, record in self.history.items() if record.final)}
        spread = self._spread(self.outstanding_asked)
        for candidate in sorted(self.outstanding, key=lambda c: landed.get(c.key, len(landed))):
            self._launch(candidate, spread)
        self._fill()
        while self.tasks:
            for key, score in self.evaluator.as_completed():
                self._on_part(key, score)
                if self.tasks:  # else a generation barrier: the call ends, the next generation goes with the next
                    self._fill()
            self._fill()
        self._write_state()

    def _fill(self) -> None:
        """Ask for as many candidates as there is room for; state.json is written once what was asked is out."""
        capacity = max(1, int(getattr(self.evaluator, "capacity", 1)))
        asked = False
        while len(self.tasks) < capacity and not self.searcher.done():
            batch = self.searcher.ask(capacity - len(self.tasks))
            if not batch:
                break
            asked = True
            spread = self._spread(len({candidate.key for candidate in batch}))
            for candidate in batch:
                self._launch(candidate, spread)
        if asked:
            self._write_state()

    def _spread(self, asked: int) -> int:
        """Pieces each of `asked` candidates' windows are cut into: a generation with fewer candidates than workers
        (descent's step, its seeds, the point rounded to the grid) would leave the others idle, so each candidate's
        windows go out in about ceil(workers / asked) ranges (`window_ranges.candidate_ranges`). Only for a
        generation asked whole (every searcher but the steady GA, whose asks follow the results' timing), and
        `asked` is the whole generation's size, a resumed run's too (`outstanding_asked`): the cut depends on the
        config and the workers started alone, so a rerun puts the same windows in each forward. Racing sends one
        group at a time instead, whatever this says."""
        workers = int(getattr(self.evaluator, "width", 1))
        steady = bool(getattr(self.searcher, "steady", False))
        return 1 if steady else pieces_per_candidate(asked, workers)

    def _launch(self, candidate: Candidate, spread: int = 1) -> None:
        """Send a candidate out, or tell it at once when history.jsonl holds its final record (a resumed run):
        nothing is scored twice. A partial record continues from its next window."""
        if candidate.key in self.tasks:  # asked twice in one generation (CMA-ES): scored once, told once
            return
        record = self.history.get(candidate.key)
        if record is not None and record.final:  # told again (asked before a stop), or a repeat (CMA-ES)
            self._tell(record)
            return
        method = self.problem.make_candidate(
            candidate.factors, attention_factor=candidate.attention_factor, n_hat=candidate.n_hat
        )
        task = _Task(candidate, method, spread)
        if record is not None:  # partial: its windows so far count, in the generation it was asked in
            task.parts[0] = CandidateScore(nll=tuple(record.nll), tokens=tuple(record.tokens))
        self.tasks[candidate.key] = task
        self._submit(task)

    def _submit(self, task: _Task) -> None:
        """The task's next window range(s): every remaining window when nothing can stop it early (no racing, or no
        threshold), cut into `task.spread` ranges (a gradient candidate's by `candidate_ranges`); else the next
        racing group. The ranges sent together are recorded together, once all are in (`task.out`)."""
        candidate, start = task.candidate, task.scored_windows()
        if candidate.gradient_windows is not None:
            ranges = candidate_ranges(self.problem.windows, candidate.gradient_windows, task.spread)
        elif self._threshold() is not None:
            ranges = [((start, next(end for _, end in self.groups if end > start)), False)]
        else:
            ranges = [(piece, False) for piece in cut((start, self.problem.windows), task.spread)]
        task.out = len(ranges)
        for windows, gradient in ranges:
            item = [((candidate.key, windows[0]), task.method)]
            if gradient:
                self.evaluator.submit(item, windows=windows, gradient=True)
            else:
                self.evaluator.submit(item, windows=windows)

    def _threshold(self) -> str | None:
        return self.searcher.threshold() if self.settings.racing.enabled else None

    def _on_part(self, part_key: tuple[str, int], score: CandidateScore | TaskFailure) -> None:
        """A window range's result: recorded (a partial record while a raced candidate goes on), and the candidate
        told once it is complete, stopped or failed."""
        key, start = part_key
        task = self.tasks.get(key)
        if task is None:  # another range of a candidate already recorded as failed
            return
        if isinstance(score, TaskFailure):
            self._on_failure(task, score)
            return
        task.parts[start] = score
        task.out -= 1
        self.window_evaluations += len(score.nll)
        if task.out > 0:
            return  # its ranges went out together: it is recorded whole
        status = self._status(task)
        record = history_record(task, status, self.problem)
        self.run_dir.append_history(record)  # durable before anything else uses it
        self.history[key] = record
        if status == "partial":
            self._submit(task)
            return
        del self.tasks[key]
        if status == "scored" and record.mean_nll is None:
            self.reporter.log(f"search: candidate {key} scored a non-finite NLL; ranked last")
        self.bar.advance(self._best_perplexity_text())
        self.heartbeat.result(self._busy())
        self.scored_since_line += 1
        self._tell(record)

    def _on_failure(self, task: _Task, failure: TaskFailure) -> None:
        """A range that raised on every worker it was tried on: the candidate is recorded as failed (with the windows
        it scored before) and told as ranking last."""
        key = task.candidate.key
        record = history_record(task, "failed", self.problem, error=failure.error)
        self.run_dir.append_history(record)
        self.history[key] = record
        del self.tasks[key]
        tries = failure.attempts
        self.reporter.log(f"search: candidate {key} failed after {tries} tries ({failure.error}); ranked last")
        self.bar.advance(self._best_perplexity_text())
        self.heartbeat.result(self._busy())
        self.scored_since_line += 1
        self._tell(record)

    def _status(self, task: _Task) -> str:
        nll, tokens, _ = task.assembled()
        if len(nll) >= self.problem.windows:
            return "scored"
        threshold_key = self._threshold()
        threshold = self.history.get(threshold_key) if threshold_key else None
        weights = self.problem.mix.racing_weights()
        if threshold and clearly_worse(nll, tokens, threshold.nll, threshold.tokens, self.settings.racing, weights):
            return "stopped"
        return "partial"

    def _tell(self, result: HistoryRecord) -> None:
        ends = self.searcher.tell([result])
        for end in ends:
            self._end_generation(end)
        if ends:
            self._write_state()

    # ---- progress and state ----

    def _end_generation(self, end: GenerationEnd) -> None:
        now = time.monotonic()
        seconds, self.started = now - self.started, now
        if end.polish:
            self.polish_seconds.append(seconds)
            self.reporter.log(polish_line(end, self._best_perplexity_text(), seconds))
        else:
            self.generation_seconds.append(seconds)
            racing = self.settings.racing.enabled
            line = generation_line(end, self.history, racing=racing, seconds=seconds, scored=self.scored_since_line)
            self.reporter.log(line)
        self.scored_since_line = 0
        self.heartbeat.beat(self._busy())
        self._tell_watcher(end.generation)

    def _tell_watcher(self, generation: int) -> None:
        """The run's progress, counted from its history as `status` counts it, to the watcher (if any)."""
        if self.watcher is None:
            return
        best, (forward, backward) = best_of(self.history), window_passes(self.history)
        nll = best.mean_nll if best else None
        self.watcher.update(Progress(generation, final_count(self.history), forward, backward, nll))

    def _busy(self) -> BusyTime | None:
        """The workers' busy time so far (heartbeat.json, for `status`), where the evaluator keeps a clock."""
        clock = getattr(self.evaluator, "busy", None)
        return clock.reading(time.monotonic()) if clock is not None else None

    def _write_state(self) -> None:
        stored = self.searcher.stored_state() if keeps_state(self.searcher) else None
        state = RunState(
            optimizer=OptimizerState(kind=self.searcher.kind, state=stored),
            progress=self.searcher.progress(),
            generation_seconds=self.generation_seconds,
            polish_seconds=self.polish_seconds,
            finished=self.finished,
            stopped_early=self.searcher.stopped_early,
            total_generations=self.searcher.total_generations,
        )
        self.run_dir.write_state(state)

    def _best_perplexity_text(self) -> str:
        best = best_of(self.history)
        return f"{best.perplexity:.4f}" if best else "-"


def history_record(task: _Task, status: str, problem: SearchProblem, error: str | None = None) -> HistoryRecord:
    """The one history.jsonl record of a candidate (a GA child, a seed, a descent step): what was scored, on which
    windows, with what result; a descent step also its gradient windows and the objective's gradient on them; a
    failed one its `error`."""
    candidate = task.candidate
    nll, tokens, gradients = task.assembled()
    mean_nll = problem.mix.mean_nll(nll, tokens) if status == "scored" else None
    finite = mean_nll is not None and math.isfinite(mean_nll)
    record = {
        "key": candidate.key,
        "status": status,
        "generation": candidate.generation,
        "seed": candidate.seed,
        "factors": recorded_factors(candidate.factors),
        "n_hat": candidate.n_hat,
        "attention_factor": task.method.attention_factor,
        "mean_nll": mean_nll if finite else None,
        "perplexity": math.exp(mean_nll) if finite else None,
        "nll": [v if math.isfinite(v) else None for v in nll],
        "tokens": list(tokens),
        **({"windows": problem.windows_hash} if problem.windows_hash else {}),
        **({"error": error} if error is not None else {}),
    }
    if candidate.gradient_windows is not None and status == "scored":
        first, last = candidate.gradient_windows
        step_gradient = objective_gradient(
            subset_mix(problem.mix, (first, last)), tokens[first:last], gradients[first:last]
        )
        record |= {
            "gradient_windows": [first, last],
            "backward_windows": last - first,
            "gradient": [float(v) if math.isfinite(v) else None for v in step_gradient],
        }
    return HistoryRecord.model_validate(record)  # the fields given are the line's (`HistoryRecord.line`)
