"""Absolute position encodings added to the token embeddings: sinusoidal (Vaswani et al. 2017) and learned
(GPT-2). Neither extrapolates: the learned table simply ends, and says so with a clear error.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from longrope.encodings.errors import EncodingConfigError, PositionOutOfRangeError
from longrope.encodings.interface import EncodingKind, PositionalEncoding


def sinusoidal_table(positions: torch.Tensor, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The paper's interleaved form: `PE[p, 2k] = sin(p / base^(2k/d))`, `PE[p, 2k+1] = cos(same angle)`."""
    if d_model < 2 or d_model % 2:
        raise EncodingConfigError(f"d_model: sinusoidal encoding needs an even size >= 2, got {d_model}")
    exponents = torch.arange(0, d_model, 2, dtype=torch.float64) / d_model
    angles = positions.to(torch.float64)[..., None] / base**exponents
    table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)
    return table.to(torch.float32)


class SinusoidalEncoding(PositionalEncoding):
    """Fixed sinusoids added to the embeddings (the paper also scales embeddings by sqrt(d_model); that is
    the model's choice, not the encoding's)."""

    kind: ClassVar[EncodingKind] = "additive"
    name: ClassVar[str] = "sinusoidal"
    summary: ClassVar[str] = "fixed sin/cos added to embeddings (Vaswani et al.)"

    def __init__(self, d_model: int, base: float = 10000.0):
        super().__init__()
        sinusoidal_table(torch.zeros(1), d_model, base)  # validates d_model early
        self.d_model, self.base = d_model, base

    def add_to_embeddings(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x + sinusoidal_table(positions, self.d_model, self.base).to(device=x.device, dtype=x.dtype)


class LearnedAbsoluteEncoding(PositionalEncoding):
    """A trained table of `max_positions` vectors (GPT-2 `wpe`); positions past it have no embedding."""

    kind: ClassVar[EncodingKind] = "additive"
    name: ClassVar[str] = "learned"
    summary: ClassVar[str] = "learned absolute table (GPT-2 wpe); errors past its length"

    def __init__(self, max_positions: int, d_model: int):
        super().__init__()
        if max_positions <= 0:
            raise EncodingConfigError(f"max_positions: must be positive, got {max_positions}")
        self.max_positions = max_positions
        self.table = nn.Embedding(max_positions, d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    def add_to_embeddings(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        low, high = int(positions.min()), int(positions.max())
        if low < 0 or high >= self.max_positions:
            bad = high if high >= self.max_positions else low
            raise PositionOutOfRangeError(
                f"learned absolute positions cover 0..{self.max_positions - 1}; got position {bad}. "
                "A learned table cannot extrapolate: use a shorter input or a relative encoding."
            )
        return x + self.table(positions.to(x.device))
