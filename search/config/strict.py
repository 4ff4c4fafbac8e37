"""What every section of the job config shares: strict pydantic (unknown fields, NaN and inf refused; frozen), the
limits on values, the path check, and the one error a bad value becomes (`JobConfigError`)."""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_validator

from longrope.encodings.baselines import seed_choices
from longrope.workers.errors import LongRopeError
from longrope.workers.path_limits import path_length_problem

MAX_LENGTH = 1 << 26  # 67M tokens: past every published context window, far below int32/int64 trouble
MAX_SEED = (1 << 63) - 1  # numpy's PCG64 takes a non-negative integer
MAX_COUNT = 1_000_000  # populations, generations, windows: larger is a typo, not a job
MIN_GRID_STEP = 1e-4  # factors live on an integer grid: (max_factor / grid_step) steps must stay countable
MAX_FACTOR = 1e4
N_HAT_CHOICES = (0, 1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 64, 128, 256)
REFERENCE_MODEL = "reference"  # model.path naming the reference model that ships with the package


class JobConfigError(LongRopeError, ValueError):
    """A job config (file, override or resolved value) is invalid; the message names every bad field."""


class Strict(BaseModel):
    """A config section: unknown fields, NaN and inf refused, frozen, and no boolean where another type goes."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_another_type(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic's lax mode reads YAML's `true` as 1 in an int or float field (`search.generations: true` ran
        one generation, `learning_rate: true` was 1.0, `polish_every: false` "must be >= 1"). Its strict mode
        would refuse it, but also the lists YAML gives for tuple fields; so a boolean, alone or in a list, is
        refused here wherever the field's type admits none. A nested section checks its own fields."""
        annotation = cls.model_fields[info.field_name].annotation
        if _admits_bool(annotation) or _holds_section(annotation):
            return value
        if isinstance(value, bool):
            raise ValueError(f"a boolean ({str(value).lower()}) where {_type_name(annotation)} goes")
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else ()
        if any(isinstance(item, bool) for item in inner):
            raise ValueError(f"holds a boolean, where {_type_name(annotation)} goes")
        return value


def checked_os_path(value: str, room: int = 0) -> str:
    """A path field the OS will take (workers/path_limits.py): refused here, before anything is opened or written."""
    problem = path_length_problem(value, room=room)
    if problem:
        raise ValueError(problem)
    return value


PathText = Annotated[str, AfterValidator(checked_os_path)]


def known_seed(name: str) -> str:
    """A closed form that may seed a search, as the encodings' registry states it (`encodings.baselines`), or a
    tuned one (`ntk_tuned`: the settings of its tuning grid, each a seed)."""
    if name not in seed_choices():
        raise ValueError(f"unknown seed {name!r}; a seed is one of {', '.join(seed_choices())}")
    return name


SeedName = Annotated[str, AfterValidator(known_seed)]


def _type_args(annotation: Any) -> tuple[Any, ...]:
    """The types inside a typing construct (Optional, Union, Annotated, list[...], tuple[...]), or ()."""
    if get_origin(annotation) is Annotated:
        return get_args(annotation)[:1]
    return tuple(arg for arg in get_args(annotation) if arg is not Ellipsis)


def _admits_bool(annotation: Any) -> bool:
    if annotation is bool or annotation is Any:
        return True
    if get_origin(annotation) is Literal:
        return any(isinstance(arg, bool) for arg in get_args(annotation))
    return any(_admits_bool(arg) for arg in _type_args(annotation))


def _holds_section(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return get_origin(annotation) is not Literal and any(_holds_section(arg) for arg in _type_args(annotation))


def _type_name(annotation: Any, plural: bool = False) -> str:
    """What a field takes, in a user's words: "an integer", "a list of numbers", "text"."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType, Annotated):
        names = [_type_name(arg, plural) for arg in _type_args(annotation) if arg is not type(None)]
        return " or ".join(dict.fromkeys(names))
    if origin in (list, tuple):
        return "a list of " + _type_name(_type_args(annotation)[0], plural=True)
    if origin is dict:
        return "a mapping to " + _type_name(_type_args(annotation)[1], plural=True)
    if origin is Literal:
        return ("values from " if plural else "one of ") + ", ".join(repr(arg) for arg in get_args(annotation))
    singular, several = TYPE_NAMES.get(annotation, ("a value of another type", "values of another type"))
    return several if plural else singular


TYPE_NAMES = {int: ("an integer", "integers"), float: ("a number", "numbers"), str: ("text", "texts")}
