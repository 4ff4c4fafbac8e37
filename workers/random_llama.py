"""A randomly initialised Llama of a chosen shape: what tests and benchmarks score when the shape matters and the
weights do not (timing, memory, FLOP counts, the rope patch against transformers' own rotary module).

One builder for all of them, so a checkpoint made for a test and one made for a benchmark differ only in the
shape each asks for. Built with transformers' own `LlamaConfig` / `LlamaForCausalLM` and saved with
`save_pretrained(safe_serialization=True)`, so it loads through `models.load_model` as a user's model does.
transformers is imported on first use: importing this module costs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PLAIN_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def llama_config(
    *,
    hidden_size: int,
    intermediate_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    vocab_size: int,
    max_position_embeddings: int,
    num_key_value_heads: int | None = None,
    head_dim: int | None = None,
    rope_parameters: dict[str, Any] | None = None,
    **extra: Any,
):
    """transformers' `LlamaConfig` of this shape (its own field names): key/value heads default to the query heads
    (no grouping), the head dim to hidden_size / num_attention_heads, RoPE to plain RoPE with theta 10000, and the
    embeddings stay untied (Llama's default); `extra` sets any other LlamaConfig field (`tie_word_embeddings`,
    `attention_bias`, ...)."""
    from transformers import LlamaConfig  # transformers only when a model is built

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads or num_attention_heads,
        head_dim=head_dim or hidden_size // num_attention_heads,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(PLAIN_ROPE if rope_parameters is None else rope_parameters),
        **{"tie_word_embeddings": False, **extra},
    )


def save_random_llama(path: Path, config, *, seed: int = 0, weight_scale: float = 1.0) -> Path:
    """A `LlamaForCausalLM(config)` initialised under `torch.manual_seed(seed)`, every parameter multiplied by
    `weight_scale` (larger than transformers' init makes positions visibly matter in a test), saved as
    config.json + model.safetensors in `path`."""
    import torch  # torch: only when a model is made; llama_config above needs transformers alone
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if weight_scale != 1.0:
        with torch.no_grad():
            for param in model.parameters():
                param.mul_(weight_scale)
    model.save_pretrained(path, safe_serialization=True)
    return Path(path)
