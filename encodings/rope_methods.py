"""The RoPE family as one model: every variant is `inv_freq` + `attention_factor` (+ a per-position rule).

One small class per method, each overriding only how its frequencies are computed (the vLLM shape). Each
class is a frozen pydantic model whose fields are the transformers `rope_parameters` keys, so validation,
`to_hf()` and the error messages all speak the names users see in `config.json`. The formulas and their
sources are in REFERENCE.md; transformers 5.x is the reference wherever it has the method, and every
computation here follows its float32 operation order so the two agree to the last bit or close to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from longrope.encodings.errors import EncodingConfigError
from longrope.encodings.lazy_import import torch
from longrope.encodings.rotary import Layout, default_inv_freq, rotary_cos_sin, rotary_dim_for

# Fields that describe the model the encoding is attached to, not the `rope_parameters` block.
CONTEXT_FIELDS = frozenset({"head_dim", "max_position_embeddings"})


class RopeMethod(BaseModel):
    """Plain RoPE (`rope_type: "default"`): `inv_freq_i = theta ** (-2i / rotary_dim)`, attention factor 1."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, populate_by_name=True)

    rope_type: ClassVar[str] = "default"
    # rope_parameters keys this method writes in to_hf(), besides rope_type/rope_theta/partial_rotary_factor.
    hf_keys: ClassVar[tuple[str, ...]] = ()

    head_dim: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    rope_theta: float = Field(default=10000.0, gt=1.0)
    partial_rotary_factor: float = Field(default=1.0, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _check_rotary_dim(self) -> RopeMethod:
        rotary_dim_for(self.head_dim, self.partial_rotary_factor)
        return self

    @property
    def rotary_dim(self) -> int:
        return rotary_dim_for(self.head_dim, self.partial_rotary_factor)

    @property
    def attention_factor(self) -> float:
        """Multiplier of cos and sin (so attention logits scale by its square)."""
        return 1.0

    @property
    def n_hat(self) -> int:
        """Leading positions that keep the original frequencies (only LongRoPE sets it)."""
        return 0

    def original_inv_freq(self) -> torch.Tensor:
        return default_inv_freq(self.rotary_dim, self.rope_theta)

    def inv_freq(self, seq_len: int | None = None) -> torch.Tensor:
        """Frequencies in force for a sequence of `seq_len` tokens (None: as at model load)."""
        return self.original_inv_freq()

    def factors(self, seq_len: int | None = None) -> torch.Tensor:
        """Per-pair divisors `original_inv_freq / inv_freq`: how this method seeds a LongRoPE search."""
        return self.original_inv_freq() / self.inv_freq(seq_len)

    def cos_sin(
        self, positions: torch.Tensor, *, seq_len: int | None = None, layout: Layout = "rotate_half"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [1 or B, T, rotary_dim]; `seq_len` defaults to max(position) + 1, as transformers uses."""
        if seq_len is None:
            seq_len = int(positions.max()) + 1
        return rotary_cos_sin(
            self.inv_freq(seq_len),
            positions,
            attention_factor=self.attention_factor,
            n_hat=self.n_hat,
            original_inv_freq=self.original_inv_freq(),
            layout=layout,
        )

    def to_hf(self) -> dict[str, Any]:
        """This method as a transformers `rope_parameters` dict (what goes into `config.json`)."""
        block: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        if self.partial_rotary_factor != 1.0:
            block["partial_rotary_factor"] = self.partial_rotary_factor
        for name, field in type(self).model_fields.items():
            key = field.alias or name
            value = getattr(self, name)
            if key in self.hf_keys and value is not None:
                block[key] = value
        return block


class LinearRope(RopeMethod):
    """Position Interpolation (`linear`): every frequency divided by `factor`, i.e. positions divided by it."""

    rope_type: ClassVar[str] = "linear"
    hf_keys: ClassVar[tuple[str, ...]] = ("factor",)
    factor: float = Field(ge=1.0)

    def inv_freq(self, seq_len: int | None = None) -> torch.Tensor:
        return self.original_inv_freq() / self.factor


class NtkRope(RopeMethod):
    """NTK-aware static base change: `theta' = theta * factor ** (d / (d - 2))`.

    Keeps the highest frequency and divides the lowest by exactly `factor`. transformers has no rope_type for
    it, so `to_hf()` states it as `default` with the changed `rope_theta`, which transformers and vLLM load
    as they are (the frequencies are identical; the method name is not kept).
    """

    rope_type: ClassVar[str] = "ntk"
    factor: float = Field(ge=1.0)

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
    transformers, `L0 = max_position_embeddings` (not `original_max_position_embeddings`). How a running model
    moves between lengths (growth only, reset below L0) is `DynamicFrequencyCache`.
    """

    rope_type: ClassVar[str] = "dynamic"
    hf_keys: ClassVar[tuple[str, ...]] = ("factor",)
    factor: float = Field(ge=1.0)

    def scaled_theta(self, seq_len: int | None) -> float:
        length = self.max_position_embeddings if seq_len is None else max(seq_len, self.max_position_embeddings)
        d = self.rotary_dim
        growth = self.factor * length / self.max_position_embeddings - (self.factor - 1)
        return self.rope_theta * growth ** (d / (d - 2))

    def inv_freq(self, seq_len: int | None = None) -> torch.Tensor:
        return default_inv_freq(self.rotary_dim, self.scaled_theta(seq_len))

    def frequency_cache(self) -> DynamicFrequencyCache:
        return DynamicFrequencyCache(self)


class DynamicFrequencyCache:
    """transformers' `dynamic_rope_update` rule for a running model, as a small state machine.

    The frequencies are recomputed only when a forward's length (max position + 1) grows past the cached
    length, and reset to the originals when a forward is shorter than `max_position_embeddings` after growth.
    So a shorter sequence that is still past L0 keeps the larger base it was given before.
    """

    def __init__(self, method: DynamicNtkRope):
        self.method = method
        self.original_length = method.max_position_embeddings
        self.cached_length = self.original_length
        self.inv_freq = method.inv_freq(None)

    def update(self, seq_len: int) -> torch.Tensor:
        if seq_len > self.cached_length:
            self.inv_freq = self.method.inv_freq(seq_len)
            self.cached_length = seq_len
        if seq_len < self.original_length and self.cached_length > self.original_length:
            self.inv_freq = self.method.original_inv_freq()
            self.cached_length = self.original_length
        return self.inv_freq


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


class YarnRope(RopeMethod):
    """YaRN (`yarn`): high frequencies kept, low ones divided by `factor`, a linear ramp between (in pair
    index), and the attention factor `0.1 ln(factor) + 1` (or the DeepSeek `mscale`/`mscale_all_dim` ratio).

    `factor` is required, as transformers' validator requires it; an explicit factor is what transformers
    >= 4.56 uses even when it disagrees with max_position_embeddings / original_max_position_embeddings.
    """

    rope_type: ClassVar[str] = "yarn"
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
    attention_factor_override: float | None = Field(default=None, gt=0.0, alias="attention_factor")
    beta_fast: float | None = Field(default=None, gt=0.0)
    beta_slow: float | None = Field(default=None, gt=0.0)
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool | None = None

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

        low, high = correction_dim(self.beta_fast or 32), correction_dim(self.beta_slow or 1)
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


def longrope_inv_freq(factors: torch.Tensor, rotary_dim: int, rope_theta: float) -> torch.Tensor:
    """`1 / (factor_i * theta ** (2i / rotary_dim))`, in transformers' operation order (5.x
    `_compute_longrope_parameters`: `1.0 / (ext_factors * base ** inv_freq_shape)`), so it agrees bit for bit.

    `factors` is [..., rotary_dim / 2] (one row per candidate, or per batch row) and may carry autograd: the
    gradient scorer (workers/scorer.py `score_with_gradient`) differentiates through it. The result has the
    factors' dtype when it is wider than float32 (a float64 finite-difference check), float32 otherwise."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (factors * rope_theta**exponents)


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
    hf_keys: ClassVar[tuple[str, ...]] = (
        "short_factor",
        "long_factor",
        "original_max_position_embeddings",
        "factor",
        "attention_factor",
        "short_mscale",
        "long_mscale",
    )
    short_factor: list[float]
    long_factor: list[float]
    original_max_position_embeddings: int = Field(gt=0)
    factor: float | None = Field(default=None, gt=0.0)
    attention_factor_override: float | None = Field(default=None, gt=0.0, alias="attention_factor")
    short_mscale: float | None = Field(default=None, gt=0.0)  # vLLM's cos/sin scale, short regime
    long_mscale: float | None = Field(default=None, gt=0.0)  # vLLM's cos/sin scale, long regime
    n_hat_positions: int = Field(default=0, ge=0, alias="n_hat")

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


class Llama3Rope(RopeMethod):
    """Llama 3.1 (`llama3`): wavelengths shorter than L0/high_freq_factor kept, longer than L0/low_freq_factor
    divided by `factor`, and a smooth blend between."""

    rope_type: ClassVar[str] = "llama3"
    hf_keys: ClassVar[tuple[str, ...]] = (
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    )
    factor: float = Field(ge=1.0)
    low_freq_factor: float = Field(gt=0.0)
    high_freq_factor: float = Field(gt=0.0)
    original_max_position_embeddings: int = Field(gt=0)

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


ROPE_METHODS: dict[str, type[RopeMethod]] = {
    cls.rope_type: cls for cls in (RopeMethod, LinearRope, NtkRope, DynamicNtkRope, YarnRope, LongRope, Llama3Rope)
}


class CandidateRows(NamedTuple):
    """Per-candidate rope inputs, one row each: what a batched cos/sin (or a patched model) needs."""

    inv_freq: torch.Tensor  # [B, d/2] float32
    attention_factor: torch.Tensor  # [B] float32
    n_hat: torch.Tensor  # [B] int64


def candidate_rows(methods: Sequence[RopeMethod], seq_len: int | None) -> CandidateRows:
    """Stack B candidates' frequencies in force at `seq_len`; they must share rotary dim and theta."""
    if not methods:
        raise EncodingConfigError("methods: need at least one candidate")
    for method in methods[1:]:
        if method.rotary_dim != methods[0].rotary_dim or method.rope_theta != methods[0].rope_theta:
            raise EncodingConfigError("methods: candidates in one batch must share rotary_dim and rope_theta")
    return CandidateRows(
        torch.stack([m.inv_freq(seq_len) for m in methods]),
        torch.tensor([m.attention_factor for m in methods], dtype=torch.float32),
        torch.tensor([m.n_hat for m in methods], dtype=torch.int64),
    )


def batch_cos_sin(
    methods: Sequence[RopeMethod],
    positions: torch.Tensor,
    *,
    seq_len: int | None = None,
    layout: Layout = "rotate_half",
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B, T, rotary_dim] for B candidate methods at once (row b is candidate b), so one forward pass
    over B copies of a window scores B candidates. All candidates must share rotary dim and theta."""
    if seq_len is None:
        seq_len = int(positions.max()) + 1
    rows = candidate_rows(methods, seq_len)
    return rotary_cos_sin(
        rows.inv_freq,
        positions,
        attention_factor=rows.attention_factor,
        n_hat=rows.n_hat,
        original_inv_freq=methods[0].original_inv_freq(),
        layout=layout,
    )
