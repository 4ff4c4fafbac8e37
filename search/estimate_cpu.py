"""This machine's CPU rates for `longrope estimate --gpu cpu`, measured at the model's own shapes (imports torch).

A CPU has no datasheet rate to multiply by an MFU: its GEMM rate depends on the matrix shapes (a d 128 model's
[T, 128] x [128, 384] runs far below a 2048 x 2048 matmul), causal SDPA runs at its own rate, and the norms, RoPE
and activations are bound by memory bandwidth. So each kind of work is timed once here, on random tensors of
the scoring forward's shapes, and `estimate.seconds` adds FLOPs / rate per kind plus elementwise bytes /
bandwidth. Nothing is fitted to the scorer's measured time: the only inputs are these micro-benchmarks and the
FLOP and byte counts of `estimate.py` (bench/estimate_accuracy.py compares the result with real scoring).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from longrope.search.estimate import (
    LOSS_CHUNK_TOKENS,
    Architecture,
    ForwardShape,
    Rates,
    attention_fraction,
    linear_weights_per_layer,
)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of `fn` over `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _dtype(name: str):
    import torch

    return getattr(torch, name)


def linear_rate(arch: Architecture, shape: ForwardShape, dtype: str, repeats: int) -> float:
    """FLOP/s of one layer's seven projections (q, k, v, o, gate, up, down) on R T rows."""
    import torch
    import torch.nn.functional as F

    kind, d, rows = _dtype(dtype), arch.hidden_size, shape.rows * shape.tokens
    q_out, kv_out, width = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim, arch.intermediate_size
    x = torch.randn(rows, d, dtype=kind)
    weights = {name: torch.randn(out, d, dtype=kind) * 0.02 for name, out in (("q", q_out), ("kv", kv_out))}
    weights |= {"o": torch.randn(d, q_out, dtype=kind) * 0.02, "up": torch.randn(width, d, dtype=kind) * 0.02}
    weights["down"] = torch.randn(d, width, dtype=kind) * 0.02

    @torch.inference_mode()
    def layer() -> None:
        q = F.linear(x, weights["q"])
        F.linear(x, weights["kv"]), F.linear(x, weights["kv"])
        F.linear(q, weights["o"])
        F.linear(x, weights["up"])  # the gate
        F.linear(F.linear(x, weights["up"]), weights["down"])  # up, then down (SiLU and * are memory-bound)

    return 2.0 * rows * linear_weights_per_layer(arch) / median_seconds(layer, repeats)


def attention_rate(arch: Architecture, shape: ForwardShape, dtype: str, causal: float, repeats: int) -> float:
    """FLOP/s of one layer's attention (SDPA with is_causal, or eager's matmul-softmax-matmul when causal = 1),
    keys and values repeated to the query heads as transformers' repeat_kv does."""
    import torch
    import torch.nn.functional as F

    kind = _dtype(dtype)
    q, k, v = (torch.randn(shape.rows, arch.num_heads, shape.tokens, arch.head_dim, dtype=kind) for _ in range(3))

    @torch.inference_mode()
    def attend() -> None:
        if causal < 1:
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = torch.matmul(q, k.transpose(2, 3)) * arch.head_dim**-0.5
            torch.softmax(scores, dim=-1, dtype=torch.float32).to(kind) @ v

    flops = 4.0 * shape.rows * arch.num_heads * arch.head_dim * shape.tokens**2 * causal
    return flops / median_seconds(attend, repeats)


def lm_head_rate(arch: Architecture, dtype: str, repeats: int) -> float:
    """FLOP/s of one loss chunk: the lm_head matmul and the float32 cross-entropy (workers/scorer.py)."""
    import torch
    import torch.nn.functional as F

    kind = _dtype(dtype)
    hidden = torch.randn(LOSS_CHUNK_TOKENS, arch.hidden_size, dtype=kind)
    weight = torch.randn(arch.vocab_size, arch.hidden_size, dtype=kind) * 0.02
    targets = torch.randint(0, arch.vocab_size, (LOSS_CHUNK_TOKENS,))

    @torch.inference_mode()
    def chunk() -> None:
        F.cross_entropy(F.linear(hidden, weight).float(), targets, reduction="none").double().sum()

    return 2.0 * LOSS_CHUNK_TOKENS * arch.hidden_size * arch.vocab_size / median_seconds(chunk, repeats)


def _dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def memory_rate(elements: int, dtype: str, repeats: int) -> float:
    """Bytes/s of an elementwise product of two tensors of `elements` values (two read, one written), the
    access pattern of the norms, RoPE and activations, at the size of the forward's activations."""
    import torch

    kind = _dtype(dtype)
    a, b = torch.randn(elements, dtype=kind), torch.randn(elements, dtype=kind)
    return 3.0 * elements * _dtype_bytes(dtype) / median_seconds(lambda: a * b, repeats)


def square_matmul_rate(repeats: int) -> float:
    """FLOP/s of a 2048 x 2048 float32 matmul: the machine's headline rate (bench/scoring.py's yardstick)."""
    import torch

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    return 2.0 * 2048**3 / median_seconds(lambda: a @ b, repeats)


def measure_cpu_rates(
    arch: Architecture, shape: ForwardShape, dtype: str, attn_implementation: str = "sdpa", repeats: int = 3
) -> Rates:
    """Every rate `estimate.seconds` needs, timed on this CPU with torch's current thread count."""
    import torch

    causal = attention_fraction(attn_implementation)
    return Rates(
        source=f"this CPU, measured ({torch.get_num_threads()} torch threads, {dtype}, at the model's shapes)",
        linear=linear_rate(arch, shape, dtype, repeats),
        attention=attention_rate(arch, shape, dtype, causal, repeats),
        lm_head=lm_head_rate(arch, dtype, repeats),
        memory=memory_rate(shape.rows * shape.tokens * arch.hidden_size, dtype, repeats),
        square_matmul=square_matmul_rate(repeats),
    )
