"""The one interface every optimizer implements: ask for candidates to score, tell their results.

Shaped like pycma's ask/tell (Hansen, `cma.CMAEvolutionStrategy.ask` / `tell`) and Ray Tune's `Searcher`
(`suggest` / `on_trial_complete`). The coordinator keeps its workers' capacity full: it asks for as many candidates
as it has room for and tells each result as it lands. What differs between a generational GA, a steady-state GA,
CMA-ES and gradient descent is only what `ask` returns:

- a generational search returns its whole next generation when nothing of it is out, and nothing until every
  result of it is told (the generation barrier lives here, not in the coordinator);
- a steady-state GA returns up to `count` children bred from the parents of the moment;
- gradient descent returns one point with the windows whose backward pass it needs (`Candidate.gradient_windows`);
- the hybrid is a GA and a descent composed: its asks and tells go to whichever of the two is running.

A candidate comes back decoded (factors and attention factor, as scored and recorded), so the coordinator never
sees an optimizer's genome. Each searcher owns its budget, its generation count, its stopping rule and its state:
`state()` is its own pydantic model, and a run's state.json holds `{"kind": ..., "state": ...}`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.optimizers.labels import generation_label

WindowRange = tuple[int, int]  # [start, stop) of the search windows, in their fixed order


@dataclass(frozen=True)
class Candidate:
    """A point to score: its identity, the generation that asked for it, and the values it is scored with."""

    key: str
    generation: int
    factors: np.ndarray
    attention_factor: float | None  # None: the encoding's own formula
    n_hat: int = 0
    seed: str | None = None  # the seed method it is, when it is one
    gradient_windows: WindowRange | None = None  # the search windows whose backward pass is wanted


@dataclass(frozen=True)
class GenerationEnd:
    """A generation (or a polish step) that a tell completed: what its log line says about it."""

    label: str  # "generation 3/20", "generation 2/7 (step 2/5)", "polish after generation 20, step 3/10"
    generation: int
    best: float  # the searcher's best score after it
    previous_best: float  # before it (inf at generation 0)
    countdown: str = ""  # the early stop's countdown, when one is in force
    polish: bool = False  # a hybrid's polish step (timed apart from the generations)
    screening: tuple[int, int] | None = None  # search.surrogate: children proposed, screened out (run so far)


@dataclass(frozen=True)
class SearchPlan:
    """What one search of a configured optimizer scores at most (no early stop): its candidates, each on every
    search window, of them the ones with a backward pass, and how the count is made up, in words."""

    candidates: int
    backward_steps: int
    text: str


class PolishProgress(BaseModel):
    """A hybrid's polish under way, or due now: after which generation, its steps told of `steps`, and whether its
    best is rounded to the grid yet."""

    model_config = ConfigDict(strict=True, extra="forbid")

    after_generation: int = Field(ge=0)
    steps_done: int = Field(ge=0)
    steps: int = Field(ge=1)
    rounded: bool = False


class SearchProgress(BaseModel):
    """Where a searcher stands, as `status` shows it (state.json's `progress`). Written after each generation and
    never read back by the search: a resume rebuilds the searcher from history.jsonl, so this is a report, not a
    second copy of anything the search decides by."""

    model_config = ConfigDict(strict=True, extra="forbid")

    generation: int = Field(ge=0)  # the generation being asked and scored (0: the initial population)
    polish: PolishProgress | None = None
    proposed: int = Field(default=0, ge=0)  # search.surrogate: children bred after generation 0
    screened_out: int = Field(default=0, ge=0)  # of those, kept from scoring by the surrogate
    stopped_early: bool = False  # its own stop rule ended it before its budget


class SearcherState(BaseModel):
    """What every searcher's state model is: strict JSON. state.json holds it only for a searcher that cannot be
    rebuilt by replaying history.jsonl (`StatefulSearcher`); `generation` is every state's (a field, or a property
    of a composed state)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    def told_scores(self) -> dict[str, float]:
        """Every told candidate's score by key, when the state keeps them (history.jsonl must hold each)."""
        return {}

    @property
    def stopped_early(self) -> bool:
        return False


class Searcher(ABC):
    """What the coordinator needs of an optimizer (see the module docstring). What an optimizer must decide is
    `ask`, `tell`, `plan` (what it scores at most, for the estimate and the progress bar) and its stop (`done`:
    by default once `generation` reaches `generations_range`'s most); everything else has a default. A resume
    rebuilds it by replaying history.jsonl: asking again and telling each recorded result, so state.json keeps none
    of it (only a searcher whose moves depend on arrival order keeps its state there: `StatefulSearcher`). A new
    optimizer is a module with such a class, plus its entry in `factory.SEARCHERS`, plus
    `settings_model` when it has settings of its own (read from the config's `search.<kind>:` section).

    The capability flags say which settings it can honour; the config's rules are read from them
    (`factory.search_problem`), never from an optimizer's name. Each is False here: an optimizer claims what it
    does. A small one, run in memory (`optimize`), the seeds and then a sample of random monotone factors:

    >>> import numpy as np
    >>> from longrope.search.config.search_section import SearchConfig
    >>> from longrope.search.optimizers.genome import GenomeGrid, Seed
    >>> from longrope.search.optimizers.optimize import optimize
    >>> class RandomSearch(Searcher):
    ...     kind = "random_example"
    ...
    ...     def __init__(self, settings, grid, seeds):
    ...         super().__init__(settings, grid, seeds)
    ...         self.out, self.told = {}, {}
    ...
    ...     @staticmethod
    ...     def plan(search, seeds):
    ...         return SearchPlan(seeds + search.generations * search.population, 0, "seeds, then samples")
    ...
    ...     def ask(self, count):
    ...         if self.out or self.done():
    ...             return []
    ...         rng = np.random.default_rng([self.settings.seed, self.generation])  # replays: no state kept
    ...         top = self.grid.high * self.grid.step
    ...         draws = [np.sort(rng.uniform(1, top, self.grid.pairs)) for _ in range(self.settings.population)]
    ...         genomes = [self.grid.from_seed(s) for s in self.seeds] if self.generation == 0 else [
    ...             self.grid.genome(factors) for factors in draws]
    ...         self.out = {g.key: self.grid.candidate(g, self.generation) for g in genomes}
    ...         return list(self.out.values())
    ...
    ...     def tell(self, results):
    ...         for result in results:
    ...             self.out.pop(result.key)
    ...             self.told[result.key] = result.score
    ...         if self.out:
    ...             return []
    ...         self.generation += 1
    ...         best = self.best()[1]
    ...         return [GenerationEnd(f"generation {self.generation - 1}", self.generation - 1, best, best)]
    ...
    ...     def best(self):
    ...         return best_score(self.told)
    >>> settings = SearchConfig(population=4, parents=2, generations=2)
    >>> searcher = RandomSearch(settings, GenomeGrid(settings, pairs=8, scale=4.0), [Seed("pi", np.full(8, 4.0))])
    >>> key, score = optimize(lambda candidate: float(np.mean(np.log(candidate.factors / 3) ** 2)), searcher)
    >>> searcher.done(), len(searcher.told) == searcher.budget == 1 + 2 * 4
    (True, True)
    """

    kind: ClassVar[str]
    settings_model: ClassVar[type[BaseModel] | None] = None  # its own settings: the config's `search.<kind>:`
    supports_racing: ClassVar[bool] = False  # search.racing: ranks children against `threshold()`
    supports_steady: ClassVar[bool] = False  # search.schedule 'steady': breeds from the parents of the moment
    supports_n_hat: ClassVar[bool] = False  # search.n_hat.enabled: n_hat as a searched gene
    supports_longrope2: ClassVar[bool] = False  # search.space 'longrope2': the pairs below the critical one derived
    supports_short_factor: ClassVar[bool] = False  # search.factor 'short': the factors up to original_length
    supports_surrogate: ClassVar[bool] = False  # search.surrogate: breeds children a surrogate can screen
    descends: ClassVar[bool] = False  # takes gradient steps: search.gradient's window split applies
    polishes: ClassVar[bool] = False  # its descent is a polish of another search's best (search.gradient.polish_*)
    generation: int = 0  # the generation being asked and scored; 0 is the initial population (or the seeds)

    def __init__(self, settings: Any, grid: Any, seeds: Sequence[Any]):
        self.settings, self.grid, self.seeds = settings, grid, list(seeds)

    @classmethod
    def from_config(cls, settings: Any, grid: Any, seeds: Sequence[Any], mix: Any = None) -> Searcher:
        """The searcher a run of `settings` (the search section) uses; `mix`: the search windows' objectives, for a
        searcher that holds windows out or weighs their gradients."""
        return cls(settings, grid, seeds)

    @abstractmethod
    def ask(self, count: int) -> list[Candidate]:
        """Up to `count` new candidates to score (fewer, or none while a generation it waits on is out)."""

    @abstractmethod
    def tell(self, results: Sequence[HistoryRecord]) -> list[GenerationEnd]:
        """Results of asked candidates, in any order; the generations (or steps) they completed."""

    @staticmethod
    @abstractmethod
    def plan(search: Any, seeds: int) -> SearchPlan:
        """What one search of these settings scores at most (no early stop)."""

    @staticmethod
    def generations_range(search: Any) -> tuple[int, int]:
        """How many generations a run makes, generation 0 included (fewest, most)."""
        return 1 + search.generations, 1 + search.generations

    @staticmethod
    def descent_steps(search: Any) -> int | None:
        """Steps of a run whose generations are descent steps (the log names them); None: generations are not."""
        return None

    @property
    def total_generations(self) -> int:
        return self.generations_range(self.settings)[1]

    @property
    def budget(self) -> int:
        """Candidates it scores at most."""
        return self.plan(self.settings, len(self.seeds)).candidates

    @property
    def stopped_early(self) -> bool:
        return False  # its own stop rule ended it before its budget

    def done(self) -> bool:
        return self.generation >= self.total_generations

    def threshold(self) -> str | None:
        return None  # the candidate a raced child is compared with (`supports_racing`)

    def progress(self) -> SearchProgress:
        """Where it stands, for `status` (state.json's `progress`)."""
        return SearchProgress(generation=self.generation, stopped_early=self.stopped_early)

    def position(self) -> str:
        return generation_label(self.generation, self.total_generations)


def keeps_state(searcher: Searcher) -> bool:
    """Whether state.json holds `searcher`'s own state and a resume loads it: a `StatefulSearcher` whose run does
    not replay. Any other is rebuilt by replaying history.jsonl (`replay.rebuild`) and state.json holds none of it."""
    return isinstance(searcher, StatefulSearcher) and not searcher.replays


class StatefulSearcher(Searcher):
    """A searcher that a replay of history.jsonl cannot rebuild, because what it does depends on the order results
    arrived in (the steady GA: its parents change after every child): state.json keeps its state, less what
    history.jsonl records, and a resume loads it (`replay.rebuild`). `replays` says whether this run of it can be
    replayed after all (the same GA, generational)."""

    state_model: ClassVar[type[BaseModel]]

    @property
    def replays(self) -> bool:
        return False

    def best(self) -> tuple[str, float]:
        return best_score(self.state().told_scores())

    def outstanding(self) -> list[Candidate]:
        """Asked and not told when the state was stored: out again first on resume."""
        return []

    def state(self) -> BaseModel:
        return self.state_model.model_validate({name: getattr(self, name) for name in self.state_model.model_fields})

    def stored_state(self) -> BaseModel | None:
        """What state.json holds of it: nothing where this run `replays`; else its state, less what history.jsonl
        records (a searcher that keeps such a copy overrides this and `resume`)."""
        return None if self.replays else self.state()

    def resume(self, state: BaseModel, records: Sequence[HistoryRecord]) -> None:
        """Where it stood: its stored state, and history.jsonl's records in the order of their lines (for what the
        stored state leaves out)."""
        self.load_state(state)

    def load_state(self, state: dict[str, Any] | BaseModel) -> None:
        loaded = self.state_model.model_validate(state)
        for name in self.state_model.model_fields:
            setattr(self, name, getattr(loaded, name))


def best_score(scores: dict[str, float]) -> tuple[str, float]:
    """(key, score) of the lowest score, ties broken by key: the one rule every searcher picks its best by."""
    key = min(scores, key=lambda k: (scores[k], k))
    return key, scores[key]


def json_score(score: float) -> float | None:
    """A score as state.json holds it: null for inf / NaN (ranked last)."""
    return score if math.isfinite(score) else None


def rank_score(score: float) -> float:
    """What an optimizer ranks by: the score, or inf when it is not finite."""
    return score if math.isfinite(score) else math.inf
