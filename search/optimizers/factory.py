"""The optimizer seam: what the coordinator needs of an optimizer, and the one place that builds it from a config.

The coordinator's loop reads like pycma's (`while not opt.stop(): genomes = opt.ask(); opt.tell(genomes, scores)`);
it never builds an optimizer itself, so a new one is a class with this shape and one line in `make_optimizer`.
"""

from __future__ import annotations

from typing import Any, Protocol

from longrope.search.config.search_section import SearchConfig
from longrope.search.optimizers.cmaes import CmaesOptimizer
from longrope.search.optimizers.evolution import DimMonoEvolution
from longrope.search.optimizers.genome import Genome, GenomeGrid, Seed
from longrope.search.optimizers.gradient import GradientDescent
from longrope.search.optimizers.hybrid import HybridSearch
from longrope.search.optimizers.objective import ObjectiveMix


class Optimizer(Protocol):
    grid: GenomeGrid
    generation: int
    seed_names: dict[str, str]  # genome key -> the seed method it came from
    scores: dict[str, float]  # every told genome's score, by key
    pending: dict[str, Genome]  # asked, not yet told

    @property
    def total_generations(self) -> int: ...

    @property
    def population(self) -> list[str]: ...

    def ask(self, count: int | None = None) -> list[Genome]: ...

    def tell(self, genomes: list[Genome], scores: list[float]) -> None: ...

    def stop(self) -> bool: ...

    def best(self) -> tuple[Genome, float]: ...

    def worst_parent(self) -> str | None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def make_optimizer(
    settings: SearchConfig,
    *,
    pairs: int,
    scale: float,
    seeds: list[Seed],
    critical_dim: int | None = None,
    mix: ObjectiveMix | None = None,
) -> Optimizer:
    """The configured optimizer on its grid. critical_dim: the resolved critical dimension for the longrope2 space
    (`genome.resolve_space(...).critical_dim`, which applies the formula when search.critical_dim is None);
    None: search.critical_dim as configured. The longrope space ignores it. `mix`: the search windows' objectives,
    which descent needs to hold some out and to weigh the others' gradients (required for gradient and hybrid)."""
    grid = GenomeGrid(settings, pairs=pairs, scale=scale, critical_dim=critical_dim)
    if settings.optimizer == "cmaes":
        return CmaesOptimizer(settings, grid, seeds)
    if settings.optimizer in ("gradient", "hybrid"):
        if mix is None:
            raise ValueError(f"optimizer {settings.optimizer!r}: the search windows' objective mix is needed")
        if settings.optimizer == "gradient":
            return GradientDescent(settings.gradient, grid, seeds, mix)
        return HybridSearch(settings, grid, seeds, mix)
    return DimMonoEvolution(settings, grid, seeds)
