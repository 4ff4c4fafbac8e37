"""The reference model's training recipe and where its checkpoint ships: kept apart from the training code so
that `longrope --help` can list the recipe's flags without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

REFERENCE_MODEL_DIR = Path(__file__).resolve().parent / "reference_model"
# The encodings `train-reference --encoding` trains the suite decoder with (kept here: the CLI lists them
# without importing torch)
EncodingName = Literal["sinusoidal", "learned", "alibi", "cope", "nope", "rope"]
ENCODING_NAMES: tuple[EncodingName, ...] = ("sinusoidal", "learned", "alibi", "cope", "nope", "rope")


@dataclass(frozen=True)
class TrainingRecipe:
    seed: int = 0
    steps: int = 4000
    batch_size: int = 32
    train_length: int = 128
    learning_rate: float = 3e-3
    warmup_steps: int = 200
    weight_decay: float = 0.1
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    head_dim: int = 32
    intermediate_size: int = 384
    rope_theta: float = 10000.0
    needle_share: float = 0.3  # share of training windows that carry a needle (0: the first release's recipe)


def reference_model_dir() -> Path:
    """Where the shipped checkpoint lives (inside the installed package)."""
    return REFERENCE_MODEL_DIR
