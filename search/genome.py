"""Genomes: a candidate's genes on integer grids, and the grid that turns them into factors.

Factors live on a grid of `grid_step` (factor_i = steps_i * grid_step), monotone non-decreasing in the pair index
and bounded to [1, max_factor]; the attention factor (when searched) lives on its own grid. Exact integers give
every candidate an exact identity (`Genome.key`), so no optimizer ever has the same candidate scored twice.
Every optimizer (`evolution.DimMonoEvolution`, `cmaes.CmaesOptimizer`) asks for Genomes on the same grid, so
history.jsonl, status and export read both the same way.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from longrope.search.job_config import SearchConfig


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


class GenomeGrid:
    """The search space's grid: bounds in grid steps, and genome <-> factors / attention factor."""

    def __init__(self, settings: SearchConfig, *, pairs: int, scale: float):
        self.pairs = pairs
        self.step = settings.grid_step
        self.low = round(1.0 / self.step)
        self.high = round((settings.max_factor or 1.25 * scale) / self.step)
        attention = settings.attention_factor
        self.attention_step = attention.step
        self.searched_attention = attention.mode == "searched"
        self.attention_low = round(attention.low / attention.step)
        self.attention_high = round(attention.high / attention.step)

    def genome(self, factors: np.ndarray, attention_factor: float | None = None, n_hat: int = 0) -> Genome:
        """The nearest genome on the grid: factors rounded, clipped to the bounds, made monotone."""
        steps = np.clip(np.round(np.asarray(factors, dtype=np.float64) / self.step), self.low, self.high)
        steps = np.maximum.accumulate(steps.astype(np.int64))
        attention = None
        if self.searched_attention:
            value = attention_factor if attention_factor is not None else 1.0
            attention = int(np.clip(round(value / self.attention_step), self.attention_low, self.attention_high))
        return Genome(tuple(int(v) for v in steps), n_hat, attention)

    def from_seed(self, seed: Seed) -> Genome:
        return self.genome(seed.factors, seed.attention_factor)

    def factors(self, genome: Genome) -> np.ndarray:
        return np.asarray(genome.factor_steps, dtype=np.float64) * self.step

    def attention_factor(self, genome: Genome) -> float | None:
        if genome.attention_steps is None:
            return None
        return genome.attention_steps * self.attention_step

    def is_valid(self, genome: Genome) -> bool:
        steps = np.asarray(genome.factor_steps)
        return bool(
            len(steps) == self.pairs and steps[0] >= self.low and steps[-1] <= self.high and np.all(np.diff(steps) >= 0)
        )
