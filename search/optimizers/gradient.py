"""Gradient descent on the factors: the fitness is differentiable in every lambda_i, so descend it.

Perplexity depends on a factor only through cos/sin of p * theta^(-2i/d) / lambda_i (and on the attention factor,
which multiplies cos and sin), so one backward pass through the model's input path gives d NLL / d lambda for
every pair at once (the workers compute it: `Scorer.score_with_gradient`). Descent here is plain numpy over an
unconstrained vector u whose every point satisfies the official constraints, stepped by Adam or, in the hybrid's
polish, judged by a backtracking line search (descent_space.py, line_search.py).

`GradientDescent` is a `Searcher` (searcher.py) like the other optimizers, and its generations are: 0, the seeds
scored on every search window (forward only, as the GA's generation 0); 1..steps, one point each, its factors
rounded to 6 decimals (what history.jsonl records is exactly what was scored), with a backward pass on the step's
gradient windows and a forward pass on the others; then one last generation, the best point rounded to the search grid,
scored forward, so the export is the grid's factors only when they do not lose (`best_of` picks). The search
windows are split: the last `holdout_windows` are never in a gradient, and a step whose mean NLL on them has not
improved by `min_improvement` for `patience` steps ends the descent. Its whole state (u, Adam's moments, the
step, the held-out best) is JSON; nothing in it is random, so a run is reproducible and resumes exactly.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from longrope.search.config.search_section import GradientConfig
from longrope.search.optimizers.descent_space import Adam, Parametrization
from longrope.search.optimizers.descent_state import DescentState
from longrope.search.optimizers.genome import Genome, GenomeGrid, Seed
from longrope.search.optimizers.history_record import RECORDED_DECIMALS, HistoryRecord, recorded_factors
from longrope.search.optimizers.labels import generation_label
from longrope.search.optimizers.line_search import BacktrackingLineSearch
from longrope.search.optimizers.objective import ObjectiveMix, subset_mix
from longrope.search.optimizers.searcher import (
    Candidate,
    GenerationEnd,
    Searcher,
    SearcherState,
    SearchPlan,
    best_score,
    json_score,
)


def point_key(factors: np.ndarray, attention_factor: float | None) -> str:
    """A descent point's identity: its recorded values (a grid candidate's key hashes its grid steps instead)."""
    payload = json.dumps(["descent", recorded_factors(factors), attention_factor])
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class WindowSplit:
    """Search windows [0, gradient) give gradients, [gradient, total) are held out for the stopping rule; a step
    takes a block of `per_step` gradient windows, the blocks in turn."""

    total: int
    gradient: int
    per_step: int

    @classmethod
    def of(cls, settings: GradientConfig, total: int) -> WindowSplit:
        gradient = total - settings.holdout_windows
        return cls(total, gradient, settings.windows_per_step or gradient)

    def block(self, step: int) -> tuple[int, int]:
        """The gradient windows of step `step` (1-based): [0, k), [k, 2k), ... cycling."""
        blocks = math.ceil(self.gradient / self.per_step)
        start = ((step - 1) % blocks) * self.per_step
        return start, min(start + self.per_step, self.gradient)

    @property
    def held_out(self) -> tuple[int, int]:
        return self.gradient, self.total


class GradientState(SearcherState):
    """`GradientDescent`'s state: the generation, every told point's score (by key), and the descent itself."""

    generation: int = Field(ge=0)
    told: list[list[Any]]  # [key, score or null]
    descent: DescentState

    def told_scores(self) -> dict[str, float]:
        return {str(key): math.inf if score is None else float(score) for key, score in self.told}


class GradientDescent(Searcher):
    """Descent as a `Searcher` (searcher.py); see the module docstring for its generations. `start` skips the
    seeds: descent from a given point (the hybrid's polish)."""

    kind = "gradient"
    state_model = GradientState
    descends = True  # no n_hat (not differentiable), every pair, the long factors, one point a generation

    def __init__(
        self,
        settings: GradientConfig,
        grid: GenomeGrid,
        seeds: list[Seed],
        mix: ObjectiveMix,
        *,
        steps: int | None = None,
        learning_rate: float | None = None,
        start: Seed | None = None,
        patience: bool = True,
        line_search: bool = False,
        probes: int = 1,
    ):
        super().__init__(settings, grid, seeds)
        self.mix = mix
        self.steps = settings.steps if steps is None else steps
        self.learning_rate = settings.learning_rate if learning_rate is None else learning_rate
        self.split = WindowSplit.of(settings, len(mix.objectives))
        attention = (grid.attention_low * grid.attention_step, grid.attention_high * grid.attention_step)
        self.param = Parametrization(
            grid.pairs, grid.high * grid.step, attention if grid.searched_attention else None, grid.step / 2
        )
        self.seed_genomes = _unique_genomes([grid.from_seed(seed) for seed in seeds])
        self.seed_names = {grid.from_seed(seed).key: seed.name for seed in seeds}
        self.patience = settings.patience if patience else None
        self.generation = 1 if start is not None else 0
        self.u: np.ndarray | None = None if start is None else self.param.inverse(start.factors, start.attention_factor)
        self.adam = Adam.fresh(self.learning_rate, self.param.size)
        self.line_search = BacktrackingLineSearch(self.learning_rate) if line_search else None  # instead of Adam
        self.probes = probes if line_search else 1  # line-search trials a step scores at once
        self.scores: dict[str, float] = {}  # every told point's mean NLL on all search windows
        self.points: dict[str, list[Any]] = {}  # key -> [factors, attention] of every told point
        self.best_held_out = math.inf
        self.since_gain = 0
        self.rounded = False  # the last generation (the best point on the grid) is told
        self.final: Genome | None = None  # that point's genome
        self.pending: dict[str, Candidate] = {}
        self._asked: list[Candidate] = []  # the generation out now, in the order asked
        self._results: dict[str, HistoryRecord] = {}  # its results told so far
        self._genomes: dict[str, Genome] = {}  # the asked points that lie on the grid (seeds, the rounding)

    @classmethod
    def from_config(cls, settings, grid: GenomeGrid, seeds: list[Seed], mix: ObjectiveMix | None) -> GradientDescent:
        """The configured descent (`settings`: the search section); the search windows' objective mix is needed
        to hold some windows out and to weigh the others' gradients."""
        if mix is None:
            raise ValueError("optimizer 'gradient': the search windows' objective mix is needed")
        return cls(settings.gradient, grid, seeds, mix)

    # ---- the searcher interface ----

    @property
    def total_generations(self) -> int:
        """Generation 0 (the seeds), `steps` steps, the rounding to the grid."""
        return 2 + self.steps

    @property
    def budget(self) -> int:
        return len(self.seed_genomes) + step_points(self.steps, self.probes) + 1

    @staticmethod
    def descent_steps(search) -> int | None:
        """Steps of a run whose generations are descent steps (the log names them); None: generations are not."""
        return search.gradient.steps

    @staticmethod
    def generations_range(search) -> tuple[int, int]:
        """The seeds, the steps, the best point rounded to the grid."""
        return 2 + search.gradient.steps, 2 + search.gradient.steps

    @staticmethod
    def plan(search, seeds: int) -> SearchPlan:
        """The seeds, one point per step (each with a backward pass on its gradient windows), then the best point
        rounded to the grid."""
        steps = search.gradient.steps
        return SearchPlan(seeds + steps + 1, steps, f"{seeds} seeds + {steps} steps + 1 on the grid")

    def done(self) -> bool:
        return self.rounded

    def best(self) -> tuple[str, float]:
        return best_score(self.scores)

    def ask(self, count: int = 1) -> list[Candidate]:
        """The next generation when none of it is out: the seeds, one step's point, or the best point on the grid
        (`count` ignored: a generation is what it is)."""
        if self.pending or self.done():
            return []
        if self.u is None:
            batch = [self._grid_point(genome) for genome in self.seed_genomes]
        elif self._descending():
            batch = list({point.key: point for point, _ in self._step_points()}.values())  # a repeat scored once
        else:
            batch = [self._rounded_point()]
        self.pending = {point.key: point for point in batch}
        self._asked = list(batch)
        return batch

    def tell(self, results: Sequence[HistoryRecord]) -> list[GenerationEnd]:
        """Take each point's result (its mean NLL on every window, and for a step its objective's gradient on the
        step's windows); a whole generation told moves descent on."""
        self._results.update((result.key, result) for result in results)
        if self._results.keys() < self.pending.keys():
            return []
        told, self._asked, self.pending = self._asked, [], {}
        for point in told:  # in the order asked: the state is the same however results came
            result = self._results[point.key]
            self.scores[point.key] = result.score
            self.points[point.key] = [list(result.factors), result.attention_factor]
        results, self._results = self._results, {}
        before = self.generation
        if self.u is None:
            best = min(told, key=lambda p: (self.scores[p.key], p.key))
            self.u = self.param.inverse(best.factors, best.attention_factor)
        elif not self._descending() or told[0].key in self._genomes:
            self.rounded, self.final = True, self._genomes[told[0].key]
        elif self._trialled():
            self._judge_trials(results)
        else:
            self._descend(told[0], results[told[0].key])
        self.generation += 1
        return [self._generation_end(before, {point.key for point in told})]

    def _generation_end(self, generation: int, told: set[str]) -> GenerationEnd:
        previous = min((score for key, score in self.scores.items() if key not in told), default=math.inf)
        label = generation_label(generation, self.total_generations, self.steps)
        return GenerationEnd(label, generation, self.best()[1], previous, self.countdown())

    def countdown(self) -> str:
        """The held-out stop's countdown: steps since the held-out windows' NLL last gained `min_improvement`."""
        if not self.patience or not self.since_gain:
            return ""
        stop = ": early stop" if self.stopped_early else ""
        gain = f"no gain >= {self.settings.min_improvement:g}"
        return f"  held-out: {gain} for {self.since_gain}/{self.patience} steps{stop}"

    def position(self) -> str:
        return generation_label(self.generation, self.total_generations, self.steps)

    # ---- descent ----

    def _descending(self) -> bool:
        stalled = self.patience is not None and self.since_gain >= self.patience
        return self.generation <= self.steps and not stalled

    @property
    def stopped_early(self) -> bool:
        return self.patience is not None and self.since_gain >= self.patience and self.generation <= self.steps

    def _trialled(self) -> bool:
        """Whether this step scores line-search trials (probes, from an anchor) rather than one point."""
        return self.probes > 1 and self.line_search.anchor is not None

    def _step_points(self) -> list[tuple[Candidate, np.ndarray]]:
        """This step's point, or with line-search probes its trials from the anchor (`BacktrackingLineSearch.trials`),
        each with its u, in the order they are judged. Trials that record as the same point (alpha halved below
        the recorded decimals) are all kept here: one at a time would judge such a point again, at the smaller
        alpha; `ask` sends it once."""
        trials = self.line_search.trials(self.probes) if self._trialled() else [self.u]
        return [(self._step_point(u), u) for u in trials]

    def _step_point(self, u: np.ndarray) -> Candidate:
        factors = np.round(self.param.factors(u), RECORDED_DECIMALS)
        attention = self.param.attention_factor(u)
        attention = None if attention is None else round(attention, RECORDED_DECIMALS)
        key = point_key(factors, attention)
        return Candidate(key, self.generation, factors, attention, gradient_windows=self.split.block(self.generation))

    def _judge_trials(self, results: dict[str, HistoryRecord]) -> None:
        """A step's line-search trials, judged in the order one at a time would have tried them, each as that step
        would have been (its held-out NLL counted, its gradient pulled back at its own u), up to the first the
        line search accepts; the rest are dropped. The trials are rebuilt from the state they were asked from
        (nothing has changed it since), so a resumed run judges them alike. One at a time would also score each
        trial on the next step's gradient windows: the two agree exactly when every step takes every gradient
        window (`windows_per_step` null, the default)."""
        for point, u in self._step_points():
            accepted = self.line_search.accepted
            self._descend_from(u, results[point.key])
            if self.line_search.accepted > accepted:
                return

    def _descend(self, point: Candidate, result: HistoryRecord) -> None:
        self._descend_from(self.u, result)

    def _descend_from(self, u: np.ndarray, result: HistoryRecord) -> None:
        """One step's result at u (its search NLL, its held-out NLL, its gradient): the held-out stop's count, then
        u moved on by Adam or judged by the line search."""
        gradient = result.gradient
        if not finite_gradient(result) and self.line_search is not None:  # refused: alpha halves, the anchor stays
            self.u = self.line_search.next_point(u, math.inf, np.full(self.param.size, math.nan))
            return
        if not finite_gradient(result):
            self.since_gain = self.patience or self.steps  # no finite gradient: nothing to descend on
            return
        held_out = self._held_out_nll(result)
        if held_out < self.best_held_out - self.settings.min_improvement:
            self.best_held_out, self.since_gain = held_out, 0
        else:
            self.since_gain += 1
        grad_u = self.param.pullback(u, np.asarray(gradient[: self.grid.pairs]), float(gradient[self.grid.pairs]))
        if self.line_search is not None:
            self.u = self.line_search.next_point(u, result.score, grad_u)
        else:
            self.u = self.adam.step(u, grad_u)

    def _held_out_nll(self, result: HistoryRecord) -> float:
        start, stop = self.split.held_out
        nll = result.nll[start:stop]
        if any(v is None for v in nll):
            return math.inf
        return subset_mix(self.mix, (start, stop)).mean_nll(nll, result.tokens[start:stop])

    def rounded_genome(self) -> Genome:
        """The descent's result on the grid (told in its last generation)."""
        if self.final is None:
            raise ValueError("the descent has not rounded its best point to the grid yet")
        return self.final

    def _grid_point(self, genome: Genome) -> Candidate:
        self._genomes[genome.key] = genome
        return self.grid.candidate(genome, self.generation, self.seed_names.get(genome.key))

    def _rounded_point(self) -> Candidate:
        key, _ = self.best()
        factors, attention = self.points[key]
        return self._grid_point(self.grid.genome(np.asarray(factors), attention))

    # ---- state ----

    def state(self) -> GradientState:
        descent = DescentState(
            u=None if self.u is None else self.u.tolist(),
            adam=self.adam.state_dict(),
            best_held_out=json_score(self.best_held_out),
            since_gain=self.since_gain,
            rounded=self.rounded,
            final=None if self.final is None else self.final.to_json(),
            points=self.points,
            line_search=None if self.line_search is None else self.line_search.state(),
        )
        told = [[key, json_score(score)] for key, score in self.scores.items()]
        return GradientState(generation=self.generation, told=told, descent=descent)

    def load_state(self, state: dict[str, Any] | GradientState) -> None:
        state = GradientState.model_validate(state)
        descent = state.descent
        self.generation = state.generation
        self.scores = {str(key): math.inf if score is None else float(score) for key, score in state.told}
        self.points = {str(key): list(value) for key, value in descent.points.items()}
        self.u = None if descent.u is None else np.asarray(descent.u, dtype=np.float64)
        for name, values in (("u", descent.u), ("adam.m", descent.adam.m)):
            if values is not None and len(values) != self.param.size:
                raise ValueError(f"descent.{name}: {len(values)} values, the run's space has {self.param.size}")
        self.adam = Adam.from_state(self.learning_rate, descent.adam.model_dump())
        self.best_held_out = math.inf if descent.best_held_out is None else float(descent.best_held_out)
        self.since_gain = descent.since_gain
        self.rounded = descent.rounded
        self.final = None if descent.final is None else Genome.from_json(descent.final)
        if self.line_search is not None:
            self.line_search = BacktrackingLineSearch(self.learning_rate)
            if descent.line_search is not None:
                self.line_search.load_state(descent.line_search)
        self.pending, self._asked, self._results = {}, [], {}


def step_points(steps: int, probes: int) -> int:
    """Points `steps` steps score: one each, or with line-search probes the first (from the start, no anchor yet)
    one and each later step `probes` trials."""
    return steps if probes == 1 or steps == 0 else 1 + (steps - 1) * probes


def finite_gradient(result: HistoryRecord) -> bool:
    return result.gradient is not None and all(v is not None and math.isfinite(v) for v in result.gradient)


def _unique_genomes(genomes: list[Genome]) -> list[Genome]:
    return list({genome.key: genome for genome in genomes}.values())
