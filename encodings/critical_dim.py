"""LongRoPE2's critical dimension: the rotary pair past which RoPE never saw a full period in pre-training.

Pair i (0 = highest frequency) of a rotary embedding with base theta over d rotated dims turns at
`theta^(-2i/d)` radians per token, so its period is `T_i = 2pi * theta^(2i/d)` tokens. A pair whose period is
at least the pre-training length L0 never completed a rotation during training, so its low-frequency end is
what a context extension has to rescale (LongRoPE2, arXiv 2502.20082, section 3; official code:
microsoft/LongRoPE `evolution/search.py`):

    d_cd = ceil(log_theta(L0 / 2pi) * d/2) - 1,  clipped to [0, d/2].

Relation to the periods: with x = log_theta(L0 / 2pi) * d/2, T_i >= L0 exactly when i >= x, so ceil(x) is the
first pair whose period reaches L0 and d_cd is the pair just before it, the last one whose period is below L0
(it is the critical pair the search anchors on; every pair from it upwards is searched).
Example: theta 5e5, L0 8192, d 128 gives x = 34.98, d_cd = 34 (Llama-3-8B; the official script overrides 33).
"""

from __future__ import annotations

import math

from longrope.encodings.errors import EncodingConfigError


def critical_dim(rope_theta: float, rotary_dim: int, original_length: int) -> int:
    """The critical pair index `ceil(log_theta(L0 / 2pi) * d/2) - 1`, clipped to [0, d/2] (LongRoPE2).

    rotary_dim is d, the rotated dims per head (head_dim x partial_rotary_factor), so there are d/2 pairs.
    d/2 (no pair searched) comes out only when every pair's period is below L0."""
    _check(rope_theta, rotary_dim, original_length)
    x = math.log(original_length / (2.0 * math.pi)) / math.log(rope_theta) * (rotary_dim / 2)
    return min(max(math.ceil(x) - 1, 0), rotary_dim // 2)


def pair_periods(rope_theta: float, rotary_dim: int) -> list[float]:
    """Each pair's period in tokens, `2pi * theta^(2i/d)` for i = 0 .. d/2 - 1: what justifies `critical_dim`."""
    _check(rope_theta, rotary_dim, 2)
    return [2.0 * math.pi * rope_theta ** (2.0 * i / rotary_dim) for i in range(rotary_dim // 2)]


def _check(rope_theta: float, rotary_dim: int, original_length: int) -> None:
    if not (math.isfinite(rope_theta) and rope_theta > 1):
        raise EncodingConfigError(f"rope_theta: must be a finite number > 1, got {rope_theta}")
    if rotary_dim < 2 or rotary_dim % 2:
        raise EncodingConfigError(f"rotary_dim: must be an even integer >= 2, got {rotary_dim}")
    if original_length < 2:
        raise EncodingConfigError(f"original_length: must be >= 2 tokens, got {original_length}")
