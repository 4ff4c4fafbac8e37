"""`longrope train-reference`: the recipes that made the shipped checkpoints.

Without `--encoding` it trains the reference model (a transformers `LlamaForCausalLM`, the demo's model); with
`--encoding NAME` (or `all`) it trains the suite's model for that positional encoding under the suite recipe,
which `longrope extrapolation` reads.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields, replace
from pathlib import Path

from longrope.search.export.output_paths import check_not_run_directory
from longrope.workers.reference_recipe import ENCODING_NAMES, TrainingRecipe


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train-reference",
        help="train the small byte-level reference model, or the suite's model for one positional encoding, on "
        "the embedded corpus (deterministic under --seed)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="output directory (config.json, model.safetensors, training.json); with --encoding all, one "
        "subdirectory per encoding",
    )
    parser.add_argument(
        "--encoding",
        choices=(*ENCODING_NAMES, "all"),
        help="train the suite decoder with this positional encoding (suite recipe: --steps 1000 "
        "--warmup-steps 100 --needle-share 0) instead of the reference Llama",
    )
    for field in fields(TrainingRecipe):
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=type(field.default), default=None, help=f"reference default {field.default}")
    parser.set_defaults(handler=run_train_reference)


def _recipe(args: argparse.Namespace, base: TrainingRecipe) -> TrainingRecipe:
    given = {field.name: getattr(args, field.name) for field in fields(TrainingRecipe)}
    return replace(base, **{name: value for name, value in given.items() if value is not None})


def run_train_reference(args: argparse.Namespace) -> int:
    def log(line: str) -> None:
        print(line, flush=True)

    check_not_run_directory(args.out, f"--out {str(args.out)!r}")  # it writes a config.json of its own there
    if args.encoding is None:
        from longrope.workers.reference_model import train_reference  # torch: only when training

        summary = train_reference(args.out, _recipe(args, TrainingRecipe()), log=log)
        print(json.dumps(summary["metrics"], indent=2))
        return 0
    from longrope.workers.suite_training import SUITE_RECIPE, train_suite_model  # torch: only when training

    recipe = _recipe(args, SUITE_RECIPE)
    names = ENCODING_NAMES if args.encoding == "all" else (args.encoding,)
    for name in names:
        out = args.out / name if args.encoding == "all" else args.out
        summary = train_suite_model(out, name, recipe, log=lambda line, name=name: log(f"{name}: {line}"))
        print(f"{name}: {summary.parameters} parameters, {summary.train_seconds:.0f} s, wrote {out}", flush=True)
    return 0
