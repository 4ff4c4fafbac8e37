"""Reading transformers `rope_parameters` blocks (and whole `config.json` dicts) into RoPE methods.

Accepts what transformers 5.x accepts: the legacy `type` key for `rope_type`, the legacy names `su`
(LongRoPE) and `mrope` (plain RoPE with sections), `rope_theta` defaulting to 10000. Unknown keys are
warned about and ignored, as transformers does, because real configs carry keys for other libraries.
Everything else that is wrong raises one `EncodingConfigError` naming the key and the value.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from pydantic import ValidationError

from longrope.encodings.errors import EncodingConfigError
from longrope.encodings.rope_methods import CONTEXT_FIELDS, ROPE_METHODS, RopeMethod

LEGACY_ROPE_TYPES = {"su": "longrope", "mrope": "default"}
# Keys that only position ids other than 1D text use; they do not change the 1D frequencies.
MULTI_AXIS_KEYS = frozenset({"mrope_section", "mrope_interleaved"})
SHARED_KEYS = frozenset({"rope_theta", "partial_rotary_factor"})
FLAG_TYPES = (bool, bool | None)  # the annotations of a method's yes/no keys (YaRN's `truncate`)


def from_hf(rope_parameters: dict[str, Any], *, head_dim: int, max_position_embeddings: int) -> RopeMethod:
    """Build the RoPE method a transformers `rope_parameters` dict describes, for a model of this shape."""
    if not isinstance(rope_parameters, dict):
        raise EncodingConfigError(f"rope_parameters: expected a dict, got {type(rope_parameters).__name__}")
    params = dict(rope_parameters)
    rope_type = _rope_type(params)
    method_cls = ROPE_METHODS[rope_type]
    known = SHARED_KEYS | set(method_cls.model_fields) | _aliases(method_cls)
    unknown = sorted(set(params) - known - CONTEXT_FIELDS - MULTI_AXIS_KEYS)
    if unknown:
        warnings.warn(f"rope_parameters: ignoring keys unknown to rope_type {rope_type!r}: {unknown}", stacklevel=2)
    fields = {k: v for k, v in params.items() if k in known and k not in CONTEXT_FIELDS}
    _reject_non_numbers(method_cls, fields)
    _reject_non_finite(fields)
    return _validate(
        method_cls, rope_type, head_dim=head_dim, max_position_embeddings=max_position_embeddings, **fields
    )


def from_hf_config(config: dict[str, Any]) -> RopeMethod:
    """Build the RoPE method of a whole `config.json` dict, resolving top-level keys as transformers does.

    `rope_parameters` (or the 4.x `rope_scaling`) is read, `rope_theta` and `partial_rotary_factor` may sit at
    the top level, `head_dim` defaults to hidden_size // num_attention_heads, and for llama3/yarn/longrope a
    top-level `original_max_position_embeddings` wins (Phi-3), else it defaults to max_position_embeddings, for
    every method whose block carries it (`RopeMethod.carries_original_length`).
    """
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in config and key not in params:
            params[key] = config[key]
    max_position_embeddings = _config_int(config, "max_position_embeddings")
    rope_type = _rope_type(dict(params))
    if ROPE_METHODS[rope_type].carries_original_length():
        if "original_max_position_embeddings" in config:
            params["original_max_position_embeddings"] = config["original_max_position_embeddings"]
        else:
            params.setdefault("original_max_position_embeddings", max_position_embeddings)
    return from_hf(params, head_dim=_head_dim(config), max_position_embeddings=max_position_embeddings)


def _rope_type(params: dict[str, Any]) -> str:
    """Pop `rope_type` (or legacy `type`) from params and map legacy names; unknown names are an error."""
    legacy = params.pop("type", None)
    rope_type = params.pop("rope_type", None) or legacy or "default"
    rope_type = LEGACY_ROPE_TYPES.get(rope_type, rope_type)
    if rope_type not in ROPE_METHODS:
        raise EncodingConfigError(
            f"rope_parameters.rope_type: unknown value {rope_type!r}; known: {', '.join(sorted(ROPE_METHODS))}"
        )
    return rope_type


def _aliases(method_cls: type[RopeMethod]) -> set[str]:
    return {f.alias for f in method_cls.model_fields.values() if f.alias}


def _reject_non_numbers(method_cls: type[RopeMethod], fields: dict[str, Any]) -> None:
    """A string or a bool where a number belongs ("8", true) is refused by name: pydantic's lax mode would read
    "8" as 8.0 and true as 1.0 (a factor of 1: no scaling, silently), and transformers would fail on either later."""
    kinds = {field.alias or name: field.annotation for name, field in method_cls.model_fields.items()}
    flags = {key for key, annotation in kinds.items() if annotation in FLAG_TYPES}
    for key, value in fields.items():
        if not isinstance(value, list) and "list" in str(kinds.get(key)):
            continue  # pydantic refuses anything but a list there, by name
        for index, item in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(item, str) or (isinstance(item, bool) and key not in flags):
                where = f"[{index}]" if isinstance(value, list) else ""
                raise EncodingConfigError(f"rope_parameters.{key}{where}: expected a number, got {item!r}")


def _reject_non_finite(fields: dict[str, Any]) -> None:
    for key, value in fields.items():
        values = value if isinstance(value, list) else [value]
        for index, item in enumerate(values):
            if isinstance(item, float) and not math.isfinite(item):
                where = f"[{index}]" if isinstance(value, list) else ""
                raise EncodingConfigError(f"rope_parameters.{key}{where}: must be finite, got {item}")


def _validate(method_cls: type[RopeMethod], rope_type: str, **fields: Any) -> RopeMethod:
    try:
        return method_cls.model_validate(fields)
    except ValidationError as exc:
        raise EncodingConfigError(describe_validation_error(exc, rope_type)) from exc


def describe_validation_error(exc: ValidationError, rope_type: str) -> str:
    """One line per problem, each naming the key (as in config.json) and the value received."""
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        where = key if key.split(".")[0] in CONTEXT_FIELDS else f"rope_parameters.{key}" if key else "rope_parameters"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing":
            lines.append(f"{where}: required for rope_type {rope_type!r} but missing")
        elif key:
            lines.append(f"{where} = {error['input']!r}: {message}")
        else:
            lines.append(f"rope_parameters.{message}")
    return "; ".join(lines)


def _config_int(config: dict[str, Any], key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise EncodingConfigError(f"{key}: expected a positive integer in the model config, got {value!r}")
    return value


def _head_dim(config: dict[str, Any]) -> int:
    if config.get("head_dim"):
        return _config_int(config, "head_dim")
    return _config_int(config, "hidden_size") // _config_int(config, "num_attention_heads")
