"""The uniform interface a decoder block uses for any positional encoding.

A block calls all three hooks; each encoding overrides the one that matches its `kind`, and the others
leave their input alone. So a block written once works with additive (sinusoidal, learned), rotary (every
RoPE variant, 2D / M-RoPE), bias (ALiBi, CoPE) and none (NoPE) encodings alike.

Tensors: embeddings `x` are [B, T, d_model]; queries and keys are [B, H, T, head_dim]; positions are [T] or
[B, T] integer positions (multi-axis rotary encodings take one row per axis, see `multi_axis`).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
from torch import nn

from longrope.encodings.rope_methods import RopeMethod
from longrope.encodings.rotary import Layout, apply_rotary

# how an encoding enters a decoder block: added to embeddings, rotating q/k, biasing the logits, or not at all
EncodingKind = Literal["additive", "rotary", "bias", "none"]


class PositionalEncoding(nn.Module):
    """Base class: every hook is the identity, so NoPE is this class with kind 'none'.

    Each subclass states its own `longrope encodings list` entry (`catalog.py` reads it): its name, a one-line
    summary, and the transformers rope_type where transformers has it."""

    kind: ClassVar[EncodingKind] = "none"
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    hf_rope_type: ClassVar[str | None] = None

    def add_to_embeddings(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Embeddings with position information added (additive encodings)."""
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys rotated by position (rotary encodings)."""
        return q, k

    def attention_bias(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
        """Additive bias [B or 1, H or 1, Tq, Tk] for the scaled attention logits (bias encodings)."""
        return None


class NoPE(PositionalEncoding):
    """No positional signal at all; a causal decoder still tells positions apart through its mask
    (Kazemnejad et al. 2023, arXiv 2305.19466)."""

    kind: ClassVar[EncodingKind] = "none"
    name: ClassVar[str] = "nope"
    summary: ClassVar[str] = "no positional encoding; the causal mask alone"


class RotaryEncoding(PositionalEncoding):
    """Any RoPE-family method (plain, PI, NTK, Dynamic NTK, YaRN, LongRoPE, Llama 3) as a block encoding."""

    kind: ClassVar[EncodingKind] = "rotary"

    def __init__(self, method: RopeMethod, layout: Layout = "rotate_half"):
        super().__init__()
        self.method = method
        self.layout = layout

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.method.cos_sin(positions, layout=self.layout)
        return apply_rotary(q, cos, sin, layout=self.layout), apply_rotary(k, cos, sin, layout=self.layout)


def causal_mask(q_len: int, k_len: int, device: torch.device | None = None) -> torch.Tensor:
    """Boolean [Tq, Tk], True where query i may see key j; queries are the last Tq of the Tk positions."""
    offset = k_len - q_len
    rows = torch.arange(q_len, device=device)[:, None] + offset
    return torch.arange(k_len, device=device)[None, :] <= rows


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    encoding: PositionalEncoding,
    positions: torch.Tensor,
    *,
    causal: bool = True,
) -> torch.Tensor:
    """Plain softmax attention through the three hooks: the decoder-block contract, written out once.

    Kept simple on purpose (materialises [Tq, Tk]); fused kernels live in the workers, not here.
    """
    q, k = encoding.rotate(q, k, positions)
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    bias = encoding.attention_bias(q, k)
    if bias is not None:
        logits = logits + bias
    if causal:
        logits = logits.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    return torch.softmax(logits, dim=-1) @ v
