"""NTK-aware scaling: the base is changed instead of the frequencies, statically or as the sequence grows.

Static (bloc97's "NTK-aware scaled RoPE", reddit r/LocalLLaMA, June 2023; jquesnelle/yarn,
`scaled_rope/LlamaNTKScaledRotaryEmbedding.py`): `b' = b * s ** (d / (d - 2))`, `theta'_i = b' ** (-2i / d)`,
attention factor 1. The exponent makes the lowest frequency (i = d/2 - 1) exactly `theta / s` while theta_0 is
unchanged. transformers has no rope_type for it (a model states it as `default` with the changed `rope_theta`);
vLLM's `dynamic` with an `alpha` key (`DynamicNTKAlphaRotaryEmbedding`) is this same static formula, while vLLM's
`ntk` type (`NTKScalingRotaryEmbedding`, kexue.fm/archives/9706) is a different one, not implemented here.

Dynamic (transformers 5.x `modeling_rope_utils.py`, `_compute_dynamic_ntk_parameters`): with
`L0 = max_position_embeddings` (not `original_max_position_embeddings`) and `L = max(seq_len, L0)`,
`b' = b * (s * L / L0 - (s - 1)) ** (d / (d - 2))`, attention factor 1; at L <= L0 the bracket is 1, plain RoPE.
Worked values (d 128, b 1e4, L0 4096, s 2): L 8192 gives b' 30527.7, L 16384 gives 72195.7. A running transformers
model recomputes them only as its sequence grows (`dynamic_rope_update`); a scored window is one forward at one
length, so the frequencies here are a function of that length alone. vLLM 0.33.0's
`DynamicNTKScalingRotaryEmbedding` (dynamic_ntk_scaling_rope.py) instead builds one static table of P =
max_position_embeddings rows on `b * (s * P / max_trained_positions - (s - 1)) ** (d / (d - 2))`, which is b itself
when the config has no `max_trained_positions` (plain RoPE, as transformers up to P; tests/test_runtimes.py checks
it), and older vLLM used the constant `s**2 - s + 1` (vllm#3488, fixed by vllm#41277), so vLLM is not the reference for
dynamic NTK.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from longrope.encodings.lazy_import import torch
from longrope.encodings.rope_methods.base import RopeMethod, RotaryShape
from longrope.encodings.rotary import default_inv_freq


class NtkRope(RopeMethod):
    """NTK-aware static base change: `theta' = theta * factor ** (d / (d - 2))`.

    Keeps the highest frequency and divides the lowest by exactly `factor`. transformers has no rope_type for
    it, so `to_hf()` states it as `default` with the changed `rope_theta`, which transformers and vLLM load
    as they are (the frequencies are identical; the method name is not kept).
    """

    rope_type: ClassVar[str] = "ntk"
    factor_follows_length: ClassVar[bool] = True
    in_transformers: ClassVar[bool] = False
    summary: ClassVar[str] = "NTK-aware static base change (exported as default + rope_theta)"
    baseline: ClassVar[str | None] = "ntk"
    seeds_search: ClassVar[bool] = True
    tuned: ClassVar[bool] = True
    factor: float = Field(ge=1.0)

    @classmethod
    def nominal(cls, shape: RotaryShape, *, original: int, target: int, scale: float) -> NtkRope:
        return cls(max_position_embeddings=target, factor=scale, **shape)

    @property
    def scaled_theta(self) -> float:
        d = self.rotary_dim
        return self.rope_theta * self.factor ** (d / (d - 2))

    def inv_freq(self, seq_len: int | None = None) -> torch.Tensor:
        return default_inv_freq(self.rotary_dim, self.scaled_theta)

    def to_hf(self) -> dict[str, Any]:
        block = RopeMethod(
            head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.scaled_theta,
            partial_rotary_factor=self.partial_rotary_factor,
        )
        return block.to_hf()


class DynamicNtkRope(RopeMethod):
    """Dynamic NTK (`dynamic`): the NTK base change grows with the sequence length past `max_position_embeddings`.

    `theta' = theta * (factor * L / L0 - (factor - 1)) ** (d / (d - 2))` with `L = max(seq_len, L0)` and, as in
    transformers, `L0 = max_position_embeddings` (not `original_max_position_embeddings`).
    """

    rope_type: ClassVar[str] = "dynamic"
    max_position_is_pretrained: ClassVar[bool] = True
    summary: ClassVar[str] = "Dynamic NTK: base grows with sequence length"
    hf_keys: ClassVar[tuple[str, ...]] = ("factor",)
    baseline: ClassVar[str | None] = "dynamic"
    factor: float = Field(ge=1.0)

    @classmethod
    def nominal(cls, shape: RotaryShape, *, original: int, target: int, scale: float) -> DynamicNtkRope:
        """Frequencies unchanged up to `original` (transformers reads L0 from max_position_embeddings)."""
        return cls(max_position_embeddings=original, factor=scale, **shape)

    def scaled_theta(self, seq_len: int | None) -> float:
        length = self.max_position_embeddings if seq_len is None else max(seq_len, self.max_position_embeddings)
        d = self.rotary_dim
        growth = self.factor * length / self.max_position_embeddings - (self.factor - 1)
        return self.rope_theta * growth ** (d / (d - 2))

    def inv_freq(self, seq_len: int | None = None) -> torch.Tensor:
        return default_inv_freq(self.rotary_dim, self.scaled_theta(seq_len))
