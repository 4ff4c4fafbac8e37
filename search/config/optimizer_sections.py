"""The config sections of optimizers registered with settings of their own: `search.<kind>:` holds an optimizer's own
settings, validated by the model it registers (`factory.register`, from its `settings_model`).

The config layer sits below the optimizers and knows none of them, so the models are looked up here, by kind, when
a config is read; a section no registered optimizer claims is refused like any unknown field. The configured
optimizer's section is written in full (its defaults where the user left it out); another optimizer's section left
out is not written, so registering an optimizer never changes an existing run's identity. A section's model is a
`Strict` one (`factory.register` refuses another), so it refuses unknown fields, NaN and booleans for numbers.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

SECTIONS: dict[str, type[BaseModel]] = {}


def register_section(kind: str, model: type[BaseModel]) -> None:
    SECTIONS[kind] = model


def checked_sections(optimizer: str, extra: dict[str, Any]) -> dict[str, Any]:
    """The extra keys of the search section, each a registered optimizer's section and valid for its model, as
    JSON, with the configured `optimizer`'s own section written in full (its defaults where the user left it out,
    so what the run did is in config.json whatever the optimizer's defaults later become); ValueError naming the
    first key that is no section, or its first bad field."""
    if optimizer in SECTIONS and optimizer not in extra:
        extra = {**extra, optimizer: {}}
    checked = {}
    for kind, value in extra.items():
        if kind not in SECTIONS:
            raise ValueError(f"{kind}: unknown field (value {value!r})")
        try:
            checked[kind] = SECTIONS[kind].model_validate(value).model_dump(mode="json")
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in (kind, *error["loc"]))
            if error["type"] == "extra_forbidden":
                raise ValueError(f"{where}: unknown field (value {error['input']!r})") from exc
            raise ValueError(f"{where}: {error['msg']}") from exc
    return checked


def section(kind: str, extra: dict[str, Any]) -> BaseModel:
    """Optimizer `kind`'s settings: its section as configured, or its model's defaults."""
    return SECTIONS[kind].model_validate(extra.get(kind, {}))
