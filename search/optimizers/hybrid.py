"""The hybrid optimizer: LongRoPE's evolution, with its best candidate polished by gradient steps every
`search.gradient.polish_every` generations and after its last, the polished point rounded to the grid entering the
population as a child (a memetic search: Moscato 1989; the GA explores, descent refines what it found).

A composition of two searchers (searcher.py): the release's `DimMonoEvolution`, untouched, and a `GradientDescent`
started at the evolution's best (no seeds, no held-out stopping: `polish_steps` steps at `polish_learning_rate`,
then its best point rounded to the grid). Asks and tells go to whichever is running; a polish runs between two
generations, once the generation before it is all told. Both states are JSON in state.json (a polish in progress
included), so a killed hybrid run resumes exactly where it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pydantic import Field

from longrope.search.config.search_section import SearchConfig
from longrope.search.optimizers.evolution import DimMonoEvolution, EvolutionState
from longrope.search.optimizers.genome import Genome, GenomeGrid, Seed
from longrope.search.optimizers.gradient import GradientDescent, GradientState, step_points
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.optimizers.labels import generation_label, polish_position
from longrope.search.optimizers.objective import ObjectiveMix
from longrope.search.optimizers.searcher import (
    Candidate,
    GenerationEnd,
    PolishProgress,
    Searcher,
    SearcherState,
    SearchPlan,
    SearchProgress,
)


class HybridState(SearcherState):
    """`HybridSearch`'s state: the evolution's, a polish in progress (or none), the last generation polished."""

    evolution: EvolutionState
    polish: GradientState | None = None
    polished_through: int = Field(default=0, ge=0)

    @property
    def generation(self) -> int:
        return self.evolution.generation

    @property
    def stopped_early(self) -> bool:
        return self.evolution.stopped_early


class HybridSearch(Searcher):
    """The evolution and its polishes as one `Searcher` (see the module docstring). Its children can be screened;
    what descent cannot follow (n_hat, longrope2, short factors, racing, the steady schedule) it does not take."""

    kind = "hybrid"
    state_model = HybridState
    supports_surrogate = True
    descends = polishes = True

    def __init__(self, settings: SearchConfig, grid: GenomeGrid, seeds: list[Seed], mix: ObjectiveMix):
        super().__init__(settings, grid, seeds)
        self.mix = mix
        self.evolution = DimMonoEvolution(settings, grid, seeds)
        self.polish: GradientDescent | None = None
        self.polished_through = 0  # the last generation whose best was polished

    @classmethod
    def from_config(cls, settings: SearchConfig, grid: GenomeGrid, seeds: list[Seed], mix: ObjectiveMix | None):
        if mix is None:
            raise ValueError("optimizer 'hybrid': the search windows' objective mix is needed")
        return cls(settings, grid, seeds, mix)

    @property
    def generation(self) -> int:
        return self.evolution.generation

    @property
    def total_generations(self) -> int:
        return self.evolution.total_generations

    @staticmethod
    def plan(search: SearchConfig, seeds: int) -> SearchPlan:
        """The GA's budget, plus each polish's steps (with a backward pass) and its best rounded to the grid."""
        ga, gradient = DimMonoEvolution.plan(search, seeds), search.gradient
        polishes = gradient.polishes(search.generations)
        word = "polish" if polishes == 1 else "polishes"
        steps, probes = gradient.polish_steps, gradient.polish_probes
        points = step_points(steps, probes)
        trials = f"{steps} steps" if probes == 1 else f"{steps} steps, {points} line-search trials"
        text = f"{ga.text} + {polishes} {word} x ({trials} + 1 on the grid)"
        return SearchPlan(ga.candidates + polishes * (points + 1), polishes * points, text)

    # ---- the searcher interface ----

    def ask(self, count: int) -> list[Candidate]:
        if self.polish is None and self.polish_due():
            self.polish = polish_descent(self.settings, self.grid, self.mix, self._evolution_best())
        if self.polish is not None:  # its steps carry the generation the evolution is at (after the one polished)
            return [replace(c, generation=self.evolution.generation) for c in self.polish.ask(count)]
        return self.evolution.ask(count)

    def tell(self, results: Sequence[HistoryRecord]) -> list[GenerationEnd]:
        if self.polish is None or any(r.key not in self.polish.pending for r in results):
            return self.evolution.tell(results)
        after = self.evolution.generation - 1
        ends = [self._polish_end(end, after) for end in self.polish.tell(results)]
        if self.polish.done():
            rounded = self.polish.rounded_genome()
            self.evolution.adopt(rounded, self.polish.scores[rounded.key])
            self.polished_through, self.polish = after, None
        return ends

    def _polish_end(self, end: GenerationEnd, after: int) -> GenerationEnd:
        """A polish step's line: which polish, which step (the one just told), the polish's own best."""
        steps, done = self.polish.steps, end.generation - 1
        label = f"polish after generation {after}, {polish_position(done, steps)}"
        return GenerationEnd(label, after, end.best, end.previous_best, polish=True)

    def done(self) -> bool:
        return self.evolution.done() and self.polish is None and not self.polish_due()

    def polish_due(self) -> bool:
        """A polish is under way, or the generation just done is all told, not polished yet, and a multiple of
        polish_every or the evolution's last (its final generation, its early stop, or no new child possible).
        The final best is always polished: the polish's gain is largest where the GA has converged."""
        if self.polish is not None:
            return True
        done, last = self.evolution.generation - 1, self.evolution.total_generations - 1
        if done <= self.polished_through or self.evolution.pending:
            return False
        return self.settings.gradient.polishes_after(done, last, self.evolution.done())

    def best(self) -> tuple[str, float]:
        return self.evolution.best()

    def threshold(self) -> str | None:
        return None if self.polish is not None else self.evolution.threshold()

    def position(self) -> str:
        """Where the run goes on from: its next generation, or the polish between two generations, as "the polish
        after generation g/last, step k/n" (its steps carry the generation after g, which printed as a generation
        would read as past the run's end)."""
        if not self.polish_due():
            return self.evolution.position()
        steps_done = 0 if self.polish is None else self.polish.generation - 1
        done, last = self.evolution.generation - 1, self.total_generations - 1
        where = polish_position(steps_done, self.settings.gradient.polish_steps)
        return f"the polish after {generation_label(done, last + 1).removesuffix(' (initial population)')}, {where}"

    @property
    def stopped_early(self) -> bool:
        return self.evolution.stopped_early

    def progress(self) -> SearchProgress:
        """The evolution's, with the polish under way or due now (its steps carry the generation after the one
        it polishes)."""
        polish = None
        if self.polish_due():
            steps = self.settings.gradient.polish_steps
            done = 0 if self.polish is None else min(self.polish.generation - 1, steps)
            rounded = self.polish is not None and self.polish.rounded
            polish = PolishProgress(after_generation=self.generation - 1, steps_done=done, steps=steps, rounded=rounded)
        return self.evolution.progress().model_copy(update={"polish": polish})

    def _evolution_best(self) -> Genome:
        return self.evolution.genomes[self.evolution.best()[0]]

    # ---- state ----

    def state(self) -> HybridState:
        polish = None if self.polish is None else self.polish.state()
        return HybridState(evolution=self.evolution.state(), polish=polish, polished_through=self.polished_through)

    def load_state(self, state: dict[str, Any] | HybridState) -> None:
        state = HybridState.model_validate(state)
        self.evolution.load_state(state.evolution)
        self.polished_through = state.polished_through
        self.polish = None
        if state.polish is not None:
            self.polish = polish_descent(self.settings, self.grid, self.mix, self._evolution_best())
            self.polish.load_state(state.polish)


def polish_descent(settings: SearchConfig, grid: GenomeGrid, mix: ObjectiveMix, start: Genome) -> GradientDescent:
    """A polish of `start` (the evolution's best when it begins): `polish_steps` steps from `polish_learning_rate`,
    by backtracking line search (line_search.py) or Adam (`polish_method`), no seeds and no held-out stop. One
    builder for the run, its resume and `run_check`'s replay of it."""
    gradient = settings.gradient
    return GradientDescent(
        gradient,
        grid,
        [],
        mix,
        steps=gradient.polish_steps,
        learning_rate=gradient.polish_learning_rate,
        start=Seed("polish", grid.factors(start), grid.attention_factor(start)),
        patience=False,
        line_search=gradient.polish_method == "line_search",
        probes=gradient.polish_probes,
    )
