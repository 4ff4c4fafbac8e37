"""The `search:` section: the search space, the optimizer and its settings, racing, early stopping, stages."""

from __future__ import annotations

import itertools
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from longrope.encodings.baselines import seed_names, tuned_names, tuned_row
from longrope.search.config.optimizer_sections import checked_sections, section
from longrope.search.config.strict import (
    MAX_COUNT,
    MAX_FACTOR,
    MAX_SEED,
    MIN_GRID_STEP,
    N_HAT_CHOICES,
    PathText,
    SeedName,
    Strict,
)
from longrope.search.config.tuning_grids import TUNING_GRIDS

# PI, NTK-aware and YaRN at their nominal settings (the LongRoPE paper's seeds), and every setting of the tuned closed
# forms' coarse grid: the first generation then holds each scale compare's tuned rows try (NTK at 1.5 and 2 times the
# nominal factor, YaRN at 1.5), read with the search's attention factor; with `attention_factor.mode: searched` the
# grid's attention points too, so the search starts where compare's tuned row ends. Settings that differ only in an
# attention factor the search does not search are one candidate.
DEFAULT_SEEDS = ("pi", "ntk", "yarn", *map(tuned_row, tuned_names()))


class NHatConfig(Strict):
    enabled: bool = Field(
        default=False,
        description="search n_hat, the first positions kept un-scaled (off: transformers and vLLM cannot express it)",
    )
    choices: tuple[int, ...] = Field(default=N_HAT_CHOICES, description="the n_hat values the search may pick")

    @field_validator("choices")
    @classmethod
    def _non_negative(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or min(value) < 0:
            raise ValueError(f"must be non-empty and >= 0, got {list(value)}")
        return tuple(sorted(set(value)))


class AttentionFactorConfig(Strict):
    mode: Literal["longrope", "searched"] = Field(
        default="longrope",
        description="longrope: transformers' formula, sqrt(1 + ln(s) / ln(original_length)); searched: a searched gene",
    )
    low: float = Field(default=1.0, gt=0, le=100, description="the searched attention factor's lower bound")
    high: float = Field(default=1.6, gt=0, le=100, description="the searched attention factor's upper bound")
    step: float = Field(default=0.01, ge=MIN_GRID_STEP, le=1, description="the searched attention factor's grid step")

    @model_validator(mode="after")
    def _ordered(self) -> AttentionFactorConfig:
        if self.high < self.low:
            raise ValueError(f"high: must be >= low ({self.low}), got {self.high}")
        return self


class EarlyStopConfig(Strict):
    patience: int | None = Field(
        default=None, ge=1, description="stop after this many generations without improvement; null: never early"
    )
    min_improvement: float = Field(
        default=0.001, ge=0, description="what counts as an improvement, in mean NLL (nats per token)"
    )


class RacingConfig(Strict):
    """Stop scoring a child once it is clearly worse than the worst parent, paired on the same windows.

    After each group of `group_windows` windows (after at least `min_windows`), with d_j the child's per-token NLL
    minus the worst parent's on window j: stop when mean(d) - z * sd(d) / sqrt(k) > 0 (a one-sided paired bound).
    """

    enabled: bool = Field(
        default=False, description="stop scoring a child once it is clearly worse than the worst parent"
    )
    z: float = Field(default=2.0, ge=0, le=10, description="how clearly: the one-sided bound's z, in standard errors")
    min_windows: int = Field(
        default=3, ge=2, le=MAX_COUNT, description="windows scored before a child may be stopped (a paired sd needs 2)"
    )
    group_windows: int = Field(default=1, ge=1, le=MAX_COUNT, description="windows scored between two looks")


class SurrogateConfig(Strict):
    """Screen the GA's children before any worker scores them (surrogate-assisted evolution; Jin, "A comprehensive
    survey of fitness approximation in evolutionary computation", Soft Computing 9, 2005, "pre-selection").

    A generation scores `scored_share` x (mutations + crossovers) children (at least 1) and breeds `proposals` x as
    many, mutations and crossovers in the configured ratio; a ridge regression fitted on every scored candidate of the
    run predicts each one's mean NLL, and the best-predicted are scored. A share `exploration` of the scored children
    is drawn at random from the rest instead, so a wrong surrogate cannot shut the search out of a region.
    """

    enabled: bool = Field(default=False, description="screen the GA's children with a surrogate before scoring them")
    scored_share: float = Field(
        default=0.5, gt=0, le=1, description="share of a generation's mutations + crossovers that is scored"
    )
    proposals: int = Field(
        default=8, ge=2, le=64, description="children bred per child scored (the surrogate picks which are scored)"
    )
    exploration: float = Field(
        default=0.25, ge=0, le=1, description="share of the scored children drawn at random from the screened-out"
    )
    model: Literal["ridge", "gaussian_process"] = Field(
        default="ridge",
        description="ridge: ridge regression on log factors, their squares, attention factor, n_hat; gaussian_process: "
        "a GP (RBF kernel, median-distance length scale) on the same features",
    )
    ridge: float = Field(
        default=1.0, gt=0, le=1e6, description="the ridge penalty on the surrogate's standardized features"
    )
    noise: float = Field(
        default=1e-3, gt=0, le=1e6, description="gaussian_process: the noise added to the kernel's diagonal"
    )


class CmaesConfig(Strict):
    """CMA-ES (the `cma` package) over log-increments of the factors; see search/optimizers/cmaes.py. It is sized by
    its own settings: generation 0 scores the seeds, then `generations` generations of `population` samples."""

    sigma: float = Field(default=0.05, gt=0, le=10, description="CMA-ES's initial step size, in log-factor units")
    population: int | None = Field(
        default=None,
        ge=2,
        le=MAX_COUNT,
        description="CMA-ES samples per generation; null: pycma's default, 4 + floor(3 ln n) for n coordinates",
    )
    generations: int = Field(default=40, ge=0, le=MAX_COUNT, description="CMA-ES generations after the seeds")
    sizing: Literal["own", "ga"] = Field(
        default="own",
        description="own: population and generations above; ga: the GA's budget (search.population + "
        "search.generations x children) in generations of mutations + crossovers samples when population is null, "
        "so CMA-ES and the GA spend one budget",
    )


class GradientConfig(Strict):
    """Gradient descent on the factors (search/optimizers/gradient.py): perplexity is smooth in every factor, so one
    backward pass gives the gradient for all pairs. The factors are parametrized so that every step satisfies the
    official constraints (non-decreasing across pairs, within [1, max_factor]; the attention factor within its bounds),
    the search windows are split into the gradient's and `holdout_windows` held out for the stopping rule, and every
    step's point is scored on all of them (a candidate in history.jsonl like any other). Adam (Kingma and Ba 2015) with
    the default betas. `hybrid` polishes the evolution's best with `polish_steps` steps every `polish_every` generations
    and always once more when the evolution ends (its last generation, an early stop), unless that generation's best was
    just polished; a polish step is kept only where it lowers the search NLL (a backtracking line search, Nocedal and
    Wright Algorithm 3.1: search/optimizers/line_search.py), or, with `polish_method: adam`, by Adam as above."""

    steps: int = Field(default=60, ge=0, le=MAX_COUNT, description="gradient steps after the seeds are scored")
    learning_rate: float = Field(default=0.15, gt=0, le=10, description="Adam's step size, in parameter units")
    windows_per_step: int | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        description="gradient windows per step, a block cycling through them; null: all of them every step",
    )
    holdout_windows: int = Field(
        default=2, ge=1, le=MAX_COUNT, description="search windows held out from the gradient (the stopping rule's)"
    )
    patience: int | None = Field(
        default=10, ge=1, le=MAX_COUNT, description="stop after this many steps without a held-out gain; null: never"
    )
    min_improvement: float = Field(
        default=1e-4, ge=0, description="a held-out gain, in mean NLL (nats per token), that resets the patience"
    )
    polish_every: int | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        description="hybrid: polish the evolution's best every this many generations; its final best always; "
        "null: the final best only",
    )
    polish_steps: int = Field(default=10, ge=1, le=MAX_COUNT, description="hybrid: gradient steps per polish")
    polish_learning_rate: float = Field(
        default=0.05, gt=0, le=10, description="hybrid: the polish's first step size (line search) or Adam's step size"
    )
    polish_method: Literal["line_search", "adam"] = Field(
        default="line_search",
        description="hybrid: line_search keeps a step only if it lowers the search NLL (never worse than the GA's "
        "best); adam: Adam's steps, kept whatever they score",
    )
    polish_probes: int = Field(
        default=1,
        ge=1,
        le=16,
        description="hybrid, line_search: trial steps scored at once from the same point (alpha, alpha/2, ...); the "
        "first that lowers the NLL enough is kept, as trying them one at a time would (exactly so with "
        "windows_per_step null): set it to fill workers that a step's windows leave idle",
    )

    def polishes_after(self, generation: int, last: int, ending: bool = False) -> bool:
        """Whether the hybrid polishes its best after `generation` (done; 0 is the initial population, never
        polished) of a run whose last is `last`: after every polish_every-th generation, after the last, and after
        an early stop (`ending`). The one rule the hybrid follows and `status` counts the polishes still due by."""
        every = self.polish_every
        return generation > 0 and (bool(every and generation % every == 0) or generation >= last or ending)

    @model_validator(mode="after")
    def _probes_need_line_search(self) -> GradientConfig:
        if self.polish_probes > 1 and self.polish_method != "line_search":
            raise ValueError(
                f"polish_probes: {self.polish_probes} trial steps at once need polish_method 'line_search' (Adam's "
                f"next step depends on each result), got '{self.polish_method}'"
            )
        return self

    def polishes(self, generations: int) -> int:
        """The hybrid's polishes in a run of `generations` that is not stopped early: one after every
        polish_every-th generation, and one after the last if that is not such a generation already (an early
        stop ends with one polish too, so this is also the most a run can do)."""
        every = self.polish_every or generations + 1
        if generations == 0:
            return 0
        return generations // every + (generations % every != 0)


class SearchConfig(Strict):
    """The search section. Beside these fields it holds `<kind>:`, the settings of an optimizer registered with a
    settings model of its own (`optimizer_sections`), kept as pydantic's extra fields so config.json writes them
    where the user did."""

    model_config = ConfigDict(**Strict.model_config | {"extra": "allow"})

    population: int = Field(default=64, ge=2, le=MAX_COUNT, description="candidates in generation 0")
    generations: int = Field(default=40, ge=0, le=MAX_COUNT, description="generations after generation 0")
    parents: int = Field(default=32, ge=1, le=MAX_COUNT, description="the best candidates kept as parents")
    mutations: int = Field(default=16, ge=0, le=MAX_COUNT, description="children by mutation, per generation")
    crossovers: int = Field(default=16, ge=0, le=MAX_COUNT, description="children by crossover, per generation")
    change_probability: float = Field(
        default=0.3, gt=0, le=1, description="the chance that a mutation changes each factor"
    )
    grid_step: float = Field(
        default=0.01, ge=MIN_GRID_STEP, le=1, description="factors live on this grid (a candidate's identity)"
    )
    max_factor: float | None = Field(
        default=None, gt=1, le=MAX_FACTOR, description="the largest factor; null: 1.25 x target/original (the paper)"
    )
    seeds: tuple[SeedName, ...] = Field(
        default=DEFAULT_SEEDS,
        description=f"closed forms at the target that start the population: any of {', '.join(seed_names())}; "
        f"or {', '.join(map(tuned_row, tuned_names()))}: every setting of its coarse tuning grid (its attention "
        "points only where attention_factor.mode is searched); a model's own RoPE scaling joins them by itself",
    )
    seed_files: tuple[PathText, ...] = Field(
        default=(),
        description="more seeds: factors JSON files (what `longrope export` writes), other runs' dirs, or a "
        "model's config.json (its RoPE scaling moved to the target)",
    )
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="the optimizer's random seed")
    n_hat: NHatConfig = Field(default=NHatConfig(), description="section: n_hat, the un-scaled first positions")
    attention_factor: AttentionFactorConfig = Field(
        default=AttentionFactorConfig(), description="section: the attention factor (temperature)"
    )
    early_stop: EarlyStopConfig = Field(default=EarlyStopConfig(), description="section: stopping early")
    optimizer: str = Field(
        default="dim_mono",
        pattern=r"^[a-z][a-z0-9_]{0,63}$",
        description="dim_mono: the LongRoPE release's evolution; cmaes: CMA-ES (search/optimizers/cmaes.py); "
        "gradient: descent on the factors (search/optimizers/gradient.py); hybrid: dim_mono with its best polished by "
        "gradient steps; any other optimizer registered in search/optimizers/factory.py (which also refuses a "
        "setting the optimizer cannot honour)",
    )
    schedule: Literal["generational", "steady"] = Field(
        default="generational",
        description="generational: parents chosen once per generation; steady: after every scored child",
    )
    racing: RacingConfig = Field(default=RacingConfig(), description="section: racing children on paired windows")
    surrogate: SurrogateConfig = Field(
        default=SurrogateConfig(), description="section: screening the GA's children with a surrogate"
    )
    cmaes: CmaesConfig = Field(default=CmaesConfig(), description="section: CMA-ES settings")
    gradient: GradientConfig = Field(
        default=GradientConfig(), description="section: gradient descent settings (optimizer gradient or hybrid)"
    )
    space: Literal["longrope", "longrope2"] = Field(
        default="longrope",
        description="longrope: every pair searched; longrope2: only pairs >= the critical dimension, within "
        "[target/original, length_scale], the pairs below set from the critical pair (LongRoPE2, arXiv 2502.20082)",
    )
    critical_dim: int | None = Field(
        default=None, ge=0, le=MAX_COUNT, description="longrope2's critical pair; null: ceil(log_theta(L0/2pi) d/2) - 1"
    )
    length_scale: float | None = Field(
        default=None, gt=1, le=MAX_FACTOR, description="longrope2's largest factor; null: 2 x target/original"
    )
    factor: Literal["long", "short"] = Field(
        default="long",
        description="long: the factors used past original_length; short: those used up to it (Phi-3), searched on "
        "windows of original_length tokens with long_factors kept",
    )
    long_factors: PathText | None = Field(
        default=None, description="the long factors a short-factor search keeps: a factors file or a run directory"
    )
    stages: tuple[int, ...] = Field(
        default=(), description="progressive search: shorter target lengths first, each seeding the next"
    )
    tensorboard: bool = Field(
        default=False,
        description="write TensorBoard scalars to RUN/tensorboard/ after every generation (the tensorboard extra: "
        "pip install 'longrope-search[tensorboard]'); not part of the run's identity, like workers",
    )

    @field_validator("stages")
    @classmethod
    def _increasing(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        for first, second in itertools.pairwise(value):
            if second <= first:
                raise ValueError(f"stage lengths must increase, got {first} then {second}")
        return value

    @model_validator(mode="after")
    def _optimizer_sections(self) -> SearchConfig:
        extra = self.__pydantic_extra__
        extra.update(checked_sections(self.optimizer, extra))
        return self

    def most_seeds(self) -> int:
        """Seeds a search starts from, at most: each closed form of `seeds` (a tuned one, `ntk_tuned`, every
        setting of its coarse grid, or every scale of it where the attention factor is not searched), and two a seed
        file (a run at another target length gives its best and those
        factors moved to this target: job_context.py `seeds_from_file`)."""
        searched = self.attention_factor.mode == "searched"
        tuned = {tuned_row(name): TUNING_GRIDS["coarse"].line(name).seed_grid(searched).size for name in tuned_names()}
        return sum(tuned.get(name, 1) for name in self.seeds) + 2 * len(self.seed_files)

    def optimizer_settings(self) -> BaseModel:
        """The configured optimizer's own settings (its registered section), for an optimizer that has some."""
        return section(self.optimizer, self.__pydantic_extra__ or {})

    @model_validator(mode="after")
    def _sizes(self) -> SearchConfig:
        if self.factor == "short" and not self.long_factors:
            raise ValueError("long_factors: factor 'short' needs the long factors it keeps (a factors file or run)")
        if self.factor == "short" and self.attention_factor.mode == "searched":
            raise ValueError(
                "attention_factor.mode: a short-factor search keeps the long factors' attention factor (transformers "
                "applies it in both regimes); use 'longrope'"
            )
        if self.factor == "short" and self.space == "longrope2":
            raise ValueError("space: a short-factor search needs 'longrope' (longrope2's bounds start at the scale)")
        if self.factor == "short" and self.stages:
            raise ValueError(f"stages: a short-factor search has one length (original_length), got {list(self.stages)}")
        if self.parents > self.population:
            raise ValueError(f"parents: must be <= population ({self.population}), got {self.parents}")
        if self.mutations + self.crossovers < 1:
            raise ValueError("mutations: mutations + crossovers must be at least 1, got 0")
        if self.factor == "long" and not self.seeds and not self.seed_files:
            raise ValueError(
                f"seeds: a population needs at least one seed: name a closed form ({', '.join(seed_names())}) or "
                "give search.seed_files, got []"
            )
        return self
