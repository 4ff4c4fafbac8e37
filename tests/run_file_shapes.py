"""The shape of every file a run directory holds, as plain JSON, and the snapshot it is checked against.

Why: a run directory outlives the code that wrote it (users keep one for weeks and upgrade in the middle), so a
change to what config.json, job.json, history.jsonl, state.json or heartbeat.json hold must come with a fixture
run directory written by the code before the change (tests/fixtures/old_runs/README.md says how), which today's
readers are then tested on. The shape is each pydantic model's fields (name, type, constraints, default) and its
`extra` rule, walked into nested models: written by hand rather than with `model_json_schema`, whose output
changes with the pydantic release, not with our files.

`python tests/run_file_shapes.py --write` rewrites the snapshot; it refuses while the shape changed and no new
fixture was added since the snapshot was last written.
"""

from __future__ import annotations

import json
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from longrope.search.config.job_config import JobConfig
from longrope.search.optimizers.factory import SEARCHERS
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.run.heartbeat import Heartbeat
from longrope.search.run.job_record import JobRecord
from longrope.search.run.run_formats import FORMAT
from longrope.search.run.run_store import RunState

FIXTURES = Path(__file__).parent / "fixtures" / "old_runs"
SNAPSHOT = FIXTURES / "shapes.json"
FILES = {
    "config.json": JobConfig,
    "job.json": JobRecord,
    "history.jsonl": HistoryRecord,
    "state.json": RunState,
    "heartbeat.json": Heartbeat,
}


def builtin_searcher_states() -> dict[str, type[BaseModel]]:
    """state.json's `optimizer.state`, per optimizer: the state model of each searcher this package registers
    (a test may register one of its own; it writes no run directory a user keeps)."""
    return {kind: cls.state_model for kind, cls in sorted(SEARCHERS.items()) if cls.__module__.startswith("longrope.")}


def type_text(annotation: object, found: list[type[BaseModel]]) -> str:
    """An annotation as text (`list[float] | None`), with each pydantic model in it named and added to `found`."""
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        found.append(annotation)
        return annotation.__name__
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return f"{type_text(args[0], found)} {[constraint_text(extra) for extra in args[1:]]}"
    if origin is typing.Literal:
        return f"Literal{list(args)!r}"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(arg, found) for arg in args)
    if origin is not None:
        name = getattr(origin, "__name__", repr(origin))
        return f"{name}[{', '.join(type_text(arg, found) for arg in args)}]"
    return getattr(annotation, "__name__", repr(annotation))


def constraint_text(item: object) -> str:
    """A field's constraint or validator as text that does not change from one process to the next: a validator
    by its function's name (not its address), a nested `Field(...)` by its constraints."""
    if isinstance(item, FieldInfo):
        return ", ".join(constraint_text(inner) for inner in item.metadata)
    function = getattr(item, "func", None)
    if callable(function):
        return f"{type(item).__name__}({function.__module__}.{function.__qualname__})"
    return repr(item)


def default_text(field) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return f"factory {field.default_factory()!r}"
    default = field.default
    return repr(default.model_dump() if isinstance(default, BaseModel) else default)


def model_shapes(roots: dict[str, type[BaseModel]]) -> dict[str, dict]:
    """Each model reachable from `roots`, by name: its `extra` rule and its fields' type, constraints, default."""
    shapes: dict[str, dict] = {}
    queue = list(roots.values())
    while queue:
        model = queue.pop(0)
        if model.__name__ in shapes:
            continue
        found: list[type[BaseModel]] = []
        fields = {
            name: {
                "type": type_text(field.annotation, found),
                "constraints": [constraint_text(item) for item in field.metadata],
                "default": default_text(field),
            }
            for name, field in model.model_fields.items()
        }
        shapes[model.__name__] = {"extra": str(model.model_config.get("extra", "ignore")), "fields": fields}
        queue.extend(found)
    return dict(sorted(shapes.items()))


def current_shapes() -> dict:
    """The run directory's files as this code writes and reads them."""
    return {
        "format": FORMAT,
        "files": {name: model.__name__ for name, model in FILES.items()},
        "searcher_states": {kind: model.__name__ for kind, model in builtin_searcher_states().items()},
        "models": model_shapes({**FILES, **builtin_searcher_states()}),
    }


def fixture_names() -> list[str]:
    return sorted(path.name for path in FIXTURES.iterdir() if (path / "config.json").is_file())


def read_snapshot() -> dict:
    return json.loads(SNAPSHOT.read_text())


def write_snapshot() -> str:
    """Rewrite the snapshot with today's shapes and fixtures; refused (a message) while the shapes changed and no
    fixture was added since it was last written."""
    shapes, old = current_shapes(), read_snapshot() if SNAPSHOT.exists() else None
    if old is not None and old["shapes"] != shapes and set(fixture_names()) <= set(old["fixtures"]):
        return (
            "refused: the run directory's files changed shape, and no fixture was added since the snapshot; write "
            "one with the code before the change (tests/fixtures/old_runs/README.md says how), then rerun this"
        )
    SNAPSHOT.write_text(json.dumps({"shapes": shapes, "fixtures": fixture_names()}, indent=1) + "\n")
    return f"wrote {SNAPSHOT}"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/run_file_shapes.py --write")
    message = write_snapshot()
    print(message)
    sys.exit(1 if message.startswith("refused") else 0)
