"""This machine's CPU rates for `longrope estimate --gpu cpu`, timed as a scoring forward runs (imports torch).

A CPU has no datasheet rate to multiply by an MFU: its GEMM rate depends on the matrix shapes (a d 128 model's
[T, 128] x [128, 384] runs far below a 2048 x 2048 matmul), causal SDPA runs at its own rate, the norms, RoPE and
activations are bound by memory traffic, and every forward pays a fixed cost (Python, module calls, op dispatch)
whatever its size. So each is timed here, and `hardware.seconds` adds FLOPs / rate per kind, elementwise bytes /
rate and forwards x the fixed cost. Nothing is fitted to the scorer's measured time: the only inputs are these
timings and the FLOP, byte and forward counts of `flops.py` and `memory.py` (bench/estimate_accuracy.py compares
the result with real scoring).

How they are timed is what makes the figure hold (one thread, thread CPU time, against the project's Scorer):
- The forward is replayed op for op as transformers' Llama runs it (`decoder_layer`: RMSNorm in float32, q/k/v
  as transposed views, RoPE with broadcast cos/sin and rotate_half's cat, SDPA with is_causal and enable_gqa, the
  output's transpose copy, SiLU x up, residual adds), through every layer with its own weights
  (`replayed_layers`), on random tensors of the forward's shape; a stopwatch splits each pass into linear,
  attention and elementwise time. Each kind timed alone (what this replaced) ran faster than inside the forward:
  a contiguous a * b reached 2-3x the bytes/s of the layer's broadcasts, casts and cats, and the matmuls lost
  their warm caches to the ops between them, which put the estimate at 0.84 of the demo's real time and 0.6 of
  one-window forwards; one layer replayed L times (its weights always in cache) still gave 0.80.
- The embedding, the candidates' cos/sin tables and the final norm run once a forward (`forward_inputs`), and
  one loss chunk runs through the scorer's own `chunked_loss`.
- A forward's fixed cost is the project's Scorer on the model at toy width (`forward_fixed_cost_seconds`),
  about 0.7 ms for the reference model's 4 layers here: 1% of the demo, but a third of a 32-token forward's.
- Torch runs with the worker's thread count (`memory.worker_threads`), not this process's: a demo worker has
  one thread (Ray sets OMP_NUM_THREADS to its num_cpus); this process's two threads, on this 2-core machine
  loaded by other jobs, timed the demo's projections at 6.8 GFLOP/s against one thread's 54.
- Each time is the least of its repeats: "the lowest value gives a lower bound for how fast your machine can
  run the given code snippet; higher values ... are typically ... caused by ... other processes interfering"
  (Python's timeit documentation, Timer.repeat).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from longrope.encodings import default_inv_freq, rotary_cos_sin
from longrope.search.cost.architecture import Architecture, linear_weights_per_layer
from longrope.search.cost.flops import LOSS_CHUNK_TOKENS, Flops, attention_fraction, elementwise_bytes, forward_flops
from longrope.search.cost.hardware import Rates
from longrope.search.cost.memory import DTYPE_BYTES, ForwardShape
from longrope.workers.errors import one_line
from longrope.workers.models import model_rope
from longrope.workers.timing import Clock, least_seconds

# the stopwatch's kinds: the four of the time model, and "outside" the layers (embedding, cos/sin, final norm)
STOPWATCH_KINDS = ("linear", "attention", "local_attention", "elementwise", "outside")
# Distinct layer weights the replay cycles through at most: more than a CPU's last-level cache (tens to a few hundred
# MiB of L3, lscpu), so a model too big to replay whole still meets its weights from memory.
REPLAY_WEIGHT_BYTES = 2**30
# Positions a replayed forward holds at most, and the first positions its attention runs on. The rates are per
# FLOP and per byte, and each kind reaches its steady rate at some length: here the projections' GEMMs and the
# elementwise ops settled from 32k positions (below it their tensors sit in the caches: bfloat16 projections ran
# 700-800 GFLOP/s at 4-8k positions against 540-570 from 16k to 128k, elementwise 40 against 4-5 GB/s), and causal
# SDPA from 8k (its kernel works in fixed query and key blocks: 150-190 GFLOP/s at 8k, 16k and 32k for SmolLM2's
# and Gemma 3's heads). So a longer job is timed on these many positions, and its own FLOP and byte counts are
# divided by those rates. The cut is what makes long targets affordable: attention is O(T^2), and replaying
# Gemma 3 270M's 64k positions ran over 40 minutes; bench/estimate_accuracy.py checks the figure past both.
REPLAY_POSITIONS = 32768
ATTENTION_POSITIONS = 8192
TOY_TOKENS = 8


class Stopwatch:
    """Splits one timed pass into kinds of work: `lap(kind)` charges the time since the previous lap to `kind`."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.spent = dict.fromkeys(STOPWATCH_KINDS, 0.0)
        self.last = clock()

    def restart(self) -> None:
        """Charge nothing for the time since the last lap (set-up that is not part of the forward)."""
        self.last = self.clock()

    def lap(self, kind: str) -> None:
        now = self.clock()
        self.spent[kind] += now - self.last
        self.last = now


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Torch's intra-op thread count set to `count` for the block, restored after."""
    import torch  # torch: only when measuring (`estimate` on a GPU needs none)

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _dtype(name: str):
    import torch  # torch: only when measuring (`estimate` on a GPU needs none)

    return getattr(torch, name)


def layer_weights(arch: Architecture, dtype: str) -> dict:
    """Random weights of one decoder layer (q, k, v, o, gate, up, down, two norms; biases where the model has them)."""
    import torch  # torch: only when measuring (`estimate` on a GPU needs none)

    kind, d, width = _dtype(dtype), arch.hidden_size, arch.intermediate_size
    q_out, kv_out = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    shapes = {"q": (q_out, d), "k": (kv_out, d), "v": (kv_out, d), "o": (d, q_out)}
    shapes |= {"gate": (width, d), "up": (width, d), "down": (d, width)}
    weights = {name: torch.randn(shape, dtype=kind) * 0.02 for name, shape in shapes.items()}
    for name in ("q", "k", "v") if arch.qkv_bias else ():
        weights[f"{name}_bias"] = torch.zeros(shapes[name][0], dtype=kind)
    if arch.o_bias:
        weights["o_bias"] = torch.zeros(d, dtype=kind)
    for name in ("gate", "up", "down") if arch.mlp_bias else ():
        weights[f"{name}_bias"] = torch.zeros(shapes[name][0], dtype=kind)
    weights["norm_1"], weights["norm_2"] = torch.ones(d, dtype=kind), torch.ones(d, dtype=kind)
    return weights


def rms_norm(hidden, weight):
    """transformers' LlamaRMSNorm.forward, op for op (float32 statistics, cast back, then the weight)."""
    import torch  # torch: only when measuring (`estimate` on a GPU needs none)

    states = hidden.to(torch.float32)
    variance = states.pow(2).mean(-1, keepdim=True)
    states = states * torch.rsqrt(variance + 1e-6)
    return weight * states.to(hidden.dtype)


def apply_rope(x, cos, sin):
    """transformers' apply_rotary_pos_emb for one of q, k: x * cos + rotate_half(x) * sin."""
    import torch  # torch: only when measuring (`estimate` on a GPU needs none)

    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def decoder_layer(
    arch: Architecture,
    weights: dict,
    hidden,
    cos,
    sin,
    causal: float,
    watch: Stopwatch,
    attended: int | None = None,
    window: int | None = None,
):
    """One Llama decoder layer as transformers 5 runs it for the scorer (modeling_llama LlamaDecoderLayer with
    sdpa_attention_forward: no mask, is_causal, enable_gqa; eager when causal = 1), each op charged to its kind.
    `attended`: attention runs on the first that many positions only (causal, so their outputs are the full layer's);
    the other rows take q's values, untimed, so every op after it runs at the full length. `window`: a windowed
    layer, whose attention is the scorer's blockwise kernel (workers/local_attention.py), charged apart."""
    import torch  # torch: only when measuring (`estimate` on a GPU needs none)
    import torch.nn.functional as F  # torch: only when measuring

    rows, tokens, _ = hidden.shape
    attended = tokens if attended is None else min(attended, tokens)
    heads = (rows, tokens, -1, arch.head_dim)
    normed = rms_norm(hidden, weights["norm_1"])
    watch.lap("elementwise")
    q, k, v = (F.linear(normed, weights[name], weights.get(f"{name}_bias")) for name in ("q", "k", "v"))
    watch.lap("linear")
    q, k, v = (x.view(heads).transpose(1, 2) for x in (q, k, v))
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    watch.lap("elementwise")
    prefix = tuple(x[:, :, :attended] for x in (q, k, v))
    if window is not None:
        out = windowed_attention(arch, *prefix, window)
    elif causal < 1:
        out = F.scaled_dot_product_attention(*prefix, is_causal=True, enable_gqa=arch.num_heads != arch.num_kv_heads)
    else:
        out = eager_attention(arch, *prefix)
    watch.lap("attention" if window is None else "local_attention")
    if attended < tokens:
        out = torch.cat((out, q[:, :, attended:]), dim=2)
        watch.restart()
    out = out.transpose(1, 2).reshape(rows, tokens, -1).contiguous()
    watch.lap("elementwise")
    out = F.linear(out, weights["o"], weights.get("o_bias"))
    watch.lap("linear")
    hidden = hidden + out
    normed = rms_norm(hidden, weights["norm_2"])
    watch.lap("elementwise")
    gate, up = (F.linear(normed, weights[name], weights.get(f"{name}_bias")) for name in ("gate", "up"))
    watch.lap("linear")
    product = F.silu(gate) * up
    watch.lap("elementwise")
    down = F.linear(product, weights["down"], weights.get("down_bias"))
    watch.lap("linear")
    hidden = hidden + down
    watch.lap("elementwise")
    return hidden


def windowed_attention(arch: Architecture, q, k, v, window: int):
    """A windowed layer's attention as the scorer runs it: `blockwise_attention` (its output is [B, T, H, D],
    transposed inside; handed back as [B, H, T, D], a view)."""
    from types import SimpleNamespace

    from longrope.workers.local_attention import blockwise_attention  # torch

    module = SimpleNamespace(head_dim=arch.head_dim)
    return blockwise_attention(module, q, k, v, None, sliding_window=window)[0].transpose(1, 2)


def windowed_replay(arch: Architecture, replayed: int) -> int:
    """How many of the `replayed` layers replay as windowed: the model's share of them, at least one where it has
    any (and at least one full layer left where it has those); none where a single layer is replayed of a model
    with both kinds (then its windowed layers are priced at the full layers' rate)."""
    if not arch.local_layers:
        return 0
    full = arch.num_layers - arch.local_layers
    return min(replayed - (full > 0), max(1, round(arch.local_layers * replayed / arch.num_layers)))


def eager_attention(arch: Architecture, q, k, v):
    """transformers' eager_attention_forward: repeat_kv, scores, a causal mask, float32 softmax, the product."""
    import torch  # torch: only when measuring (`estimate` on a GPU needs none)

    groups = arch.num_heads // arch.num_kv_heads
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    tokens = q.shape[2]
    mask = torch.full((tokens, tokens), float("-inf"), dtype=q.dtype).triu(1)
    scores = torch.matmul(q, k.transpose(2, 3)) * arch.head_dim**-0.5 + mask
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)


def forward_inputs(arch: Architecture, shape: ForwardShape, dtype: str, watch: Stopwatch):
    """The work a forward does once before its layers, charged to "outside": the embedding lookup and the
    candidates' cos/sin tables (encodings.rotary_cos_sin, which the rope patch calls once a forward, in float32,
    then cast to the model's dtype)."""
    import torch  # torch: only when measuring (`estimate` on a GPU needs none)
    import torch.nn.functional as F  # torch: only when measuring

    kind = _dtype(dtype)
    ids = torch.randint(0, arch.vocab_size, (shape.rows, shape.tokens))
    table = torch.randn(arch.vocab_size, arch.hidden_size, dtype=kind)
    inv_freq = default_inv_freq(arch.head_dim, 10000.0)[None].expand(shape.rows, -1) / 2.0
    factor = torch.full((shape.rows,), 1.1)
    watch.restart()
    hidden = F.embedding(ids, table)
    cos, sin = rotary_cos_sin(inv_freq, torch.arange(shape.tokens)[None], attention_factor=factor)
    cos, sin = cos.to(kind), sin.to(kind)
    watch.lap("outside")
    return hidden, cos, sin


def replayed_layers(arch: Architecture, dtype: str) -> int:
    """Decoder layers the replay runs, each with its own weights: all of the model's when their weights fit in
    REPLAY_WEIGHT_BYTES (then caches hold what they hold in the real forward), else as many as fit, at least one
    (by then one pass streams more weights than a CPU's last-level cache holds, as the real forward does)."""
    layer_bytes = linear_weights_per_layer(arch) * DTYPE_BYTES[dtype]
    return max(1, min(arch.num_layers, REPLAY_WEIGHT_BYTES // layer_bytes))


def replay_shape(shape: ForwardShape) -> ForwardShape:
    """The forward the rates are timed on: the job's, shortened to REPLAY_POSITIONS positions a row and holding
    at most that many in all (fewer rows of the same length first); its attention runs on the first
    ATTENTION_POSITIONS of each row."""
    tokens = min(shape.tokens, REPLAY_POSITIONS)
    return ForwardShape(tokens=tokens, rows=max(1, min(shape.rows, REPLAY_POSITIONS // tokens)))


def forward_seconds(
    arch: Architecture,
    shape: ForwardShape,
    dtype: str,
    causal: float,
    repeats: int,
    clock: Clock = time.perf_counter,
    attended: int | None = None,
) -> dict[str, float]:
    """Seconds of one forward by kind (linear, attention, local_attention, elementwise): the forward's inputs,
    `replayed_layers` decoder layers in sequence and the final norm, replayed `repeats` times after a warm-up pass;
    each kind's least time, the layers' scaled to the model's count, the inputs and final norm charged once (as
    elementwise); attention on the first `attended` positions of each row (None: all)."""
    import torch  # torch: only when measuring (`estimate` on a GPU needs none)

    layers = [layer_weights(arch, dtype) for _ in range(replayed_layers(arch, dtype))]
    windowed = windowed_replay(arch, len(layers))
    windows = [arch.local_window] * windowed + [None] * (len(layers) - windowed)
    passes = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            watch = Stopwatch(clock)
            hidden, cos, sin = forward_inputs(arch, shape, dtype, watch)
            for weights, window in zip(layers, windows, strict=True):
                hidden = decoder_layer(arch, weights, hidden, cos, sin, causal, watch, attended, window)
            rms_norm(hidden, layers[-1]["norm_2"])  # the model's final norm
            watch.lap("outside")
            passes.append(watch.spent)
    least = {kind: min(spent[kind] for spent in passes[1:]) for kind in STOPWATCH_KINDS}
    scale, full = arch.num_layers / len(layers), len(layers) - windowed
    return {
        "linear": scale * least["linear"],
        "attention": (arch.num_layers - arch.local_layers) / full * least["attention"] if full else 0.0,
        "local_attention": arch.local_layers / windowed * least["local_attention"] if windowed else 0.0,
        "elementwise": scale * least["elementwise"] + least["outside"],
    }


def loss_chunk_seconds(arch: Architecture, rows: int, dtype: str, repeats: int, clock: Clock) -> tuple[float, int]:
    """(seconds, positions) of one loss chunk as the scorer computes it: workers/scorer.py `chunked_loss` on
    `rows` rows of LOSS_CHUNK_TOKENS // rows positions (the lm_head matmul, float32 cross-entropy, float64 sums)."""
    import torch  # torch: only when measuring (`estimate` on a GPU needs none)
    import torch.nn.functional as F  # torch: only when measuring

    from longrope.workers.scorer import chunked_loss  # torch

    kind, step = _dtype(dtype), max(1, LOSS_CHUNK_TOKENS // rows)
    hidden = torch.randn(rows, step, arch.hidden_size, dtype=kind)
    weight = torch.randn(arch.vocab_size, arch.hidden_size, dtype=kind) * 0.02
    targets = torch.randint(0, arch.vocab_size, (rows, step))

    @torch.inference_mode()
    def chunk() -> None:
        chunked_loss(hidden, targets, lambda x: F.linear(x, weight), chunk_tokens=LOSS_CHUNK_TOKENS)

    return least_seconds(chunk, repeats, clock), rows * step


def toy_model_config(model_config: dict, arch: Architecture) -> dict:
    """The model's config.json at toy width: the same model type, layers, head size and RoPE, one attention head
    (hidden size = head size), an MLP of 16 and a vocabulary of 64, so a forward of TOY_TOKENS costs only what
    every forward costs whatever its size (Python, module calls, op dispatch, the rope patch, the loss loop)."""
    toy = {**model_config, "hidden_size": arch.head_dim, "head_dim": arch.head_dim}
    toy |= {"num_attention_heads": 1, "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 64}
    return toy | {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def forward_fixed_cost_seconds(
    model_config: dict, arch: Architecture, dtype: str, attn_implementation: str, repeats: int, clock: Clock
) -> float:
    """Seconds a scoring forward spends outside the replayed ops: the project's Scorer (workers/scorer.py, with
    its rope patch and chunked loss) on the toy-width model (`toy_model_config`, built by transformers from the
    config) scoring one row of TOY_TOKENS, less the replay of that same toy forward (whose op dispatch the replay
    at full size already times). Raises ImportError without transformers, ValueError or KeyError for a config
    transformers cannot build."""
    import torch  # torch: only when measuring (`estimate` on a GPU needs none)
    from transformers import AutoConfig, AutoModelForCausalLM  # only when measuring

    from longrope.workers.scorer import Scorer  # torch

    toy = toy_model_config(model_config, arch)
    settings = {key: value for key, value in toy.items() if key != "model_type"}
    hf_config = AutoConfig.for_model(toy["model_type"], **settings)
    model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=attn_implementation)
    model = model.to(_dtype(dtype)).eval()
    rope = model_rope(toy).method
    windows = torch.randint(0, 64, (1, TOY_TOKENS + 1))
    scorer = Scorer(model, windows, rope.original_inv_freq(), candidates_per_forward=1)
    scoring = least_seconds(lambda: scorer.score([rope]), repeats, clock)
    toy_arch = Architecture.from_hf_config(toy)
    shape = ForwardShape(tokens=TOY_TOKENS, rows=1)
    replay = forward_seconds(toy_arch, shape, dtype, attention_fraction(attn_implementation), repeats, clock)
    return max(0.0, scoring - sum(replay.values()))


def square_matmul_rate(repeats: int, clock: Clock = time.perf_counter) -> float:
    """FLOP/s of a 2048 x 2048 float32 matmul: the machine's headline rate (bench/scoring.py's yardstick)."""
    import torch  # torch: only when measuring (`estimate` on a GPU needs none)

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    return 2.0 * 2048**3 / least_seconds(lambda: a @ b, repeats, clock)


def worker_clock(threads: int) -> Clock:
    """With one torch thread every op runs on the calling thread, so its CPU time (`time.thread_time`) is the
    forward's time on a core of its own, whatever else the machine runs: on a shared machine the wall clock
    charged other processes' time to the forward (the demo's estimate rose from 0.32 to 4.7 s a candidate with two
    test suites beside it). Several threads work outside the calling thread, so they are timed by the wall clock."""
    return time.thread_time if threads == 1 else time.perf_counter


def measure_cpu_rates(
    arch: Architecture,
    shape: ForwardShape,
    dtype: str,
    attn_implementation: str = "sdpa",
    *,
    threads: int,
    model_config: dict | None = None,
    repeats: int = 3,
    clock: Clock | None = None,
) -> Rates:
    """Every rate `hardware.seconds` needs, timed on this CPU with `threads` torch threads (a worker's): each
    kind's FLOPs (or elementwise bytes) in one forward of `replay_shape(shape)` over its time in the replayed
    forward (attention's over its first ATTENTION_POSITIONS; windowed layers' blockwise attention a rate of its
    own), and, from
    the model's config.json (`model_config`), the fixed cost of a forward.

    The clock (None: `worker_clock(threads)`) decides what load on the machine does to the figures: a worker
    holds its own CPUs (Ray reserves them), so the time to predict is the time on a core of its own."""
    clock = clock or worker_clock(threads)
    causal, shape = attention_fraction(attn_implementation), replay_shape(shape)
    attended = min(shape.tokens, ATTENTION_POSITIONS)
    with torch_threads(threads):
        spent = forward_seconds(arch, shape, dtype, causal, repeats, clock, attended)
        chunk, positions = loss_chunk_seconds(arch, shape.rows, dtype, repeats, clock)
        square = square_matmul_rate(repeats, clock)
        fixed_cost, note = None, ""
        if model_config is not None:
            try:
                fixed_cost = forward_fixed_cost_seconds(model_config, arch, dtype, attn_implementation, repeats, clock)
            except Exception as exc:  # no transformers, or a config it cannot build at toy width: said, left out
                note = f"; a forward's fixed cost not measured: {type(exc).__name__}: {one_line(exc)}"
    flops = forward_flops(arch, shape.tokens, causal=causal) * shape.rows
    local, full = attention_rates(forward_flops(arch, attended, causal=causal) * shape.rows, spent)
    traffic = elementwise_bytes(arch, shape.rows * shape.tokens, DTYPE_BYTES[dtype])
    plural = "s" if threads > 1 else ""
    clock_note = ", in thread CPU time" if clock is time.thread_time else ""
    return Rates(
        source=f"this CPU, measured ({threads} torch thread{plural} as a worker runs, {dtype}, the forward replayed "
        f"at {shape.rows} x {shape.tokens} positions, attention on {attended}{clock_note}{note})",
        linear=flops.linear / spent["linear"],
        attention=full,
        lm_head=2.0 * positions * arch.hidden_size * arch.vocab_size / chunk,
        memory=traffic / spent["elementwise"],
        square_matmul=square,
        forward_fixed_cost=fixed_cost,
        local_attention=local,
    )


def attention_rates(attended: Flops, spent: dict[str, float]) -> tuple[float | None, float]:
    """(windowed layers' rate, full layers' rate) from the attended positions' FLOPs and the replay's seconds: None
    for the windowed layers where none was replayed (then they go at the full layers' rate); a model with no full
    layer takes the windowed rate for both (its full-attention FLOPs are 0)."""
    local = attended.local_attention / spent["local_attention"] if spent["local_attention"] else None
    full = attended.attention / spent["attention"] if spent["attention"] else local
    return local, full
