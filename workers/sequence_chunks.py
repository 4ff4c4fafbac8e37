"""The position-wise MLP of every decoder layer run a chunk of positions at a time, so a long window's activation
memory is O(T x hidden) and not O(T x intermediate).

A layer's MLP (gated or not, dense or mixture-of-experts) maps each position's hidden state on its own: splitting
the sequence into chunks and concatenating the outputs is the same function. Unchunked, its intermediates live at
once: for a Llama-3-8B at 1M tokens in bfloat16 the gate, up and activation tensors are 3 x 2^20 x 14336 x 2 bytes
= 84 GiB, more than the model's whole forward needs elsewhere; in chunks of 16k tokens they are 1.3 GiB. Attention
is not chunked here (SDPA and flash attention already keep it O(T)), nor are the norms (O(T x hidden), like the
residual stream itself); the lm_head and the loss are chunked by the scorer's `chunked_loss`.

In a gradient pass each chunk is checkpointed (`torch.utils.checkpoint`, non-reentrant): the backward recomputes one
chunk's intermediates at a time, so the chunking holds in the backward too. Every decoder in transformers 5.x calls
`self.mlp(hidden_states)` with a [batch, positions, hidden] tensor and gets one back
(models/<family>/modeling_<family>.py, the MoE blocks of Mixtral and Qwen included), which the wrapper relies on and
checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils.checkpoint import checkpoint

from longrope.workers.families import decoder_of

# Positions x batch rows per MLP chunk: large enough that each chunk's matmuls fill a GPU (16k x 4096 x 14336 is
# 1.9 TFLOP), small enough that its intermediates are a small share of the forward's memory.
DEFAULT_MLP_CHUNK_TOKENS = 16384


@contextmanager
def chunked_mlps(model, chunk_tokens: int | None) -> Iterator[None]:
    """Every decoder layer's `mlp` runs `chunk_tokens` tokens (positions x batch rows) at a time for the block
    (None: unchunked); each layer's instance `forward` is wrapped and restored after, as the scorer wraps layers."""
    mlps = [layer.mlp for layer in decoder_of(model).layers if isinstance(getattr(layer, "mlp", None), torch.nn.Module)]
    if chunk_tokens is None or not mlps:
        yield
        return
    with wrapped_forwards(mlps, lambda forward: _chunked(forward, chunk_tokens)):
        yield


@contextmanager
def wrapped_forwards(modules, wrap) -> Iterator[None]:
    """Each module's instance `forward` replaced by `wrap(forward)` for the block, and put back after (an instance
    forward set before, such as accelerate's device hook, is the one wrapped and the one restored): how the scorer
    changes a loaded model's layers for a call without touching its class or other instances."""
    modules = list(modules)
    saved = [module.__dict__.get("forward") for module in modules]
    for module in modules:
        module.forward = wrap(module.forward)
    try:
        yield
    finally:
        for module, previous in zip(modules, saved, strict=True):
            del module.forward
            if previous is not None:
                module.forward = previous


def _chunked(forward, chunk_tokens: int):
    def run(hidden: torch.Tensor) -> torch.Tensor:
        rows, positions = hidden.shape[0], hidden.shape[1]
        step = max(1, chunk_tokens // rows)
        if positions <= step:
            return forward(hidden)
        recompute = torch.is_grad_enabled() and hidden.requires_grad
        outputs = []
        for start in range(0, positions, step):
            chunk = hidden[:, start : start + step].contiguous()  # several rows: a slice is strided (MoE blocks .view)
            out = checkpoint(forward, chunk, use_reentrant=False) if recompute else forward(chunk)
            if not isinstance(out, torch.Tensor) or out.shape[:2] != chunk.shape[:2]:
                raise TypeError(f"a chunked MLP must map [batch, positions, hidden] to the same, got {type(out)}")
            outputs.append(out)
        return torch.cat(outputs, dim=1)

    return run
