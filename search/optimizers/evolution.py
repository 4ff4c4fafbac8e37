"""LongRoPE's dim-monotone evolutionary search, as a pure-numpy ask/tell optimizer, generational or steady-state.

The optimizer never calls the objective: `ask()` returns genomes (`genome.py`), `tell()` takes their scores (mean
NLL, lower is better; NaN/inf rank last, and so does a candidate that racing stopped), and its whole state, the
generator's included, round-trips through JSON, so a resumed search continues exactly where it stopped.
Mutation and crossover follow the official release (microsoft/LongRoPE, evolution/algorithms/dim_mono.py):
a mutated pair is redrawn uniformly between its neighbours (monotone by construction); a crossover takes pairs
from the second parent with probability 1/2 where the change probability fires. In the longrope2 space
(LongRoPE2, arXiv 2502.20082) only the pairs from the critical dimension up are mutated or crossed, strictly
between their neighbours and with the last-pair cap (`GenomeGrid.redraw_bounds`), and after every change the
pairs below it are set from the critical pair (`GenomeGrid.derive`).

Two schedules (`search.schedule`):
- generational (the release's): generation 0 is the seeds plus their mutations (`population` in all); then each
  generation breeds `mutations` + `crossovers` children from the `parents` best, and waits for all of them;
- steady: generation 0 is the same; then `ask(n)` breeds n children at a time from the current parents and
  `tell` inserts each as it arrives ((mu + lambda) with lambda = 1), so no worker waits for a generation's slowest
  candidate. The budget is the same number of children; a "generation" is counted every mutations + crossovers
  children. Arrival order decides the parents, so a steady run is not bit-reproducible across runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import Field

from longrope.search.config.search_section import SearchConfig
from longrope.search.optimizers.early_stop import EarlyStop, EarlyStopState
from longrope.search.optimizers.genome import Genome, GenomeGrid, Seed
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.optimizers.labels import generation_label
from longrope.search.optimizers.screening import ChildScreen, bred_children, scored_children
from longrope.search.optimizers.searcher import (
    Candidate,
    GenerationEnd,
    SearcherState,
    SearchPlan,
    SearchProgress,
    StatefulSearcher,
    best_score,
    json_score,
    rank_score,
)

MAX_TRIES = 200  # redraws before giving up on one new candidate
CROSSOVER_PASSES = 20  # the official max_crossover_try


class EvolutionState(SearcherState):
    """`DimMonoEvolution`'s state: the generator, every told genome and score, the parents, what is out.

    As state.json holds it (a steady run's: `stored_state`) `told` and `early_stop` are null: history.jsonl holds
    every told genome's factors and score in the order they were told, from which `resume` takes them and the best
    after each generation the early stop recorded."""

    generation: int = Field(ge=0)
    rng: dict[str, Any]  # the PCG64 generator's state
    population: list[str]
    told: list[list[Any]] | None = None  # [genome (Genome.to_json), score or null]; null: history.jsonl's
    pending: list[list[Any]] = Field(default_factory=list)  # asked, not yet told (steady: re-submitted on resume)
    children_told: int = Field(default=0, ge=0)
    generation_keys: list[str] = Field(default_factory=list)  # what generation 0 / the current round asked
    threshold: str | None = None  # generational racing: the worst parent when the generation was asked
    early_stop: EarlyStopState | None = EarlyStopState()  # null: history.jsonl's (`resume`)
    exhausted: bool = False  # no new candidate could be made: the search is over
    proposed: int = Field(default=0, ge=0)  # search.surrogate: children bred after generation 0
    screened_out: int = Field(default=0, ge=0)  # of those, the ones the surrogate kept from scoring

    def told_scores(self) -> dict[str, float]:
        return told_from_json(self.told or [])[1]

    def parent_keys(self) -> list[str]:
        return list(self.population)

    def out_keys(self) -> list[str]:
        """The keys of the asks out (`pending`)."""
        return [Genome.from_json(item).key for item in self.pending]

    @property
    def stopped_early(self) -> bool:
        """In memory; a stored state has none (state.json's `progress` says whether the run stopped early)."""
        return self.early_stop is not None and self.early_stop.stopped


class DimMonoEvolution(StatefulSearcher):
    """The release's GA as a `Searcher` (searcher.py): ask(count) -> candidates, tell(results), done(), best(),
    threshold(), state() / load_state(). Every setting of the search section applies to it."""

    kind = "dim_mono"
    state_model = EvolutionState
    supports_racing = supports_steady = supports_n_hat = supports_longrope2 = True
    supports_short_factor = supports_surrogate = True

    def __init__(self, settings: SearchConfig, grid: GenomeGrid, seeds: list[Seed]):
        super().__init__(settings, grid, seeds)
        self.steady = settings.schedule == "steady"
        self.children_per_generation = scored_children(settings)
        self.n_hat_choices = settings.n_hat.choices if settings.n_hat.enabled else (0,)
        self.rng = np.random.Generator(np.random.PCG64(settings.seed))
        self.generation = 0
        self.children_told = 0  # steady: children told since generation 0
        self.scores: dict[str, float] = {}  # every genome ever told, by key
        self.genomes: dict[str, Genome] = {}
        self.population: list[str] = []  # keys of the current parents, best first
        self.pending: dict[str, Genome] = {}  # asked, not yet told (in order)
        self._generation_keys: list[str] = []  # generation 0 / a generational round: what was asked
        self.seed_genomes = [grid.from_seed(seed) for seed in seeds]
        self.seed_names = {g.key: seed.name for g, seed in zip(self.seed_genomes, seeds, strict=True)}
        self.early_stop = EarlyStop(settings.early_stop)
        self.exhausted = False
        self._threshold: str | None = None
        self._arrived: dict[str, float] = {}  # scores of the generation out, until all of it is in
        self.screen = ChildScreen(settings.surrogate, grid) if settings.surrogate.enabled else None
        self.proposals_per_child = settings.surrogate.proposals if self.screen else 1

    @property
    def replays(self) -> bool:
        return not self.steady  # a steady run's parents depend on the order results arrived in

    def progress(self) -> SearchProgress:
        proposed, screened_out = self.screen.counts() if self.screen else (0, 0)
        return SearchProgress(
            generation=self.generation, proposed=proposed, screened_out=screened_out, stopped_early=self.stopped_early
        )

    @staticmethod
    def plan(search: SearchConfig, seeds: int) -> SearchPlan:
        """The initial population (every seed, where there are more seeds than `population`), then every generation's
        children; the steady schedule spends the same."""
        children = scored_children(search)
        text = f"{search.population} + {search.generations} generations x {children}"
        if search.surrogate.enabled:  # the screened-out are bred and predicted, never scored
            text += f" (each screened by the surrogate from {search.surrogate.proposals * children} proposals)"
        first = max(search.population, seeds)  # generation 0 keeps every seed, however many
        if first > search.population:
            text = f"{seeds} seeds" + text.removeprefix(str(search.population))
        return SearchPlan(first + search.generations * children, 0, text)

    # ---- operators ----

    def mutate(self, parent: Genome, seen: set[str]) -> Genome | None:
        """Each searched pair, with the change probability, is redrawn from the grid between its neighbours
        (`GenomeGrid.redraw_bounds`; a pair with no room stays, as in the release); the derived pairs follow."""
        p, grid = self.settings.change_probability, self.grid
        for _ in range(MAX_TRIES):
            steps = list(parent.factor_steps)
            for i in grid.searched_pairs:
                if self.rng.random() < p:
                    lower, upper = grid.redraw_bounds(steps, i)
                    if lower <= upper:
                        steps[i] = int(self.rng.integers(lower, upper + 1))
            steps = grid.derive(steps)
            n_hat = parent.n_hat
            if len(self.n_hat_choices) > 1 and self.rng.random() < p:
                n_hat = int(self.rng.choice(self.n_hat_choices))
            attention = parent.attention_steps
            if attention is not None and self.rng.random() < p:
                attention = int(self.rng.integers(grid.attention_low, grid.attention_high + 1))
            child = Genome(tuple(steps), n_hat, attention)
            if child.key not in seen and grid.is_valid(child):
                return child
        return None

    def crossover(self, first: Genome, second: Genome, seen: set[str]) -> Genome | None:
        """From the first parent, each searched pair considered with the change probability takes the second
        parent's value with probability 1/2 (derived pairs follow); the first valid, unseen child wins; else the
        first parent mutates."""
        p, grid = self.settings.change_probability, self.grid
        for _ in range(CROSSOVER_PASSES):
            steps = list(first.factor_steps)
            n_hat, attention = first.n_hat, first.attention_steps
            for i in grid.searched_pairs:
                if self.rng.random() < p and self.rng.random() < 0.5:
                    steps[i] = second.factor_steps[i]
                    steps = grid.derive(steps)
                    child = Genome(tuple(steps), n_hat, attention)
                    if child.key not in seen and self.grid.is_valid(child):
                        return child
            if self.rng.random() < p:
                n_hat = second.n_hat
            if self.rng.random() < p:
                attention = second.attention_steps
            child = Genome(tuple(steps), n_hat, attention)
            if child.key not in seen and self.grid.is_valid(child):
                return child
        return self.mutate(first, seen)

    # ---- the searcher interface ----

    def done(self) -> bool:
        return self.early_stop.stopped or self.exhausted or self.budget_spent()

    def budget_spent(self) -> bool:
        if self.steady and self.generation > 0:
            return self.children_told >= self.children_per_generation * self.settings.generations
        return self.generation >= self.total_generations

    def ask(self, count: int) -> list[Candidate]:
        """New candidates to score (none scored or asked before).

        Generation 0 (both schedules) and every generational round: the whole generation when none of it is out,
        `count` ignored; nothing while it is out. Steady, after generation 0: up to `count` children (fewer near the
        budget; none while generation 0 is out). A generation that breeds nothing new ends the search."""
        if self.done():
            return []
        genomes = self.ask_genomes(count)
        if not genomes and not self.pending:
            self.exhausted = True
        if genomes and not self.steady:
            self._threshold = self.worst_parent()  # fixed for the generation: racing is deterministic
        return [self.candidate(genome) for genome in genomes]

    def ask_genomes(self, count: int) -> list[Genome]:
        if self.generation == 0 or not self.steady:
            if self.pending:
                return []  # the generation is out; tell it first
            batch = self._initial_population() if self.generation == 0 else self._generation_children()
        else:
            room = self.children_per_generation * self.settings.generations - self.children_told - len(self.pending)
            batch = self._children(min(count, room))
        self.pending.update((g.key, g) for g in batch)
        return batch

    def candidate(self, genome: Genome) -> Candidate:
        return self.grid.candidate(genome, self.generation, self.seed_names.get(genome.key))

    def tell(self, results: Sequence[HistoryRecord]) -> list[GenerationEnd]:
        """Record scores; generational: once the generation is all told, keep the best `parents` of everything
        alive (elitist); steady: each child joins the parents at once if it beats the worst of them. Returns the
        generation it completed, if any (its best recorded for the early stop)."""
        before = self.generation
        if self.steady and self.generation > 0:  # arrival order is the schedule itself
            self.tell_genomes([self.pending[r.key] for r in results], [r.score for r in results])
        else:  # a generation is told whole, in the order it was asked: the state is the same however results came
            self._arrived.update((r.key, r.score) for r in results)
            if self._arrived.keys() >= self.pending.keys():
                keys = [key for key in self._generation_keys if key in self._arrived]
                self.tell_genomes([self.pending[k] for k in keys], [self._arrived[k] for k in keys])
                self._arrived = {}
        return [self._generation_end(done) for done in range(before, self.generation)]

    def tell_genomes(self, genomes: list[Genome], scores: list[float]) -> None:
        for genome, score in zip(genomes, scores, strict=True):
            self.scores[genome.key] = rank_score(float(score))
            self.genomes[genome.key] = genome
            self.pending.pop(genome.key, None)
        if self.steady and self.generation > 0:
            self.population = self._best_of([*self.population, *(g.key for g in genomes)])
            self.children_told += len(genomes)
            self.generation = 1 + self.children_told // self.children_per_generation
        elif not self.pending:
            self.population = self._best_of([*self.population, *self._generation_keys])
            self.generation += 1

    def _generation_end(self, generation: int) -> GenerationEnd:
        best = self.best()[1]
        self.early_stop.record(best)
        label = generation_label(generation, self.total_generations)
        previous = self.early_stop.previous_best
        screening = self.screen.counts() if self.screen else None
        return GenerationEnd(label, generation, best, previous, self.early_stop.countdown(), screening=screening)

    def threshold(self) -> str | None:
        """The parent a racing child is compared with: the worst parent when its generation was asked
        (generational), or of the moment (steady)."""
        return self.worst_parent() if self.steady else self._threshold

    def outstanding(self) -> list[Candidate]:
        return [self.candidate(genome) for genome in self.pending.values()]

    @property
    def stopped_early(self) -> bool:
        return self.early_stop.stopped

    def adopt(self, genome: Genome, score: float) -> None:
        """A child made elsewhere (the hybrid's polished best, on the grid) and its score: it joins the parents
        if it beats the worst of them, as a told child does; the generator is not touched."""
        self.scores[genome.key] = rank_score(float(score))
        self.genomes[genome.key] = genome
        self.population = self._best_of([*self.population, genome.key])

    def worst_parent(self) -> str | None:
        """The acceptance threshold: a child worse than the worst parent can never become a parent (elitism).
        None while the parents are not all there with finite scores (then every child may get in)."""
        if len(self.population) < self.settings.parents or not math.isfinite(self.scores[self.population[-1]]):
            return None
        return self.population[-1]

    def best(self) -> tuple[str, float]:
        return best_score(self.scores)

    # ---- breeding ----

    def _initial_population(self) -> list[Genome]:
        batch = self._unique(self.seed_genomes)
        seen = set(self.scores) | {g.key for g in batch}
        while len(batch) < self.settings.population:
            child = self.mutate(self.seed_genomes[int(self.rng.integers(len(self.seed_genomes)))], seen)
            if child is None:
                break  # MAX_TRIES redraws found nothing new: the grid is exhausted around the seeds
            batch += self._unique([child], seen)
        self._generation_keys = [g.key for g in batch]
        return batch

    def _generation_children(self) -> list[Genome]:
        seen = set(self.scores)
        parents = [self.genomes[key] for key in self.population]
        batch: list[Genome] = []
        mutations, crossovers = bred_children(self.settings)
        for _ in range(mutations):
            batch += self._unique([self.mutate(parents[int(self.rng.integers(len(parents)))], seen)], seen)
        for _ in range(crossovers):
            if len(parents) < 2:
                break
            i, j = self.rng.choice(len(parents), size=2, replace=False)
            batch += self._unique([self.crossover(parents[int(i)], parents[int(j)], seen)], seen)
        batch = self._screened(batch, self.children_per_generation)
        self._generation_keys = [g.key for g in batch]
        return batch

    def _children(self, count: int) -> list[Genome]:
        """Steady breeding: each child is a mutation with probability mutations / (mutations + crossovers)."""
        seen = set(self.scores) | set(self.pending)
        parents = [self.genomes[key] for key in self.population]
        batch: list[Genome] = []
        children = self.settings.mutations + self.settings.crossovers
        for _ in range(max(0, count) * self.proposals_per_child):
            if len(parents) < 2 or self.rng.random() < self.settings.mutations / children:
                child = self.mutate(parents[int(self.rng.integers(len(parents)))], seen)
            else:
                i, j = self.rng.choice(len(parents), size=2, replace=False)
                child = self.crossover(parents[int(i)], parents[int(j)], seen)
            batch += self._unique([child], seen)
        return self._screened(batch, count)

    def _screened(self, batch: list[Genome], keep: int) -> list[Genome]:
        """search.surrogate off: the batch; on: the `keep` children of it the screen picks (screening.py)."""
        if self.screen is None:
            return batch
        return self.screen.screened(batch, keep, self.scores, self.genomes, self.rng)

    @staticmethod
    def _unique(genomes: list[Genome | None], seen: set[str] | None = None) -> list[Genome]:
        """The genomes not seen yet (None dropped), each once; `seen` is updated in place."""
        seen = set() if seen is None else seen
        kept = []
        for genome in genomes:
            if genome is not None and genome.key not in seen:
                seen.add(genome.key)
                kept.append(genome)
        return kept

    def _best_of(self, keys: list[str]) -> list[str]:
        alive = set(keys)
        return sorted(alive, key=lambda key: (self.scores[key], key))[: self.settings.parents]

    # ---- state ----

    def state(self) -> EvolutionState:
        proposed, screened_out = self.screen.counts() if self.screen else (0, 0)
        return EvolutionState(
            generation=self.generation,
            rng=self.rng.bit_generator.state,
            population=list(self.population),
            told=[[self.genomes[k].to_json(), json_score(s)] for k, s in self.scores.items()],
            pending=[g.to_json() for g in self.pending.values()],
            children_told=self.children_told,
            generation_keys=list(self._generation_keys),
            threshold=self._threshold,
            early_stop=self.early_stop.state(),
            exhausted=self.exhausted,
            proposed=proposed,
            screened_out=screened_out,
        )

    def stored_state(self) -> EvolutionState | None:
        """What state.json holds: a steady run's state less `told` and `early_stop`, which history.jsonl gives
        (`resume`); nothing for a generational run, which a replay rebuilds."""
        return None if self.replays else self.state().model_copy(update={"told": None, "early_stop": None})

    def resume(self, state: EvolutionState, records: Sequence[HistoryRecord]) -> None:
        """The stored state with the told genomes and scores taken from history.jsonl's final `records` (in the
        order of their lines). state.json is rewritten whenever candidates go out, so every candidate asked before
        it was written is told or among its asks out: the told ones are the recorded ones not out, as many as the
        state counts. Their order is the order they were told in: generation 0 whole, in the order it was asked
        (`generation_keys`), then each child as it landed, which is when its line was appended (a resume tells the
        asks out that history.jsonl holds in that order too). Each genome is the grid's for the recorded factors,
        checked against its key; the early stop's bests are those scores replayed in order (`EarlyStop.replayed`)."""
        state = EvolutionState.model_validate(state)
        out = set(state.out_keys())
        told = {r.key: r for r in records if r.final and r.key not in out}
        first = [key for key in state.generation_keys if key in told]
        first_keys = set(first)
        children = [key for key in told if key not in first_keys]
        counts = (len(state.generation_keys), state.children_told) if state.generation > 0 else (0, 0)
        if (len(first), len(children)) != counts:
            raise ValueError(
                f"history.jsonl holds {len(first)} told candidates of generation 0 and {len(children)} "
                f"children, state.json counts {counts[0]} and {counts[1]}"
            )
        pairs = [[self._recorded_genome(told[key]).to_json(), json_score(told[key].score)] for key in first + children]
        scores = [told[key].score for key in first], [told[key].score for key in children]
        early_stop = EarlyStop.replayed(self.settings.early_stop, *scores, self.children_per_generation)
        self.load_state(state.model_copy(update={"told": pairs, "early_stop": early_stop.state()}))

    def _recorded_genome(self, record: HistoryRecord) -> Genome:
        attention = record.attention_factor if self.grid.searched_attention else None
        genome = self.grid.genome(np.asarray(record.factors, dtype=np.float64), attention, record.n_hat)
        if genome.key != record.key:
            raise ValueError(f"candidate {record.key}'s recorded factors are another genome's ({genome.key})")
        return genome

    def load_state(self, state: dict[str, Any] | EvolutionState) -> None:
        state = EvolutionState.model_validate(state)
        if state.told is None or state.early_stop is None:
            raise ValueError("told or early_stop is null: a stored state is resumed with history.jsonl's records")
        self.generation = state.generation
        self.rng.bit_generator.state = state.rng
        self.genomes, self.scores = told_from_json(state.told)
        self.population = list(state.population)
        self.pending = {g.key: g for g in (Genome.from_json(item) for item in state.pending)}
        self.children_told = state.children_told
        self._generation_keys = list(state.generation_keys)
        self._threshold = state.threshold
        self._arrived = {}
        self.early_stop.load_state(state.early_stop)
        self.exhausted = state.exhausted
        if self.screen is not None:
            self.screen.proposed, self.screen.screened_out = state.proposed, state.screened_out
        unknown = [key for key in self.population if key not in self.genomes]
        if unknown:
            raise ValueError(f"population holds {unknown[0]}, which is not among the told genomes")


def told_from_json(told: list) -> tuple[dict[str, Genome], dict[str, float]]:
    """state.json's `told`: [genome, score] pairs (a gradient point, off the grid, is told by its key alone)."""
    genomes, scores = {}, {}
    for genome_json, score in told:
        if isinstance(genome_json, str):
            key = genome_json
        else:
            genome = Genome.from_json(genome_json)
            key, genomes[genome.key] = genome.key, genome
        scores[key] = math.inf if score is None else float(score)
    return genomes, scores
