"""The one place that builds a searcher from a config, the registry of the optimizers by name, and the config rules
read from their capability flags.

The coordinator drives any `Searcher` (searcher.py); it never builds one itself, so a new optimizer is a subclass
with `ask`, `tell`, `plan` and a state model, plus one entry in SEARCHERS (`register`). What the rest of the code
needs to know of an optimizer (its budget: `searcher_class(kind).plan(...)`; whether it can race, screen, search
n_hat: its flags) it asks the class, never by comparing names. The config layer sits below this one and knows no
optimizer, so the settings an optimizer cannot honour are refused here (`config_problem`), where every command that
reads a config (`load_job_config` below, `RunDir.read_config`) and `make_searcher` ask.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from longrope.search.config.job_config import JobConfig
from longrope.search.config.loading import read_job_config
from longrope.search.config.optimizer_sections import register_section
from longrope.search.config.search_section import SearchConfig
from longrope.search.config.strict import JobConfigError, Strict
from longrope.search.optimizers.cmaes import CmaesOptimizer
from longrope.search.optimizers.evolution import DimMonoEvolution
from longrope.search.optimizers.genome import GenomeGrid, Seed
from longrope.search.optimizers.gradient import GradientDescent
from longrope.search.optimizers.hybrid import HybridSearch
from longrope.search.optimizers.objective import ObjectiveMix
from longrope.search.optimizers.searcher import Searcher, SearchPlan

SEARCHERS: dict[str, type[Searcher]] = {}


def register(cls: type[Searcher]) -> type[Searcher]:
    """Add an optimizer under its `kind` (what `search.optimizer` names and state.json's optimizer.kind holds), and
    its settings model, when it has one, as the config's `search.<kind>:` section."""
    kind = getattr(cls, "kind", None)
    if not kind or kind in SEARCHERS:
        raise ValueError(f"an optimizer needs a kind of its own, got {kind!r}")
    if cls.settings_model is not None and kind in SearchConfig.model_fields:
        raise ValueError(f"optimizer {kind!r}: its settings section would take the name of search.{kind}")
    if cls.settings_model is not None and not issubclass(cls.settings_model, Strict):
        raise ValueError(f"optimizer {kind!r}: settings_model must be a config.strict.Strict model (as every section)")
    SEARCHERS[kind] = cls
    if cls.settings_model is not None:
        register_section(kind, cls.settings_model)
    return cls


for _searcher in (DimMonoEvolution, CmaesOptimizer, GradientDescent, HybridSearch):
    register(_searcher)

# (a setting in force, the flag an optimizer needs for it, the field, what it is): `config_problem` reads these
CAPABILITY_RULES: tuple[tuple[Callable[[SearchConfig], bool], str, str, str], ...] = (
    (lambda s: s.racing.enabled, "supports_racing", "racing.enabled", "racing"),
    (lambda s: s.schedule == "steady", "supports_steady", "schedule", "'steady'"),
    (lambda s: s.n_hat.enabled, "supports_n_hat", "n_hat.enabled", "searching n_hat"),
    (lambda s: s.space == "longrope2", "supports_longrope2", "space", "'longrope2'"),
    (lambda s: s.factor == "short", "supports_short_factor", "factor", "'short'"),
    (lambda s: s.surrogate.enabled, "supports_surrogate", "surrogate.enabled", "the surrogate"),
)


def searcher_class(kind: str) -> type[Searcher]:
    return SEARCHERS[kind]


def search_problem(settings: SearchConfig) -> str | None:
    """The first setting of the search section its optimizer cannot honour, as an error line naming the field;
    None when there is none."""
    kind = settings.optimizer
    if kind not in SEARCHERS:
        return f"search.optimizer = {kind!r}: unknown optimizer; one of {', '.join(SEARCHERS)}"
    cls = SEARCHERS[kind]
    for in_force, flag, field, what in CAPABILITY_RULES:
        if in_force(settings) and not getattr(cls, flag):
            able = " or ".join(repr(name) for name, other in SEARCHERS.items() if getattr(other, flag))
            return f"search.{field}: {what} needs optimizer {able or '(none)'}, got {kind!r}"
    return None


def config_problem(config: JobConfig) -> str | None:
    """`search_problem`, then what descent needs of the search windows (`descends`): the gradient's own and held-out
    ones (search.gradient.holdout_windows, windows_per_step)."""
    problem = search_problem(config.search)
    if problem or not SEARCHERS[config.search.optimizer].descends:
        return problem
    gradient, windows = config.search.gradient, config.data.search_windows * len(config.data.objective_weights())
    if gradient.holdout_windows >= windows:
        return (
            f"search.gradient.holdout_windows: must leave the gradient at least one of the {windows} search windows, "
            f"got {gradient.holdout_windows}"
        )
    if (gradient.windows_per_step or 0) > windows - gradient.holdout_windows:
        return (
            f"search.gradient.windows_per_step: at most the {windows - gradient.holdout_windows} gradient windows "
            f"(search windows less holdout_windows), got {gradient.windows_per_step}"
        )
    return None


def load_job_config(path: str | Path | None, overrides: list[str] = (), base: dict | None = None) -> JobConfig:
    """`config.loading.read_job_config` (YAML, `--set`s, the model's checks), then what the optimizer cannot
    honour (`config_problem`): the one loader of a user's config, every problem one line naming the field."""
    config = read_job_config(path, overrides, base)
    problem = config_problem(config)
    if problem:
        raise JobConfigError(f"{path or 'config'}: {problem}")
    return config


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
    """The configured optimizer on its grid (refused, like a config, when it cannot honour the settings).
    critical_dim: the resolved critical dimension for the longrope2 space (`genome.resolve_space(...)
    .critical_dim`); None: search.critical_dim as configured. `mix`: the search windows' objectives, which descent
    needs to hold some out and to weigh the others' gradients."""
    problem = search_problem(settings)
    if problem:
        raise ValueError(problem)
    grid = GenomeGrid(settings, pairs=pairs, scale=scale, critical_dim=critical_dim)
    return searcher_class(settings.optimizer).from_config(settings, grid, seeds, mix)
