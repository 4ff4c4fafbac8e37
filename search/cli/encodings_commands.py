"""`longrope encodings ...`: list the suite's methods, state any RoPE method as per-pair factors, and show
LongRoPE2's critical dimension."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import yaml
from rich.table import Table

from longrope.encodings import ROPE_METHODS, from_hf
from longrope.encodings.critical_dim import critical_dim, pair_periods
from longrope.encodings.errors import EncodingConfigError
from longrope.search.cli.console import cli_console
from longrope.search.config.factors_file import factors_file_for
from longrope.search.config.strict import MAX_FACTOR, MAX_LENGTH

# Friendly names accepted on the command line, mapped to rope_type.
METHOD_ALIASES = {"pi": "linear", "rope": "default", "none": "default", "dynamic_ntk": "dynamic", "su": "longrope"}
# Methods whose transformers form reads the original length from max_position_embeddings.
LENGTH_FROM_MAX_POSITIONS = {"dynamic"}


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
        "rope_parameters block equivalent to METHOD at the target length, plus provenance.",
    )
    factors.add_argument("method", help=f"one of {sorted(ROPE_METHODS)} (or pi, rope, none, dynamic_ntk, su)")
    factors.add_argument("--factor", type=float, default=1.0, help="scale s = target / original length")
    factors.add_argument("--original-length", type=int, required=True, help="pre-training context length L0")
    factors.add_argument("--target-length", type=int, help="default: original length x factor")
    factors.add_argument("--head-dim", type=int, required=True)
    factors.add_argument("--theta", type=float, default=10000.0, help="rope_theta (default 10000)")
    factors.add_argument("--partial-rotary-factor", type=float, default=1.0)
    factors.add_argument("--attention-factor", type=float, help="override the method's attention factor")
    factors.add_argument("--beta-fast", type=float, help="YaRN (default 32)")
    factors.add_argument("--beta-slow", type=float, help="YaRN (default 1)")
    factors.add_argument("--mscale", type=float, help="YaRN / DeepSeek")
    factors.add_argument("--mscale-all-dim", type=float, help="YaRN / DeepSeek")
    factors.add_argument("--no-truncate", action="store_true", help="YaRN: do not round the ramp bounds")
    factors.add_argument("--low-freq-factor", type=float, default=1.0, help="Llama 3 (default 1)")
    factors.add_argument("--high-freq-factor", type=float, default=4.0, help="Llama 3 (default 4)")
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
    rope_type = METHOD_ALIASES.get(args.method, args.method)
    if rope_type not in ROPE_METHODS:
        raise EncodingConfigError(f"method: unknown value {args.method!r}; known: {', '.join(sorted(ROPE_METHODS))}")
    for flag, value in (("--original-length", args.original_length), ("--head-dim", args.head_dim)):
        if value <= 0:
            raise EncodingConfigError(f"{flag}: must be a positive integer, got {value}")
    if not math.isfinite(args.factor) or not 0 < args.factor <= MAX_FACTOR:
        raise EncodingConfigError(f"--factor: must be a finite number in (0, {MAX_FACTOR:g}], got {args.factor}")
    target_length = args.target_length or round(args.original_length * args.factor)
    for flag, value in (("--original-length", args.original_length), ("--target-length", target_length)):
        if value > MAX_LENGTH:
            raise EncodingConfigError(f"{flag}: must be at most {MAX_LENGTH} tokens, got {value}")
    if args.beta_fast is not None and args.beta_slow is not None and args.beta_fast <= args.beta_slow:
        raise EncodingConfigError(
            f"--beta-fast: must be greater than --beta-slow ({args.beta_slow}), got {args.beta_fast} "
            "(beta_fast counts the rotations of the fast dimensions, which are kept)"
        )
    max_positions = args.original_length if rope_type in LENGTH_FROM_MAX_POSITIONS else target_length
    method = from_hf(_rope_parameters(rope_type, args), head_dim=args.head_dim, max_position_embeddings=max_positions)
    factors_file = factors_file_for(
        method,
        method_name=rope_type,
        target_length=target_length,
        original_length=args.original_length,
        created_by="longrope encodings factors",
    )
    print(factors_file.model_dump_json(indent=2, exclude_none=True))
    return 0


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
    """The rotary dim for `critical-dim`, after checking each flag (one line naming the flag on bad input)."""
    if not (math.isfinite(args.theta) and args.theta > 1):
        raise EncodingConfigError(f"--theta: must be a finite number > 1, got {args.theta}")
    if args.head_dim < 2 or args.head_dim % 2:
        raise EncodingConfigError(f"--head-dim: must be an even integer >= 2, got {args.head_dim}")
    if args.original_length < 2:
        raise EncodingConfigError(f"--original-length: must be >= 2 tokens, got {args.original_length}")
    factor = args.partial_rotary_factor
    rotary_dim = int(args.head_dim * factor) if math.isfinite(factor) else 0
    if not 0 < factor <= 1 or rotary_dim < 2 or rotary_dim % 2:
        raise EncodingConfigError(
            f"--partial-rotary-factor: must be in (0, 1] and give an even rotary dim >= 2 with --head-dim "
            f"{args.head_dim}, got {factor}"
        )
    if args.original_length > MAX_LENGTH:
        raise EncodingConfigError(f"--original-length: must be at most {MAX_LENGTH} tokens, got {args.original_length}")
    return rotary_dim


def _rope_parameters(rope_type: str, args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {"rope_type": rope_type, "rope_theta": args.theta}
    if args.partial_rotary_factor != 1.0:
        params["partial_rotary_factor"] = args.partial_rotary_factor
    method_cls = ROPE_METHODS[rope_type]
    if "factor" in method_cls.model_fields:
        params["factor"] = args.factor
    if method_cls.carries_original_length():
        params["original_max_position_embeddings"] = args.original_length
    if rope_type == "llama3":
        params.update(low_freq_factor=args.low_freq_factor, high_freq_factor=args.high_freq_factor)
    if rope_type == "yarn":
        optional = {
            "beta_fast": args.beta_fast,
            "beta_slow": args.beta_slow,
            "mscale": args.mscale,
            "mscale_all_dim": args.mscale_all_dim,
        }
        params.update({k: v for k, v in optional.items() if v is not None})
        if args.no_truncate:
            params["truncate"] = False
    if args.attention_factor is not None:
        params["attention_factor"] = args.attention_factor
    params.update(_parse_params(args.param))
    return params


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
