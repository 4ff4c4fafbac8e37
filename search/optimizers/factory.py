"""The one place that builds a searcher from a config, and the registry of the optimizers by name.

The coordinator drives any `Searcher` (searcher.py); it never builds one itself, so a new optimizer is a class
with that interface and one entry in SEARCHERS. What the rest of the code needs to know of an optimizer (its
budget: `searcher_class(kind).plan(...)`) it asks the class, never by comparing names.
"""

from __future__ import annotations

from longrope.search.config.search_section import SearchConfig
from longrope.search.optimizers.cmaes import CmaesOptimizer
from longrope.search.optimizers.evolution import DimMonoEvolution
from longrope.search.optimizers.genome import GenomeGrid, Seed
from longrope.search.optimizers.gradient import GradientDescent
from longrope.search.optimizers.hybrid import HybridSearch
from longrope.search.optimizers.objective import ObjectiveMix
from longrope.search.optimizers.searcher import Searcher, SearchPlan

SEARCHERS = {cls.kind: cls for cls in (DimMonoEvolution, CmaesOptimizer, GradientDescent, HybridSearch)}


def searcher_class(kind: str) -> type:
    return SEARCHERS[kind]


def state_model(kind: str) -> type:
    """The pydantic model of a searcher's state (state.json's optimizer.state)."""
    return SEARCHERS[kind].state_model


def search_plan(settings: SearchConfig, seeds: int) -> SearchPlan:
    """What one search of the configured optimizer scores at most (its class's `plan`)."""
    return searcher_class(settings.optimizer).plan(settings, seeds)


def make_searcher(
    settings: SearchConfig,
    *,
    pairs: int,
    scale: float,
    seeds: list[Seed],
    critical_dim: int | None = None,
    mix: ObjectiveMix | None = None,
) -> Searcher:
    """The configured optimizer on its grid. critical_dim: the resolved critical dimension for the longrope2 space
    (`genome.resolve_space(...).critical_dim`); None: search.critical_dim as configured. `mix`: the search
    windows' objectives, which descent needs to hold some out and to weigh the others' gradients."""
    grid = GenomeGrid(settings, pairs=pairs, scale=scale, critical_dim=critical_dim)
    return searcher_class(settings.optimizer).from_config(settings, grid, seeds, mix)
