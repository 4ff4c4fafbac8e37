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

from longrope.search.optimizers.evolution import EvolutionState
from longrope.search.optimizers.factory import SEARCHERS
from longrope.search.optimizers.hybrid import HybridState
from longrope.search.optimizers.searcher import PolishProgress, Searcher, SearcherState, SearchProgress


class OptimizerState(BaseModel):
    """The searcher that ran (`kind`) and its state, validated as that searcher's `state_model`."""

    model_config = ConfigDict(strict=True, extra="forbid")

    kind: str
    state: SerializeAsAny[SearcherState] | None = None  # format 3 on: only a searcher that does not replay (steady)

    @model_validator(mode="before")
    @classmethod
    def _typed(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("state"), dict):  # null: a replayed searcher
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


def legacy_progress(state: SearcherState, search: Any, last_generation: int) -> SearchProgress:
    """A format-1/2 state.json's searcher state as the `progress` format 3 writes: the generation, the surrogate's
    counts, the stop, and a hybrid's polish under way or due after the last generation done (by the rule the
    hybrid polishes by, `GradientConfig.polishes_after`)."""
    evolution = state.evolution if isinstance(state, HybridState) else state
    counts = {}
    if isinstance(evolution, EvolutionState):
        counts = {"proposed": evolution.proposed, "screened_out": evolution.screened_out}
    progress = SearchProgress(generation=state.generation, stopped_early=state.stopped_early, **counts)
    if not isinstance(state, HybridState):
        return progress
    steps, done = search.gradient.polish_steps, state.generation - 1
    if state.polish is not None:
        steps_done, rounded = min(state.polish.generation - 1, steps), state.polish.descent.rounded
        polish = PolishProgress(after_generation=done, steps_done=steps_done, steps=steps, rounded=rounded)
    elif done > state.polished_through and search.gradient.polishes_after(
        done, last_generation, evolution.stopped_early or evolution.exhausted
    ):
        polish = PolishProgress(after_generation=done, steps_done=0, steps=steps)
    else:
        return progress
    return progress.model_copy(update={"polish": polish})
