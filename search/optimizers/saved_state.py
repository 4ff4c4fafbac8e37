"""state.json's `optimizer`: which searcher ran, and its own state in its own model.

`{"kind": "dim_mono", "state": {...}}` is read as the state model of the optimizer registered under that kind
(`factory.SEARCHERS`, looked up when the file is read, so an optimizer registered later is read like the built-in
ones); a state of another shape is refused with the path of the first field that does not fit, so every reader
gets the searcher's state typed.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, SerializeAsAny, create_model, model_validator

from longrope.search.optimizers.factory import SEARCHERS
from longrope.search.optimizers.searcher import SearcherState, StatefulSearcher


class OptimizerState(BaseModel):
    """The searcher that ran (`kind`) and its state, validated as that searcher's `state_model`."""

    model_config = ConfigDict(strict=True, extra="forbid")

    kind: str
    state: SerializeAsAny[SearcherState] | None = None  # only a searcher that does not replay (the steady GA)

    @model_validator(mode="before")
    @classmethod
    def _typed(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("state"), dict):  # null: a replayed searcher
            return data  # not a mapping, or a state already typed: the fields' own checks say what is wrong
        kind = data.get("kind")
        if kind not in SEARCHERS:
            raise ValueError(f"kind: unknown optimizer {kind!r}; one of {', '.join(SEARCHERS)}")
        if not issubclass(SEARCHERS[kind], StatefulSearcher):
            raise ValueError(f"state: optimizer {kind!r} keeps no state here (a replay of history.jsonl rebuilds it)")
        typed = _saved_model(SEARCHERS[kind]).model_validate(data)  # its errors name optimizer.state.<field>
        return {"kind": kind, "state": typed.state}


@functools.cache
def _saved_model(searcher: type[StatefulSearcher]) -> type[BaseModel]:
    """`{"kind": ..., "state": <the searcher's state_model>}` as a model of its own."""
    kind, state = searcher.kind, (searcher.state_model, ...)
    return create_model(
        f"Saved_{kind}", __config__=ConfigDict(strict=True, extra="forbid"), kind=(str, ...), state=state
    )
