"""Position Interpolation (`rope_type: "linear"`): every frequency divided by the scale.

Chen et al. 2023, "Extending Context Window of Large Language Models via Positional Interpolation" (arXiv
2306.15595): `theta'_i = theta_i / s`, which is the same as reading position p as p / s; attention factor 1.
transformers 5.x `modeling_rope_utils.py`, `_compute_linear_scaling_rope_parameters` (`factor` required, its
validator warns below 1); vLLM 0.33 `LinearScalingRotaryEmbedding` divides the positions instead, with the same
angles.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from longrope.encodings.lazy_import import torch
from longrope.encodings.rope_methods.base import RopeMethod, RotaryShape


class LinearRope(RopeMethod):
    """Position Interpolation (`linear`): every frequency divided by `factor`, i.e. positions divided by it."""

    rope_type: ClassVar[str] = "linear"
    factor_follows_length: ClassVar[bool] = True
    max_position_is_pretrained: ClassVar[bool] = True
    summary: ClassVar[str] = "Position Interpolation: every frequency / factor"
    hf_keys: ClassVar[tuple[str, ...]] = ("factor",)
    baseline: ClassVar[str | None] = "pi"
    seeds_search: ClassVar[bool] = True
    factor: float = Field(ge=1.0)

    @classmethod
    def nominal(cls, shape: RotaryShape, *, original: int, target: int, scale: float) -> LinearRope:
        return cls(max_position_embeddings=target, factor=scale, **shape)

    def inv_freq(self, seq_len: int | None = None) -> torch.Tensor:
        return self.original_inv_freq() / self.factor
