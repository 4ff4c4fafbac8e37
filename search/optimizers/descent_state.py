"""A descent's state (`GradientDescent.state().descent`), typed and finite: what the optimizer hands around in
memory (a polish is a descent inside the hybrid). state.json holds none: a descent is a function of its recorded
points, NLLs and gradients, so a resume replays history.jsonl instead."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from longrope.search.optimizers.line_search import LineSearchState


class AdamState(BaseModel):
    """state.json's Adam: the moments (finite; v, a mean of squares, never below 0) and the steps taken."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    m: list[float]
    v: list[float]
    t: int = Field(ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> AdamState:
        if any(value < 0 for value in self.v):
            raise ValueError(f"v: a mean of squared gradients is never below 0, got {min(self.v)}")
        return self


class DescentState(BaseModel):
    """state.json's `descent` (`GradientDescent.state_dict`): typed and finite here; its lengths (one value per
    parameter) and its agreement with history.jsonl are checked by `run_check`, which knows the run's parameter
    space, so that an error names the field that is wrong rather than the one it disagrees with."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    u: list[float] | None  # None: the seeds are not told yet
    adam: AdamState
    best_held_out: float | None  # None: no held-out NLL yet (inf in memory)
    since_gain: int = Field(ge=0)
    rounded: bool
    final: list[Any] | None  # the rounding's genome (Genome.to_json)
    points: dict[str, list[Any]]  # key -> [factors, attention factor] of every told point
    line_search: LineSearchState | None = None  # the hybrid's polish by line search (line_search.py); else Adam

    @model_validator(mode="after")
    def _consistent(self) -> DescentState:
        if self.rounded != (self.final is not None):
            raise ValueError(f"final: {self.final!r}, but rounded is {self.rounded} (the rounding's genome)")
        return self
