"""Shared helpers: transformers configs and rotary modules built the way a user's model would build them."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlamaConfig, Phi3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding


def hf_config(rope_parameters: dict[str, Any], *, head_dim: int, max_position_embeddings: int) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=head_dim,
        intermediate_size=64,
        num_hidden_layers=1,
        vocab_size=32,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(rope_parameters),
    )


def hf_inv_freq(
    rope_parameters: dict[str, Any], *, head_dim: int, max_position_embeddings: int, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """transformers' own (inv_freq, attention_factor) for this rope_parameters block."""
    config = hf_config(rope_parameters, head_dim=head_dim, max_position_embeddings=max_position_embeddings)
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        # Llama's default init ignores partial_rotary_factor; Phi-3's honours it, as every scaled type does.
        phi3 = Phi3Config(**config.to_dict())
        return Phi3RotaryEmbedding.compute_default_rope_parameters(phi3)
    return ROPE_INIT_FUNCTIONS[rope_type](config, seq_len=seq_len)


def hf_rotary_module(rope_parameters: dict[str, Any], *, head_dim: int, max_position_embeddings: int):
    config = hf_config(rope_parameters, head_dim=head_dim, max_position_embeddings=max_position_embeddings)
    return LlamaRotaryEmbedding(config)


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(1234)
