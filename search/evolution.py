"""LongRoPE's dim-monotone evolutionary search, as a pure-numpy ask/tell optimizer.

Genes live on integer grids (factors in units of `grid_step`, the attention factor in units of its own step),
so a candidate's identity is exact and no candidate is ever scored twice. Factors are monotone non-decreasing
in the pair index and bounded to [1, max_factor]. The optimizer never calls the objective: `ask()` returns
candidates, `tell()` takes their scores (mean NLL, lower is better; NaN/inf rank last), and its whole state,
the generator's included, round-trips through JSON, so a resumed search continues exactly where it stopped.
Mutation and crossover follow the official release (evolution/algorithms/dim_mono.py); REFERENCE.md 6c.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from longrope.search.job_config import SearchConfig

MAX_TRIES = 200  # redraws before giving up on one new candidate
CROSSOVER_PASSES = 20  # the official max_crossover_try


@dataclass(frozen=True)
class Genome:
    factor_steps: tuple[int, ...]  # factor_i = factor_steps[i] * grid_step
    n_hat: int = 0
    attention_steps: int | None = None  # attention_factor = attention_steps * attention step; None: formula

    @property
    def key(self) -> str:
        payload = json.dumps([self.factor_steps, self.n_hat, self.attention_steps])
        return hashlib.sha256(payload.encode()).hexdigest()[:20]

    def to_json(self) -> list:
        return [list(self.factor_steps), self.n_hat, self.attention_steps]

    @classmethod
    def from_json(cls, data: list) -> Genome:
        return cls(tuple(int(v) for v in data[0]), int(data[1]), None if data[2] is None else int(data[2]))


@dataclass(frozen=True)
class Seed:
    name: str
    factors: np.ndarray
    attention_factor: float | None = None


def rank_score(score: float) -> float:
    return score if math.isfinite(score) else math.inf


class DimMonoEvolution:
    """ask() -> genomes to score; tell(genomes, scores); best(); state_dict() / from_state_dict()."""

    def __init__(self, settings: SearchConfig, *, pairs: int, scale: float, seeds: list[Seed]):
        self.settings = settings
        self.pairs = pairs
        self.step = settings.grid_step
        self.low = round(1.0 / self.step)
        self.high = round((settings.max_factor or 1.25 * scale) / self.step)
        attention = settings.attention_factor
        self.searched_attention = attention.mode == "searched"
        self.attention_low = round(attention.low / attention.step)
        self.attention_high = round(attention.high / attention.step)
        self.n_hat_choices = settings.n_hat.choices if settings.n_hat.enabled else (0,)
        self.rng = np.random.Generator(np.random.PCG64(settings.seed))
        self.generation = 0
        self.scores: dict[str, float] = {}  # every genome ever told, by key
        self.genomes: dict[str, Genome] = {}
        self.population: list[str] = []  # keys of the current parents, best first
        self.seed_genomes = [self.genome_from_seed(seed) for seed in seeds]
        self.seed_names = {g.key: seed.name for g, seed in zip(self.seed_genomes, seeds, strict=True)}

    # ---- genes ----

    def genome_from_seed(self, seed: Seed) -> Genome:
        steps = np.clip(np.round(np.asarray(seed.factors, dtype=np.float64) / self.step), self.low, self.high)
        steps = np.maximum.accumulate(steps.astype(np.int64))
        attention = None
        if self.searched_attention:
            value = seed.attention_factor if seed.attention_factor is not None else 1.0
            attention = int(
                np.clip(round(value / self.settings.attention_factor.step), self.attention_low, self.attention_high)
            )
        return Genome(tuple(int(v) for v in steps), 0, attention)

    def factors(self, genome: Genome) -> np.ndarray:
        return np.asarray(genome.factor_steps, dtype=np.float64) * self.step

    def attention_factor(self, genome: Genome) -> float | None:
        if genome.attention_steps is None:
            return None
        return genome.attention_steps * self.settings.attention_factor.step

    def is_valid(self, genome: Genome) -> bool:
        steps = np.asarray(genome.factor_steps)
        return bool(
            len(steps) == self.pairs and steps[0] >= self.low and steps[-1] <= self.high and np.all(np.diff(steps) >= 0)
        )

    # ---- operators ----

    def mutate(self, parent: Genome, seen: set[str]) -> Genome | None:
        """Each pair, with the change probability, is redrawn from the grid between its neighbours."""
        p = self.settings.change_probability
        for _ in range(MAX_TRIES):
            steps = list(parent.factor_steps)
            for i in range(self.pairs):
                if self.rng.random() < p:
                    lower = steps[i - 1] if i > 0 else self.low
                    upper = steps[i + 1] if i < self.pairs - 1 else self.high
                    steps[i] = int(self.rng.integers(lower, upper + 1))
            n_hat = parent.n_hat
            if len(self.n_hat_choices) > 1 and self.rng.random() < p:
                n_hat = int(self.rng.choice(self.n_hat_choices))
            attention = parent.attention_steps
            if attention is not None and self.rng.random() < p:
                attention = int(self.rng.integers(self.attention_low, self.attention_high + 1))
            child = Genome(tuple(steps), n_hat, attention)
            if child.key not in seen and self.is_valid(child):
                return child
        return None

    def crossover(self, first: Genome, second: Genome, seen: set[str]) -> Genome | None:
        """From the first parent, each pair considered with the change probability takes the second parent's
        value with probability 1/2; the first monotone, unseen child wins; else the first parent mutates."""
        p = self.settings.change_probability
        for _ in range(CROSSOVER_PASSES):
            steps = list(first.factor_steps)
            n_hat, attention = first.n_hat, first.attention_steps
            for i in range(self.pairs):
                if self.rng.random() < p and self.rng.random() < 0.5:
                    steps[i] = second.factor_steps[i]
                    child = Genome(tuple(steps), n_hat, attention)
                    if child.key not in seen and self.is_valid(child):
                        return child
            if self.rng.random() < p:
                n_hat = second.n_hat
            if self.rng.random() < p:
                attention = second.attention_steps
            child = Genome(tuple(steps), n_hat, attention)
            if child.key not in seen and self.is_valid(child):
                return child
        return self.mutate(first, seen)

    # ---- ask / tell ----

    def ask(self) -> list[Genome]:
        """The candidates of the current generation (all new; none scored before)."""
        seen = set(self.scores)
        batch: list[Genome] = []

        def add(genome: Genome | None) -> None:
            if genome is not None and genome.key not in seen:
                seen.add(genome.key)
                batch.append(genome)

        if self.generation == 0:
            for genome in self.seed_genomes:
                add(genome)
            while len(batch) < self.settings.population:
                before = len(batch)
                add(self.mutate(self.seed_genomes[int(self.rng.integers(len(self.seed_genomes)))], seen))
                if len(batch) == before and len(seen) > 10 * self.settings.population:
                    break  # the grid is exhausted around the seeds
            return batch
        parents = [self.genomes[key] for key in self.population]
        for _ in range(self.settings.mutations):
            add(self.mutate(parents[int(self.rng.integers(len(parents)))], seen))
        for _ in range(self.settings.crossovers):
            if len(parents) < 2:
                break
            i, j = self.rng.choice(len(parents), size=2, replace=False)
            add(self.crossover(parents[int(i)], parents[int(j)], seen))
        return batch

    def tell(self, genomes: list[Genome], scores: list[float]) -> None:
        """Record a generation's scores and keep the best `parents` of everything alive (elitist)."""
        for genome, score in zip(genomes, scores, strict=True):
            self.scores[genome.key] = rank_score(float(score))
            self.genomes[genome.key] = genome
        alive = set(self.population) | {g.key for g in genomes}
        self.population = sorted(alive, key=lambda key: (self.scores[key], key))[: self.settings.parents]
        self.generation += 1

    def best(self) -> tuple[Genome, float]:
        key = min(self.scores, key=lambda k: (self.scores[k], k))
        return self.genomes[key], self.scores[key]

    # ---- persistence ----

    def state_dict(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "rng": self.rng.bit_generator.state,
            "population": list(self.population),
            "told": [[self.genomes[k].to_json(), _json_score(s)] for k, s in self.scores.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generation = int(state["generation"])
        self.rng.bit_generator.state = state["rng"]
        self.scores, self.genomes = {}, {}
        for genome_json, score in state["told"]:
            genome = Genome.from_json(genome_json)
            self.genomes[genome.key] = genome
            self.scores[genome.key] = math.inf if score is None else float(score)
        self.population = [str(key) for key in state["population"]]
        unknown = [key for key in self.population if key not in self.genomes]
        if unknown:
            raise ValueError(f"population holds {unknown[0]}, which is not among the told genomes")


def _json_score(score: float) -> float | None:
    return score if math.isfinite(score) else None
