"""YaRN (`rope_type: "yarn"`): keep the high frequencies, interpolate the low ones, ramp between, and warm the
attention.

Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models" (arXiv 2309.00071); the
authors' code is jquesnelle/yarn (`scaled_rope/LlamaYaRNScaledRotaryEmbedding.py`). This follows
transformers 5.24 `modeling_rope_utils.py`, `_compute_yarn_parameters`, which vLLM 0.33's
`YaRNScalingRotaryEmbedding` matches:
- correction dim of r rotations over L0 = original_max_position_embeddings (the pair index whose wavelength
  `2 pi b ** (2i/d)` fits r turns into L0): `cdim(r) = d * ln(L0 / (2 pi r)) / (2 ln b)`;
  `low = floor(cdim(beta_fast))`, `high = ceil(cdim(beta_slow))` (no rounding when `truncate` is false; GPT-OSS
  sets that), then clamped to [0, d - 1] (d - 1, not d/2 - 1, in every implementation); beta_fast 32, beta_slow 1;
- `ramp_i = clamp((i - low) / (high - low), 0, 1)` (high += 0.001 when they meet), linear in the pair index (the
  paper writes the ramp in rotations r; all code ramps in the index, and so does this);
- `theta'_i = theta_i * (1 - ramp_i) + (theta_i / s) * ramp_i`: pairs up to `low` kept, from `high` divided by s;
- attention factor: `attention_factor` when given; else, when `mscale` and `mscale_all_dim` are both set (the
  DeepSeek-V3 keys), `get_mscale(s, mscale) / get_mscale(s, mscale_all_dim)`; else `get_mscale(s)`, with
  `get_mscale(s, m) = 0.1 m ln(s) + 1` (1 when s <= 1): the paper's `sqrt(1/t) = 0.1 ln s + 1`.
An explicit `factor` wins over max_position_embeddings / L0 (transformers since PR #40320; older 4.x releases
replaced it by that ratio). Worked test vector (d 128, b 1e4, L0 4096, s 8): cdim(32) = 20.944 so low = 20,
cdim(1) = 45.027 so high = 46; attention factor 1.2079441541679836.
"""

from __future__ import annotations

import math
from typing import ClassVar

from pydantic import Field, model_validator

from longrope.encodings.lazy_import import torch
from longrope.encodings.rope_methods.base import RopeMethod, RotaryShape


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """transformers' `get_mscale`: `0.1 * mscale * ln(scale) + 1`, and 1 when the scale is at most 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


BETA_FAST, BETA_SLOW = 32.0, 1.0  # the paper's and every runtime's defaults


class YarnRope(RopeMethod):
    """YaRN (`yarn`): high frequencies kept, low ones divided by `factor`, a linear ramp between (in pair
    index), and the attention factor `0.1 ln(factor) + 1` (or the DeepSeek `mscale`/`mscale_all_dim` ratio).

    `factor` is required, as transformers' validator requires it; an explicit factor is what transformers
    >= 4.56 uses even when it disagrees with max_position_embeddings / original_max_position_embeddings.
    """

    rope_type: ClassVar[str] = "yarn"
    factor_follows_length: ClassVar[bool] = True
    summary: ClassVar[str] = "YaRN: ramped interpolation + attention temperature"
    hf_keys: ClassVar[tuple[str, ...]] = (
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    )
    factor: float = Field(ge=1.0)
    original_max_position_embeddings: int = Field(gt=0)
    attention_factor_override: float | None = Field(
        default=None, gt=0.0, alias="attention_factor", description="the cos/sin scale, in place of the formula's"
    )
    beta_fast: float | None = Field(
        default=None, gt=0.0, description=f"rotations within L0 from which a pair is kept (default {BETA_FAST:g})"
    )
    beta_slow: float | None = Field(
        default=None, gt=0.0, description=f"rotations within L0 below which a pair is divided (default {BETA_SLOW:g})"
    )
    mscale: float | None = Field(default=None, description="DeepSeek's attention-factor numerator")
    mscale_all_dim: float | None = Field(default=None, description="DeepSeek's attention-factor denominator")
    truncate: bool | None = Field(default=None, description="round the ramp's ends to whole pairs (default true)")
    baseline: ClassVar[str | None] = "yarn"
    seeds_search: ClassVar[bool] = True
    tuned: ClassVar[bool] = True

    @classmethod
    def nominal(cls, shape: RotaryShape, *, original: int, target: int, scale: float) -> YarnRope:
        """Its defaults: beta_fast 32, beta_slow 1, attention factor 0.1 ln(scale) + 1."""
        return cls(max_position_embeddings=target, factor=scale, original_max_position_embeddings=original, **shape)

    @model_validator(mode="after")
    def _check_betas(self) -> YarnRope:
        """beta_fast must stay above beta_slow, else the ramp runs backwards (transformers only warns)."""
        fast, slow = self.beta_fast or BETA_FAST, self.beta_slow or BETA_SLOW
        if fast <= slow:
            raise ValueError(
                f"beta_fast: must be greater than beta_slow ({slow:g}), got {fast:g} (beta_fast counts the rotations "
                "of the fast pairs, which are kept)"
            )
        return self

    @property
    def serving_span(self) -> float:
        """`factor` times the pre-trained length: transformers reads YaRN's factor as "the ratio between the pre-yarn
        and post-yarn context lengths" (`_validate_yarn_rope_parameters`), and Qwen2.5 ships factor 4 over 32,768
        tokens with max_position_embeddings left at 32,768 to serve 131,072; a larger max_position_embeddings
        (transformers warns that the factors disagree) is served too."""
        return max(float(self.max_position_embeddings), self.factor * self.original_max_position_embeddings)

    @property
    def attention_factor(self) -> float:
        if self.attention_factor_override is not None:
            return self.attention_factor_override
        if self.mscale and self.mscale_all_dim:
            return float(_yarn_mscale(self.factor, self.mscale) / _yarn_mscale(self.factor, self.mscale_all_dim))
        return _yarn_mscale(self.factor)

    def correction_range(self) -> tuple[float, float]:
        """Pair indices (low, high) where the ramp from 'keep' to 'divide by factor' starts and ends."""
        d, base, length = self.rotary_dim, self.rope_theta, self.original_max_position_embeddings

        def correction_dim(rotations: float) -> float:
            return (d * math.log(length / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = correction_dim(self.beta_fast or BETA_FAST), correction_dim(self.beta_slow or BETA_SLOW)
        if self.truncate is None or self.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, d - 1)

    def ramp(self) -> torch.Tensor:
        """0 where the frequency is kept, 1 where it is divided by `factor`, linear in the pair index."""
        low, high = self.correction_range()
        if low == high:
            high += 0.001
        linear = (torch.arange(self.rotary_dim // 2, dtype=torch.float32) - low) / (high - low)
        return torch.clamp(linear, 0, 1)

    def inv_freq(self, seq_len: int | None = None) -> torch.Tensor:
        d = self.rotary_dim
        pos_freqs = self.rope_theta ** (torch.arange(0, d, 2).to(dtype=torch.float32) / d)
        extrapolation = 1.0 / pos_freqs
        interpolation = 1.0 / (self.factor * pos_freqs)
        keep = 1 - self.ramp()
        return interpolation * (1 - keep) + extrapolation * keep
