"""RoPE over several position axes: 2D axial RoPE for image patches and M-RoPE for multimodal decoders.

Both split the rotary pairs between axes and rotate each pair by its own axis' position. For text tokens
M-RoPE's three axes carry the same position, so it reduces exactly to 1D RoPE (a property the tests check).
Layouts are rotate-half, as in transformers' Qwen2-VL / Qwen3-VL modules these follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from longrope.encodings.errors import EncodingConfigError
from longrope.encodings.interface import EncodingKind, PositionalEncoding
from longrope.encodings.rope_methods import RopeMethod
from longrope.encodings.rotary import apply_rotary


def mrope_pair_axes(mrope_section: Sequence[int], *, interleaved: bool = False) -> torch.Tensor:
    """Axis index (0 = t, 1 = h, 2 = w) of each rotary pair.

    Qwen2-VL (`interleaved=False`): consecutive chunks of `mrope_section` sizes, chunk k from axis k mod 3.
    Qwen3-VL (`interleaved=True`): pair k is h if k mod 3 == 1 and k < 3 * section[1], w if k mod 3 == 2 and
    k < 3 * section[2], else t.
    """
    if len(mrope_section) != 3 or any(size < 0 for size in mrope_section):
        raise EncodingConfigError(f"mrope_section: expected three non-negative sizes, got {list(mrope_section)}")
    pairs = sum(mrope_section)
    if not interleaved:
        chunks = [torch.full((size,), k % 3) for k, size in enumerate(mrope_section)]
        return torch.cat(chunks).long()
    axes = torch.zeros(pairs, dtype=torch.long)
    for axis in (1, 2):
        axes[axis : 3 * mrope_section[axis] : 3] = axis
    return axes


def mrope_cos_sin(
    inv_freq: torch.Tensor,
    position_ids: torch.Tensor,
    mrope_section: Sequence[int],
    *,
    attention_factor: float = 1.0,
    interleaved: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B, T, d] for `position_ids` [3, B, T] (t, h, w); `inv_freq` [d/2] with d/2 == sum(sections)."""
    if sum(mrope_section) != inv_freq.shape[-1]:
        raise EncodingConfigError(
            f"mrope_section: sizes {list(mrope_section)} sum to {sum(mrope_section)}, "
            f"but the rotary dim has {inv_freq.shape[-1]} pairs"
        )
    if position_ids.ndim != 3 or position_ids.shape[0] != 3:
        raise EncodingConfigError(f"position_ids: expected shape [3, B, T], got {tuple(position_ids.shape)}")
    freqs = position_ids[..., None].float() * inv_freq.float()  # [3, B, T, d/2]
    axes = mrope_pair_axes(mrope_section, interleaved=interleaved).to(freqs.device)
    chosen = freqs.gather(0, axes.expand(freqs.shape[1:])[None]).squeeze(0)  # [B, T, d/2]
    emb = torch.cat((chosen, chosen), dim=-1)
    return emb.cos() * attention_factor, emb.sin() * attention_factor


def axial_2d_inv_freq(head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """Frequencies shared by the row and column axes: `theta ** (-2k / (head_dim/2))`, k < head_dim/4."""
    if head_dim % 4:
        raise EncodingConfigError(f"head_dim: 2D axial RoPE needs a multiple of 4, got {head_dim}")
    spatial_dim = head_dim // 2
    return 1.0 / (theta ** (torch.arange(0, spatial_dim, 2, dtype=torch.float32) / spatial_dim))


def axial_2d_cos_sin(
    position_ids: torch.Tensor, head_dim: int, theta: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [N, head_dim] for patch positions [2, N] (row, column), Qwen2-VL vision layout:
    the first quarter of the dims rotate by row, the second by column, and the second half repeats that."""
    freqs = position_ids[..., None].float() * axial_2d_inv_freq(head_dim, theta)  # [2, N, d/4]
    rows_cols = torch.cat((freqs[0], freqs[1]), dim=-1)
    emb = torch.cat((rows_cols, rows_cols), dim=-1)
    return emb.cos(), emb.sin()


class MRopeEncoding(PositionalEncoding):
    """M-RoPE over a RoPE method's frequencies; `rotate` takes positions [3, B, T]."""

    kind: ClassVar[EncodingKind] = "rotary"
    name: ClassVar[str] = "mrope"
    summary: ClassVar[str] = "M-RoPE (Qwen2-VL sections / Qwen3-VL interleaved), t/h/w axes"
    hf_rope_type: ClassVar[str | None] = "default"

    def __init__(self, method: RopeMethod, mrope_section: Sequence[int], *, interleaved: bool = False):
        super().__init__()
        mrope_pair_axes(mrope_section, interleaved=interleaved)
        self.method, self.mrope_section, self.interleaved = method, list(mrope_section), interleaved

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = mrope_cos_sin(
            self.method.inv_freq(int(positions.max()) + 1),
            positions,
            self.mrope_section,
            attention_factor=self.method.attention_factor,
            interleaved=self.interleaved,
        )
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


class Axial2DRopeEncoding(PositionalEncoding):
    """2D axial RoPE for image patches; `rotate` takes positions [2, N] (row, column) for one image."""

    kind: ClassVar[EncodingKind] = "rotary"
    name: ClassVar[str] = "axial_2d"
    summary: ClassVar[str] = "2D axial RoPE for image patches (Qwen2-VL vision layout)"

    def __init__(self, head_dim: int, theta: float = 10000.0):
        super().__init__()
        axial_2d_inv_freq(head_dim, theta)
        self.head_dim, self.theta = head_dim, theta

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = axial_2d_cos_sin(positions, self.head_dim, self.theta)
        return apply_rotary(q, cos[None], sin[None]), apply_rotary(k, cos[None], sin[None])
