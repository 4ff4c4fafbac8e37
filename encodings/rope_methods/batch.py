"""Several candidates' RoPE at once: one row of frequencies, attention factor and n_hat per candidate.

The scorer runs B candidates in one forward pass over B copies of a window (workers/rope_patch.py), so the
cos/sin tables carry a leading candidate dimension (`rotary.rotary_cos_sin`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from longrope.encodings.errors import EncodingConfigError
from longrope.encodings.lazy_import import torch
from longrope.encodings.rope_methods.base import RopeMethod
from longrope.encodings.rotary import Layout, rotary_cos_sin


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
