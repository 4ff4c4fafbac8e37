"""Replacing a transformers model's rotary module with one driven by the encoding suite.

The replacement takes one row of frequencies per batch row, so B candidates score in one forward pass over B
copies of a window; it multiplies cos and sin by each candidate's attention factor (as transformers does) and
keeps the original frequencies for positions below a candidate's `n_hat`. Replacing the module, rather than
overwriting `inv_freq`, is what sticks for every rope_type: transformers rewrites `inv_freq` on each forward
for `longrope` and `dynamic` models.

The family (workers/families.py) says where the module is (`model.model.rotary_emb`, GPT-NeoX's
`model.gpt_neox.rotary_emb`), how cos and sin are laid out (Llama's halves, Cohere's interleaved pairs), and for a
module serving several layer types (Gemma 3's local and global layers) which type's RoPE the candidates replace;
the other types are passed to the model's own module, unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from longrope.encodings import LongRope, RopeMethod, rotary_cos_sin
from longrope.encodings.rope_methods import candidate_rows, longrope_inv_freq
from longrope.workers.families import model_family


class CandidateRotaryEmbedding(nn.Module):
    """Drop-in for the decoder's `rotary_emb`: `forward(x, position_ids[, layer_type]) -> (cos, sin)`, one row per
    candidate, in the family's `layout`. With `searched_layer_type`, a call for another layer type is answered by
    `own` (the model's module: a local layer keeps its window's base and scaling)."""

    def __init__(
        self,
        original_inv_freq: torch.Tensor,
        layout: str = "rotate_half",
        searched_layer_type: str | None = None,
        own: nn.Module | None = None,
    ):
        super().__init__()
        self.layout = layout
        self.searched_layer_type = searched_layer_type
        self.own = own
        self.register_buffer("original_inv_freq", original_inv_freq.float().clone(), persistent=False)
        self.register_buffer("inv_freq", original_inv_freq.float()[None].clone(), persistent=False)
        self.attention_factor = torch.ones(1)
        self.n_hat = torch.zeros(1, dtype=torch.long)

    def set_candidates(self, methods: Sequence[RopeMethod], seq_len: int, rows_each: int = 1) -> None:
        """Frequencies in force for a `seq_len`-token forward: `rows_each` consecutive batch rows per method."""
        device = self.original_inv_freq.device
        rows = candidate_rows(methods, seq_len)
        self.inv_freq = rows.inv_freq.repeat_interleave(rows_each, dim=0).to(device)
        self.attention_factor = rows.attention_factor.repeat_interleave(rows_each).to(device)
        self.n_hat = rows.n_hat.repeat_interleave(rows_each).to(device)

    def set_long_factors(self, method: LongRope, factors: torch.Tensor, attention_factor: torch.Tensor) -> None:
        """The long regime of `method` with its factors and attention factor given as tensors, one row per batch
        row (`factors` [rows, pairs], `attention_factor` [rows]), which may carry autograd: the gradient scorer's
        leaves. The frequencies come from the same function `LongRope.inv_freq` uses (`longrope_inv_freq`), so with
        the method's own values this sets exactly what `set_candidates` sets for it, n_hat 0 at every row."""
        device = self.original_inv_freq.device
        self.inv_freq = longrope_inv_freq(factors.to(device), method.rotary_dim, method.rope_theta)
        self.attention_factor = attention_factor.to(device)
        self.n_hat = torch.zeros(factors.shape[0], dtype=torch.long, device=device)

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """No `torch.no_grad` here: the tables carry autograd exactly when the rows set carry it (the gradient
        scorer's leaves); under the plain scorer's inference mode nothing is recorded either way."""
        if self.searched_layer_type is not None and layer_type != self.searched_layer_type:
            return self.own(x, position_ids, layer_type)
        rows = self.inv_freq.shape[0]
        position_ids = position_ids.to(self.inv_freq.device)  # the decoder makes them on the embedding's device
        if position_ids.shape[0] not in (1, rows):
            raise ValueError(f"batch of {position_ids.shape[0]} rows but {rows} candidates are set")
        cos, sin = rotary_cos_sin(
            self.inv_freq,
            position_ids,
            attention_factor=self.attention_factor,
            n_hat=self.n_hat,
            original_inv_freq=self.original_inv_freq,
            layout=self.layout,
        )
        return cos.to(x.dtype), sin.to(x.dtype)


def patch_rotary(model, original_inv_freq: torch.Tensor) -> tuple[CandidateRotaryEmbedding, nn.Module]:
    """Install a CandidateRotaryEmbedding; returns (it, the module it replaced)."""
    family = model_family(model)
    decoder = getattr(model, family.decoder)
    original = decoder.rotary_emb
    device = rotary_device(model, original)
    patched = CandidateRotaryEmbedding(
        original_inv_freq.to(device), family.layout, family.searched_layer_type, original
    )
    decoder.rotary_emb = patched
    return patched, original


def rotary_device(model, rotary: nn.Module) -> torch.device:
    """Where the model's rotary module computes: its frequencies' device. A model spread over GPUs has the module
    where accelerate's device map put it (`model.rotary_emb` in transformers' map); each layer's hook then moves
    cos/sin to that layer's device, tuples included (accelerate hooks.py `AlignDevicesHook.pre_forward` ->
    utils/operations.py `send_to_device`). On one device it is every parameter's device."""
    buffer = next(rotary.buffers(), None)
    return buffer.device if buffer is not None else next(model.parameters()).device


def restore_rotary(model, original: nn.Module) -> None:
    getattr(model, model_family(model).decoder).rotary_emb = original


@contextmanager
def patched_rotary(model, original_inv_freq: torch.Tensor) -> Iterator[CandidateRotaryEmbedding]:
    """The patch for the duration of a block; the model's own rotary module is back afterwards."""
    patched, original = patch_rotary(model, original_inv_freq)
    try:
        yield patched
    finally:
        restore_rotary(model, original)
