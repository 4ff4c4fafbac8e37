"""The list of every positional-encoding method the suite implements, for `longrope encodings list`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# how an encoding enters a decoder block: added to embeddings, rotating q/k, biasing the logits, or not at all
EncodingKind = Literal["additive", "rotary", "bias", "none"]


@dataclass(frozen=True)
class MethodInfo:
    name: str
    kind: EncodingKind
    hf_rope_type: str | None  # the transformers rope_type, where transformers has the method
    summary: str
    where: str  # the class or function that implements it, as module.name under longrope.encodings


METHODS: tuple[MethodInfo, ...] = (
    MethodInfo(
        "default",
        "rotary",
        "default",
        "plain RoPE (RoFormer), rotate-half or interleaved pairs",
        "rope_methods.base.RopeMethod",
    ),
    MethodInfo(
        "linear",
        "rotary",
        "linear",
        "Position Interpolation: every frequency / factor",
        "rope_methods.linear.LinearRope",
    ),
    MethodInfo(
        "ntk",
        "rotary",
        None,
        "NTK-aware static base change (exported as default + rope_theta)",
        "rope_methods.ntk.NtkRope",
    ),
    MethodInfo(
        "dynamic",
        "rotary",
        "dynamic",
        "Dynamic NTK: base grows with sequence length",
        "rope_methods.ntk.DynamicNtkRope",
    ),
    MethodInfo(
        "yarn", "rotary", "yarn", "YaRN: ramped interpolation + attention temperature", "rope_methods.yarn.YarnRope"
    ),
    MethodInfo(
        "longrope",
        "rotary",
        "longrope",
        "LongRoPE: searched per-pair factors (short/long), n_hat",
        "rope_methods.longrope.LongRope",
    ),
    MethodInfo("llama3", "rotary", "llama3", "Llama 3.1 wavelength-band scaling", "rope_methods.llama3.Llama3Rope"),
    MethodInfo(
        "mrope",
        "rotary",
        "default",
        "M-RoPE (Qwen2-VL sections / Qwen3-VL interleaved), t/h/w axes",
        "multi_axis.MRopeEncoding",
    ),
    MethodInfo(
        "axial_2d",
        "rotary",
        None,
        "2D axial RoPE for image patches (Qwen2-VL vision layout)",
        "multi_axis.Axial2DRopeEncoding",
    ),
    MethodInfo(
        "sinusoidal",
        "additive",
        None,
        "fixed sin/cos added to embeddings (Vaswani et al.)",
        "absolute.SinusoidalEncoding",
    ),
    MethodInfo(
        "learned",
        "additive",
        None,
        "learned absolute table (GPT-2 wpe); errors past its length",
        "absolute.LearnedAbsoluteEncoding",
    ),
    MethodInfo("alibi", "bias", None, "ALiBi linear distance bias, causal or symmetric", "alibi.ALiBiEncoding"),
    MethodInfo("cope", "bias", None, "CoPE contextual (gated, fractional) positions", "cope.CoPEEncoding"),
    MethodInfo("nope", "none", None, "no positional encoding; the causal mask alone", "interface.NoPE"),
)
