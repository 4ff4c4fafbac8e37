"""A worker's forwards and memory: how the scorer stacks windows into forwards, and what a forward (or a
gradient step) holds at its peak besides the weights."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import computed_field

from longrope.search.config.job_config import JobConfig
from longrope.search.cost.architecture import Architecture, Frozen, parameter_count
from longrope.search.cost.budget import gradient_windows
from longrope.search.cost.flops import LOSS_CHUNK_TOKENS

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The scorer's stacking budget (workers/scorer.py DEFAULT_TOKENS_PER_FORWARD): copied, not imported, because the
# scorer imports torch.
TOKENS_PER_FORWARD = {"gpu": 16384, "cpu": 2048}
# Tokens per chunk of a layer's MLP (workers/sequence_chunks.py DEFAULT_MLP_CHUNK_TOKENS), copied for the same reason.
MLP_CHUNK_TOKENS = 16384


def mlp_chunk(shape: ForwardShape, chunk_tokens: int = MLP_CHUNK_TOKENS) -> int | None:
    """Positions (all rows) in one chunk of a layer's MLP, or None where the forward is one chunk: the scorer takes
    chunk_tokens // rows positions of every row at a time (workers/sequence_chunks.py)."""
    if shape.rows * shape.tokens <= chunk_tokens:
        return None
    return max(1, chunk_tokens // shape.rows) * shape.rows


class ForwardShape(Frozen):
    """How the scorer lays out one forward: `rows` sequences of `tokens` positions (workers/scorer.py: a
    forward holds min(candidates_per_forward, batch_size) candidates x the windows stacked to fill
    tokens_per_forward)."""

    tokens: int
    rows: int


def forward_shape(config: JobConfig, tokens: int, windows: int, device: Literal["cpu", "gpu"]) -> ForwardShape:
    candidates = min(config.workers.candidates_per_forward, config.workers.batch_size)
    stacked = max(1, min(windows, TOKENS_PER_FORWARD[device] // (candidates * tokens)))
    return ForwardShape(tokens=tokens, rows=candidates * stacked)


def gradient_shape(config: JobConfig, tokens: int, device: Literal["cpu", "gpu"]) -> ForwardShape:
    """A gradient forward (workers/scorer.py `score_with_gradient`): one candidate, its windows stacked to the same
    token budget, at most a step's gradient windows (a task may hold fewer)."""
    stacked = max(1, min(gradient_windows(config), TOKENS_PER_FORWARD[device] // tokens))
    return ForwardShape(tokens=tokens, rows=stacked)


def forwards_per_candidate(config: JobConfig, tokens: int, windows: int, device: Literal["cpu", "gpu"]) -> float:
    """Forwards per candidate as workers/scorer.py Scorer.score runs a call of batch_size candidates: groups of
    candidates_per_forward (the last one smaller), each group's windows stacked up to the token budget; the
    candidates of a group share its forwards (and their fixed cost)."""
    batch, group = config.workers.batch_size, config.workers.candidates_per_forward

    def group_forwards(size: int) -> int:
        return math.ceil(windows / max(1, min(windows, TOKENS_PER_FORWARD[device] // (size * tokens))))

    full, rest = divmod(batch, group)
    return (full * group_forwards(group) + (group_forwards(rest) if rest else 0)) / batch


class Memory(Frozen):
    """Bytes a worker holds at its peak (one forward or one loss chunk at a time)."""

    weights: float
    keys_values: float
    layer_activations: float
    attention_matrix: float
    loss_chunk: float
    checkpoints: float = 0.0  # the gradient path: each decoder layer's input, kept to the backward
    host_checkpoints: float = 0.0  # the same, kept in host memory instead (`offloaded`): not on the device
    layer_backward: float = 0.0  # the gradient path: one layer's recomputed activations and gradients

    @computed_field
    @property
    def forward_peak(self) -> float:
        return self.keys_values + self.layer_activations + self.attention_matrix

    @computed_field
    @property
    def peak(self) -> float:
        """Weights, the checkpoints (alive from the forward to the backward), and the larger of a layer's forward
        plus its backward (zero on the forward-only path) and the loss."""
        return self.weights + self.checkpoints + max(self.forward_peak + self.layer_backward, self.loss_chunk)


def worker_memory(
    arch: Architecture, shape: ForwardShape, dtype: str, attn_implementation: str, chunk_tokens: int = MLP_CHUNK_TOKENS
) -> Memory:
    """Peak memory of a worker scoring one forward (inference mode: no activations are kept for a backward).

    - weights: parameters x dtype bytes.
    - keys_values: one layer's keys and values, 2 R T K Q bytes. The scorer calls the model with
      use_cache=False, so no layer's keys and values outlive the layer (with a DynamicCache all L layers' would
      be alive at the last layer: L times this).
    - layer_activations: R T bytes x (residual stream d + the layer input d + max(attention: normed input d,
      q and the attention output 2 H Q; MLP: normed input d, SiLU(gate), up and their product 3 I)) + RoPE's
      cos and sin (2 R T Q). Past `chunk_tokens` positions the MLP runs a chunk of c positions at a time
      (`mlp_chunk`): its part is then the normed input, the chunks' outputs and their concatenation, 3 d per
      position, plus one chunk's 3 I c.
    - attention_matrix: eager only, R H T^2 x (scores + the float32 softmax + its cast back: 2 bytes + 4)
      plus the float mask R T^2 bytes; SDPA's flash kernels and flash-attention never hold it.
    - loss_chunk: after the forward, the last hidden states R T d and one chunk of 1024 positions' logits
      (dtype), their float32 copy (none when already float32) and cross-entropy's float32 log-softmax: the
      full [T, V] logits never exist (workers/scorer.py chunked_loss).
    Not counted: the CUDA context and allocator slack (add about 1 GiB on a GPU)."""
    size = DTYPE_BYTES[dtype]
    rows, tokens, d = shape.rows, shape.tokens, arch.hidden_size
    q_out, kv_out, width = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim, arch.intermediate_size
    chunk = mlp_chunk(shape, chunk_tokens)
    mlp = d + 3 * width if chunk is None else 3 * d
    per_position = 2 * d + max(d + 2 * q_out, mlp) + 2 * arch.head_dim
    mlp_chunk_bytes = 0 if chunk is None else chunk * 3 * width
    matrix = 0.0
    if attn_implementation == "eager":
        matrix = rows * tokens * tokens * (arch.num_heads * (2 * size + 4) + size)
    loss_chunk = min(LOSS_CHUNK_TOKENS, rows * tokens)
    logits = loss_chunk * arch.vocab_size * (size + (4 if size != 4 else 0) + 4)
    return Memory(
        weights=float(parameter_count(arch) * size),
        keys_values=float(2 * rows * tokens * kv_out * size),
        layer_activations=float((rows * tokens * per_position + mlp_chunk_bytes) * size),
        attention_matrix=float(matrix),
        loss_chunk=float(rows * tokens * d * size + logits),
    )


def gradient_memory(
    arch: Architecture, shape: ForwardShape, dtype: str, attn_implementation: str, chunk_tokens: int = MLP_CHUNK_TOKENS
) -> Memory:
    """Peak memory of a worker's gradient pass (workers/scorer.py `score_with_gradient`): `worker_memory`'s
    forward, plus

    - checkpoints: each decoder layer runs under torch.utils.checkpoint, so the forward keeps only each layer's
      input hidden state until the backward, L R T d values (tests/test_gradient_scorer.py counts exactly one
      hidden state per layer among the tensors autograd saves);
    - layer_backward: the layer being differentiated, its forward run again with autograd, holds what autograd
      saves for its backward (`saved_bytes_per_position`) and the gradients in flight, d (the layer output's) +
      max(3 I: the MLP product's and its two inputs', 2 H Q + 2 K Q: the attention output's and dq, dk, dv); with
      eager attention also its saved probabilities and their gradient, 2 R H T^2 values;
    - the loss: the hidden states' gradient (R T d) and one chunk's logits gradient (float32) on top of the
      forward's loss chunk: the loss chunks are checkpointed too, so only one chunk's logits exist at a time.

    Past `chunk_tokens` positions each MLP chunk is checkpointed: the layer saves its chunks' inputs (d a position)
    in place of the MLP's products (3 I), and the backward holds one chunk's products and their gradients at a time
    (2 x 3 I c). The forward's peak and one layer's backward are added, not maxed: the recomputed layer's transient
    buffers coexist with the incoming gradient (an upper bound). Not counted: cos/sin and their gradients (4 R T Q
    float32 values, less than one hidden state), the parameters' gradients (none: frozen)."""
    forward = worker_memory(arch, shape, dtype, attn_implementation, chunk_tokens)
    size, positions, d = DTYPE_BYTES[dtype], shape.rows * shape.tokens, arch.hidden_size
    q_out, kv_out, width = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim, arch.intermediate_size
    chunk = mlp_chunk(shape, chunk_tokens)
    saved = saved_bytes_per_position(arch, dtype)
    if chunk is None:
        in_flight = (d + max(3 * width, 2 * q_out + 2 * kv_out)) * size
        mlp_chunk_bytes = 0
    else:  # the chunks' inputs saved instead of the products; one chunk's products and their gradients at a time
        saved += (d - 3 * width) * size
        in_flight = (d + 2 * q_out + 2 * kv_out) * size
        mlp_chunk_bytes = 2 * chunk * 3 * width * size
    matrix = 0.0
    if attn_implementation == "eager":
        matrix = 2.0 * shape.rows * arch.num_heads * shape.tokens * shape.tokens * size
    loss_chunk = min(LOSS_CHUNK_TOKENS, positions)
    return forward.model_copy(
        update={
            "checkpoints": float(arch.num_layers * positions * d * size),
            "layer_backward": float(positions * (saved + in_flight) + mlp_chunk_bytes + matrix),
            "loss_chunk": forward.loss_chunk + positions * d * size + loss_chunk * arch.vocab_size * 4,
        }
    )


def saved_bytes_per_position(arch: Architecture, dtype: str) -> float:
    """Bytes autograd saves per position in a transformers Llama decoder layer whose input and cos/sin carry
    autograd and whose weights are frozen (the gradient path past the first layer), beyond its input, cos/sin and
    weights: 4 H Q (q before and after RoPE, its rotate_half, the attention output SDPA keeps) + 4 K Q (k likewise,
    and v) + 3 I (gate, SiLU(gate), up: the MLP's products) at the model's dtype, H float32 (SDPA's logsumexp),
    two float32 values (the norms' rsqrt), and the norms' inputs: the second's at the dtype (the first's is the
    layer input) in float32, both as float32 copies otherwise (LlamaRMSNorm upcasts). A frozen linear layer keeps
    no input: its backward needs only its weight. Counted by storage with torch's saved-tensor hooks, this is exact
    for float32 and bfloat16 (tests/test_estimate.py)."""
    size = DTYPE_BYTES[dtype]
    q_out, kv_out = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    norms = arch.hidden_size * size if size == 4 else 2 * arch.hidden_size * 4
    return (4 * q_out + 4 * kv_out + 3 * arch.intermediate_size) * size + norms + (arch.num_heads + 2) * 4


# What a GPU worker holds beyond the scorer's tensors, assumed until measured on a GPU: the CUDA context
# with cuBLAS's and the attention kernels' workspaces (about 1 GiB on an H100 with torch 2.x), and the caching
# allocator's slack between freed and reused blocks, a share of the activations' peak.
CUDA_CONTEXT_BYTES = 2**30
ALLOCATOR_SLACK = 0.05


def gpu_headroom(memory: Memory, shape: ForwardShape, arch: Architecture) -> float:
    """Bytes a GPU worker needs beyond `memory.peak`: the CUDA context, the rope patch's float32 cos and sin tables
    (2 R T Q x 4 bytes, computed in float32 before the cast to the model's dtype), and the allocator's slack on the
    activations (`ALLOCATOR_SLACK` of the peak less the weights)."""
    tables = 2 * shape.rows * shape.tokens * arch.head_dim * 4
    return CUDA_CONTEXT_BYTES + tables + ALLOCATOR_SLACK * (memory.peak - memory.weights)


# The share of a GPU's free memory a gradient pass's checkpoints may take before they go to the host: the rest holds
# the forward's activations and one layer's recompute and backward, which at long windows are each about the
# checkpoints' size (Llama-3-8B at 128k tokens: 32 GiB of checkpoints, 23 GiB of the rest). The scorer's rule is
# the same (workers/scorer.py CHECKPOINT_SHARE): copied, not imported, because the scorer imports torch.
CHECKPOINT_SHARE = 1 / 3


def offloaded(memory: Memory, capacity_bytes: float, gpus: int = 1) -> Memory:
    """A GPU gradient pass's memory with its checkpoints where the scorer keeps them with `workers.checkpoints: auto`
    (workers/scorer.py `Scorer.checkpoint_home`): on the host when they would take more than a third of the GPU's
    free memory at the pass's start (its capacity less the weights and the CUDA context). A model spread over `gpus`
    GPUs is judged as the scorer judges it, on its first GPU, which holds about 1/gpus of the weights."""
    free = capacity_bytes - memory.weights / gpus - CUDA_CONTEXT_BYTES
    if memory.checkpoints <= free * CHECKPOINT_SHARE:
        return memory
    return memory.model_copy(update={"checkpoints": 0.0, "host_checkpoints": memory.checkpoints})


def worker_dtype(config: JobConfig, device: Literal["cpu", "gpu"]) -> str:
    """workers/models.py resolve_dtype: 'auto' is bfloat16 on a GPU and float32 on the CPU."""
    if config.model.dtype != "auto":
        return config.model.dtype
    return "bfloat16" if device == "gpu" else "float32"


def worker_threads(config: JobConfig, omp_num_threads: str | None = None) -> int:
    """Torch threads a CPU worker scores with: workers/scoring_worker.py sets torch's count to OMP_NUM_THREADS,
    which Ray sets in an actor to floor(num_cpus), at least 1, unless the environment already sets it
    (ray/_private/utils.py set_omp_num_threads_if_unset); `omp_num_threads` is that environment value, if any."""
    if omp_num_threads and omp_num_threads.strip().isdigit() and int(omp_num_threads) >= 1:
        return int(omp_num_threads)
    return max(1, int(config.workers.num_cpus_per_worker))
