"""The coordinator: the only piece that knows both the optimizer and the evaluator (the Ray worker pool).

Each generation it asks the optimizer for candidates, sends the new ones to the evaluator, records each result
the moment it arrives (history.jsonl), tells the optimizer, and writes state.json atomically. A resumed run
restores the optimizer from state.json (or, when the first generation never ended, starts it afresh from the
same seed) and takes the scores of candidates already in history.jsonl, so it reaches exactly the result of an
uninterrupted run with the same seed and never scores a candidate twice.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from longrope.encodings import RopeMethod
from longrope.search.evolution import DimMonoEvolution, Genome, Seed
from longrope.search.job_config import SearchConfig
from longrope.search.run_store import HISTORY, History, RunDir, RunStoreError, best_of
from longrope.workers.scorer import CandidateScore


class Evaluator(Protocol):
    """What the coordinator needs of a worker pool (WorkerPool has exactly this shape)."""

    def submit(self, candidates: Iterable[tuple[Hashable, RopeMethod]]) -> None: ...

    def as_completed(self) -> Iterator[tuple[Hashable, CandidateScore]]: ...


@dataclass(frozen=True)
class SearchProblem:
    """The search space of one job: how many pairs, the scale, the seeds, and genome -> candidate encoding."""

    pairs: int
    scale: float
    seeds: list[Seed]
    make_candidate: Callable[..., RopeMethod]  # (factors, attention_factor=None, n_hat=0) -> RopeMethod


class Coordinator:
    def __init__(
        self,
        settings: SearchConfig,
        problem: SearchProblem,
        run_dir: RunDir,
        evaluator: Evaluator,
        *,
        console: Console | None = None,
        show_progress: bool = True,
    ):
        self.settings, self.problem, self.run_dir, self.evaluator = settings, problem, run_dir, evaluator
        self.console = console or Console(stderr=True)
        self.show_progress = show_progress
        self.evolution = DimMonoEvolution(settings, pairs=problem.pairs, scale=problem.scale, seeds=problem.seeds)
        self.history: dict[str, dict[str, Any]] = {}
        self.generation_seconds: list[float] = []
        self.best_by_generation: list[float] = []
        self.stopped_early = False

    @property
    def total_generations(self) -> int:
        """The initial population, then `generations` rounds of mutation and crossover."""
        return 1 + self.settings.generations

    def resume(self) -> History:
        """Load what the run directory holds; writes nothing, so a damaged directory is left as it was.

        Returns the history as read, so the caller can cut a torn last line once every check has passed."""
        history = self.run_dir.load_history()
        state = self.run_dir.read_state()
        if state is not None:
            try:
                self.evolution.load_state_dict(state["evolution"])
                self.generation_seconds = [float(v) for v in state["generation_seconds"]]
                best = state.get("best_by_generation", [])
                self.best_by_generation = [math.inf if v is None else float(v) for v in best]
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise RunStoreError(f"{self.run_dir.file('state.json')}: corrupted ({exc!r})") from None
            self.stopped_early = bool(state.get("stopped_early", False))
            lost = [key for key in self.evolution.scores if key not in history.records]
            if lost:
                raise RunStoreError(
                    f"{self.run_dir.file(HISTORY)}: lacks {len(lost)} of the {len(self.evolution.scores)} candidates "
                    f"that state.json counts as scored (first {lost[0]}); the run directory is damaged"
                )
        self.history = dict(history.records)
        return history

    @property
    def finished(self) -> bool:
        return self.stopped_early or self.evolution.generation >= self.total_generations

    def run(self) -> dict[str, Any]:
        """Run the remaining generations; returns the best candidate's history record."""
        with self._progress() as progress:
            task = progress.add_task("search", total=self._expected_evaluations(), completed=len(self.history))
            while self.evolution.generation < self.total_generations and not self.stopped_early:
                started = time.monotonic()
                genomes = self.evolution.ask()
                if not genomes:
                    self.console.print("search: no new candidate can be made around the population; stopping")
                    break
                scores = self._score(genomes, progress, task)
                self.evolution.tell(genomes, scores)
                self._end_generation(time.monotonic() - started)
        return self.best_record()

    def best_record(self) -> dict[str, Any]:
        """The best scored candidate, by the one rule that status and export also use (`run_store.best_of`)."""
        best = best_of(self.history)
        if best is None:
            raise RunStoreError("search: no candidate got a finite score; check the model and the data")
        return best

    # ---- one generation ----

    def _score(self, genomes: list[Genome], progress: Progress, task) -> list[float]:
        generation = self.evolution.generation
        fresh = {g.key: g for g in genomes if g.key not in self.history}
        candidates = {key: self._candidate(g) for key, g in fresh.items()}
        self.evaluator.submit(candidates.items())
        for key, score in self.evaluator.as_completed():
            record = self._record(fresh[key], candidates[key], score, generation)
            self.run_dir.append_history(record)  # durable before anything else uses it
            self.history[key] = record
            progress.update(task, advance=1, best=self._best_perplexity_text())
        return [_score_of(self.history[g.key]) for g in genomes]

    def _candidate(self, genome: Genome) -> RopeMethod:
        return self.problem.make_candidate(
            self.evolution.factors(genome), attention_factor=self.evolution.attention_factor(genome), n_hat=genome.n_hat
        )

    def _record(self, genome: Genome, candidate: RopeMethod, score: CandidateScore, generation: int) -> dict[str, Any]:
        mean_nll = score.mean_nll
        finite = math.isfinite(mean_nll)
        if not finite:
            self.console.print(f"search: candidate {genome.key} scored {mean_nll}; ranked last")
        return {
            "key": genome.key,
            "generation": generation,
            "seed": self.evolution.seed_names.get(genome.key),
            "factors": [round(float(f), 6) for f in self.evolution.factors(genome)],
            "n_hat": genome.n_hat,
            "attention_factor": candidate.attention_factor,
            "mean_nll": mean_nll if finite else None,
            "perplexity": math.exp(mean_nll) if finite else None,
            "nll": [v if math.isfinite(v) else None for v in score.nll],
            "tokens": list(score.tokens),
        }

    def _end_generation(self, seconds: float) -> None:
        _, best_nll = self.evolution.best()
        self.generation_seconds.append(seconds)
        self.best_by_generation.append(best_nll)
        patience = self.settings.early_stop.patience
        if patience and len(self.best_by_generation) > patience:
            gain = self.best_by_generation[-patience - 1] - best_nll
            self.stopped_early = gain < self.settings.early_stop.min_improvement
        self.run_dir.write_state(
            {
                "evolution": self.evolution.state_dict(),
                "generation_seconds": self.generation_seconds,
                "best_by_generation": [v if math.isfinite(v) else None for v in self.best_by_generation],
                "stopped_early": self.stopped_early,
                "finished": self.finished,
            }
        )
        done = self.evolution.generation
        self.console.print(
            f"generation {done}/{self.total_generations}  evaluations {len(self.history)}  "
            f"best ppl {math.exp(best_nll):.4f}  ({seconds:.1f}s, "
            f"{self._fresh_in_generation(done - 1) / max(seconds, 1e-9):.2f} eval/s)"
            + ("  early stop: no improvement" if self.stopped_early else "")
        )

    def _fresh_in_generation(self, generation: int) -> int:
        return sum(1 for record in self.history.values() if record["generation"] == generation)

    def _best_perplexity_text(self) -> str:
        finite = [r["perplexity"] for r in self.history.values() if r["perplexity"] is not None]
        return f"{min(finite):.4f}" if finite else "-"

    def _expected_evaluations(self) -> int:
        per_generation = self.settings.mutations + self.settings.crossovers
        return self.settings.population + per_generation * self.settings.generations

    def _progress(self) -> Progress:
        return SearchProgress(self.console, disable=not self.show_progress)


class SearchProgress(Progress):
    """The search progress bar: evaluations done / expected, best perplexity so far, evaluations per second."""

    def __init__(self, console: Console, *, disable: bool):
        super().__init__(
            TextColumn("[bold]search"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("evaluations  best ppl {task.fields[best]}  {task.fields[rate]} eval/s"),
            TimeElapsedColumn(),
            console=console,
            disable=disable,
        )
        self.started = time.monotonic()
        self.counted = 0

    def add_task(self, description: str, **kwargs) -> int:
        kwargs.setdefault("best", "-")
        kwargs.setdefault("rate", "-")
        return super().add_task(description, **kwargs)

    def update(self, task_id, **kwargs) -> None:
        self.counted += int(kwargs.get("advance", 0))
        kwargs["rate"] = f"{self.counted / max(time.monotonic() - self.started, 1e-9):.2f}"
        super().update(task_id, **kwargs)


def _score_of(record: dict[str, Any]) -> float:
    return math.inf if record["mean_nll"] is None else float(record["mean_nll"])
