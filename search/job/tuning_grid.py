"""The tuning grids' settings as methods of this job (search/config/tuning_grids.py holds the settings): what
compare scores on the search split, and what a search takes as seeds (`search.seeds: [ntk_tuned, yarn_tuned]`,
`JobContext.seeds`). A setting whose factor (the job's scale x its multiplier) would be below 1 is left out: the
methods need a factor of at least 1.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from longrope.encodings import LongRope, RopeMethod
from longrope.encodings.baselines import closed_forms
from longrope.search.config.tuning_grids import LONGROPE_ATTENTION, AttentionPoint, MethodGrid


class GridContext(Protocol):
    """What a grid's settings are built from: the job's lengths and scale, the model's RoPE, and its LongRoPE
    builder (`JobContext` has them all; a Protocol here, since the job context imports this module)."""

    scale: float
    pairs: int
    method: RopeMethod
    original_length: int
    target_length: int

    def longrope(self, factors, **fields) -> LongRope: ...


def attention_value(context: GridContext, point: AttentionPoint) -> float | None:
    """A grid point's attention factor: LongRoPE's at the job's scale for `LONGROPE_ATTENTION`, else the point."""
    if point == LONGROPE_ATTENTION:
        return context.longrope(np.ones(context.pairs)).attention_factor
    return point


def tuned_method(context: GridContext, name: str, factor: float, attention: float | None) -> RopeMethod:
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


def method_grid(context: GridContext, name: str, grid: MethodGrid) -> dict[tuple[float, AttentionPoint], RopeMethod]:
    """The closed form `name` at every setting of `grid` whose factor is at least 1 (`usable`)."""
    return {
        (multiplier, point): tuned_method(context, name, context.scale * multiplier, attention_value(context, point))
        for multiplier in usable(context, grid.multipliers)
        for point in grid.attention
    }


def usable(context: GridContext, multipliers: tuple[float, ...]) -> tuple[float, ...]:
    """The multipliers whose factor, the job's scale times it, is at least 1."""
    return tuple(m for m in multipliers if context.scale * m >= 1.0)
