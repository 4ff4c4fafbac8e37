"""state.json's `optimizer`: which searcher ran, and its own state in its own model, as one tagged union.

`{"kind": "dim_mono", "state": {...}}` is read as the kind's model (a state of another kind's shape is refused with
the path of the first field that does not fit), so every reader gets the searcher's state typed. A state.json
written before the searchers had states of their own held every optimizer's fields in one `evolution` object,
with the GA's early stop at the top level: `legacy_state` moves those fields into the new shape, so a run in
progress resumes across the upgrade.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from longrope.search.optimizers.cmaes import CmaesState
from longrope.search.optimizers.evolution import EvolutionState
from longrope.search.optimizers.gradient import GradientState
from longrope.search.optimizers.hybrid import HybridState

SearcherState = EvolutionState | CmaesState | GradientState | HybridState


class _Tagged(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class SavedEvolution(_Tagged):
    kind: Literal["dim_mono"]
    state: EvolutionState


class SavedCmaes(_Tagged):
    kind: Literal["cmaes"]
    state: CmaesState


class SavedGradient(_Tagged):
    kind: Literal["gradient"]
    state: GradientState


class SavedHybrid(_Tagged):
    kind: Literal["hybrid"]
    state: HybridState


OptimizerState = Annotated[SavedEvolution | SavedCmaes | SavedGradient | SavedHybrid, Field(discriminator="kind")]


def legacy_state(data: dict[str, Any]) -> dict[str, Any]:
    """An older state.json (`evolution` holding every optimizer's fields, the early stop at the top) in the
    `{"optimizer": {"kind", "state"}}` shape. Only moves fields: what it held is what the new state holds."""
    data = dict(data)
    evolution = dict(data.pop("evolution"))
    early_stop = {"best_by_generation": data.pop("best_by_generation", []), "stopped": data.pop("stopped_early", False)}
    exhausted = data.pop("exhausted", False)
    kind = evolution.pop("kind", "dim_mono")
    if kind == "dim_mono":
        state = {**_ga_fields(evolution), "early_stop": early_stop, "exhausted": exhausted}
    elif kind == "cmaes":
        state = {k: evolution[k] for k in ("generation", "told", "asked_keys") if k in evolution}
        state["early_stop"] = early_stop
    elif kind == "gradient":
        state = {k: evolution[k] for k in ("generation", "told", "descent") if k in evolution}
    else:
        polish = evolution.get("polish")
        state = {
            "evolution": {**_ga_fields(evolution), "early_stop": early_stop, "exhausted": exhausted},
            "polish": None if polish is None else {k: polish[k] for k in ("generation", "told", "descent")},
            "polished_through": evolution.get("polished_through", 0),
        }
    return {**data, "optimizer": {"kind": kind, "state": state}, "stopped_early": early_stop["stopped"]}


def _ga_fields(evolution: dict[str, Any]) -> dict[str, Any]:
    names = ("generation", "rng", "population", "told", "pending", "children_told", "generation_keys")
    return {name: evolution[name] for name in names if name in evolution}
