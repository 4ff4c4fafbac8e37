"""`longrope train-reference`: the recipe that made the shipped reference model."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from longrope.workers.reference_recipe import TrainingRecipe


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train-reference",
        help="train the small byte-level reference model on the embedded corpus (deterministic under --seed)",
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory (config.json, model.safetensors)")
    for field in fields(TrainingRecipe):
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=type(field.default), default=field.default, help=f"default {field.default}")
    parser.set_defaults(handler=run_train_reference)


def run_train_reference(args: argparse.Namespace) -> int:
    from longrope.workers.reference_model import train_reference  # torch: only when training

    recipe = TrainingRecipe(**{field.name: getattr(args, field.name) for field in fields(TrainingRecipe)})
    summary = train_reference(args.out, recipe, log=lambda line: print(line, flush=True))
    print(json.dumps(summary["metrics"], indent=2))
    return 0
