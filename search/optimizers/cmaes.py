"""A second optimizer: CMA-ES (Hansen's `cma` package) over a monotone parametrisation of the factors.

The genome is continuous, x = [log f_0, d_1, ..., d_{n-1}] (+ the attention factor when it is searched), decoded
as log f_i = log f_0 + sum_{j<=i} max(d_j, 0): every x is a monotone factor vector, so CMA-ES needs no repair
step and no rejected samples; increments shared by neighbouring pairs are what it learns to correlate. Each
decoded vector is rounded onto the same grid as the GA's (`genome.GenomeGrid`), so candidates keep exact keys
and one never gets scored twice (a duplicate takes the recorded score).

Generation 0 scores the seeds; CMA-ES starts at the best of them (x0) with step size `search.cmaes.sigma`, for
`search.cmaes.generations` generations of `search.cmaes.population` samples (default pycma's, 4 + floor(3 ln n) for
n coordinates: Hansen, "The CMA Evolution Strategy: A Tutorial", 2016, Table 1). With `cmaes.sizing: ga` (to compare it
with the GA on one budget) it spends the GA's evaluation budget in generations of
mutations + crossovers samples instead. Its normal samples come from its own numpy Generator (`randn` option), so no
other user of numpy's global generator can change a run.

Resume without pickle: the state records the keys asked in each generation and every told score; loading builds a
fresh, identically seeded instance and replays ask/tell with those scores, checking each replayed generation asks
for exactly the recorded keys, which puts it in the same state as an uninterrupted run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from longrope.search.config.search_section import SearchConfig
from longrope.search.optimizers.early_stop import EarlyStop, EarlyStopState
from longrope.search.optimizers.evolution import DimMonoEvolution, told_from_json
from longrope.search.optimizers.genome import Genome, GenomeGrid, Seed
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.optimizers.labels import generation_label
from longrope.search.optimizers.searcher import (
    Candidate,
    GenerationEnd,
    Searcher,
    SearcherState,
    SearchPlan,
    best_score,
    json_score,
)

if TYPE_CHECKING:
    import cma

FAILED_SCORE_MARGIN = 1.0  # a non-finite score is told as (worst finite of its generation) + this


class CmaesState(SearcherState):
    """`CmaesOptimizer`'s state: every told genome and score, and the keys each CMA-ES generation asked for (a
    fresh, identically seeded instance replays them: no pickle)."""

    generation: int = Field(ge=0)
    told: list[list[Any]]  # [genome (Genome.to_json), score or null]
    asked_keys: list[list[str]] = Field(default_factory=list)
    early_stop: EarlyStopState = EarlyStopState()

    def told_scores(self) -> dict[str, float]:
        return told_from_json(self.told)[1]

    @property
    def stopped_early(self) -> bool:
        return self.early_stop.stopped


class CmaesOptimizer(Searcher):
    """CMA-ES as a `Searcher` (searcher.py); its samples may repeat a candidate, which takes the recorded score.
    It ranks whole generations of a distribution's samples: no parents to race against or breed from one by one,
    no n_hat gene, and no longrope2 space (every pair is a coordinate)."""

    kind = "cmaes"
    state_model = CmaesState
    supports_short_factor = True

    def __init__(self, settings: SearchConfig, grid: GenomeGrid, seeds: list[Seed]):
        super().__init__(settings, grid, seeds)
        self.seed_genomes = _unique([grid.from_seed(seed) for seed in seeds])
        self.seed_names = {grid.from_seed(seed).key: seed.name for seed in seeds}
        self.popsize = samples_per_generation(settings, grid.pairs + grid.searched_attention)
        self.iterations = iterations(settings, len(self.seed_genomes), self.popsize)
        self.generation = 0
        self.scores: dict[str, float] = {}
        self.genomes: dict[str, Genome] = {}
        self.asked_keys: list[list[str]] = []  # per CMA-ES generation, for the replay
        self.pending: dict[str, Genome] = {}
        self.es: cma.CMAEvolutionStrategy | None = None
        self._asked_x: list[np.ndarray] = []
        self.early_stop = EarlyStop(settings.early_stop)

    @property
    def total_generations(self) -> int:
        return 1 + self.iterations

    @property
    def budget(self) -> int:
        return len(self.seed_genomes) + self.iterations * self.popsize

    @staticmethod
    def generations_range(search: SearchConfig) -> tuple[int, int]:
        """Generation 0 included. Own sizing: 1 + cmaes.generations. GA sizing: 1 + ceil((budget - seeds) / samples
        per generation), with the distinct seeds between 1 and what the config can give (a run's file gives two)."""
        if search.cmaes.sizing == "own":
            return 1 + search.cmaes.generations, 1 + search.cmaes.generations
        budget = DimMonoEvolution.plan(search, 0).candidates
        samples = search.cmaes.population or search.mutations + search.crossovers
        most_seeds = search.most_seeds() + 1
        return 1 + max(0, math.ceil((budget - most_seeds) / samples)), 1 + max(0, math.ceil((budget - 1) / samples))

    @staticmethod
    def plan(search: SearchConfig, seeds: int, coordinates: int | None = None) -> SearchPlan:
        """The seeds, then its generations of samples. `coordinates`: the search's dimension, which pycma's default
        population depends on (None: a factor per pair of a 128-dim head, 64, for a plan made before the model is
        read; the searcher itself passes its own)."""
        if search.cmaes.sizing == "ga":
            return DimMonoEvolution.plan(search, seeds)
        samples = samples_per_generation(search, 64 if coordinates is None else coordinates)
        generations = search.cmaes.generations
        return SearchPlan(seeds + generations * samples, 0, f"{seeds} seeds + {generations} generations x {samples}")

    # ---- the parametrisation ----

    def encode(self, genome: Genome) -> np.ndarray:
        log_factors = np.log(self.grid.factors(genome))
        x = np.concatenate([log_factors[:1], np.diff(log_factors)])
        attention = self.grid.attention_factor(genome)
        return np.append(x, attention) if attention is not None else x

    def decode(self, x: np.ndarray) -> Genome:
        pairs = self.grid.pairs
        log_factors = x[0] + np.concatenate([[0.0], np.cumsum(np.maximum(x[1:pairs], 0.0))])
        attention = float(x[pairs]) if self.grid.searched_attention else None
        return self.grid.genome(np.exp(np.minimum(log_factors, 700.0)), attention)

    # ---- the searcher interface ----

    def done(self) -> bool:
        if self.early_stop.stopped or self.generation >= self.total_generations:
            return True
        return self.es is not None and bool(self.es.stop())

    def ask(self, count: int) -> list[Candidate]:
        """The next generation when none of it is out (`count` ignored: CMA-ES samples its population whole)."""
        if self.pending or self.done():
            return []
        return [self.candidate(genome) for genome in self.ask_genomes()]

    def ask_genomes(self) -> list[Genome]:
        if self.generation == 0:
            batch = list(self.seed_genomes)
        else:
            self._asked_x = self.es.ask()
            batch = [self.decode(np.asarray(x)) for x in self._asked_x]
            self.asked_keys.append([g.key for g in batch])
        self.pending = {g.key: g for g in batch}
        return batch

    def candidate(self, genome: Genome) -> Candidate:
        return self.grid.candidate(genome, self.generation, self.seed_names.get(genome.key))

    def tell(self, results: Sequence[HistoryRecord]) -> list[GenerationEnd]:
        before = self.generation
        self.tell_genomes([self.pending[r.key] for r in results], [r.score for r in results])
        if self.generation == before:
            return []
        best = self.best()[1]
        self.early_stop.record(best)
        label = generation_label(before, self.total_generations)
        return [GenerationEnd(label, before, best, self.early_stop.previous_best, self.early_stop.countdown())]

    def tell_genomes(self, genomes: list[Genome], scores: list[float]) -> None:
        for genome, score in zip(genomes, scores, strict=True):
            self.scores[genome.key] = score if math.isfinite(score) else math.inf
            self.genomes[genome.key] = genome
            self.pending.pop(genome.key, None)
        if self.pending:
            return
        if self.generation == 0:
            self._start()
        else:
            self._tell_es(self.asked_keys[-1])
        self.generation += 1

    def best(self) -> tuple[str, float]:
        return best_score(self.scores)

    @property
    def stopped_early(self) -> bool:
        return self.early_stop.stopped

    def _start(self) -> None:
        best_seed = min(self.seed_genomes, key=lambda g: (self.scores[g.key], g.key))
        x0 = self.encode(best_seed)
        rng = np.random.Generator(np.random.PCG64(self.settings.seed))
        options = {
            "popsize": self.popsize,
            "seed": np.nan,  # leave numpy's global generator alone: samples come from `rng`
            "randn": lambda count, dim: rng.standard_normal((count, dim)),
            "verbose": -9,
            "tolflatfitness": 10,  # the grid makes equal scores common; do not stop on a few flat generations
        }
        import cma  # imported when a CMA-ES search starts: `cma` loads matplotlib, which status and export avoid

        self.es = cma.CMAEvolutionStrategy(x0, self.settings.cmaes.sigma, options)

    def _tell_es(self, keys: list[str]) -> None:
        scores = [self.scores[key] for key in keys]
        finite = [s for s in scores if math.isfinite(s)]
        failed = (max(finite) if finite else 0.0) + FAILED_SCORE_MARGIN
        self.es.tell(self._asked_x, [s if math.isfinite(s) else failed for s in scores])

    # ---- state (replay, no pickle) ----

    def state(self) -> CmaesState:
        """The told scores and the keys of every generation told whole (one still out is asked again on resume: the
        replayed instance samples it anew, the same)."""
        return CmaesState(
            generation=self.generation,
            told=[[self.genomes[k].to_json(), json_score(s)] for k, s in self.scores.items()],
            asked_keys=[list(keys) for keys in self.asked_keys[: max(0, self.generation - 1)]],
            early_stop=self.early_stop.state(),
        )

    def load_state(self, state: dict[str, Any] | CmaesState) -> None:
        state = CmaesState.model_validate(state)
        self.genomes, self.scores = told_from_json(state.told)
        self.early_stop.load_state(state.early_stop)
        recorded, generation = state.asked_keys, state.generation
        if generation != (len(recorded) + 1 if generation else 0):
            raise ValueError(f"generation {generation} does not match {len(recorded)} recorded CMA-ES generations")
        self.asked_keys, self.generation, self.pending = [], 0, {}
        if generation == 0:
            return
        self._start()
        self.generation = 1
        for number, keys in enumerate(recorded, start=1):
            self._asked_x = self.es.ask()
            replayed = [self.decode(np.asarray(x)).key for x in self._asked_x]
            if replayed != keys:
                raise ValueError(f"replaying CMA-ES generation {number} asks for other candidates than recorded")
            missing = [key for key in keys if key not in self.scores]
            if missing:
                raise ValueError(f"CMA-ES generation {number}: {missing[0]} was asked but has no told score")
            self.asked_keys.append(keys)
            self._tell_es(keys)
            self.generation += 1


def _unique(genomes: list[Genome]) -> list[Genome]:
    return list({g.key: g for g in genomes}.values())


def samples_per_generation(search: SearchConfig, coordinates: int) -> int:
    """cmaes.population, or when null: pycma's default 4 + floor(3 ln n) (own sizing; Hansen 2016, Table 1), or
    mutations + crossovers (GA sizing)."""
    if search.cmaes.population is not None:
        return search.cmaes.population
    if search.cmaes.sizing == "ga":
        return search.mutations + search.crossovers
    return 4 + int(3 * math.log(max(coordinates, 1)))


def iterations(search: SearchConfig, seeds: int, popsize: int) -> int:
    """CMA-ES generations after the seeds: its own, or as many as spend the GA's budget (GA sizing)."""
    if search.cmaes.sizing == "own":
        return search.cmaes.generations
    budget = DimMonoEvolution.plan(search, seeds).candidates
    return max(0, math.ceil((budget - seeds) / popsize))
