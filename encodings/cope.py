"""CoPE, contextual position encoding (Golovneva et al. 2024, arXiv 2405.18719).

Positions are not token counts but sums of gates: key j is `p_ij = sum_{t=j..i} sigmoid(q_i . k_t / sqrt(d))`
positions back from query i, so a head can count words, sentences or anything its gates pick out. Positions
are fractional; the position logit `q_i . e[p]` is interpolated between the two nearest integer embeddings,
which keeps it differentiable in the gates. Follows the authors' code (facebookresearch/RAM, projects/cope).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from longrope.encodings.errors import EncodingConfigError
from longrope.encodings.interface import EncodingKind, PositionalEncoding, causal_mask


def cope_positions(gate_logits: torch.Tensor, mask: torch.Tensor, npos_max: int) -> torch.Tensor:
    """Fractional positions [..., Tq, Tk]: reverse cumulative sum of sigmoid gates over visible keys."""
    gates = torch.sigmoid(gate_logits) * mask
    positions = gates.flip(-1).cumsum(dim=-1).flip(-1)
    return positions.clamp(max=npos_max - 1)


class CoPE(nn.Module):
    """The CoPE position-logit layer: one learned `head_dim x npos_max` table shared by a layer's heads."""

    def __init__(self, npos_max: int, head_dim: int):
        super().__init__()
        if npos_max < 2:
            raise EncodingConfigError(f"npos_max: CoPE needs at least 2 positions, got {npos_max}")
        self.npos_max = npos_max
        self.pos_emb = nn.Parameter(torch.zeros(head_dim, npos_max))

    def forward(self, q: torch.Tensor, gate_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Position logits [B, H, Tq, Tk] for queries q [B, H, Tq, d] and gate logits q.k/sqrt(d)."""
        positions = cope_positions(gate_logits, mask, self.npos_max)
        floor = positions.floor()
        weight = positions - floor
        logits_int = q @ self.pos_emb  # [B, H, Tq, npos_max]
        below = logits_int.gather(-1, floor.long())
        above = logits_int.gather(-1, positions.ceil().long())
        return above * weight + below * (1 - weight)


class CoPEEncoding(PositionalEncoding):
    """CoPE as a block encoding (bias kind): gates from the same q and k as attention.

    `divide_by_sqrt_d=True` is the authors' default, `(q.k + cope) / sqrt(d)`; False is the paper's snippet,
    `q.k / sqrt(d) + cope`. `npos_max` defaults in the paper's code to block size + 1.
    """

    kind: ClassVar[EncodingKind] = "bias"
    name: ClassVar[str] = "cope"
    summary: ClassVar[str] = "CoPE contextual (gated, fractional) positions"

    def __init__(self, npos_max: int, head_dim: int, *, causal: bool = True, divide_by_sqrt_d: bool = True):
        super().__init__()
        self.cope = CoPE(npos_max, head_dim)
        self.causal, self.divide_by_sqrt_d = causal, divide_by_sqrt_d

    def attention_bias(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        scale = math.sqrt(q.shape[-1])
        gate_logits = q @ k.transpose(-1, -2) / scale
        if self.causal:
            mask = causal_mask(q.shape[-2], k.shape[-2], q.device).to(q.dtype)
        else:
            mask = torch.ones(q.shape[-2], k.shape[-2], device=q.device, dtype=q.dtype)
        bias = self.cope(q, gate_logits, mask)
        return bias / scale if self.divide_by_sqrt_d else bias
