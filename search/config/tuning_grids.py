"""The tuning grids' settings: for each tuned closed form (NTK-aware and YaRN today, each class's `tuned`), the
scale multipliers and attention factors compare tries on the search split, and that `search.seeds: [ntk_tuned]`
takes as seeds (search/job/tuning_grid.py builds the methods).

Two grids: `full` (56 NTK and 40 YaRN settings) and `coarse` (9 and 6), for models where every setting is a long
forward; a tuned method without a line of its own in a grid takes the grid's `default` line. Every line tries
LongRoPE's own attention factor, sqrt(1 + ln s / ln L0) at the job's scale, as a point of the attention dimension
(`LONGROPE_ATTENTION`): a searched row carries it, so a tuned closed form may too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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

    @property
    def size(self) -> int:
        """Settings at most (a job under 2x drops the multipliers that would take a factor below 1)."""
        return len(self.multipliers) * len(self.attention)

    def seed_grid(self, attention_searched: bool) -> MethodGrid:
        """The settings a search takes as seeds: every one where the search has an attention factor gene, else one
        per scale, at the first attention point (settings that differ only in the attention factor are one genome)."""
        return self if attention_searched else MethodGrid(self.multipliers, self.attention[:1])


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
