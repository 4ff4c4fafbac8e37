"""Plain RoPE (`rope_type: "default"`), and the base class every RoPE-family method overrides.

RoPE (Su et al. 2021, RoFormer, arXiv 2104.09864) rotates each pair `i` of a head's rotary dims by the angle
`p * theta_i` at position p, with `theta_i = b ** (-2i / d)`, i = 0 .. d/2 - 1, b = `rope_theta` (10000 unless a
model sets it: Llama 3 uses 500000, Qwen2-VL's text model 1e6). transformers 5.x computes it in float32 as
`1 / b ** (arange(0, d, 2) / d)` (models/llama/modeling_llama.py, `LlamaRotaryEmbedding.
compute_default_rope_parameters`), and so does `default_inv_freq` here, bit for bit.

Partial rotary (`partial_rotary_factor`, GPT-NeoX's `rotary_pct`, Phi-4-mini): only the first
`d_rot = int(head_dim * partial_rotary_factor)` dims of a head rotate and `d_rot` is the exponent's
denominator. transformers' Phi-3 default init and every scaled rope_type honour it, as vLLM's `get_rope` does
(`int(head_size * partial_rotary_factor)`); transformers' Llama default init ignores it, which is why the
tests compare plain RoPE with Phi-3's init.

Every method reduces to `inv_freq` (float32, d_rot/2) and `attention_factor`, which multiplies cos and sin (so
the attention logits scale by its square), as transformers applies them in `LlamaRotaryEmbedding.forward`. A
subclass overrides only `inv_freq` (and, where it has one, `attention_factor`): the shape of vLLM 0.33's
`model_executor/layers/rotary_embedding/` package, one class per scaling type over a base that owns the cos/sin.
Each class is a frozen pydantic model whose fields are the transformers `rope_parameters` keys, so validation,
`to_hf()` and the error messages speak the names users see in `config.json`.

A closed-form method also states itself as a baseline, read by `encodings.baselines` and from there by every part
that lists the baselines (a search's seeds, compare's rows and tuning grid, `longrope extrapolation`, the CLI): the
name it goes by (`baseline`; None for LongRoPE, whose factors are searched), whether its nominal instance may seed a
search (`seeds_search`), whether compare also tunes it on the search split (`tuned`), and that nominal instance for
a scale (`nominal`). So a new method is its file and its entry in `registry(...)`, nothing else.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypedDict

from pydantic import BaseModel, ConfigDict, Field, model_validator

from longrope.encodings.lazy_import import torch
from longrope.encodings.rotary import Layout, default_inv_freq, rotary_cos_sin, rotary_dim_for

# Fields that describe the model the encoding is attached to, not the `rope_parameters` block.
CONTEXT_FIELDS = frozenset({"head_dim", "max_position_embeddings"})


class RotaryShape(TypedDict):
    """What a method takes from the model it extends, besides its lengths."""

    head_dim: int
    rope_theta: float
    partial_rotary_factor: float


class RopeMethod(BaseModel):
    """Plain RoPE (`rope_type: "default"`): `inv_freq_i = theta ** (-2i / rotary_dim)`, attention factor 1."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, populate_by_name=True)

    rope_type: ClassVar[str] = "default"
    summary: ClassVar[str] = "plain RoPE (RoFormer), rotate-half or interleaved pairs"
    # rope_parameters keys this method writes in to_hf(), besides rope_type/rope_theta/partial_rotary_factor.
    hf_keys: ClassVar[tuple[str, ...]] = ()
    # whether transformers has this rope_type (NTK-aware has none: it is exported as default with another theta)
    in_transformers: ClassVar[bool] = True
    # as a baseline (see the module docstring); every subclass states its own `baseline` name, which `registry` checks
    baseline: ClassVar[str | None] = "none"
    seeds_search: ClassVar[bool] = False
    tuned: ClassVar[bool] = False
    # whether `factor` is the length served over the pre-training length, so that serving longer multiplies it
    # (linear, NTK-aware, YaRN, Llama 3); Dynamic NTK's factor and LongRoPE's factors hold at any length as they are
    factor_follows_length: ClassVar[bool] = False
    # whether a model config's max_position_embeddings is the length it was pre-trained at, which it serves `factor`
    # times (linear, dynamic: transformers' RoPE docs read factor x as "x times the original maximum pre-trained
    # length", and vLLM 0.33 derives max_model_len = max_position_embeddings * factor for every rope_type but su,
    # longrope, llama3 and the yarn ones, vllm/config/model.py `_get_and_verify_max_len`), rather than the length it
    # serves (Llama 3, LongRoPE, YaRN, which hold the pre-trained one in original_max_position_embeddings)
    max_position_is_pretrained: ClassVar[bool] = False

    head_dim: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    rope_theta: float = Field(default=10000.0, gt=1.0)
    partial_rotary_factor: float = Field(default=1.0, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _check_rotary_dim(self) -> RopeMethod:
        rotary_dim_for(self.head_dim, self.partial_rotary_factor)
        return self

    @property
    def pretrained_length(self) -> int:
        """The context the model this method was read from was pre-trained at: `original_max_position_embeddings`
        where the method keeps one, else `max_position_embeddings`."""
        return getattr(self, "original_max_position_embeddings", None) or self.max_position_embeddings

    @property
    def serving_span(self) -> float:
        """The context a model whose config holds this method serves as shipped, unrounded: `max_position_embeddings`,
        or `factor` times it where that is the pre-trained length (`max_position_is_pretrained`). What `moved_to`
        divides by, so that a factor moved to a target serves exactly that target."""
        if self.max_position_is_pretrained:
            return self.factor * self.max_position_embeddings
        return float(self.max_position_embeddings)

    @property
    def serving_length(self) -> int:
        """`serving_span` in whole tokens."""
        return round(self.serving_span)

    def moved_to(self, target: int) -> RopeMethod:
        """This method serving `target` tokens instead of `serving_length`, as its own definition extends it: a
        model that ships Llama 3 scaling with factor 4 to serve 4x its pre-training length serves 16x of it at
        factor 16 (transformers 5.x `_compute_llama3_parameters`, `_compute_yarn_parameters` and
        `_compute_linear_scaling_rope_parameters` read `factor` as served / original), so the factor becomes
        `factor * target / serving_span`. Dynamic NTK's rule and LongRoPE's factors hold at any length as they are.
        The starting point a search of a scaled model begins from, and compare's row for it."""
        update: dict[str, Any] = {} if self.max_position_is_pretrained else {"max_position_embeddings": target}
        if self.factor_follows_length:
            update["factor"] = self.factor * target / self.serving_span
        return type(self).model_validate({**dict(self), **update})

    @classmethod
    def nominal(cls, shape: RotaryShape, *, original: int, target: int, scale: float) -> RopeMethod:
        """The method at its authors' setting for a model trained at `original` tokens read at `target`, with
        `scale` as its factor (target / original, unless a tuning grid tries another); plain RoPE: unchanged."""
        return cls(max_position_embeddings=target, **shape)

    @classmethod
    def carries_original_length(cls) -> bool:
        """Whether its rope_parameters block holds `original_max_position_embeddings` (YaRN, LongRoPE, Llama 3 in
        transformers): a model config's top-level value of it then belongs in the block (Phi-3 keeps it there)."""
        return "original_max_position_embeddings" in cls.model_fields

    @property
    def rotary_shape(self) -> RotaryShape:
        return RotaryShape(
            head_dim=self.head_dim, rope_theta=self.rope_theta, partial_rotary_factor=self.partial_rotary_factor
        )

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


def registry(*classes: type[RopeMethod]) -> dict[str, type[RopeMethod]]:
    """{rope_type: class}, in the order given. A class that shares another's rope_type or baseline name (a subclass
    that forgot to state its own inherits its parent's) is refused when the package is imported."""
    for attribute in ("rope_type", "baseline"):
        names = [getattr(cls, attribute) for cls in classes if getattr(cls, attribute) is not None]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise TypeError(f"ROPE_METHODS: two methods share the {attribute} {repeated[0]!r}")
    return {cls.rope_type: cls for cls in classes}
