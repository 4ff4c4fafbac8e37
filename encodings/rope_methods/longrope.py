"""LongRoPE (`rope_type: "longrope"`, legacy `su`): every rotary pair divided by its own searched factor.

Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens" (arXiv 2402.13753); the
authors' code is microsoft/LongRoPE (`rope/longrope.py`, `LongRoPEScaledRotaryEmbedding`):
`theta'_i = 1 / (lambda_i * b ** (2i / d))`, i.e. `theta_i / lambda_i`, with lambda the per-pair factors
(monotone non-decreasing in i, as the search keeps them). `MixedLongRoPEScaledRotaryEmbedding` there keeps the
first `start_token_idx` positions (the paper's n_hat) on the original, un-scaled cos/sin: `n_hat` here.

transformers 5.24 (`modeling_rope_utils.py`, `_compute_longrope_parameters`; the switch is
`longrope_frequency_update`):
- lambda = `long_factor` when `seq_len = max(position_ids) + 1 > L0` (L0 = original_max_position_embeddings),
  else `short_factor` (also at model load, where seq_len is None): position 4095 of a 4096 model is short,
  position 4096 already long;
- attention factor: `attention_factor` when given; else 1 when s <= 1, else `sqrt(1 + ln(s) / ln(L0))`, with
  `s = factor`, or max_position_embeddings / L0 when `factor` is absent (the Phi-3 convention); the same in both
  regimes. Phi-3-mini-128k (s = 131072 / 4096 = 32): 1.1902380714238083.
vLLM 0.33 (`phi3_long_rope_scaled_rope.py`, `Phi3LongRoPEScaledRotaryEmbedding`) reads other keys and fixes the
regime once per engine: see `LongRope`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import Field, model_validator

from longrope.encodings.lazy_import import torch
from longrope.encodings.rope_methods.base import RopeMethod


def longrope_inv_freq(factors: torch.Tensor, rotary_dim: int, rope_theta: float) -> torch.Tensor:
    """`1 / (factor_i * theta ** (2i / rotary_dim))`, in transformers' operation order (5.x
    `_compute_longrope_parameters`: `1.0 / (ext_factors * base ** inv_freq_shape)`), so it agrees bit for bit.

    `factors` is [..., rotary_dim / 2] (one row per candidate, or per batch row) and may carry autograd: the
    gradient scorer (workers/scorer.py `score_with_gradient`) differentiates through it. The result has the
    factors' dtype when it is wider than float32 (a float64 finite-difference check), float32 otherwise."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    # the powers on the CPU, as transformers computes them, then on the factors' device (a GPU's pow may differ in the
    # last bit; the gradient scorer's factors live on the model's device)
    return 1.0 / (factors * (rope_theta**exponents).to(factors.device))


def float_list(values) -> list[float]:
    """A sequence, numpy array or tensor of factors as Python floats (exact; no torch needed for lists)."""
    return [float(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]


class LongRope(RopeMethod):
    """LongRoPE (`longrope`, legacy `su`): each pair divided by its own factor.

    `long_factor` applies when the sequence is longer than `original_max_position_embeddings`, `short_factor`
    otherwise (and at load time). The attention factor defaults to `sqrt(1 + ln(s) / ln(L0))` with
    `s = factor` (or max_position_embeddings / L0 when `factor` is absent, the Phi-3 convention). `n_hat` is
    this project's extension from the paper: the first `n_hat` positions keep the original frequencies;
    transformers and vLLM do not know it and ignore it.

    The two runtimes read different keys for the cos/sin scale (transformers 5.x
    `_compute_longrope_parameters`; vLLM 0.33 `Phi3LongRoPEScaledRotaryEmbedding`):
    - transformers: `attention_factor` (default above), the same in both regimes; it ignores the mscales.
    - vLLM: `short_mscale` / `long_mscale`, each defaulting to `sqrt(1 + ln(P / L0) / ln L0)` with
      P = max_position_embeddings (1 when P <= L0); it ignores `attention_factor` and `factor`.
    This class computes what transformers applies (`attention_factor`, used by the scorer) and what vLLM applies
    (`vllm_mscale`); `for_both_runtimes` states one scale in every key, so both apply the same cos/sin.
    """

    rope_type: ClassVar[str] = "longrope"
    summary: ClassVar[str] = "LongRoPE: searched per-pair factors (short/long), n_hat"
    hf_keys: ClassVar[tuple[str, ...]] = (
        "short_factor",
        "long_factor",
        "original_max_position_embeddings",
        "factor",
        "attention_factor",
        "short_mscale",
        "long_mscale",
    )
    baseline: ClassVar[str | None] = None  # its factors are searched: no nominal setting
    short_factor: list[float]
    long_factor: list[float]
    original_max_position_embeddings: int = Field(gt=0)
    factor: float | None = Field(default=None, gt=0.0)
    attention_factor_override: float | None = Field(
        default=None, gt=0.0, alias="attention_factor", description="the cos/sin scale, in place of the formula's"
    )
    short_mscale: float | None = Field(default=None, gt=0.0, description="vLLM's cos/sin scale, short regime")
    long_mscale: float | None = Field(default=None, gt=0.0, description="vLLM's cos/sin scale, long regime")
    n_hat_positions: int = Field(
        default=0, ge=0, alias="n_hat", description="leading positions kept on the original frequencies"
    )

    @model_validator(mode="after")
    def _check_factor_lists(self) -> LongRope:
        pairs = self.rotary_dim // 2
        problems = []
        for key in ("short_factor", "long_factor"):
            values = getattr(self, key)
            if len(values) != pairs:
                problems.append(f"{key}: expected {pairs} values (rotary_dim {self.rotary_dim} / 2), got {len(values)}")
            bad = [(i, v) for i, v in enumerate(values) if not v > 0]
            if bad:
                problems.append(f"{key}: every factor must be > 0, got {bad[0][1]} at pair {bad[0][0]}")
        if problems:
            raise ValueError("; rope_parameters.".join(problems))
        return self

    @classmethod
    def from_factors(
        cls,
        long_factor: Sequence[float] | torch.Tensor,
        *,
        head_dim: int,
        original_length: int,
        target_length: int,
        rope_theta: float = 10000.0,
        partial_rotary_factor: float = 1.0,
        attention_factor: float | None = None,
        n_hat: int = 0,
        short_factor: Sequence[float] | torch.Tensor | None = None,
    ) -> LongRope:
        """A LongRoPE encoding for searched factors, `factor = target / original`; short factors all ones unless
        given (a short-factor search, the Phi-3 recipe)."""
        values = float_list(long_factor)
        short = [1.0] * len(values) if short_factor is None else float_list(short_factor)
        return cls(
            head_dim=head_dim,
            max_position_embeddings=target_length,
            rope_theta=rope_theta,
            partial_rotary_factor=partial_rotary_factor,
            short_factor=short,
            long_factor=values,
            original_max_position_embeddings=original_length,
            factor=target_length / original_length,
            attention_factor=attention_factor,
            n_hat=n_hat,
        )

    @property
    def scale(self) -> float:
        if self.factor is not None:
            return self.factor
        return self.max_position_embeddings / self.original_max_position_embeddings

    @property
    def attention_factor(self) -> float:
        if self.attention_factor_override is not None:
            return self.attention_factor_override
        if self.scale <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(self.scale) / math.log(self.original_max_position_embeddings))

    def vllm_mscale(self, *, long: bool) -> float:
        """The cos/sin scale vLLM applies in one regime: the block's `long_mscale` / `short_mscale`, else
        `sqrt(1 + ln(P / L0) / ln L0)` with P = max_position_embeddings (1 when P <= L0); vLLM never reads
        `attention_factor` or `factor`."""
        given = self.long_mscale if long else self.short_mscale
        if given is not None:
            return given
        ratio = self.max_position_embeddings / self.original_max_position_embeddings
        if ratio <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(ratio) / math.log(self.original_max_position_embeddings))

    def for_both_runtimes(self) -> LongRope:
        """The same encoding with its scale in every key both runtimes read: `factor`, `attention_factor`, and
        `short_mscale` = `long_mscale` = the attention factor transformers applies (in both regimes). vLLM then
        scales cos/sin exactly as transformers does, searched or non-default attention factors included."""
        scale = self.attention_factor
        return self.model_copy(
            update={
                "factor": self.scale,
                "attention_factor_override": scale,
                "short_mscale": scale,
                "long_mscale": scale,
            }
        )

    def vllm_regime(self) -> LongRope:
        """What a vLLM engine with `max_model_len > original_max_position_embeddings` applies at every length:
        the long factors and `long_mscale`, for short prompts too (vLLM fixes the regime once per engine, to
        keep its KV cache valid; transformers switches per forward). vLLM ignores `n_hat`."""
        long_scale = self.vllm_mscale(long=True)
        return self.model_copy(
            update={
                "short_factor": list(self.long_factor),
                "attention_factor_override": long_scale,
                "short_mscale": long_scale,
                "long_mscale": long_scale,
                "n_hat_positions": 0,
            }
        )

    @property
    def n_hat(self) -> int:
        return self.n_hat_positions

    def uses_long_factor(self, seq_len: int | None) -> bool:
        """transformers switches on `max(position) + 1 > original_max_position_embeddings`."""
        return bool(seq_len) and seq_len > self.original_max_position_embeddings

    def inv_freq(self, seq_len: int | None = None) -> torch.Tensor:
        chosen = self.long_factor if self.uses_long_factor(seq_len) else self.short_factor
        return longrope_inv_freq(torch.tensor(chosen, dtype=torch.float32), self.rotary_dim, self.rope_theta)

    def to_hf(self) -> dict[str, Any]:
        block = super().to_hf()
        if self.n_hat_positions:
            block["n_hat"] = self.n_hat_positions
        return block
