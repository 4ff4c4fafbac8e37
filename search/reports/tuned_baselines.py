"""The closed forms compare tunes (NTK and YaRN today: each class's `tuned`), tuned on the search split: fair,
strong baselines for the searched factors.

NTK-aware scaling (bloc97, 2023: `theta' = theta * factor^(d/(d-2))`, as `encodings.NtkRope` computes it) at the
nominal factor (the job's scale) is often far from its best, and an oversized factor with an attention factor
(a temperature on cos and sin) does much better, so a comparison with nominal NTK alone would flatter the search.
YaRN (Peng et al. 2023, `encodings.YarnRope`: a ramp between interpolation and extrapolation by each pair's
rotations within the original length, beta_fast 32 / beta_slow 1, attention factor 0.1 ln(factor) + 1) likewise:
its factor and its temperature are tried over a grid. compare scores every setting of every tuned method on the
search split at the target length and keeps each method's lowest mean NLL; the test split never sees the choice.

Two grids: `full` (the default; 56 NTK and 40 YaRN settings) and `coarse` (9 and 6), for models where every
setting is a long forward; a tuned method without a line of its own in a grid takes the grid's `default` line. Every
line tries LongRoPE's own attention factor, sqrt(1 + ln s / ln L0) at the job's scale, as a point of the attention
dimension (`LONGROPE_ATTENTION`): a searched row carries it, so a tuned closed form may too.
A setting whose factor (the job's scale x its multiplier) would be below 1 is left out:
the methods need a factor of at least 1 (below it they would stretch the frequencies beyond the plain model's),
so a job under 2x tries fewer settings, and compare.json's `tuning_grid` counts those tried.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from longrope.encodings import LongRope, RopeMethod
from longrope.encodings.baselines import closed_forms, tuned_names
from longrope.search.job.job_context import JobContext
from longrope.search.reports.compare_result import tuned_row
from longrope.search.reports.compare_scoring import ComparePool, Progress, no_progress

# An attention-factor point that stands for LongRoPE's own, sqrt(1 + ln s / ln L0) at the job's scale s (Ding et al.
# 2024; transformers' `_compute_longrope_parameters`): 1.0742 at 4x of 8k. Every grid has it, so a tuned closed form
# can take the temperature a searched LongRoPE row carries.
LONGROPE_ATTENTION = "longrope"
NTK_SCALE_MULTIPLIERS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
NTK_ATTENTION_FACTORS = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, LONGROPE_ATTENTION)

AttentionPoint = float | str | None


@dataclass(frozen=True)
class MethodGrid:
    """One method's settings: scale multipliers (its factor = the job's scale x multiplier) and attention points;
    None is the method's own attention factor (YaRN's 0.1 ln(factor) + 1), `LONGROPE_ATTENTION` LongRoPE's at the
    job's scale."""

    multipliers: tuple[float, ...]
    attention: tuple[AttentionPoint, ...]


@dataclass(frozen=True)
class TuningGrid:
    """The settings tried for each tuned closed form: its own line where the grid has one, else `default`."""

    lines: Mapping[str, MethodGrid]
    default: MethodGrid

    def line(self, name: str) -> MethodGrid:
        return self.lines.get(name, self.default)


TUNING_GRIDS = {
    "full": TuningGrid(
        {
            "ntk": MethodGrid(NTK_SCALE_MULTIPLIERS, NTK_ATTENTION_FACTORS),
            "yarn": MethodGrid((0.75, 1.0, 1.5, 2.0, 3.0), (None, 1.0, 1.05, 1.1, 1.15, 1.2, 1.3, LONGROPE_ATTENTION)),
        },
        default=MethodGrid(NTK_SCALE_MULTIPLIERS, (None, *NTK_ATTENTION_FACTORS)),
    ),
    "coarse": TuningGrid(
        {
            "ntk": MethodGrid((1.0, 1.5, 2.0), (1.0, 1.1, LONGROPE_ATTENTION)),
            "yarn": MethodGrid((1.0, 1.5), (None, 1.0, LONGROPE_ATTENTION)),
        },
        default=MethodGrid((1.0, 1.5, 2.0), (None, 1.0, 1.1, LONGROPE_ATTENTION)),
    ),
}


def attention_value(context: JobContext, point: AttentionPoint) -> float | None:
    """A grid point's attention factor: LongRoPE's at the job's scale for `LONGROPE_ATTENTION`, else the point."""
    if point == LONGROPE_ATTENTION:
        return context.longrope(np.ones(context.pairs)).attention_factor
    return point


def tuned_method(context: JobContext, name: str, factor: float, attention: float | None) -> RopeMethod:
    """The closed form `name` with `factor` for its scale and `attention` for its attention factor (None: its own):
    the method itself where its rope_parameters have an `attention_factor` key (YaRN), else its per-pair factors at
    the target as LongRoPE with that attention factor (NTK-aware has none)."""
    method = closed_forms()[name].nominal(
        context.method.rotary_shape, original=context.original_length, target=context.target_length, scale=factor
    )
    if attention is None:
        return method
    fields = method.model_dump(by_alias=True)
    if "attention_factor" in fields:
        return type(method).model_validate({**fields, "attention_factor": attention})
    return context.longrope(method.factors(context.target_length).double(), attention_factor=attention)


def method_grid(context: JobContext, name: str, grid: MethodGrid) -> dict[tuple[float, AttentionPoint], RopeMethod]:
    """The closed form `name` at every setting of `grid` whose factor is at least 1 (`usable`)."""
    return {
        (multiplier, point): tuned_method(context, name, context.scale * multiplier, attention_value(context, point))
        for multiplier in usable(context, grid.multipliers)
        for point in grid.attention
    }


def usable(context: JobContext, multipliers: tuple[float, ...]) -> tuple[float, ...]:
    """The multipliers whose factor, the job's scale times it, is at least 1."""
    return tuple(m for m in multipliers if context.scale * m >= 1.0)


def tuning_grids(context: JobContext, grid_name: str) -> dict[str, dict[tuple, RopeMethod]]:
    """{tuned row: {setting: method}} ("ntk_tuned", "yarn_tuned", ...): every setting of the named grid tried for
    each tuned closed form of this job."""
    grid = TUNING_GRIDS[grid_name]
    return {tuned_row(name): method_grid(context, name, grid.line(name)) for name in tuned_names()}


def setting_label(name: str, setting: tuple) -> str:
    """A setting's label among the methods scored: e.g. "ntk_tuned (1.5, 1.1)"."""
    return f"{name} {setting}"


def pick_tuned(
    context: JobContext, grids: dict[str, dict[tuple, RopeMethod]], mean_nll: Mapping[str, float]
) -> tuple[dict[str, RopeMethod], dict[str, dict[str, float]]]:
    """({tuned row: method}, {tuned row: its setting}): for each tuned closed form, the setting of `grids`
    (`tuning_grids`) with the lowest mean NLL on the search split (`mean_nll`, by `setting_label`). A LongRoPE row
    (tuned NTK) states its scale in every key both runtimes read, as an export would, so its vLLM row differs only
    by regime."""
    tuned, settings = {}, {}
    for name in tuned_names():
        row = tuned_row(name)
        best = min(grids[row], key=lambda key, row=row: mean_nll[setting_label(row, key)])
        method = grids[row][best]
        tuned[row] = method.for_both_runtimes() if isinstance(method, LongRope) else method
        settings[row] = {f"{name}_factor": context.scale * best[0], "attention_factor": method.attention_factor}
    return tuned, settings


def tuned_baselines(
    context: JobContext, pool: ComparePool, grids: dict[str, dict[tuple, RopeMethod]], progress: Progress = no_progress
) -> tuple[dict[str, RopeMethod], dict[str, dict[str, float]]]:
    """`pick_tuned` over the grids (`tuning_grids`), every setting scored in one pass on the search split at the
    target length."""
    tuning = ("tuning", context.target_length)
    methods = {setting_label(name, key): method for name, found in grids.items() for key, method in found.items()}
    scores = pool.score(methods, [tuning], progress, phase=f"{' and '.join(tuned_names())} settings tried")[tuning]
    return pick_tuned(context, grids, {label: score.mean_nll for label, score in scores.items()})
