"""The hybrid optimizer (issue 20): LongRoPE's evolution, with its best candidate polished by gradient steps every
`search.gradient.polish_every` generations, the polished point rounded to the grid entering the population as a
child (a memetic search: Moscato 1989; the GA explores, descent refines what it found).

The evolution is the release's `DimMonoEvolution`, untouched; the polish is a `GradientDescent` started at the
evolution's best (no seeds, no held-out stopping: `polish_steps` steps at `polish_learning_rate`, then its best
point rounded to the grid), run by the coordinator between two generations. Both states are JSON in state.json
(a polish in progress included), so a killed hybrid run resumes exactly where it stopped.
"""

from __future__ import annotations

from typing import Any

from longrope.search.config.search_section import SearchConfig
from longrope.search.optimizers.evolution import DimMonoEvolution
from longrope.search.optimizers.genome import Genome, GenomeGrid, Seed
from longrope.search.optimizers.gradient import GradientDescent
from longrope.search.optimizers.objective import ObjectiveMix


class HybridSearch:
    """DimMonoEvolution's ask/tell interface, plus `polish_due()`, `polisher()` and `adopt_polish()`."""

    kind = "hybrid"

    def __init__(self, settings: SearchConfig, grid: GenomeGrid, seeds: list[Seed], mix: ObjectiveMix):
        self.settings, self.grid, self.mix = settings, grid, mix
        self.evolution = DimMonoEvolution(settings, grid, seeds)
        self.polish: GradientDescent | None = None
        self.polished_through = 0  # the last generation whose best was polished

    # ---- the evolution's interface ----

    @property
    def generation(self) -> int:
        return self.evolution.generation

    @property
    def total_generations(self) -> int:
        return self.evolution.total_generations

    @property
    def seed_names(self) -> dict[str, str]:
        return self.evolution.seed_names

    @property
    def scores(self) -> dict[str, float]:
        return self.evolution.scores

    @property
    def pending(self) -> dict[str, Genome]:
        return self.evolution.pending

    @property
    def population(self) -> list[str]:
        return self.evolution.population

    def ask(self, count: int | None = None) -> list[Genome]:
        return self.evolution.ask(count)

    def tell(self, genomes: list[Genome], scores: list[float]) -> None:
        self.evolution.tell(genomes, scores)

    def stop(self) -> bool:
        return self.evolution.stop() and not self.polish_due()

    def best(self) -> tuple[Genome, float]:
        return self.evolution.best()

    def worst_parent(self) -> str | None:
        return self.evolution.worst_parent()

    # ---- the polish ----

    def polish_due(self, ending: bool = False) -> bool:
        """A polish is under way, or the generation just done is not polished yet and is a multiple of
        polish_every, or the evolution's last: its final generation, or `ending` (the coordinator's early stop,
        or no new child could be made). The final best is always polished: the polish's gain is largest where the
        GA has converged (the issue's probe: 3.69 -> 3.63 held-out from the demo's final factors)."""
        if self.polish is not None:
            return True
        done, last = self.evolution.generation - 1, self.evolution.total_generations - 1
        if done <= self.polished_through:
            return False
        return self.settings.gradient.polishes_after(done, last, ending or self.evolution.stop())

    def polisher(self) -> GradientDescent:
        """The polish under way, or a new one from the evolution's best."""
        if self.polish is None:
            self.polish = polish_descent(self.settings, self.grid, self.mix, self.evolution.best()[0])
        return self.polish

    def adopt_polish(self) -> Genome:
        """The finished polish's result (its best point on the grid) joins the evolution as a child."""
        rounded = self.polish.rounded_genome()
        self.evolution.adopt(rounded, self.polish.scores[rounded.key])
        self.polished_through, self.polish = self.evolution.generation - 1, None
        return rounded

    # ---- state ----

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.evolution.state_dict(),
            "kind": self.kind,
            "polish": None if self.polish is None else self.polish.state_dict(),
            "polished_through": self.polished_through,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise ValueError(f"kind: state.json holds a {state.get('kind')!r} optimizer, the config says hybrid")
        self.evolution.load_state_dict({**state, "kind": "dim_mono"})
        self.polished_through = int(state.get("polished_through", 0))
        self.polish = None
        if state.get("polish") is not None:
            self.polish = polish_descent(self.settings, self.grid, self.mix, self.evolution.best()[0])
            self.polish.load_state_dict(state["polish"])


def polish_descent(settings: SearchConfig, grid: GenomeGrid, mix: ObjectiveMix, start: Genome) -> GradientDescent:
    """A polish of `start` (the evolution's best when it begins): `polish_steps` steps at `polish_learning_rate`,
    no seeds and no held-out stop. One builder for the run, its resume and `run_check`'s replay of it."""
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
    )
