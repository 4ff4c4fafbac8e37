"""Llama 3.1's frequency bands (`rope_type: "llama3"`): short wavelengths kept, long ones interpolated, a smooth
blend between.

Meta's llama-models `models/llama3/model.py`, `apply_scaling` (there hard-coded to factor 8, low_freq_factor 1,
high_freq_factor 4, L0 8192), transformers 5.x `modeling_rope_utils.py`, `_compute_llama3_parameters`, and vLLM
0.33's `Llama3RotaryEmbedding` agree: with `wl_i = 2 pi / theta_i`, `low_wl = L0 / low_freq_factor` and
`high_wl = L0 / high_freq_factor`,
- `wl_i < high_wl`: theta_i kept;
- `wl_i > low_wl`: theta_i / s;
- otherwise, with `g = (L0 / wl_i - low_freq_factor) / (high_freq_factor - low_freq_factor)`:
  `theta'_i = (1 - g) * theta_i / s + g * theta_i` (the band edges count as the middle band; continuous there).
Attention factor 1. Worked test vector (d 128, b 5e5, s 8, 1 / 4, L0 8192): theta / theta' is 1 for i <= 28;
1.207, 1.553, 2.026, 2.695, 3.684, 5.257 for i = 29 .. 34; 8 for i >= 35. transformers divides by zero when
the two band factors are equal (vLLM sets g = 0); this class refuses that.
"""

from __future__ import annotations

import math
from typing import ClassVar

from pydantic import Field, model_validator

from longrope.encodings.lazy_import import torch
from longrope.encodings.rope_methods.base import RopeMethod, RotaryShape


class Llama3Rope(RopeMethod):
    """Llama 3.1 (`llama3`): wavelengths shorter than L0/high_freq_factor kept, longer than L0/low_freq_factor
    divided by `factor`, and a smooth blend between."""

    rope_type: ClassVar[str] = "llama3"
    factor_follows_length: ClassVar[bool] = True
    summary: ClassVar[str] = "Llama 3.1 wavelength-band scaling"
    hf_keys: ClassVar[tuple[str, ...]] = (
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    )
    factor: float = Field(ge=1.0)
    low_freq_factor: float = Field(gt=0.0, description="L0 / this: the wavelength past which a pair is interpolated")
    high_freq_factor: float = Field(gt=0.0, description="L0 / this: the wavelength below which a pair is kept")
    original_max_position_embeddings: int = Field(gt=0)
    baseline: ClassVar[str | None] = "llama3"
    seeds_search: ClassVar[bool] = True

    @classmethod
    def nominal(cls, shape: RotaryShape, *, original: int, target: int, scale: float) -> Llama3Rope:
        """Meta's release config: low_freq_factor 1, high_freq_factor 4."""
        return cls(
            max_position_embeddings=target,
            factor=scale,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=original,
            **shape,
        )

    @model_validator(mode="after")
    def _check_band(self) -> Llama3Rope:
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor: must be greater than low_freq_factor ({self.low_freq_factor}), "
                f"got {self.high_freq_factor}"
            )
        return self

    def inv_freq(self, seq_len: int | None = None) -> torch.Tensor:
        inv_freq = self.original_inv_freq()
        length = self.original_max_position_embeddings
        low_wavelen = length / self.low_freq_factor
        high_wavelen = length / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (length / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(is_medium, smoothed, scaled)
