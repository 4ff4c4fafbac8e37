"""Loading a job config: the YAML file (guarded, `yaml_reader.py`), then each `--set FIELD=VALUE` over it, then
validation, every problem as one line naming the field and the value."""

from __future__ import annotations

import math
import stat
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from longrope.search.config.job_config import JobConfig
from longrope.search.config.optimizer_sections import SECTIONS
from longrope.search.config.search_section import SearchConfig
from longrope.search.config.strict import JobConfigError
from longrope.search.config.yaml_reader import ConfigYamlError, parse_yaml, read_yaml
from longrope.workers.path_limits import SHOWN_CHARACTERS, shown_path


def describe_errors(exc: ValidationError, source: str) -> str:
    lines = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing":
            lines.append(f"{source}: {field}: required but missing")
        elif isinstance(error["input"], dict) and error["type"] == "value_error":
            prefix = "" if field == "(top level)" else f"{field}."
            lines.append(f"{source}: {prefix}{message}")  # a cross-field check: its message names field and value
        elif error["type"] == "extra_forbidden":
            lines.append(f"{source}: {field}: unknown field (value {shown_value(error['input'])})")
        else:
            lines.append(f"{source}: {field} = {shown_value(error['input'])}: {message}")
    return "\n".join(lines)


def shown_value(value: Any) -> str:
    """A value as an error line shows it: its repr, or a string too long to read (a 5,000-character path) cut in
    the middle as paths are (`shown_path`)."""
    return shown_path(value) if isinstance(value, str) and len(value) > SHOWN_CHARACTERS else repr(value)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`search.generations=10` -> (["search", "generations"], 10); the value is read as YAML."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise JobConfigError(f"--set {text!r}: expected FIELD=VALUE, e.g. search.generations=10")
    try:
        parsed = parse_yaml(value)
    except ConfigYamlError as exc:
        raise JobConfigError(f"--set {key.strip()}: cannot read value {value[:80]!r} ({exc})") from exc
    return key.strip().split("."), parsed


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Each `--set FIELD=VALUE` in turn. A mapping given for a section (`search={population: 8}`) merges into what
    the file and earlier overrides set there, recursively; any other value, a mapping-valued field's included
    (`model.config_overrides`, `data.objective`), replaces the one before it."""
    for text in overrides:
        path, value = parse_override(text)
        node = raw
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise JobConfigError(f"--set {'.'.join(path)}: {part} is not a section")
            node = child
        node[path[-1]] = merged_into(node.get(path[-1]), value, section_model(path))
    return raw


def merged_into(current: Any, value: Any, section: type[BaseModel] | None) -> Any:
    """`value` set over `current`: a mapping given for a section (a pydantic model field) keeps the section's other
    fields; nested sections merge the same way."""
    if section is None or not isinstance(value, dict) or not isinstance(current, dict):
        return value
    merged = dict(current)
    for key, item in value.items():
        merged[key] = merged_into(current.get(key), item, section_model([str(key)], section))
    return merged


def section_model(path: list[str], root: type[BaseModel] | None = None) -> type[BaseModel] | None:
    """The pydantic model of the section at `path` (`["search", "racing"]` -> RacingConfig), or None when the path
    names a plain field or nothing."""
    model = root or JobConfig
    for part in path:
        field = model.model_fields.get(part)
        annotation = field.annotation if field else None
        if field is None and model is SearchConfig:  # search.<kind>: a registered optimizer's own section
            annotation = SECTIONS.get(part)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def read_job_config(path: str | Path | None, overrides: list[str] = (), base: dict | None = None) -> JobConfig:
    """Read YAML (guarded safe_load), apply `--set` overrides (on `base` when no file is given), validate the model;
    JobConfigError lists every problem. What the chosen optimizer cannot honour is checked a layer up: a user's
    config is loaded by `optimizers.factory.load_job_config`, which calls this."""
    raw: dict[str, Any] = dict(base or {})
    source = str(path) if path else "config"
    if path is not None:
        check_config_file(Path(path), source)
        try:
            raw = read_yaml(Path(path)) or {}
        except ConfigYamlError as exc:
            raise JobConfigError(f"{source}: {exc}") from exc
        except OSError as exc:
            raise JobConfigError(f"{source}: cannot read ({exc.strerror or exc})") from exc
        if not isinstance(raw, dict):
            raise JobConfigError(f"{source}: expected a mapping of fields at the top level, got {type(raw).__name__}")
    raw = apply_overrides(raw, list(overrides))
    _reject_non_finite(raw, [])
    try:
        return JobConfig.model_validate(raw)
    except ValidationError as exc:
        raise JobConfigError(describe_errors(exc, source)) from exc


def check_config_file(file: Path, source: str) -> None:
    """A config path names a regular file: not a directory, a device (`/dev/null`), a FIFO or a name too long."""
    try:
        mode = file.stat().st_mode
    except FileNotFoundError as exc:
        raise JobConfigError(f"{source}: no such config file") from exc
    except OSError as exc:  # e.g. a name past NAME_MAX, or a folder on the way that is a file
        raise JobConfigError(f"{shown_path(source)}: cannot read ({exc.strerror or exc})") from exc
    if stat.S_ISDIR(mode):
        raise JobConfigError(f"{source}: is a directory, not a config file")
    if not stat.S_ISREG(mode):
        kind = "a character device" if stat.S_ISCHR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a file"
        raise JobConfigError(f"{source}: not a regular file ({kind}); give a YAML config file")


def _reject_non_finite(node: Any, path: list[str]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            _reject_non_finite(value, [*path, str(key)])
    elif isinstance(node, list):
        for index, value in enumerate(node):
            _reject_non_finite(value, [*path[:-1], f"{path[-1] if path else ''}[{index}]"])
    elif isinstance(node, float) and not math.isfinite(node):
        raise JobConfigError(f"{'.'.join(path)} = {node}: must be a finite number")
