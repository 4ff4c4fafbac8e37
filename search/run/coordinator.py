"""The coordinator: the only piece that knows both the optimizer and the evaluator (the Ray worker pool).

Its loop reads like pycma's: `while not opt.stop(): genomes = opt.ask(); opt.tell(genomes, scores)`, with the
optimizer passed in (`optimizers/factory.make_optimizer`). Each genome is decoded once into a `Candidate`; the candidate
is scored window group by window group (`racing.window_groups`: all windows at once unless racing is on), every
result is appended to history.jsonl the moment it arrives, and with racing a child that is clearly worse than the
worst parent is stopped (`racing.clearly_worse`), recorded with status "stopped", and told to the optimizer as
ranking last, so it is never a parent and never the best.

Schedules (`search.schedule`):
- generational: one generation out at a time; the racing threshold is fixed when the generation is asked, so the
  run is deterministic and a resumed run reaches exactly the result of an uninterrupted one; state.json is written
  after every generation;
- steady: after generation 0 (scored as one batch), the evaluator's `capacity` candidates are kept out until the
  budget runs low; each result is told as it arrives, new children are asked for at once, the threshold is the
  worst parent of the moment, and state.json (with the asked, untold candidates) is written after every result,
  once the children it asked for are out. A resumed steady run re-submits the untold candidates and takes every
  score history.jsonl holds, so nothing is lost and nothing is scored twice.

On resume, the optimizer is restored from state.json (or, without one, started afresh from the same seed, which
asks for the candidates already recorded), and a candidate with a "partial" record continues from its next window.

Progress: generations are numbered from 0, the initial population (seeds and their mutations), to
`total_generations - 1`; one plain line per generation (best search-split perplexity, "new best", the early-stop
countdown, `generation_log.py`) goes to the reporter with the progress (`reporting.py`): the command line draws a
live bar on a terminal, and piped output (nohup, `ray job logs`) gets the lines alone, as they happen. The descent
loop (gradient steps, the hybrid's polish) is `descent_loop.py`. While it runs the coordinator keeps heartbeat.json
(`heartbeat.py`) for `status`; nothing it writes there feeds back into the search. After every generation (and
descent or polish step) it tells its `ProgressWatcher` where the run stands: with `search.tensorboard: true`,
TensorBoard scalars in RUN/tensorboard/ (`tensorboard_scalars.py`), which feed nothing back either.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from longrope.search.config.search_section import SearchConfig
from longrope.search.optimizers.factory import Optimizer
from longrope.search.optimizers.genome import Genome
from longrope.search.optimizers.racing import clearly_worse, window_groups
from longrope.search.run.descent_loop import DescentLoop
from longrope.search.run.generation_log import (
    countdown_text,
    generation_line,
    held_out_countdown_text,
    resume_position,
)
from longrope.search.run.heartbeat import HEARTBEAT, HeartbeatWriter
from longrope.search.run.reporting import Progress, ProgressWatcher, SearchReporter, SilentReporter
from longrope.search.run.run_check import check_history_holds
from longrope.search.run.run_store import (
    FINAL_STATUSES,
    History,
    RunDir,
    RunState,
    RunStoreError,
    best_of,
    final_count,
    window_passes,
)
from longrope.search.run.search_problem import Candidate, Evaluator, SearchProblem
from longrope.search.run.tensorboard_scalars import TENSORBOARD_DIR, TensorBoardScalars
from longrope.workers.scorer import CandidateScore


@dataclass
class _Race:
    """A candidate being scored: the per-window results so far (all of them, in window order)."""

    candidate: Candidate
    nll: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


class Coordinator(DescentLoop):
    """Joins an optimizer (ask/tell) to an evaluator (the worker pool); records every result in the run directory,
    reports progress to a reporter, and keeps heartbeat.json while it runs. `watcher`: told the run's progress
    after every generation (default: TensorBoard scalars when `settings.tensorboard`, their window-equivalents
    counting a backward pass as `backward_cost` forwards)."""

    def __init__(
        self,
        settings: SearchConfig,
        problem: SearchProblem,
        run_dir: RunDir,
        evaluator: Evaluator | None,
        optimizer: Optimizer,
        *,
        reporter: SearchReporter | None = None,
        heartbeat: HeartbeatWriter | None = None,
        watcher: ProgressWatcher | None = None,
        backward_cost: float | None = None,
    ):
        self.settings, self.problem, self.run_dir, self.evaluator = settings, problem, run_dir, evaluator
        self.optimizer = optimizer
        self.heartbeat = heartbeat or HeartbeatWriter(run_dir.file(HEARTBEAT))
        self.reporter = reporter or SilentReporter()
        if watcher is None and settings.tensorboard:  # a forward-only optimizer's window-equivalents need no c
            forward_only = settings.optimizer not in ("gradient", "hybrid")
            watcher = TensorBoardScalars(run_dir.file(TENSORBOARD_DIR), 0.0 if forward_only else backward_cost)
        self.watcher = watcher
        self.groups = window_groups(problem.windows, settings.racing)
        self.history: dict[str, dict[str, Any]] = {}
        self.races: dict[str, _Race] = {}
        self.threshold_key: str | None = None  # generational: the worst parent when the generation was asked
        self.generation_seconds: list[float] = []
        self.polish_seconds: list[float] = []  # hybrid: each polish step's (and rounding's), for status's ETA
        self.best_by_generation: list[float] = []
        self.stopped_early = False
        self.exhausted = False  # the optimizer could make no new candidate
        self.window_evaluations = 0  # scored by this process (not counting what a resumed run found recorded)

    @property
    def total_generations(self) -> int:
        return self.optimizer.total_generations

    @property
    def steady(self) -> bool:
        return self.settings.schedule == "steady"

    @property
    def descent(self) -> bool:
        return getattr(self.optimizer, "kind", None) == "gradient"

    @property
    def finished(self) -> bool:
        """Descent's early stop is its own (held-out windows), and it still rounds its best to the grid after; a
        hybrid run that stopped early still polishes its final best."""
        if self.descent:
            return self.optimizer.stop()
        if self.polish_pending():
            return False
        return self.stopped_early or self.exhausted or self.optimizer.stop()

    def resume(self) -> History:
        """Load what the run directory holds; writes nothing, so a damaged directory is left as it was.

        Returns the history as read, so the caller can cut a torn last line once every check has passed."""
        history = self.run_dir.load_history()
        state = self.run_dir.read_state()
        if state is not None:
            try:
                self.optimizer.load_state_dict(state["evolution"])
                self.generation_seconds = [float(v) for v in state["generation_seconds"]]
                self.polish_seconds = [float(v) for v in state.get("polish_seconds", [])]
                best = state.get("best_by_generation", [])
                self.best_by_generation = [math.inf if v is None else float(v) for v in best]
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise RunStoreError(f"{self.run_dir.file('state.json')}: corrupted ({exc})") from None
            self.stopped_early = bool(state.get("stopped_early", False))
            self.exhausted = bool(state.get("exhausted", False))
            check_history_holds(self.run_dir, RunState.model_validate(state), history.records)
        self.history = dict(history.records)
        return history

    def run(self) -> dict[str, Any]:
        """Run until the optimizer stops (or early stopping); returns the best candidate's history record.
        heartbeat.json says the run is alive meanwhile, and records how it ended (an exception: which one)."""
        done = final_count(self.history)
        try:
            with self.heartbeat.held(), self.reporter.progress(self._expected_evaluations(), done) as bar:
                self.bar = bar
                if not bar.live:  # no bar: say at once what is being scored, not only when generation 0 ends
                    position = resume_position(self.optimizer, self.polish_pending())
                    self._log(f"search: scoring {position}, {done} evaluations done")
                if self.descent:
                    self._run_descent(self.optimizer, self._end_descent_generation)
                elif self.steady:
                    self._run_steady()
                else:
                    self._run_generational()
        finally:
            if self.watcher is not None:
                self.watcher.close()
        return self.best_record()

    def best_record(self) -> dict[str, Any]:
        """The best scored candidate, by the one rule that status and export also use (`run_store.best_of`)."""
        best = best_of(self.history)
        if best is None:
            raise RunStoreError("search: no candidate got a finite score; check the model and the data")
        return best

    # ---- the two schedules ----

    def _run_generational(self) -> None:
        self._polish_if_due()  # a resumed hybrid run may stop in the middle of a polish
        while not self.finished:
            started = time.monotonic()
            genomes = self.optimizer.ask()
            if not genomes:
                self._exhausted()
                break
            self.threshold_key = self.optimizer.worst_parent()  # fixed for the generation: deterministic racing
            scores = self._score_all(genomes)
            self.optimizer.tell(genomes, [scores[g.key] for g in genomes])
            self._end_generation(time.monotonic() - started)
            self._write_state()
            self._polish_if_due()
        self._polish_if_due()  # the last one after an early stop or an exhausted population

    def _exhausted(self) -> None:
        """No new candidate can be made: the run is finished (recorded, so a resume does not try again)."""
        self.exhausted = True
        self._log("search: no new candidate can be made around the population; stopping")
        self._write_state()

    def _score_all(self, genomes: list[Genome]) -> dict[str, float]:
        generation = self.optimizer.generation
        scores: dict[str, float] = {}
        for genome in {g.key: g for g in genomes}.values():
            final = self._start(genome, generation)
            if final is not None:
                scores[genome.key] = final
        for key, score in self.evaluator.as_completed():
            final = self._on_result(key, score)
            if final is not None:
                scores[key] = final
        return scores

    def _run_steady(self) -> None:
        capacity = max(1, int(getattr(self.evaluator, "capacity", 1)))
        self.generation_started = time.monotonic()
        in_flight: dict[str, Genome] = {}
        for genome in list(self.optimizer.pending.values()):  # asked before a crash, not told: out again
            self._launch(genome, in_flight)
        self._fill(in_flight, capacity)
        self._write_state()  # after the fill: the state lists every child that is out, and the generator after it
        for key, score in self.evaluator.as_completed():
            final = self._on_result(key, score)
            if final is not None:
                self._tell_one(in_flight.pop(key), final)
                self._fill(in_flight, capacity)
                self._write_state()
        if not in_flight and not self.finished:
            self._exhausted()

    def _fill(self, in_flight: dict[str, Genome], capacity: int) -> None:
        """Keep `capacity` candidates out: ask the optimizer for as many children as there is room for."""
        while not self.optimizer.stop() and not self.stopped_early and len(in_flight) < capacity:
            genomes = self.optimizer.ask(capacity - len(in_flight))
            if not genomes:
                return
            for genome in genomes:
                self._launch(genome, in_flight)

    def _launch(self, genome: Genome, in_flight: dict[str, Genome]) -> None:
        in_flight[genome.key] = genome
        final = self._start(genome, self.optimizer.generation)
        if final is not None:  # recorded before a crash: told at once, scored nowhere
            self._tell_one(in_flight.pop(genome.key), final)

    def _tell_one(self, genome: Genome, score: float) -> None:
        """Tell one result (state.json is written by the caller, once the children it makes room for are out)."""
        before = self.optimizer.generation
        self.optimizer.tell([genome], [score])
        if self.optimizer.generation != before:
            now = time.monotonic()
            self._end_generation(now - self.generation_started)
            self.generation_started = now

    # ---- one candidate, group by group ----

    def _start(self, genome: Genome, generation: int) -> float | None:
        """Send a candidate's next window group out; returns its score at once if history.jsonl has its final
        record (a resumed run), so nothing is scored twice."""
        record = self.history.get(genome.key)
        if record is not None and record.get("status", "scored") in FINAL_STATUSES:
            return _score_of(record)
        if record is not None:  # partial: continue from the next window, in the generation it was asked in
            generation = int(record["generation"])
        race = _Race(self._decode(genome, generation))
        if record is not None:
            race.nll = [math.nan if v is None else float(v) for v in record["nll"]]
            race.tokens = [int(v) for v in record["tokens"]]
        self.races[genome.key] = race
        self._submit(race)
        return None

    def _submit(self, race: _Race) -> None:
        """Send the next window group; with no threshold to race against (generation 0, or parents not all
        there) every remaining window at once, since nothing could stop the candidate early."""
        start = len(race.nll)
        stop = next(end for _, end in self.groups if end > start) if self._threshold_key() else self.problem.windows
        self.evaluator.submit([(race.candidate.genome.key, race.candidate.method)], windows=(start, stop))

    def _threshold_key(self) -> str | None:
        """The worst parent to race against: fixed when the generation was asked (generational), or the worst
        parent of the moment (steady); None when racing is off or there is none yet."""
        if not self.settings.racing.enabled:
            return None
        return self.optimizer.worst_parent() if self.steady else self.threshold_key

    def _on_result(self, key: str, score: CandidateScore) -> float | None:
        """Record a group's result; returns the candidate's score once it is final (inf when stopped)."""
        race = self.races[key]
        race.nll += list(score.nll)
        race.tokens += list(score.tokens)
        self.window_evaluations += len(score.nll)
        status = self._status(race)
        record = self._record(race, status)
        self.run_dir.append_history(record)  # durable before anything else uses it
        self.history[key] = record
        if status == "partial":
            self._submit(race)
            return None
        del self.races[key]
        self.bar.advance(self._best_perplexity_text())
        self.heartbeat.result()
        return _score_of(record)

    def _status(self, race: _Race) -> str:
        if len(race.nll) >= self.problem.windows:
            return "scored"
        threshold_key = self._threshold_key()
        threshold = self.history.get(threshold_key) if threshold_key else None
        if threshold and clearly_worse(
            race.nll,
            race.tokens,
            threshold["nll"],
            threshold["tokens"],
            self.settings.racing,
            self.problem.mix.racing_weights(),
        ):
            return "stopped"
        return "partial"

    def _decode(self, genome: Genome, generation: int) -> Candidate:
        grid = self.optimizer.grid
        factors, attention = grid.factors(genome), grid.attention_factor(genome)
        method = self.problem.make_candidate(factors, attention_factor=attention, n_hat=genome.n_hat)
        return Candidate(genome, generation, factors, attention, method)

    def _record(self, race: _Race, status: str) -> dict[str, Any]:
        candidate = race.candidate
        mean_nll = self.problem.mix.mean_nll(race.nll, race.tokens) if status == "scored" else None
        finite = mean_nll is not None and math.isfinite(mean_nll)
        if status == "scored" and not finite:
            self._log(f"search: candidate {candidate.genome.key} scored {mean_nll}; ranked last")
        windows = {"windows": self.problem.windows_hash} if self.problem.windows_hash else {}
        return {
            "key": candidate.genome.key,
            "status": status,
            "generation": candidate.generation,
            "seed": self.optimizer.seed_names.get(candidate.genome.key),
            "factors": [round(float(f), 6) for f in candidate.factors],
            "n_hat": candidate.genome.n_hat,
            "attention_factor": candidate.method.attention_factor,
            "mean_nll": mean_nll if finite else None,
            "perplexity": math.exp(mean_nll) if finite else None,
            "nll": [v if math.isfinite(v) else None for v in race.nll],
            "tokens": list(race.tokens),
            **windows,
        }

    # ---- progress and state ----

    def _end_generation(self, seconds: float) -> None:
        _, best_nll = self.optimizer.best()
        self.generation_seconds.append(seconds)
        self.best_by_generation.append(best_nll)
        patience = None if self.descent else self.settings.early_stop.patience  # descent stops on held-out windows
        if patience and len(self.best_by_generation) > patience:
            gain = self.best_by_generation[-patience - 1] - best_nll
            # sticky: in steady mode candidates still out are told after the stop and may cross a boundary
            self.stopped_early = self.stopped_early or gain < self.settings.early_stop.min_improvement
        self._log(self._generation_line(seconds))
        self.heartbeat.beat()
        self._tell_watcher()

    def _tell_watcher(self) -> None:
        """The run's progress, counted from its history as `status` counts it, to the watcher (if any)."""
        if self.watcher is None:
            return
        best, (forward, backward) = best_of(self.history), window_passes(self.history)
        done = final_count(self.history)
        nll = best["mean_nll"] if best else None
        self.watcher.update(Progress(self.optimizer.generation - 1, done, forward, backward, nll))

    def _generation_line(self, seconds: float) -> str:
        """The line for the generation just ended (`generation_log.generation_line`), with the countdown of the
        early stop in force: descent's on its held-out windows, the others' on the best by generation."""
        if self.descent:
            countdown = held_out_countdown_text(self.optimizer, self.settings.gradient)
        else:
            countdown = countdown_text(self.best_by_generation, self.settings.early_stop, self.stopped_early)
        return generation_line(
            self.optimizer.generation - 1,
            self.total_generations,
            self.best_by_generation,
            self.history,
            racing=self.settings.racing.enabled,
            countdown=countdown,
            seconds=seconds,
            descent_steps=self.optimizer.steps if self.descent else None,
        )

    def _log(self, line: str) -> None:
        """One whole plain line to the reporter (the core never prints)."""
        self.reporter.log(line)

    def _write_state(self) -> None:
        self.run_dir.write_state(
            {
                "evolution": self.optimizer.state_dict(),
                "generation_seconds": self.generation_seconds,
                **({"polish_seconds": self.polish_seconds} if self.polish_seconds else {}),
                "best_by_generation": [v if math.isfinite(v) else None for v in self.best_by_generation],
                "stopped_early": self.stopped_early,
                "finished": self.finished,
                "exhausted": self.exhausted,
                "total_generations": self.total_generations,
            }
        )

    def _fresh_in_generation(self, generation: int) -> int:
        return sum(1 for record in self.history.values() if record["generation"] == generation)

    def _best_perplexity_text(self) -> str:
        best = best_of(self.history)
        return f"{best['perplexity']:.4f}" if best else "-"

    def _expected_evaluations(self) -> int:
        """Candidates the run scores at most: the GA's budget; descent's seeds, steps and rounding; the hybrid's
        GA budget and each polish's steps and rounding."""
        settings, gradient = self.settings, self.settings.gradient
        if self.descent:
            return len(self.problem.seeds) + gradient.steps + 1
        per_generation = settings.mutations + settings.crossovers
        budget = settings.population + per_generation * settings.generations
        if settings.optimizer == "hybrid":
            budget += gradient.polishes(settings.generations) * (gradient.polish_steps + 1)
        return budget


def _score_of(record: dict[str, Any]) -> float:
    """A record's score for the optimizer: its mean NLL, or inf (ranked last) when it has none."""
    return math.inf if record["mean_nll"] is None else float(record["mean_nll"])
