"""`longrope encodings ...`: list the suite's methods, state any RoPE method as per-pair factors, and show
LongRoPE2's critical dimension."""

from __future__ import annotations

import argparse
import json
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError
from rich.table import Table

from longrope.encodings import ROPE_METHODS, RopeMethod
from longrope.encodings.baselines import closed_forms
from longrope.encodings.critical_dim import critical_dim, pair_periods
from longrope.encodings.errors import EncodingConfigError
from longrope.encodings.hf_params import LEGACY_ROPE_TYPES
from longrope.search.cli.console import cli_console
from longrope.search.config.factors_file import factors_file_for
from longrope.search.config.strict import MAX_FACTOR, MAX_LENGTH

# The flags every method takes, by the rope_parameters field each sets; a method's other scalar fields get a flag of
# their own (`method_settings`), any other key goes through --param.
SHARED_FLAGS = {
    "head_dim": "--head-dim",
    "rope_theta": "--theta",
    "partial_rotary_factor": "--partial-rotary-factor",
    "factor": "--factor",
    "original_max_position_embeddings": "--original-length",
    "max_position_embeddings": "--target-length",  # Dynamic NTK's is the original length, checked by `model_shape`
}
FLAG_TYPES = (float, int, bool)


@dataclass(frozen=True)
class MethodSetting:
    """A scalar rope_parameters key of one or more registered methods, set by its own flag (`--beta-fast`)."""

    key: str
    kind: type
    rope_types: tuple[str, ...]
    description: str

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")


def method_settings() -> dict[str, MethodSetting]:
    """{key: setting} of every registered method's scalar fields besides the shared ones, read off the classes, so a
    new method's settings are flags with nothing else to edit."""
    found: dict[str, MethodSetting] = {}
    for cls in ROPE_METHODS.values():
        for name, field in cls.model_fields.items():
            key, kind = field.alias or name, _scalar_type(field.annotation)
            if name in SHARED_FLAGS or kind is None:
                continue
            known = found.get(key)
            rope_types = (*known.rope_types, cls.rope_type) if known else (cls.rope_type,)
            description = (known.description if known else "") or field.description or ""
            found[key] = MethodSetting(key, kind, rope_types, description)
    return found


def _scalar_type(annotation: Any) -> type | None:
    """float, int or bool for a field of that type (or that type or None), else None (lists go through --param)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        annotation = kinds[0] if len(kinds) == 1 else None
    return annotation if annotation in FLAG_TYPES else None


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    encodings = subparsers.add_parser("encodings", help="the positional-encoding suite")
    commands = encodings.add_subparsers(dest="encodings_command", required=True)

    listing = commands.add_parser("list", help="list every positional-encoding method")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(handler=run_list)

    factors = commands.add_parser(
        "factors",
        help="print a RoPE method's per-pair factors and attention factor as a factors JSON",
        description="Prints the same JSON shape `longrope export` writes: a transformers `longrope` "
        "rope_parameters block equivalent to METHOD at the target length, plus provenance. A closed form starts from "
        "its nominal setting for --factor; each of its settings below overrides it.",
    )
    factors.add_argument("method", help=f"a rope_type or a baseline's name: one of {', '.join(method_names())}")
    factors.add_argument("--factor", type=float, default=1.0, help="scale s = target / original length")
    factors.add_argument("--original-length", type=int, required=True, help="pre-training context length L0")
    factors.add_argument("--target-length", type=int, help="default: original length x factor")
    factors.add_argument("--head-dim", type=int, required=True)
    factors.add_argument("--theta", type=float, default=10000.0, help="rope_theta (default 10000)")
    factors.add_argument("--partial-rotary-factor", type=float, default=1.0)
    for setting in method_settings().values():
        action = argparse.BooleanOptionalAction if setting.kind is bool else "store"
        kind = {} if setting.kind is bool else {"type": setting.kind}
        methods = ", ".join(setting.rope_types)
        help_text = f"{setting.description} ({methods})".lstrip()
        factors.add_argument(setting.flag, dest=setting.key, action=action, help=help_text, **kind)
    factors.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other rope_parameters key (VALUE is YAML: 2.0, true, [1, 1.5])",
    )
    factors.set_defaults(handler=run_factors)

    critical = commands.add_parser(
        "critical-dim",
        help="print LongRoPE2's critical dimension and the pair periods around it",
        description="d_cd = ceil(log_theta(L0 / 2pi) * d/2) - 1 (LongRoPE2, arXiv 2502.20082): the last pair whose "
        "period 2pi * theta^(2i/d) is below the original length L0. `search.space: longrope2` searches the pairs "
        "from d_cd up and sets the ones below from it.",
    )
    critical.add_argument("--theta", type=float, required=True, help="rope_theta")
    critical.add_argument("--head-dim", type=int, required=True)
    critical.add_argument("--original-length", type=int, required=True, help="pre-training context length L0")
    critical.add_argument("--partial-rotary-factor", type=float, default=1.0)
    critical.set_defaults(handler=run_critical_dim)


def run_list(args: argparse.Namespace) -> int:
    from longrope.encodings.catalog import catalog_entries  # the encodings' torch modules: not for the other commands

    if args.json:
        print(json.dumps([m.__dict__ for m in catalog_entries()], indent=2))
        return 0
    table = Table(title="positional encodings in longrope.encodings")
    for column in ("name", "kind", "transformers rope_type", "what it is", "implemented in"):
        table.add_column(column)
    for m in catalog_entries():
        table.add_row(m.name, m.kind, m.hf_rope_type or "-", m.summary, m.where)
    cli_console(stderr=False, width=160).print(table)
    return 0


def run_factors(args: argparse.Namespace) -> int:
    method_cls = method_class(args.method)
    target_length = _checked_lengths(args)
    model = model_shape(args)
    method = method_from_flags(method_cls, args, model, target_length)
    factors_file = factors_file_for(
        method,
        method_name=method_cls.rope_type,
        target_length=target_length,
        original_length=args.original_length,
        created_by="longrope encodings factors",
    )
    print(factors_file.model_dump_json(indent=2, exclude_none=True))
    return 0


def method_names() -> list[str]:
    """What `encodings factors` takes for METHOD: a rope_type, a baseline's name (pi, none) or a legacy rope_type."""
    return sorted({*ROPE_METHODS, *closed_forms(), *LEGACY_ROPE_TYPES})


def method_class(name: str) -> type[RopeMethod]:
    rope_type = LEGACY_ROPE_TYPES.get(name, name)
    by_name = {**closed_forms(), **ROPE_METHODS}
    if rope_type not in by_name:
        raise EncodingConfigError(f"method: unknown value {name!r}; known: {', '.join(method_names())}")
    return by_name[rope_type]


def _checked_lengths(args: argparse.Namespace) -> int:
    """The target length, after the project's own limits (a method's fields check the rest): --factor finite and
    at most MAX_FACTOR (it sets the default target), both lengths at most MAX_LENGTH."""
    if not math.isfinite(args.factor) or not 0 < args.factor <= MAX_FACTOR:
        raise EncodingConfigError(f"--factor: must be a finite number in (0, {MAX_FACTOR:g}], got {args.factor}")
    target_length = args.target_length or round(args.original_length * args.factor)
    for flag, value in (("--original-length", args.original_length), ("--target-length", target_length)):
        if value > MAX_LENGTH:
            raise EncodingConfigError(f"{flag}: must be at most {MAX_LENGTH} tokens, got {value}")
    return target_length


def model_shape(args: argparse.Namespace) -> RopeMethod:
    """The model as trained, plain RoPE at --original-length: its fields check --head-dim, --theta and
    --partial-rotary-factor, each error naming its flag."""
    fields = {
        "head_dim": args.head_dim,
        "max_position_embeddings": args.original_length,
        "rope_theta": args.theta,
        "partial_rotary_factor": args.partial_rotary_factor,
    }
    return checked(lambda: RopeMethod(**fields), {**SHARED_FLAGS, "max_position_embeddings": "--original-length"})


def method_from_flags(
    method_cls: type[RopeMethod], args: argparse.Namespace, model: RopeMethod, target_length: int
) -> RopeMethod:
    """The method at its nominal setting for --factor (a closed form; LongRoPE, which has none, from the shared
    flags), with its own flags and --param over it, validated by its fields."""
    flags, fields = dict(SHARED_FLAGS), _starting_fields(method_cls, args, model, target_length)
    keys = {field.alias or name for name, field in method_cls.model_fields.items()}
    for setting in method_settings().values():
        value = getattr(args, setting.key)
        if value is None:
            continue
        if setting.key not in keys:
            raise EncodingConfigError(
                f"{setting.flag}: a setting of {', '.join(setting.rope_types)}, not of {method_cls.rope_type}"
            )
        fields[setting.key], flags[setting.key] = value, setting.flag
    for key, value in _parse_params(args.param).items():
        if key not in keys:
            own = ", ".join(sorted(keys - set(SHARED_FLAGS)))
            raise EncodingConfigError(f"--param {key}: not a key of rope_type {method_cls.rope_type} (its own: {own})")
        fields[key], flags[key] = value, f"--param {key}"
    return checked(lambda: method_cls.model_validate(fields), flags)


def _starting_fields(
    method_cls: type[RopeMethod], args: argparse.Namespace, model: RopeMethod, target_length: int
) -> dict[str, Any]:
    if method_cls.baseline is not None:
        nominal = checked(
            lambda: method_cls.nominal(
                model.rotary_shape, original=args.original_length, target=target_length, scale=args.factor
            ),
            SHARED_FLAGS,
        )
        return nominal.model_dump(by_alias=True)
    fields: dict[str, Any] = {**model.rotary_shape, "max_position_embeddings": target_length}
    if "factor" in method_cls.model_fields:
        fields["factor"] = args.factor
    if method_cls.carries_original_length():
        fields["original_max_position_embeddings"] = args.original_length
    return fields


def checked(build: Callable[[], RopeMethod], flags: dict[str, str]) -> RopeMethod:
    """`build()`, its ValidationError as one EncodingConfigError line naming each bad flag and the value it got
    (`flags`: each field's flag)."""
    try:
        return build()
    except ValidationError as exc:
        raise EncodingConfigError("; ".join(_flag_problem(error, flags) for error in exc.errors())) from exc


def _flag_problem(error, flags: dict[str, str]) -> str:
    message = error["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
    if not error["loc"]:  # a rule over several fields: its message starts with the field it names
        key, sep, rest = message.partition(": ")
        return f"{flags[key]}: {rest}" if sep and key in flags else message
    key = str(error["loc"][0])
    flag = flags.get(key, f"--param {key}")
    if error["type"] == "missing":
        return f"{flag}: required"
    return f"{flag}: {message}, got {error['input']!r}"


def run_critical_dim(args: argparse.Namespace) -> int:
    rotary_dim = _critical_dim_inputs(args)
    d_cd = critical_dim(args.theta, rotary_dim, args.original_length)
    periods, pairs, length = pair_periods(args.theta, rotary_dim), rotary_dim // 2, args.original_length
    x = math.log(length / (2 * math.pi)) / math.log(args.theta) * pairs
    print(
        f"critical dimension d_cd = {d_cd}  (theta {args.theta:g}, rotary dim {rotary_dim} = {pairs} pairs, "
        f"L0 {length})"
    )
    print(f"  ceil(log_theta(L0 / 2pi) * d/2) - 1 = ceil({x:.4f}) - 1, clipped to [0, {pairs}]  (LongRoPE2)")
    print("  pair  period (tokens)  vs L0")
    for i in range(max(0, d_cd - 2), min(pairs, d_cd + 3)):
        mark = ">" if i == d_cd else " "
        relation = "<  L0" if periods[i] < length else ">= L0"
        print(f"{mark} {i:5d}  {periods[i]:15.1f}  {relation}")
    if d_cd >= pairs:
        print(f"  every pair's period is below L0: no pair is left to search (longrope2 needs d_cd < {pairs})")
    else:
        low = f"pairs 0..{d_cd - 1} follow it (lambda_i = lambda_{d_cd}^(i/{d_cd}))" if d_cd else "no pair below it"
        print(f"  longrope2 searches pairs {d_cd}..{pairs - 1}; {low}")
    return 0


def _critical_dim_inputs(args: argparse.Namespace) -> int:
    """The rotary dim for `critical-dim`: --theta, --head-dim and --partial-rotary-factor checked by the model's
    fields (`model_shape`), then the length this command needs (one line naming the flag on bad input)."""
    rotary_dim = model_shape(args).rotary_dim
    if args.original_length < 2:
        raise EncodingConfigError(f"--original-length: must be >= 2 tokens, got {args.original_length}")
    if args.original_length > MAX_LENGTH:
        raise EncodingConfigError(f"--original-length: must be at most {MAX_LENGTH} tokens, got {args.original_length}")
    return rotary_dim


def _parse_params(items: list[str]) -> dict[str, Any]:
    parsed = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise EncodingConfigError(f"--param: expected KEY=VALUE, got {item!r}")
        try:
            parsed[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise EncodingConfigError(f"--param {key}: cannot read value {value!r}: {exc}") from exc
    return parsed
