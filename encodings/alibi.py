"""ALiBi (Press et al. 2021, arXiv 2108.12409): no position embeddings, a per-head linear distance penalty on
the attention logits instead."""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from longrope.encodings.errors import EncodingConfigError
from longrope.encodings.interface import EncodingKind, PositionalEncoding


def _power_of_two_slopes(n_heads: int) -> list[float]:
    return [2.0 ** (-8.0 * h / n_heads) for h in range(1, n_heads + 1)]


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Slopes `2^(-8h/n)` for n a power of two; otherwise the slopes of the largest power of two c <= n,
    then every other slope of 2c (exponents 1, 3, 5, ...) until n are taken, as the paper's code does."""
    if n_heads < 1:
        raise EncodingConfigError(f"n_heads: ALiBi needs at least one head, got {n_heads}")
    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = _power_of_two_slopes(closest)
    slopes += _power_of_two_slopes(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(n_heads: int, q_len: int, k_len: int, *, causal: bool = True) -> torch.Tensor:
    """Bias [H, Tq, Tk]: `-m_h * (i - j)` (causal; future keys are for the mask to hide) or
    `-m_h * |i - j|` (symmetric, for encoders). Queries are the last Tq of the Tk positions."""
    query_pos = torch.arange(k_len - q_len, k_len)[:, None]
    distance = query_pos - torch.arange(k_len)[None, :]
    if not causal:
        distance = distance.abs()
    return -alibi_slopes(n_heads)[:, None, None] * distance.to(torch.float32)


class ALiBiEncoding(PositionalEncoding):
    kind: ClassVar[EncodingKind] = "bias"
    name: ClassVar[str] = "alibi"
    summary: ClassVar[str] = "ALiBi linear distance bias, causal or symmetric"

    def __init__(self, n_heads: int, *, causal: bool = True):
        super().__init__()
        alibi_slopes(n_heads)  # validates n_heads early
        self.n_heads, self.causal = n_heads, causal

    def attention_bias(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        bias = alibi_bias(self.n_heads, q.shape[-2], k.shape[-2], causal=self.causal)
        return bias.to(device=q.device, dtype=q.dtype)[None]
