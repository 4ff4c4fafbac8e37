"""state.json's `optimizer`: which searcher ran, and its own state in its own model.

`{"kind": "dim_mono", "state": {...}}` is read as the state model of the optimizer registered under that kind
(`factory.SEARCHERS`, looked up when the file is read, so an optimizer registered later is read like the built-in
ones); a state of another shape is refused with the path of the first field that does not fit, so every reader
gets the searcher's state typed. A state.json written before the searchers had states of their own held every
optimizer's fields in one `evolution` object, with the GA's early stop at the top level: `legacy_state` moves
those fields into the new shape, so a run in progress resumes across the upgrade.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, SerializeAsAny, create_model, model_validator

from longrope.search.optimizers.factory import SEARCHERS
from longrope.search.optimizers.searcher import Searcher, SearcherState


class OptimizerState(BaseModel):
    """The searcher that ran (`kind`) and its state, validated as that searcher's `state_model`."""

    model_config = ConfigDict(strict=True, extra="forbid")

    kind: str
    state: SerializeAsAny[SearcherState]

    @model_validator(mode="before")
    @classmethod
    def _typed(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("state"), dict):
            return data  # not a mapping, or a state already typed: the fields' own checks say what is wrong
        kind = data.get("kind")
        if kind not in SEARCHERS:
            raise ValueError(f"kind: unknown optimizer {kind!r}; one of {', '.join(SEARCHERS)}")
        typed = _saved_model(SEARCHERS[kind]).model_validate(data)  # its errors name optimizer.state.<field>
        return {"kind": kind, "state": typed.state}


@functools.cache
def _saved_model(searcher: type[Searcher]) -> type[BaseModel]:
    """`{"kind": ..., "state": <the searcher's state_model>}` as a model of its own."""
    kind, state = searcher.kind, (searcher.state_model, ...)
    return create_model(
        f"Saved_{kind}", __config__=ConfigDict(strict=True, extra="forbid"), kind=(str, ...), state=state
    )


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
