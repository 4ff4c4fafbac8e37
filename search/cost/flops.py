"""FLOPs of a decoder forward and backward, and the bytes its elementwise work moves.

FLOPs count multiply-adds as 2 (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Table 1:
forward C = 2N + 2 n_layer n_ctx d_attn per token, with N the non-embedding parameters and the attention term
the causal average over the context; PaLM, Chowdhery et al. 2022, appendix B: 6N + 12 L H Q T per token for
training, the forward being a third, 2N + 4 L H Q T, with the full T x T attention). Here, per forward of T tokens:

    linear    = 2 T L (d H Q + 2 d K Q + H Q d + 3 d I)           (q, k, v, o and the gated MLP's 3 matrices)
    attention = 4 L H Q T^2 f                                     (Q K^T and A V; f = 1/2 causal, 1 eager)
    local     = 4 L_w H Q T min(T f, B + W - 1)                     (L_w windowed layers: each query block of B
                                                                   reads its own keys and the window's W)
    lm_head   = 2 T_loss d V                                      (the chunked loss; T_loss = predicted positions)

with d the hidden size, L layers, H query heads and K key/value heads of size Q, I the MLP width, V the
vocabulary. f = 1/2 is what SDPA (flash kernels, `is_causal=True`, no mask: what transformers passes on the CPU
and GPU here) and flash-attention execute, skipping the blocks above the diagonal (FlashAttention-2, Dao 2023,
counts causal attention FLOPs the same way); eager attention materialises and multiplies the whole T x T matrix
(f = 1, which is also what `torch.utils.flop_counter` counts for it). Norms, RoPE and activations are not
FLOPs here (they are memory-bound; `elementwise_bytes` counts their traffic for the CPU time model).
"""

from __future__ import annotations

from pydantic import computed_field

from longrope.search.cost.architecture import Architecture, Frozen, linear_weights_per_layer
from longrope.workers.families import QUERY_BLOCK

# The scorer's loss chunk (workers/specs.py ModelSpec.loss_chunk_tokens): copied, not imported, because the scorer
# imports torch (memory.py's TOKENS_PER_FORWARD likewise).
LOSS_CHUNK_TOKENS = 1024


class Flops(Frozen):
    """FLOPs of one sequence's forward, by kind (each kind runs at its own rate on a CPU). `attention` is the full
    layers' (SDPA's causal kernel), `local_attention` the windowed layers' (the scorer's blockwise attention,
    workers/local_attention.py: eager arithmetic in query blocks, a rate of its own)."""

    linear: float
    attention: float
    lm_head: float
    local_attention: float = 0.0

    @computed_field
    @property
    def total(self) -> float:
        return self.linear + self.attention + self.local_attention + self.lm_head

    def __mul__(self, times: float) -> Flops:
        return Flops(
            linear=self.linear * times,
            attention=self.attention * times,
            lm_head=self.lm_head * times,
            local_attention=self.local_attention * times,
        )


def attention_fraction(attn_implementation: str) -> float:
    """f: 1/2 for kernels that skip the masked half (SDPA with is_causal, flash-attention), 1 for eager."""
    return 1.0 if attn_implementation == "eager" else 0.5


def local_keys(arch: Architecture, tokens: int) -> float:
    """Keys a query of a windowed layer is scored against in the scorer's blockwise attention: a block of
    QUERY_BLOCK queries reads its own keys and the window's before it (workers/local_attention.py)."""
    if arch.local_window is None:
        return float(tokens)
    return float(min(tokens, QUERY_BLOCK + arch.local_window - 1))


def forward_flops(arch: Architecture, tokens: int, *, loss_tokens: int | None = None, causal: float = 0.5) -> Flops:
    """One sequence of `tokens` positions (module docstring's formulas); `loss_tokens` positions go through the
    lm_head (None: all of them)."""
    per_layer = 4.0 * arch.num_heads * arch.head_dim * tokens
    local = arch.local_layers * per_layer * min(tokens * causal, local_keys(arch, tokens))
    return Flops(
        linear=2.0 * tokens * arch.num_layers * linear_weights_per_layer(arch),
        attention=(arch.num_layers - arch.local_layers) * per_layer * tokens * causal,
        local_attention=local,
        lm_head=2.0 * (tokens if loss_tokens is None else loss_tokens) * arch.hidden_size * arch.vocab_size,
    )


def loss_tokens(objective: str, tokens: int, original_length: int, chunk: int = LOSS_CHUNK_TOKENS) -> int:
    """Positions whose loss chunk is computed: `chunked_loss` skips chunks with nothing to count, so `tail` pays
    for positions >= original_length (rounded out to chunks) and `needle` for the one chunk holding the answer."""
    if objective == "tail":
        return tokens - (min(original_length, tokens) // chunk) * chunk
    if objective == "needle":
        return min(tokens, chunk)
    return tokens


def elementwise_bytes(arch: Architecture, tokens: int, dtype_bytes: int) -> float:
    """Memory traffic of the non-matmul ops of forwards over `tokens` positions, counted from transformers' Llama
    layer: per token and layer two RMSNorms (pow, mean, 2 muls: 7 d values read or written each), two residual
    adds (3 d each), RoPE on q and k (mul, rotate_half's neg and cat, mul, add: 12 values per element), the
    attention output's transpose copy (2 H Q), SiLU (2 I) and the gate * up product (3 I); per token once a
    forward, the embedding lookup (2 d), the final RMSNorm (7 d) and the cos/sin tables (`forward_table_bytes`).
    A first-principles count, not fitted."""
    d, q_out, kv_out = arch.hidden_size, arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    width = arch.intermediate_size
    per_layer = 14 * d + 6 * d + 12 * (q_out + kv_out) + 2 * q_out + 5 * width
    per_forward = (2 * d + 7 * d) * dtype_bytes + forward_table_bytes(arch, dtype_bytes)
    return float(tokens * (arch.num_layers * per_layer * dtype_bytes + per_forward))


def forward_table_bytes(arch: Architecture, dtype_bytes: int) -> float:
    """Bytes per position of the cos/sin tables the rope patch builds once a forward (encodings.rotary_cos_sin, in
    float32): positions x inv_freq (Q/2 written), the cat (Q read, Q written), cos and sin (2 Q each), the two
    products with the attention factor (2 Q each) = 10.5 Q float32 values; then both cast to the model's dtype
    (Q read at 4 bytes and written at dtype bytes, each), which float32 skips."""
    head = arch.head_dim
    cast = 0 if dtype_bytes == 4 else 2 * head * (4 + dtype_bytes)
    return 10.5 * head * 4 + cast


def recompute_flops(arch: Architecture, forward: Flops, length: int) -> Flops:
    """The checkpointed forward run again in the backward, less each layer's down projection: non-reentrant
    torch.utils.checkpoint stops recomputing once every tensor the backward needs is back (its default
    early_stop), and a frozen linear layer's output is saved by nothing after the MLP's product, so down_proj is
    never rerun (2 T d I FLOPs a layer)."""
    down = 2.0 * length * arch.hidden_size * arch.intermediate_size * arch.num_layers
    return forward.model_copy(update={"linear": forward.linear - down})
