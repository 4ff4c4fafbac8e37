"""Training the suite's checkpoints: one per positional encoding, everything else equal.

Every encoding gets the same architecture (`suite_model.SuiteDecoder`), the same training split, the same
window draws, steps and seed (`SUITE_RECIPE`), so the only thing that differs between two checkpoints is how
position enters the model. The learned table covers the training length only, as GPT-2's does.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from longrope.workers.corpus import corpus_provenance
from longrope.workers.errors import ModelLoadError
from longrope.workers.reference_model import split_tokens
from longrope.workers.reference_recipe import EncodingName, TrainingRecipe
from longrope.workers.suite_model import SuiteDecoder, SuiteModelConfig, suite_config
from longrope.workers.training_loop import train_steps

SUITE_MODELS_DIR = Path(__file__).resolve().parent / "suite_models"
# `make demo`'s runs/demo/factors.json (searched on the reference model, which has the rope model's shape)
DEMO_FACTORS = SUITE_MODELS_DIR / "demo_factors.json"
# The reference recipe's shape and data at a quarter of its steps and without needles: six checkpoints in about
# 45 minutes on 2 cores instead of two hours (CoPE's step costs twice the others').
SUITE_RECIPE = replace(TrainingRecipe(), steps=1000, warmup_steps=100, needle_share=0.0)


class SuiteTraining(BaseModel):
    """A suite checkpoint's training.json: the recipe, what it cost, and the loss curve."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    encoding: EncodingName
    recipe: dict
    parameters: int
    train_seconds: float
    corpus: dict[str, str]
    losses: list[float]


def suite_model_dir(encoding: EncodingName) -> Path:
    """Where the shipped checkpoint of one encoding lives (inside the installed package)."""
    return SUITE_MODELS_DIR / encoding


def train_suite_model(out_dir: Path, encoding: EncodingName, recipe: TrainingRecipe, *, log=print) -> SuiteTraining:
    """Train one encoding's model and write config.json, model.safetensors and training.json to `out_dir`."""
    torch.manual_seed(recipe.seed)
    torch.use_deterministic_algorithms(True)
    model = SuiteDecoder(suite_config(encoding, recipe))
    stream = np.concatenate(split_tokens("train"))
    started = time.monotonic()
    losses = train_steps(model, model.loss, stream, recipe, log=log)
    summary = SuiteTraining(
        encoding=encoding,
        recipe=asdict(recipe),
        parameters=sum(p.numel() for p in model.parameters()),
        train_seconds=round(time.monotonic() - started, 1),
        corpus=corpus_provenance(),
        losses=[round(loss, 5) for loss in losses],
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(model.config.model_dump_json(indent=2) + "\n")
    save_file({name: t.contiguous() for name, t in model.state_dict().items()}, out_dir / "model.safetensors")
    (out_dir / "training.json").write_text(summary.model_dump_json(indent=2) + "\n")
    return summary


def load_suite_model(directory: Path) -> SuiteDecoder:
    """A suite checkpoint in eval mode; a missing or malformed file is one ModelLoadError naming it."""
    config_path, weights_path = directory / "config.json", directory / "model.safetensors"
    try:
        config = SuiteModelConfig.model_validate_json(config_path.read_text())
        weights = load_file(weights_path)
    except (OSError, ValueError, SafetensorError) as error:  # pydantic's ValidationError is a ValueError
        raise ModelLoadError(f"{directory}: not a suite checkpoint ({error})") from error
    model = SuiteDecoder(config)
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as error:
        raise ModelLoadError(f"{weights_path}: weights do not fit {config.encoding}'s config ({error})") from error
    return model.eval()
