"""The shape of every file a run directory holds, as plain JSON, and the last release's snapshot of it.

Why: a run directory outlives the release that wrote it, so from 1.0 on every release reads every earlier
release's run directories. The shape is each pydantic model's fields (name, type, constraints, default, aliases),
its config rules (extra, strict, ...) and its validators' code, walked into nested models, plus what the fields
typed `Any` hold (a genome, the generator state): written by hand rather than with `model_json_schema`, whose
output changes with the pydantic release, not with our files.

Each release's snapshot lies beside its fixture run directories, in tests/fixtures/releases/<version>/shapes.json
(`python tests/release_fixtures.py <version>` writes both, with the code of that release). A change to a shape
since the newest release needs a new run-directory format (`run_store.FORMAT`) whose reader still reads that
release's format (`run_store.READABLE_FORMATS`); the release's fixtures hold the reader to it. Commits within a
release owe each other nothing.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import textwrap
import tokenize
import types
import typing
from pathlib import Path

import numpy as np
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from longrope.encodings.baselines import seed_names
from longrope.search.config.job_config import JobConfig
from longrope.search.optimizers.factory import SEARCHERS
from longrope.search.optimizers.genome import Genome
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.optimizers.searcher import StatefulSearcher
from longrope.search.run.heartbeat import Heartbeat
from longrope.search.run.job_record import JobRecord
from longrope.search.run.run_store import FORMAT, RunState

RELEASES = Path(__file__).parent / "fixtures" / "releases"
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
    builtin = {kind: cls for kind, cls in sorted(SEARCHERS.items()) if cls.__module__.startswith("longrope.")}
    return {kind: cls.state_model for kind, cls in builtin.items() if issubclass(cls, StatefulSearcher)}


CONFIG_KEYS = ("extra", "strict", "allow_inf_nan", "populate_by_name", "validate_by_name", "validate_by_alias")
FIELD_KEYS = ("alias", "validation_alias", "serialization_alias", "discriminator", "strict")


class ShapeWalk:
    """The models reachable from some roots, each named once (by its class name; a second class of the same name
    by its module too, so neither hides the other)."""

    def __init__(self):
        self.names: dict[type[BaseModel], str] = {}
        self.queue: list[type[BaseModel]] = []

    def name(self, model: type[BaseModel]) -> str:
        if model not in self.names:
            taken = model.__name__ in self.names.values()
            self.names[model] = f"{model.__module__}.{model.__qualname__}" if taken else model.__name__
            self.queue.append(model)
        return self.names[model]

    def type_text(self, annotation: object) -> str:
        """An annotation as text (`list[float] | None`), each pydantic model in it by its name (and walked)."""
        if annotation is type(None):
            return "None"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return self.name(annotation)
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin is typing.Annotated:
            return f"{self.type_text(args[0])} {[constraint_text(extra) for extra in args[1:]]}"
        if origin is typing.Literal:
            return f"Literal{list(args)!r}"
        if origin in (typing.Union, types.UnionType):
            return " | ".join(self.type_text(arg) for arg in args)
        if origin is not None:
            name = getattr(origin, "__name__", repr(origin))
            return f"{name}[{', '.join(self.type_text(arg) for arg in args)}]"
        return getattr(annotation, "__name__", repr(annotation))

    def shape(self, model: type[BaseModel]) -> dict:
        """What decides how a file's JSON reads: the config rules, each field's type, constraints, default and
        aliases, and the validators (by their code: a tightened one refuses what older runs hold)."""
        fields = {}
        for name, field in model.model_fields.items():
            fields[name] = {
                "type": self.type_text(field.annotation),
                "constraints": [constraint_text(item) for item in field.metadata],
                "default": default_text(field),
                **{key: repr(getattr(field, key)) for key in FIELD_KEYS if getattr(field, key, None) is not None},
            }
        decorators = model.__pydantic_decorators__
        validators = {**decorators.field_validators, **decorators.model_validators}
        return {
            "config": {key: repr(model.model_config[key]) for key in CONFIG_KEYS if key in model.model_config},
            "fields": fields,
            "validators": {name: code_text(validator.func) for name, validator in sorted(validators.items())},
        }


def code_text(function) -> str:
    """A function as its name and a digest of its code's tokens (comments and layout left out, so only a change to
    what it does is a change)."""
    function = getattr(function, "__func__", function)  # a classmethod's function
    source = textwrap.dedent(inspect.getsource(function))
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    tokens = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skipped]
    digest = hashlib.sha256(" ".join(tokens).encode()).hexdigest()[:16]
    return f"{function.__module__}.{function.__qualname__} {digest}"


def constraint_text(item: object) -> str:
    """A field's constraint or validator as text that does not change from one process to the next: a validator
    by its code (`code_text`, not its address), a nested `Field(...)` by its constraints."""
    if isinstance(item, FieldInfo):
        return ", ".join(constraint_text(inner) for inner in item.metadata)
    function = getattr(item, "func", None)
    if callable(function):
        return f"{type(item).__name__}({code_text(function)})"
    if type(item).__name__.startswith("_Pydantic"):  # pydantic's private holder of Field(pattern=...) and the like
        return f"metadata({', '.join(f'{key}={value!r}' for key, value in sorted(vars(item).items()))})"
    return repr(item)


def default_text(field) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return f"factory {field.default_factory()!r}"
    default = field.default
    return repr(default.model_dump() if isinstance(default, BaseModel) else default)


def model_shapes(roots: dict[str, type[BaseModel]]) -> dict[str, dict]:
    """Each model reachable from `roots`, by name (`ShapeWalk`), and its shape."""
    walk, shapes = ShapeWalk(), {}
    for model in roots.values():
        walk.name(model)
    while walk.queue:
        model = walk.queue.pop(0)
        shapes[walk.names[model]] = walk.shape(model)
    return dict(sorted(shapes.items()))


def payload_shapes() -> dict:
    """What fields typed `Any` hold, written by hand: a genome (`Genome.to_json`, in state.json's pending and
    told lists, and its key, history.jsonl's candidate key) and the GA's generator state (state.json's `rng`); and
    what a validator reads off a registry rather than its own code: the seed names config.json's `search.seeds`
    may hold (the closed forms registered as seeds)."""
    genome = Genome((1, 2), 3, 4)
    rng = np.random.Generator(np.random.PCG64(0)).bit_generator.state
    seeds = sorted(seed_names())
    return {"genome": [genome.to_json(), genome.key], "rng": json_structure(rng), "seed_names": seeds}


def json_structure(value: object) -> object:
    """A JSON value's structure: its keys and the types of its leaves."""
    if isinstance(value, dict):
        return {key: json_structure(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return [json_structure(item) for item in value]
    return type(value).__name__


def current_shapes() -> dict:
    """The run directory's files as this code writes and reads them."""
    return {
        "format": FORMAT,
        "files": {name: model.__name__ for name, model in FILES.items()},
        "searcher_states": {kind: model.__name__ for kind, model in builtin_searcher_states().items()},
        "models": model_shapes({**FILES, **builtin_searcher_states()}),
        "payloads": payload_shapes(),
    }


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def releases() -> list[str]:
    """The releases with fixtures, oldest first."""
    return sorted((path.name for path in RELEASES.iterdir() if path.is_dir()), key=version_key)


def release_runs(version: str) -> list[str]:
    """The run directories a release's fixtures hold (a staged run's stages live inside its folder)."""
    folder = RELEASES / version
    return sorted(path.name for path in folder.iterdir() if (path / "config.json").is_file())


def read_snapshot(version: str) -> dict:
    return json.loads((RELEASES / version / "shapes.json").read_text())


def write_snapshot(version: str) -> None:
    """The shapes of this code's run files, as release `version`'s snapshot."""
    (RELEASES / version).mkdir(parents=True, exist_ok=True)
    (RELEASES / version / "shapes.json").write_text(json.dumps(current_shapes(), indent=1) + "\n")
