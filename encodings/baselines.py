"""The closed-form context-extension methods at their nominal settings, for one scale `s = target / original`.

These are the methods a LongRoPE search is measured against (and seeded by), each as its authors or
transformers set it for a model trained at `original` tokens and read at `target`:
- none: plain RoPE, unchanged (what the model was trained with);
- pi: Position Interpolation, every frequency / s (Chen et al. 2023, arXiv 2306.15595);
- ntk: NTK-aware base change `theta * s^(d/(d-2))` (bloc97, reddit r/LocalLLaMA 2023);
- dynamic: Dynamic NTK with factor s, frequencies unchanged up to `original` (transformers `dynamic`);
- yarn: YaRN with factor s and its defaults beta_fast 32, beta_slow 1 (Peng et al. 2023, arXiv 2309.00071);
- llama3: Llama 3.1's bands, low_freq_factor 1, high_freq_factor 4 (Meta's release config).
"""

from __future__ import annotations

from longrope.encodings.rope_methods import (
    DynamicNtkRope,
    LinearRope,
    Llama3Rope,
    NtkRope,
    RopeMethod,
    YarnRope,
)


def baseline_methods(
    *, head_dim: int, rope_theta: float, partial_rotary_factor: float, original: int, target: int
) -> dict[str, RopeMethod]:
    """{name: method} for reading a model trained at `original` tokens at `target` tokens."""
    shape = {"head_dim": head_dim, "rope_theta": rope_theta, "partial_rotary_factor": partial_rotary_factor}
    s = target / original
    return {
        "none": RopeMethod(max_position_embeddings=target, **shape),
        "pi": LinearRope(max_position_embeddings=target, factor=s, **shape),
        "ntk": NtkRope(max_position_embeddings=target, factor=s, **shape),
        "dynamic": DynamicNtkRope(max_position_embeddings=original, factor=s, **shape),
        "yarn": YarnRope(max_position_embeddings=target, factor=s, original_max_position_embeddings=original, **shape),
        "llama3": Llama3Rope(
            max_position_embeddings=target,
            factor=s,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=original,
            **shape,
        ),
    }
