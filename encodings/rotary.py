"""Rotary position embedding primitives shared by every RoPE variant.

All RoPE variants differ only in the frequencies (`inv_freq`, one per rotary pair) and in the scalar
`attention_factor` that multiplies cos and sin. This module holds what they share: the plain frequencies, the
cos/sin tables (with a leading candidate dimension so one forward pass can score several candidates), and the
rotation itself in both pairing conventions.

Conventions: pair i runs from the highest frequency (i = 0) to the lowest. A pair (a, c) at angle phi becomes
`(a cos phi - c sin phi, c cos phi + a sin phi)` (a complex multiplication, RoFormer, arXiv 2104.09864), so
`<R(p) q, R(p') k>` depends only on p - p'. The two layouts share the frequencies and differ in which dims pair:
- "rotate_half" (GPT-NeoX, transformers' Llama `rotate_half` / `apply_rotary_pos_emb` in
  models/llama/modeling_llama.py, vLLM's `rotate_neox`) pairs dims (i, i + d/2); cos/sin hold the d/2 angles
  written twice, [phi_0 .. phi_{d/2-1}, phi_0 .. phi_{d/2-1}];
- "interleaved" (GPT-J's `rotate_every_two`, Meta's original meta-llama/llama `llama/model.py`
  `precompute_freqs_cis` / `apply_rotary_emb`, vLLM's `is_neox_style=False`) pairs dims (2i, 2i + 1); cos/sin
  hold each angle twice side by side, [phi_0, phi_0, phi_1, phi_1, ...].
They are not interchangeable at run time without permuting the q/k projection rows
(`interleaved_to_rotate_half_permutation`).
"""

from __future__ import annotations

from typing import Literal

from longrope.encodings.errors import EncodingConfigError
from longrope.encodings.lazy_import import torch

Layout = Literal["rotate_half", "interleaved"]
LAYOUTS: tuple[Layout, ...] = ("rotate_half", "interleaved")


def rotary_dim_for(head_dim: int, partial_rotary_factor: float = 1.0) -> int:
    """Number of rotated dims per head; HF and vLLM both truncate `head_dim * partial_rotary_factor`."""
    dim = int(head_dim * partial_rotary_factor)
    if (dim < 2 or dim % 2) and partial_rotary_factor == 1.0:
        raise EncodingConfigError(f"head_dim: must be even and at least 2, got {head_dim}")
    if dim < 2 or dim % 2:
        raise EncodingConfigError(
            f"partial_rotary_factor: head_dim {head_dim} x {partial_rotary_factor} gives rotary dim {dim}; "
            "it must be even and at least 2"
        )
    return dim


def default_inv_freq(rotary_dim: int, theta: float) -> torch.Tensor:
    """`theta ** (-2i / rotary_dim)` in float32, computed exactly as transformers does (bit-for-bit)."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(dtype=torch.float32) / rotary_dim
    return 1.0 / (theta**exponents)


def _as_rows(value: torch.Tensor | float | int, batch: int, dtype: torch.dtype) -> torch.Tensor:
    """Broadcast a per-candidate scalar (or a length-B vector) to shape [B]."""
    tensor = torch.as_tensor(value, dtype=dtype)
    if tensor.ndim == 0:
        return tensor.expand(batch)
    if tensor.shape != (batch,):
        raise EncodingConfigError(f"expected a scalar or {batch} per-candidate values, got shape {tuple(tensor.shape)}")
    return tensor


def rotary_cos_sin(
    inv_freq: torch.Tensor,
    positions: torch.Tensor,
    *,
    attention_factor: torch.Tensor | float = 1.0,
    n_hat: torch.Tensor | int = 0,
    original_inv_freq: torch.Tensor | None = None,
    layout: Layout = "rotate_half",
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape [B, T, rotary_dim], one row block per candidate.

    `inv_freq` is [d/2] or [B, d/2]; `positions` is [T] or [B, T]; `attention_factor` and `n_hat` are scalars
    or [B]. Positions below a candidate's `n_hat` keep the original frequencies and an attention factor of 1,
    as the LongRoPE release does (its mixed embedding copies the un-scaled cos/sin of the first n_hat tokens).
    Everything is computed in float32, as transformers does, whatever the model's dtype; a float64 `inv_freq`
    (a finite-difference check of the gradient) keeps float64 throughout.

    Differentiable in `inv_freq` and `attention_factor`: the gradient scorer passes tensors that carry autograd
    (one row per batch row) and gets d cos/sin by the same operations the no-grad path runs.
    """
    dtype = torch.promote_types(inv_freq.dtype, torch.float32)
    inv_freq = inv_freq.to(dtype)
    if inv_freq.ndim == 1:
        inv_freq = inv_freq[None]
    batch = inv_freq.shape[0]
    if positions.ndim == 1:
        positions = positions[None]
    positions = positions.to(device=inv_freq.device, dtype=dtype)
    freqs = positions[..., None] * inv_freq[:, None, :]  # [B, T, d/2]
    scale = _as_rows(attention_factor, batch, dtype).to(inv_freq.device)[:, None].expand(freqs.shape[:2])
    n_hat_rows = _as_rows(n_hat, batch, torch.int64).to(inv_freq.device)
    if bool((n_hat_rows > 0).any()):
        if original_inv_freq is None:
            raise EncodingConfigError("n_hat: positions below n_hat need original_inv_freq, which was not given")
        keep_original = positions < n_hat_rows[:, None]  # [B, T]
        original = positions[..., None] * original_inv_freq.to(inv_freq)[None, None, :]
        freqs = torch.where(keep_original[..., None], original, freqs)
        scale = torch.where(keep_original, torch.ones_like(scale), scale)
    if layout == "rotate_half":
        emb = torch.cat((freqs, freqs), dim=-1)
    elif layout == "interleaved":
        emb = torch.repeat_interleave(freqs, 2, dim=-1)
    else:
        raise EncodingConfigError(f"layout: unknown value {layout!r}; expected one of {LAYOUTS}")
    return emb.cos() * scale[..., None], emb.sin() * scale[..., None]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last dim: the partner of dim i is dim i + d/2."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    """(a, c) -> (-c, a) for each adjacent pair (2i, 2i+1)."""
    evens, odds = x[..., 0::2], x[..., 1::2]
    return torch.stack((-odds, evens), dim=-1).flatten(-2)


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: Layout = "rotate_half",
    head_axis: int | None = 1,
) -> torch.Tensor:
    """Rotate the first `cos.shape[-1]` dims of `x`; the rest (partial rotary) pass through unchanged.

    `x` is [B, H, T, head_dim] (heads at `head_axis`; None when x has no head axis) and cos/sin are [B, T, d].
    """
    if head_axis is not None:
        cos, sin = cos.unsqueeze(head_axis), sin.unsqueeze(head_axis)
    cos, sin = cos.to(device=x.device, dtype=x.dtype), sin.to(device=x.device, dtype=x.dtype)
    rot_dim = cos.shape[-1]
    x_rot, x_pass = x[..., :rot_dim], x[..., rot_dim:]
    rotate = rotate_half if layout == "rotate_half" else rotate_interleaved
    rotated = x_rot * cos + rotate(x_rot) * sin
    return torch.cat((rotated, x_pass), dim=-1) if x_pass.shape[-1] else rotated


def interleaved_to_rotate_half_permutation(rotary_dim: int) -> torch.Tensor:
    """Index list `perm` with interleaved-RoPE(x) == rotate-half-RoPE(x[perm]) up to the same permutation:
    `perm = [0, 2, 4, ..., d-2, 1, 3, ..., d-1]`.

    Permuting the rows of a q/k projection by `perm` (per head) turns a Meta-layout checkpoint into an HF one,
    which is what transformers' Llama converter does once on the weights (`permute` in
    models/llama/convert_llama_weights_to_hf.py: the per-head view (n_heads, d/2, 2, in) transposed to
    (n_heads, 2, d/2, in), applied to wq and wk, not wv).
    """
    return torch.cat((torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2)))
