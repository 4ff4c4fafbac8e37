"""NTK and YaRN tuned on the search split: fair, strong baselines for the searched factors.

NTK-aware scaling (bloc97, 2023: `theta' = theta * factor^(d/(d-2))`, as `encodings.NtkRope` computes it) at the
nominal factor (the job's scale) is often far from its best, and an oversized factor with an attention factor
(a temperature on cos and sin) does much better, so a comparison with nominal NTK alone would flatter the search.
YaRN (Peng et al. 2023, `encodings.YarnRope`: a ramp between interpolation and extrapolation by each pair's
rotations within the original length, beta_fast 32 / beta_slow 1, attention factor 0.1 ln(factor) + 1) likewise:
its factor and its temperature are tried over a grid. compare scores every setting of both grids on the search
split at the target length and keeps each method's lowest mean NLL; the test split never sees the choice.

Two grids: `full` (the default; 56 NTK and 40 YaRN settings) and `coarse` (9 and 6), for models where every
setting is a long forward. Both try LongRoPE's own attention factor, sqrt(1 + ln s / ln L0) at the job's scale, as
a point of the attention dimension (`LONGROPE_ATTENTION`): a searched row carries it, so a tuned closed form may too.
A setting whose factor (the job's scale x its multiplier) would be below 1 is left out:
both methods need a factor of at least 1 (below it they would stretch the frequencies beyond the plain model's),
so a job under 2x tries fewer settings, and compare.json's `tuning_grid` counts those tried.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from longrope.encodings import NtkRope, RopeMethod, YarnRope
from longrope.search.reports.compare_scoring import ComparePool, Progress, no_progress
from longrope.search.run.job_context import JobContext

# An attention-factor point that stands for LongRoPE's own, sqrt(1 + ln s / ln L0) at the job's scale s (Ding et al.
# 2024; transformers' `_compute_longrope_parameters`): 1.0742 at 4x of 8k. Every grid has it, so a tuned closed form
# can take the temperature a searched LongRoPE row carries.
LONGROPE_ATTENTION = "longrope"
NTK_SCALE_MULTIPLIERS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
NTK_ATTENTION_FACTORS = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, LONGROPE_ATTENTION)

AttentionPoint = float | str | None


@dataclass(frozen=True)
class TuningGrid:
    """The settings tried: scale multipliers (the method's factor = the job's scale x multiplier) and attention
    factors; None among YaRN's attention factors is YaRN's own, 0.1 ln(factor) + 1, and `LONGROPE_ATTENTION`
    LongRoPE's at the job's scale."""

    ntk_multipliers: tuple[float, ...]
    ntk_attention: tuple[AttentionPoint, ...]
    yarn_multipliers: tuple[float, ...]
    yarn_attention: tuple[AttentionPoint, ...]

    @property
    def size(self) -> int:
        ntk = len(self.ntk_multipliers) * len(self.ntk_attention)
        return ntk + len(self.yarn_multipliers) * len(self.yarn_attention)


TUNING_GRIDS = {
    "full": TuningGrid(
        NTK_SCALE_MULTIPLIERS,
        NTK_ATTENTION_FACTORS,
        (0.75, 1.0, 1.5, 2.0, 3.0),
        (None, 1.0, 1.05, 1.1, 1.15, 1.2, 1.3, LONGROPE_ATTENTION),
    ),
    "coarse": TuningGrid((1.0, 1.5, 2.0), (1.0, 1.1, LONGROPE_ATTENTION), (1.0, 1.5), (None, 1.0, LONGROPE_ATTENTION)),
}


def attention_value(context: JobContext, point: AttentionPoint) -> float | None:
    """A grid point's attention factor: LongRoPE's at the job's scale for `LONGROPE_ATTENTION`, else the point."""
    if point == LONGROPE_ATTENTION:
        return context.longrope(np.ones(context.pairs)).attention_factor
    return point


def baseline_shape(context: JobContext) -> dict:
    return {
        "head_dim": context.method.head_dim,
        "rope_theta": context.method.rope_theta,
        "partial_rotary_factor": context.method.partial_rotary_factor,
        "max_position_embeddings": context.target_length,
    }


def ntk_grid(context: JobContext, grid: TuningGrid = TUNING_GRIDS["full"]) -> dict[tuple[float, float], RopeMethod]:
    """NTK at several scales and attention factors, each as LongRoPE factors at the target length."""
    shape, methods = baseline_shape(context), {}
    for multiplier in usable(context, grid.ntk_multipliers):
        factors = NtkRope(factor=context.scale * multiplier, **shape).factors().double()
        for attention in grid.ntk_attention:
            methods[(multiplier, attention)] = context.longrope(
                factors, attention_factor=attention_value(context, attention)
            )
    return methods


def yarn_grid(context: JobContext, grid: TuningGrid) -> dict[tuple[float, float | None], RopeMethod]:
    """YaRN at several factors and attention factors (None: YaRN's own), its ramp as published."""
    shape = baseline_shape(context)
    return {
        (multiplier, attention): YarnRope(
            factor=context.scale * multiplier,
            original_max_position_embeddings=context.original_length,
            attention_factor=attention_value(context, attention),
            **shape,
        )
        for multiplier in usable(context, grid.yarn_multipliers)
        for attention in grid.yarn_attention
    }


def usable(context: JobContext, multipliers: tuple[float, ...]) -> tuple[float, ...]:
    """The multipliers whose factor, the job's scale times it, is at least 1."""
    return tuple(m for m in multipliers if context.scale * m >= 1.0)


def tuning_grids(context: JobContext, grid_name: str) -> dict[str, dict[tuple, RopeMethod]]:
    """{"ntk_tuned": {setting: method}, "yarn_tuned": {...}}: every setting of the named grid tried for this job."""
    grid = TUNING_GRIDS[grid_name]
    return {"ntk_tuned": ntk_grid(context, grid), "yarn_tuned": yarn_grid(context, grid)}


def setting_label(name: str, setting: tuple) -> str:
    """A setting's label among the methods scored: e.g. "ntk_tuned (1.5, 1.1)"."""
    return f"{name} {setting}"


def pick_tuned(
    context: JobContext, grids: dict[str, dict[tuple, RopeMethod]], mean_nll: Mapping[str, float]
) -> tuple[dict[str, RopeMethod], dict[str, dict[str, float]]]:
    """({"ntk_tuned": method, "yarn_tuned": method}, each one's settings): for each method, the setting with the
    lowest mean NLL on the search split (`mean_nll`, by `setting_label`)."""
    tuned, settings = {}, {}
    for name, candidates in grids.items():
        best = min(candidates, key=lambda key, name=name: mean_nll[setting_label(name, key)])
        method = candidates[best]
        # NTK as it would be exported: its scale in the keys vLLM reads too, so its vLLM row differs only by regime
        tuned[name] = method.for_both_runtimes() if name == "ntk_tuned" else method
        factor_key = "ntk_factor" if name == "ntk_tuned" else "yarn_factor"
        settings[name] = {factor_key: context.scale * best[0], "attention_factor": method.attention_factor}
    return tuned, settings


def tuned_baselines(
    context: JobContext, pool: ComparePool, grids: dict[str, dict[tuple, RopeMethod]], progress: Progress = no_progress
) -> tuple[dict[str, RopeMethod], dict[str, dict[str, float]]]:
    """`pick_tuned` over the grids (`tuning_grids`), every setting scored in one pass on the search split at the
    target length."""
    tuning = ("tuning", context.target_length)
    methods = {setting_label(name, key): method for name, found in grids.items() for key, method in found.items()}
    scores = pool.score(methods, [tuning], progress, phase="NTK and YaRN settings tried")[tuning]
    return pick_tuned(context, grids, {label: score.mean_nll for label, score in scores.items()})
