"""The shipped reference model: a standard Llama that shows the long-context problem the product solves."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from longrope.encodings import RopeMethod
from longrope.workers.documents import read_source
from longrope.workers.models import load_model
from longrope.workers.reference_model import train_reference
from longrope.workers.reference_recipe import TrainingRecipe, reference_model_dir
from longrope.workers.scorer import Scorer
from longrope.workers.tokenization import TextTokenizer
from longrope.workers.windows import load_windows


def test_shipped_checkpoint_is_a_standard_small_llama():
    config = json.loads((reference_model_dir() / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 256
    assert config["head_dim"] >= 32 and config["max_position_embeddings"] == 128
    model, rope = load_model(reference_model_dir(), device="cpu")
    assert type(model).__name__ == "LlamaForCausalLM" and rope.original_length == 128


def test_plain_rope_at_8x_is_at_least_twice_the_perplexity_at_1x():
    """Same 1024 predicted tokens of held-out text: read in 8 windows of 128, then in one window of 1024."""
    model, rope = load_model(reference_model_dir(), device="cpu")
    long_windows = load_windows(read_source("corpus:test"), TextTokenizer("bytes"), length=1025, count=16, seed=0)
    short_windows = np.concatenate([long_windows.tokens[:, k * 128 : k * 128 + 129] for k in range(8)])
    plain = [RopeMethod(head_dim=32, max_position_embeddings=1024)]
    ppl = {}
    for name, windows in (("1x", short_windows), ("8x", long_windows.tokens)):
        scorer = Scorer(model, torch.from_numpy(windows), rope.method.original_inv_freq())
        ppl[name] = scorer.score(plain)[0].perplexity
    assert ppl["1x"] < 6.0, ppl
    assert ppl["8x"] >= 2 * ppl["1x"], ppl


@pytest.mark.slow
def test_training_recipe_is_deterministic(tmp_path):
    recipe = TrainingRecipe(
        steps=4,
        warmup_steps=2,
        batch_size=4,
        hidden_size=32,
        head_dim=8,
        num_heads=4,
        num_layers=1,
        intermediate_size=64,
    )
    first = train_reference(tmp_path / "a", recipe, log=lambda line: None)
    second = train_reference(tmp_path / "b", recipe, log=lambda line: None)
    weights_a, weights_b = (
        load_file(tmp_path / "a" / "model.safetensors"),
        load_file(tmp_path / "b" / "model.safetensors"),
    )
    assert weights_a.keys() == weights_b.keys()
    for key in weights_a:
        torch.testing.assert_close(weights_a[key], weights_b[key], rtol=0, atol=0)
    assert first["metrics"] == second["metrics"]
    other = train_reference(tmp_path / "c", TrainingRecipe(**{**recipe.__dict__, "seed": 1}), log=lambda line: None)
    assert other["metrics"] != first["metrics"]
