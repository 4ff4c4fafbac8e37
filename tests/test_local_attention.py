"""The scorer's blockwise attention equals transformers' eager attention with transformers' own masks.

The reference is transformers 5.x `eager_attention_forward` (Gemma 2's, which applies a softcap) given the 4D mask
transformers itself builds (`masking_utils.sdpa_mask` with `sliding_window_causal_mask_function`, turned into an
additive float mask as eager reads it). Blocks of 7 queries over 50 positions put window edges inside blocks and
across them.
"""

from __future__ import annotations

import pytest
import torch
from transformers.masking_utils import causal_mask_function, sdpa_mask, sliding_window_causal_mask_function
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

from longrope.workers import families
from longrope.workers.local_attention import blockwise_attention

LENGTH, HEADS, KV_HEADS, HEAD_DIM = 50, 4, 2, 8


class Module(torch.nn.Module):
    head_dim = HEAD_DIM
    num_key_value_groups = HEADS // KV_HEADS


def transformers_mask(window: int | None) -> torch.Tensor:
    function = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    allowed = sdpa_mask(
        batch_size=2, q_length=LENGTH, kv_length=LENGTH, mask_function=function, allow_is_causal_skip=False
    )
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))


@pytest.mark.parametrize("window", [None, 5, 12, 64])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_blockwise_attention_equals_eager_with_transformers_mask(window, softcap, monkeypatch):
    monkeypatch.setattr(families, "QUERY_BLOCK", 7)
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, HEADS, LENGTH, HEAD_DIM, generator=generator, dtype=torch.float64)
    key, value = (torch.randn(2, KV_HEADS, LENGTH, HEAD_DIM, generator=generator, dtype=torch.float64) for _ in "kv")
    ours, _ = blockwise_attention(
        Module(), query, key, value, None, scaling=0.3, sliding_window=window, softcap=softcap
    )
    theirs, _ = eager_attention_forward(
        Module(), query, key, value, transformers_mask(window).double(), scaling=0.3, softcap=softcap
    )
    # eager's softmax is float32 (`dtype=torch.float32`), SDPA's float64 here: they agree to float32 rounding
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_a_padding_mask_is_refused():
    tensor = torch.zeros(1, HEADS, 4, HEAD_DIM)
    with pytest.raises(ValueError, match="unpadded"):
        blockwise_attention(Module(), tensor, tensor, tensor, torch.zeros(1, 1, 4, 4))


def test_the_estimate_counts_the_keys_blockwise_attention_reads():
    """Gemma 3 270M's shape: 3 full layers read T^2 / 2 keys, 15 local ones T x (1024 + 512 - 1), worked by hand."""
    from longrope.search.cost.architecture import Architecture
    from longrope.search.cost.flops import forward_flops

    layer_types = (["sliding_attention"] * 5 + ["full_attention"]) * 3
    config = {
        "model_type": "gemma3_text",
        "hidden_size": 640,
        "num_hidden_layers": 18,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "intermediate_size": 2048,
        "vocab_size": 262144,
        "max_position_embeddings": 32768,
        "sliding_window": 512,
        "layer_types": layer_types,
    }
    arch = Architecture.from_hf_config(config)
    assert (arch.local_layers, arch.local_window) == (15, 512)
    tokens = 65536
    per_key = 4 * 4 * 256 * tokens
    flops = forward_flops(arch, tokens)
    assert flops.attention == 3 * per_key * tokens / 2 and flops.local_attention == 15 * per_key * (1024 + 512 - 1)
    assert forward_flops(Architecture.from_hf_config({**config, "sliding_window": None}), tokens).attention == (
        18 * per_key * tokens / 2
    )
