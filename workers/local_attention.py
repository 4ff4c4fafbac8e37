"""Attention for scoring windowed and softcapped models without a [T, T] mask: `blockwise` in transformers' attention
registry.

transformers builds a 4D mask whenever a layer has a sliding window (transformers 5.x masking_utils.py
`sliding_window_causal_mask_function`), so SDPA and eager both hold and read a T x T mask. At 64k tokens the mask
alone is 4 GiB of booleans, and a Gemma 3 local layer computes 64k x 64k scores to keep 512 per row. Gemma 2's
attention logit softcapping is refused by SDPA outright ("`sdpa` attention does not support `softcap`",
integrations/sdpa_attention.py), which leaves eager's O(T^2) scores.

`blockwise` reads queries in blocks. Each block attends to the keys it may see: for a window of W, the last W before
each query (transformers' `sliding_window_overlay`: key > query - W), so a local layer costs O(T x (W + block)).
Without a window it reads every earlier key. A full layer without softcapping goes to SDPA's causal kernel with no
mask at all. The mask function registered beside it returns no mask (`None`), which only holds for unpadded
batches: the scorer's windows are never padded, and a mask passed in anyway is refused.

The arithmetic is eager's (transformers 5.x models/gemma2/modeling_gemma2.py `eager_attention_forward`): scores in
the model's dtype times `scaling`, then the softcap, the softmax in float32, then the values. Only the masked-out
scores are never computed. tests/test_families.py compares the scorer, which loads windowed and softcapped models
with it, against transformers' eager forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from longrope.workers import families


def blockwise_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: q [B, H, T, D], k and v [B, H_kv, T, D]; returns [B, T, H, D]."""
    if attention_mask is not None:
        raise ValueError("blockwise attention: scores unpadded windows only, but an attention mask was passed")
    if query.shape[2] != key.shape[2]:
        raise ValueError("blockwise attention: scores whole windows (no cache), but queries and keys differ in length")
    scaling = module.head_dim**-0.5 if scaling is None else scaling
    groups = query.shape[1] // key.shape[1]
    if sliding_window is None and softcap is None:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=groups > 1)
        return out.transpose(1, 2).contiguous(), None
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    length = query.shape[2]
    blocks = [
        attend(query, key, value, start, min(start + families.QUERY_BLOCK, length), scaling, sliding_window, softcap)
        for start in range(0, length, families.QUERY_BLOCK)
    ]
    return torch.cat(blocks, dim=2).transpose(1, 2).contiguous(), None


def attend(query, key, value, start: int, stop: int, scaling: float, window: int | None, softcap: float | None):
    """Queries [start, stop) against the keys they may see, eager's arithmetic."""
    first = 0 if window is None else max(0, start - window + 1)
    scores = torch.matmul(query[:, :, start:stop], key[:, :, first:stop].transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    queries = torch.arange(start, stop, device=query.device)[:, None]
    keys = torch.arange(first, stop, device=query.device)[None]
    seen = keys <= queries
    if window is not None:
        seen &= keys > queries - window
    scores = scores.masked_fill(~seen, float("-inf"))
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value[:, :, first:stop])


def no_mask(*args, **kwargs) -> None:
    """The mask function registered with `blockwise`: none is built; the attention applies causality and windows."""
    return None


def register() -> str:
    """Make `blockwise` a name `from_pretrained(attn_implementation=...)` accepts; returns the name."""
    from transformers import AttentionInterface  # transformers: only where a model loads
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(families.BLOCKWISE, blockwise_attention)
    AttentionMaskInterface.register(families.BLOCKWISE, no_mask)
    return families.BLOCKWISE
