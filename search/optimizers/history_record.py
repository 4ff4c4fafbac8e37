"""One line of history.jsonl as its model: what a candidate was scored with and what it scored. It is also what
a searcher is told: the record travels as this one model from the result assembled (or the line read on resume)
to the searcher's `tell`, to `status` and to `export`, so no second shape of it is kept in step with the first."""

from __future__ import annotations

import json
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

RECORDED_DECIMALS = 6  # history.jsonl's precision for factors: a point is scored exactly as it is recorded


def recorded_factors(factors) -> list[float]:
    """Factors as a history.jsonl line holds them (RECORDED_DECIMALS): what is written, and what a resume's replay
    compares an asked candidate with."""
    return [round(float(f), RECORDED_DECIMALS) for f in factors]


class HistoryRecord(BaseModel):
    """One line of history.jsonl: a scored candidate (mean_nll / perplexity null when the score was not finite).

    What one line can say about itself is checked here (a NLL is never negative, perplexity = exp(mean_nll), one
    token count per window NLL); what it must agree with in the rest of the run directory (the model's pairs, the
    job's windows and objective) is checked by `run_check`."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    key: str
    status: Literal["scored", "stopped", "partial", "failed"] = "scored"  # see FINAL_STATUSES
    generation: int = Field(ge=0)
    seed: str | None = None  # the seed method's name for a seed candidate
    factors: list[float]
    n_hat: int = Field(ge=0)
    attention_factor: float | None = Field(gt=0)
    mean_nll: float | None = Field(ge=0)  # nats per token: -log of a probability, never below 0
    perplexity: float | None = Field(ge=1)
    nll: list[float | None]  # per window scored so far (all of them when scored), summed over its tokens
    tokens: list[int]
    windows: str | None = None  # the search windows' hash (job.json's search_windows_hash); absent in memory
    # a descent step's (gradient, hybrid): the windows of its backward pass [first, last), their count, and the
    # gradient of the objective on them (d / d factors, then d / d attention factor; null where not finite)
    gradient_windows: list[int] | None = None
    backward_windows: int = Field(default=0, ge=0)
    gradient: list[float | None] | None = None
    error: str | None = Field(default=None, min_length=1)  # a failed candidate's last exception, on one line

    @model_validator(mode="after")
    def _consistent(self) -> HistoryRecord:
        problem = self._descent_problem()
        if problem:
            raise ValueError(problem)
        if any(f <= 0 for f in self.factors):
            raise ValueError(f"factors: must be > 0, got {min(self.factors)}")
        if any(v is not None and v < 0 for v in self.nll):
            raise ValueError(f"nll: a window's NLL is never below 0, got {min(v for v in self.nll if v is not None)}")
        if len(self.tokens) != len(self.nll) or any(t < 1 for t in self.tokens):
            raise ValueError(f"tokens: one count >= 1 per window NLL ({len(self.nll)}), got {self.tokens[:8]}")
        if (self.status == "failed") != (self.error is not None):
            raise ValueError(f"error: a {self.status!r} record {'needs' if self.error is None else 'has no'} error")
        if self.status != "scored" and (self.mean_nll is not None or self.perplexity is not None):
            raise ValueError(f"mean_nll: a {self.status!r} record has no score, got {self.mean_nll}")
        if (self.mean_nll is None) != (self.perplexity is None):
            raise ValueError(f"perplexity: must be exp(mean_nll) (mean_nll {self.mean_nll}), got {self.perplexity}")
        if self.mean_nll is not None and not math.isclose(
            math.log(self.perplexity), self.mean_nll, rel_tol=1e-9, abs_tol=1e-12
        ):  # compared as logs: exp of a large NLL overflows
            raise ValueError(f"perplexity: must be exp(mean_nll) (mean_nll {self.mean_nll}), got {self.perplexity}")
        return self

    @property
    def score(self) -> float:
        """What a searcher ranks it by: its mean NLL per token, or inf when it has none (stopped by racing, failed,
        not finite, still partial)."""
        return math.inf if self.mean_nll is None else self.mean_nll

    @property
    def final(self) -> bool:
        """Scored on every window, stopped by racing or failed (FINAL_STATUSES): not a raced candidate's partial
        line."""
        return self.status in FINAL_STATUSES

    def line(self) -> str:
        """Its history.jsonl line: the fields it was made or read with, in field order (a field not given stays
        absent)."""
        return json.dumps(self.model_dump(mode="json", exclude_unset=True))

    def _descent_problem(self) -> str | None:
        """A descent step's three fields agree: all there or none, the windows a range of the line's own windows,
        backward_windows their count, one gradient value per factor and one for the attention factor."""
        windows, gradient = self.gradient_windows, self.gradient
        if windows is None:
            if gradient is not None or self.backward_windows:
                return (
                    "gradient_windows: missing, but the line has a gradient or backward windows (a step has all three)"
                )
            return None
        if gradient is None:
            return "gradient: missing, but the line has gradient_windows (a descent step has both)"
        if len(windows) != 2 or not 0 <= windows[0] < windows[1] <= len(self.nll):
            return f"gradient_windows: must be [first, last) within the line's {len(self.nll)} windows, got {windows}"
        if self.backward_windows != windows[1] - windows[0]:
            return (
                f"backward_windows: must be the {windows[1] - windows[0]} gradient windows, got {self.backward_windows}"
            )
        if len(gradient) != len(self.factors) + 1:
            return f"gradient: {len(gradient)} values, must be one per factor ({len(self.factors)}) and the attention's"
        return None


# "scored": every search window; "stopped": racing stopped it, clearly worse than the worst parent on the windows
# in `nll` (never a parent, never the best); "partial": the windows scored so far of a candidate still racing (a
# later line for the same key replaces it); "failed": its scoring raised on every worker it was tried on (`error`
# says how; `nll` holds the windows scored before), ranked last as a non-finite score is. Stopped, partial and
# failed records have mean_nll and perplexity null.
FINAL_STATUSES = ("scored", "stopped", "failed")
