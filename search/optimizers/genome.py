"""Genomes: a candidate's genes on integer grids, the search space they live in, and the grid that decodes them.

Factors live on a grid of `grid_step` (factor_i = steps_i * grid_step), and the attention factor (when searched)
on its own grid. Exact integers give every candidate an exact identity (`Genome.key`), so no optimizer ever has the
same candidate scored twice. Every optimizer (`evolution.DimMonoEvolution`, `cmaes.CmaesOptimizer`) asks for
Genomes on the same grid, so history.jsonl, status and export read both the same way.

Two search spaces (`search.space`, resolved once by `resolve_space`):
- longrope (LongRoPE, arXiv 2402.13753): every pair searched, monotone non-decreasing in the pair index, within
  [1, max_factor] (max_factor default 1.25 x S, S = target/original);
- longrope2 (LongRoPE2, arXiv 2502.20082; microsoft/LongRoPE `evolution/search.py` and
  `evolution/algorithms/dim_mono.py`): only pairs i >= d_cd (the critical dimension,
  `longrope.encodings.critical_dim`) are searched, within [S, length_scale] (default 2 x S), strictly increasing,
  the last pair at most 4 above the one before it; the pairs i < d_cd are set from the critical pair,
  `lambda_i = lambda_cd^(i/d_cd)` (geometric from 1 to lambda_cd, NTK-like). One Genome type serves both: in
  longrope2 the steps of the pairs below d_cd are `round(lambda_i / grid_step)`, a function of the critical pair's
  steps alone (so equal searched parts give equal keys), while `GenomeGrid.factors` returns the exact lambda_i.
  Where we differ from the official code (microsoft/LongRoPE, `evolution/search.py`): the +4 cap is a constraint
  every genome meets (`is_valid`), where the official code only bounds the last pair's own redraw with it; the
  critical pair's lower bound is S (the official one is max(S, lambda_{d_cd - 1})); length_scale defaults to 2 x S
  (the official default S leaves no room for strictly increasing pairs); and seeds are projected into the space
  (see `genome`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from longrope.encodings.critical_dim import critical_dim as critical_dim_formula
from longrope.search.config.search_section import SearchConfig
from longrope.search.config.strict import JobConfigError
from longrope.search.optimizers.searcher import Candidate

LAST_PAIR_CAP = 4.0  # longrope2: last pair <= previous pair + 4, in factor units (official dim_mono.py)
GRID_TOLERANCE = 1e-9  # in steps: S = 4.0 at step 0.01 is 400.00000000000006 steps, still on the grid


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


@dataclass(frozen=True)
class SearchSpace:
    """The resolved space: which pairs are searched and their bounds, in grid steps."""

    kind: Literal["longrope", "longrope2"]
    critical_dim: int  # the first searched pair (0 in longrope: every pair is searched)
    low: int  # a searched pair's least factor, in steps
    high: int  # a searched pair's greatest factor, in steps
    cap: int | None = None  # longrope2: last pair - previous pair, at most, in steps


def resolve_space(
    settings: SearchConfig, *, pairs: int, scale: float, rope_theta: float, rotary_dim: int, original_length: int
) -> SearchSpace:
    """The search space of a job, defaults resolved: critical_dim None -> the LongRoPE2 formula
    `ceil(log_theta(L0 / 2pi) * d/2) - 1` (d = rotary_dim), length_scale None -> 2 x S.
    Raises JobConfigError (a ValueError) naming the field when the space is impossible."""
    if settings.space != "longrope2" or settings.critical_dim is not None:
        return space_for(settings, pairs=pairs, scale=scale)
    formula = critical_dim_formula(rope_theta, rotary_dim, original_length)
    if formula >= pairs:
        raise JobConfigError(
            f"search.critical_dim: must be < {pairs} pairs, got {formula} (the formula ceil(log_theta(L0/2pi) d/2) - 1 "
            f"for theta {rope_theta:g}, d {rotary_dim}, L0 {original_length}: no pair's period reaches L0); set it"
        )
    return space_for(settings, pairs=pairs, scale=scale, critical_dim=formula)


def space_for(settings: SearchConfig, *, pairs: int, scale: float, critical_dim: int | None = None) -> SearchSpace:
    """The space for `settings` with the critical dimension given (else settings.critical_dim); longrope ignores it,
    and longrope2 ignores max_factor (its searched pairs are bounded by [S, length_scale] instead).
    Bounds on the grid: low = ceil(S / step), high = floor(length_scale / step), so both stay inside the range."""
    step = settings.grid_step
    if settings.space == "longrope":
        return SearchSpace("longrope", 0, round(1.0 / step), round((settings.max_factor or 1.25 * scale) / step))
    critical = settings.critical_dim if critical_dim is None else critical_dim
    if critical is None:
        raise JobConfigError("search.critical_dim: the longrope2 space needs it; resolve it with resolve_space()")
    if not 0 <= critical < pairs:
        raise JobConfigError(f"search.critical_dim: must be < {pairs} pairs, got {critical}")
    length_scale = settings.length_scale or 2.0 * scale
    given = f"{length_scale:g}" + (" (the default, 2 x target/original)" if settings.length_scale is None else "")
    if length_scale < scale:
        raise JobConfigError(f"search.length_scale: must be >= target/original ({scale:g}), got {given}")
    low = math.ceil(scale / step - GRID_TOLERANCE)
    high = math.floor(length_scale / step + GRID_TOLERANCE)
    searched = pairs - critical
    if high - low < searched - 1:
        needed = round((low + searched - 1) * step, 12)
        raise JobConfigError(
            f"search.length_scale: must be >= {needed:g} for the {searched} searched pairs (critical_dim {critical} "
            f"to {pairs - 1}) to increase strictly on the {step:g} grid from {scale:g}, got {given}"
        )
    return SearchSpace("longrope2", critical, low, high, max(1, round(LAST_PAIR_CAP / step)))


class GenomeGrid:
    """The search space's grid: bounds in grid steps, and genome <-> factors / attention factor.

    critical_dim: the resolved critical dimension (`resolve_space(...).critical_dim`) for the longrope2 space;
    None: settings.critical_dim. The longrope space ignores it."""

    def __init__(self, settings: SearchConfig, *, pairs: int, scale: float, critical_dim: int | None = None):
        self.pairs = pairs
        self.step = settings.grid_step
        self.space = space_for(settings, pairs=pairs, scale=scale, critical_dim=critical_dim)
        self.low, self.high = self.space.low, self.space.high
        self.strict = self.space.kind == "longrope2"
        self.critical_dim = self.space.critical_dim
        attention = settings.attention_factor
        self.attention_step = attention.step
        self.searched_attention = attention.mode == "searched"
        self.attention_low = round(attention.low / attention.step)
        self.attention_high = round(attention.high / attention.step)

    @property
    def searched_pairs(self) -> range:
        """The pairs an optimizer changes: all (longrope), or those from the critical dimension up (longrope2)."""
        return range(self.critical_dim, self.pairs)

    def genome(self, factors: np.ndarray, attention_factor: float | None = None, n_hat: int = 0) -> Genome:
        """The nearest genome in the space. longrope: factors rounded, clipped to the bounds, made monotone.
        longrope2: the searched pairs rounded, clipped, made strictly increasing with the last-pair cap, and the
        pairs below d_cd derived from the critical pair. The official LongRoPE2 search ignores the initial factors
        in this mode; we seed from them (PI, NTK, YaRN, files) projected this way instead."""
        if self.strict:
            steps = self._project(np.asarray(factors, dtype=np.float64))
        else:
            steps = np.clip(np.round(np.asarray(factors, dtype=np.float64) / self.step), self.low, self.high)
            steps = [int(v) for v in np.maximum.accumulate(steps.astype(np.int64))]
        attention = None
        if self.searched_attention:
            value = attention_factor if attention_factor is not None else 1.0
            attention = int(np.clip(round(value / self.attention_step), self.attention_low, self.attention_high))
        return Genome(tuple(steps), n_hat, attention)

    def from_seed(self, seed: Seed) -> Genome:
        return self.genome(seed.factors, seed.attention_factor)

    def factors(self, genome: Genome) -> np.ndarray:
        """The factors; longrope2: the pairs below d_cd exactly lambda_cd^(i/d_cd), not their rounded steps."""
        factors = np.asarray(genome.factor_steps, dtype=np.float64) * self.step
        if self.strict:
            factors[: self.critical_dim] = self.low_pair_factors(genome.factor_steps[self.critical_dim])
        return factors

    def candidate(self, genome: Genome, generation: int, seed: str | None = None) -> Candidate:
        """A genome decoded for scoring: its key, factors and attention factor on this grid, its n_hat."""
        return Candidate(
            key=genome.key,
            generation=generation,
            factors=self.factors(genome),
            attention_factor=self.attention_factor(genome),
            n_hat=genome.n_hat,
            seed=seed,
        )

    def attention_factor(self, genome: Genome) -> float | None:
        if genome.attention_steps is None:
            return None
        return genome.attention_steps * self.attention_step

    def is_valid(self, genome: Genome) -> bool:
        steps = np.asarray(genome.factor_steps)
        if len(steps) != self.pairs:
            return False
        if not self.strict:
            return bool(steps[0] >= self.low and steps[-1] <= self.high and np.all(np.diff(steps) >= 0))
        searched = steps[self.critical_dim :]
        capped = len(searched) < 2 or searched[-1] - searched[-2] <= self.space.cap
        derived = list(genome.factor_steps) == self.derive(list(genome.factor_steps))
        return bool(searched[0] >= self.low and searched[-1] <= self.high and np.all(np.diff(searched) > 0)) and (
            capped and derived
        )

    # ---- the longrope2 space ----

    def low_pair_factors(self, critical_steps: int) -> np.ndarray:
        """lambda_i = lambda_cd^(i/d_cd) for i < d_cd (LongRoPE2: NTK-like, geometric from 1 to lambda_cd)."""
        critical, d = critical_steps * self.step, self.critical_dim
        return np.array([critical ** (i / d) for i in range(d)], dtype=np.float64)

    def derive(self, steps: list[int]) -> list[int]:
        """longrope2: `steps` with the pairs below d_cd set from the critical pair (their steps are the rounded
        lambda_i, a function of the critical pair alone); longrope: `steps` unchanged."""
        if not self.strict or self.critical_dim == 0:
            return steps
        low_pairs = [round(value / self.step) for value in self.low_pair_factors(steps[self.critical_dim])]
        return low_pairs + list(steps[self.critical_dim :])

    def redraw_bounds(self, steps: list[int], i: int) -> tuple[int, int]:
        """Where a mutation may redraw searched pair i, given the others (inclusive, in steps).

        longrope (LongRoPE's dim_mono.py): between its neighbours, the first pair from the lower bound, the last up
        to the upper bound. longrope2: strictly between its neighbours, the first searched pair from S, the last
        up to min(length_scale, previous + 4), and the one before the last no lower than last - 4, so the cap
        holds by construction (a mutated valid parent is a valid child)."""
        first, last, gap = self.critical_dim, self.pairs - 1, 1 if self.strict else 0
        lower = steps[i - 1] + gap if i > first else self.low
        upper = steps[i + 1] - gap if i < last else self.high
        if self.strict and last > first:
            if i == last:
                upper = min(upper, steps[i - 1] + self.space.cap)
            elif i == last - 1:
                lower = max(lower, steps[last] - self.space.cap)
        return lower, upper

    def _project(self, factors: np.ndarray) -> list[int]:
        """Searched pairs into [low, high], strictly increasing (each leaves room for the pairs after it), the last
        capped at previous + 4; then the pairs below d_cd derived."""
        critical, searched = self.critical_dim, self.pairs - self.critical_dim
        steps: list[int] = []
        for j, value in enumerate(np.round(factors[critical:] / self.step)):
            lower = steps[-1] + 1 if steps else self.low
            steps.append(int(min(max(value, lower), self.high - (searched - 1 - j))))
        if searched >= 2:
            steps[-1] = min(steps[-1], steps[-2] + self.space.cap)
        return self.derive([0] * critical + steps)
