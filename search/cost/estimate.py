"""What a search will cost before it runs: parameters, FLOPs per candidate, candidates, memory per worker, hours.

Pure functions over two small pydantic models (the model's `Architecture`, read from a config.json without
weights, and the validated `JobConfig`); nothing here imports torch, ray or transformers, so `longrope estimate`
answers in well under a second on a laptop. The measured CPU rates that `--gpu cpu` uses live in
`search/cost/cpu_rates.py` (it imports torch when called).

FLOPs count multiply-adds as 2 (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Table 1:
forward C = 2N + 2 n_layer n_ctx d_attn per token, with N the non-embedding parameters and the attention term
the causal average over the context; PaLM, Chowdhery et al. 2022, appendix B: 6N + 12 L H Q T per token for
training, the forward being a third, 2N + 4 L H Q T, with the full T x T attention). Here, per forward of T tokens:

    linear    = 2 T L (d H Q + 2 d K Q + H Q d + 3 d I)           (q, k, v, o and the gated MLP's 3 matrices)
    attention = 4 L H Q T^2 f                                     (Q K^T and A V; f = 1/2 causal, 1 eager)
    lm_head   = 2 T_loss d V                                      (the chunked loss; T_loss = predicted positions)

with d the hidden size, L layers, H query heads and K key/value heads of size Q, I the MLP width, V the
vocabulary. f = 1/2 is what SDPA (flash kernels, `is_causal=True`, no mask: what transformers passes on the CPU
and GPU here) and flash-attention execute, skipping the blocks above the diagonal (FlashAttention-2, Dao 2023,
counts causal attention FLOPs the same way); eager attention materialises and multiplies the whole T x T matrix
(f = 1, which is also what `torch.utils.flop_counter` counts for it). Norms, RoPE and activations are not
FLOPs here (they are memory-bound; `elementwise_bytes` counts their traffic for the CPU time model).

On a CPU a candidate's time also counts its forwards (`forwards_per_candidate`, as the scorer stacks candidates
and windows) times a forward's measured fixed cost; where that fixed cost is over FIXED_COST_SHARE_LIMIT of the
time, no time is given (`withheld_time`): the estimate is not valid for such small forwards.
"""

from __future__ import annotations

import math
from pathlib import Path, PurePath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from longrope.search.config.job_config import JobConfig, JobConfigError
from longrope.workers.models import read_config_file

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The scorer's stacking budget (workers/scorer.py DEFAULT_TOKENS_PER_FORWARD) and loss chunk (workers/pool.py
# ModelSpec.loss_chunk_tokens): copied, not imported, because the scorer imports torch.
TOKENS_PER_FORWARD = {"gpu": 16384, "cpu": 2048}
LOSS_CHUNK_TOKENS = 1024
# Racing, measured by bench/search_cost.py (README "Search cost": 2163, 2198 and 1885 window evaluations of 2816
# on seeds 0-2; generation 0, 32 x 8 = 256 of them, is never raced): the share of a raced child's windows that
# are scored, (evals - 256) / (2816 - 256), at 8 search windows, min_windows 3, z 2.
RACING_CHILD_FRACTIONS = (0.745, 0.759, 0.636)


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Architecture(Frozen):
    """The shape of a decoder-only transformer with a gated MLP (Llama, Mistral, Qwen2, Phi-3, Gemma layouts)."""

    name: str = ""
    hidden_size: int = Field(ge=1)
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    original_length: int | None = None  # the pre-training context, as the rope reader resolves it
    dtype: str | None = None  # the checkpoint's dtype, from config.json

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str = "") -> Architecture:
        """From a transformers config.json (as a dict); a missing key is one JobConfigError naming it."""
        try:
            hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
            rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
            original = (
                rope.get("original_max_position_embeddings")
                or config.get("original_max_position_embeddings")
                or config.get("max_position_embeddings")
            )
            bias = bool(config.get("attention_bias", False))
            return cls(
                name=name or str(config.get("_name_or_path") or config.get("model_type") or ""),
                hidden_size=hidden,
                num_layers=int(config["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate_size=int(config["intermediate_size"]),
                vocab_size=int(config["vocab_size"]),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                qkv_bias=bias or config.get("model_type") == "qwen2",  # Qwen2 always has q/k/v biases
                o_bias=bias,
                mlp_bias=bool(config.get("mlp_bias", False)),
                original_length=int(original) if original else None,
                dtype=config.get("dtype") or config.get("torch_dtype"),
            )
        except KeyError as exc:
            raise JobConfigError(f"model config{f' {name}' if name else ''}: no {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise JobConfigError(f"model config{f' {name}' if name else ''}: {exc}") from None


# Public architecture numbers (each model's config.json on the Hugging Face hub), so that the shipped configs,
# whose model paths name checkpoints that are not on a laptop, can be estimated before renting a GPU.
_LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}
_PHI3 = {
    "model_type": "phi3",
    "hidden_size": 3072,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 8192,
    "vocab_size": 32064,
    "rope_theta": 10000.0,
    "dtype": "bfloat16",
}
KNOWN_MODELS: dict[str, dict[str, Any]] = {
    "Llama-2-7b-hf": {
        **_LLAMA,
        "num_key_value_heads": 32,
        "intermediate_size": 11008,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "dtype": "float16",
    },
    "Meta-Llama-3-8B": {
        **_LLAMA,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "dtype": "bfloat16",
    },
    "Mistral-7B-v0.1": {
        **_LLAMA,
        "model_type": "mistral",
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,  # sliding_window 4096 is ignored: the shipped config turns it off
        "rope_theta": 10000.0,
        "dtype": "bfloat16",
    },
    "Phi-3-mini-4k-instruct": {**_PHI3, "max_position_embeddings": 4096},
    "Phi-3-mini-128k-instruct": {**_PHI3, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096},
}
KNOWN_ALIASES = {"llama-2-7b": "Llama-2-7b-hf", "llama-3-8b": "Meta-Llama-3-8B", "mistral-7b": "Mistral-7B-v0.1"}


def known_model(name: str) -> str | None:
    """The table's key for a model path or name (its last path part, case-insensitive), or None."""
    last = PurePath(name.rstrip("/")).name.lower()
    keys = {key.lower(): key for key in KNOWN_MODELS}
    return keys.get(last) or KNOWN_ALIASES.get(last)


# ----------------------------------------------------------------------------------------------------- counts


def parameter_count(arch: Architecture) -> int:
    """Every parameter, a tied lm_head counted once (what `sum(p.numel() for p in model.parameters())` gives):
    per layer the attention's d H Q + 2 d K Q + H Q d, the MLP's 3 d I, two RMSNorm weights of d, and biases;
    then the embedding V d, the final norm d and, untied, the lm_head V d."""
    d, q_out, kv_out = arch.hidden_size, arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    attention = d * q_out + 2 * d * kv_out + q_out * d
    attention += (q_out + 2 * kv_out) * arch.qkv_bias + d * arch.o_bias
    mlp = 3 * d * arch.intermediate_size + (2 * arch.intermediate_size + d) * arch.mlp_bias
    per_layer = attention + mlp + 2 * d
    embeddings = arch.vocab_size * d * (1 if arch.tie_word_embeddings else 2)
    return arch.num_layers * per_layer + embeddings + d


def linear_weights_per_layer(arch: Architecture) -> int:
    """Weights a token meets in one layer's matmuls (q, k, v, o, gate, up, down): the 'N' of 2N per layer."""
    d, q_out, kv_out = arch.hidden_size, arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    return d * q_out + 2 * d * kv_out + q_out * d + 3 * d * arch.intermediate_size


class Flops(Frozen):
    """FLOPs of one sequence's forward, by kind (each kind runs at its own rate on a CPU)."""

    linear: float
    attention: float
    lm_head: float

    @computed_field
    @property
    def total(self) -> float:
        return self.linear + self.attention + self.lm_head

    def __mul__(self, times: float) -> Flops:
        return Flops(linear=self.linear * times, attention=self.attention * times, lm_head=self.lm_head * times)


def attention_fraction(attn_implementation: str) -> float:
    """f: 1/2 for kernels that skip the masked half (SDPA with is_causal, flash-attention), 1 for eager."""
    return 1.0 if attn_implementation == "eager" else 0.5


def forward_flops(arch: Architecture, tokens: int, *, loss_tokens: int | None = None, causal: float = 0.5) -> Flops:
    """One sequence of `tokens` positions (module docstring's formulas); `loss_tokens` positions go through the
    lm_head (None: all of them)."""
    return Flops(
        linear=2.0 * tokens * arch.num_layers * linear_weights_per_layer(arch),
        attention=4.0 * arch.num_layers * arch.num_heads * arch.head_dim * tokens * tokens * causal,
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


# ----------------------------------------------------------------------------------------------------- the search


class StageBudget(Frozen):
    """One search (a stage of a progressive search, or the only one): its window length and candidate count."""

    length: int
    candidates: int
    windows: int  # windows each candidate is scored on (search_windows x objectives)
    backward_windows: int = 0  # window passes with a backward (gradient and hybrid optimizers)


class SearchBudget(Frozen):
    stages: tuple[StageBudget, ...]
    racing: bool
    racing_child_fraction: tuple[float, float, float] | None  # (mean, low, high) of windows a raced child scores

    @property
    def candidates(self) -> int:
        return sum(stage.candidates for stage in self.stages)


def candidates_per_search(config: JobConfig) -> int:
    """Upper bound (no early stop, no patience): points scored forward on every search window.

    - dim_mono and CMA-ES: the initial population, then generations x (mutations + crossovers); the steady
      schedule spends the same budget (README, "Search cost").
    - gradient: the seeds (`seed_count`), then one point per step (search.gradient.steps): every step's point is
      scored on all windows, a candidate in history.jsonl like any other; then its best rounded to the grid.
    - hybrid: the GA's budget, plus each polish step's point (`gradient_steps`) and each polish's rounded best."""
    search = config.search
    descent = gradient_steps(config) + grid_points(config)
    if search.optimizer == "gradient":
        return seed_count(config) + descent
    return search.population + search.generations * (search.mutations + search.crossovers) + descent


def grid_points(config: JobConfig) -> int:
    """A descent ends by scoring its best point rounded to the search grid (search/optimizers/gradient.py): one for
    `gradient`, one a polish for `hybrid` (GradientConfig.polishes), none for the other optimizers."""
    search = config.search
    if search.optimizer == "gradient":
        return 1
    return search.gradient.polishes(search.generations) if search.optimizer == "hybrid" else 0


def seed_count(config: JobConfig) -> int:
    """Seeds a search starts from, at most: each closed form of search.seeds, and two a seed file (a run at
    another target length gives its best and those factors moved to this target: job_context.py
    `seeds_from_file`)."""
    return len(config.search.seeds) + 2 * len(config.search.seed_files)


def gradient_steps(config: JobConfig) -> int:
    """Steps with a backward in one search: search.gradient.steps for `gradient`; for `hybrid`, polish_steps at
    every polish_every-th generation and after the last (GradientConfig.polishes); none for the other optimizers."""
    search, gradient = config.search, config.search.gradient
    if search.optimizer == "gradient":
        return gradient.steps
    if search.optimizer == "hybrid":
        return gradient.polishes(search.generations) * gradient.polish_steps
    return 0


def gradient_windows(config: JobConfig) -> int:
    """Windows a step differentiates: search.gradient.windows_per_step, or every search window less the
    holdout_windows its stopping rule reads (the rest of a step's windows are scored forward only)."""
    windows = config.data.search_windows * len(config.data.objective_weights())
    return config.search.gradient.windows_per_step or windows - config.search.gradient.holdout_windows


def search_budget(config: JobConfig, original_length: int) -> SearchBudget:
    """Each stage of `search.stages` is a whole search at its length, then the target (a short-factor search reads
    windows of original_length tokens). Racing's expected share comes from RACING_CHILD_FRACTIONS, floored at
    min_windows / windows (a child is never stopped before min_windows)."""
    objectives = len(config.data.objective_weights())
    windows = config.data.search_windows * objectives
    short = config.search.factor == "short"
    lengths = [original_length] if short else [*config.search.stages, config.target_length]
    count = candidates_per_search(config)
    racing = config.search.racing
    fraction = None
    if racing.enabled:
        floor = min(1.0, racing.min_windows / config.data.search_windows)
        values = [max(floor, value) for value in RACING_CHILD_FRACTIONS]
        fraction = (sum(values) / len(values), min(values), max(values))
    backward = gradient_steps(config) * gradient_windows(config)
    return SearchBudget(
        stages=tuple(
            StageBudget(length=length, candidates=count, windows=windows, backward_windows=backward)
            for length in lengths
        ),
        racing=racing.enabled,
        racing_child_fraction=fraction,
    )


def window_evaluations(config: JobConfig, budget: SearchBudget, fraction: float | None = None) -> float:
    """Window evaluations of the whole job: every candidate on every window, or with racing the initial
    population in full and each child on `fraction` of its windows."""
    total = 0.0
    children = config.search.generations * (config.search.mutations + config.search.crossovers)
    for stage in budget.stages:
        if fraction is None:
            total += stage.candidates * stage.windows
        else:
            total += (stage.candidates - children) * stage.windows + children * stage.windows * fraction
    return total


def objective_loss_tokens(config: JobConfig, tokens: int, original_length: int) -> float:
    """Mean lm_head positions per window over the objectives' windows (a mix interleaves equal counts)."""
    names = list(config.data.objective_weights())
    return sum(loss_tokens(name, tokens, original_length) for name in names) / len(names)


def stage_flops(config: JobConfig, arch: Architecture, stage: StageBudget, original_length: int) -> Flops:
    """FLOPs of one candidate in a stage: `stage.windows` forwards of `stage.length` tokens."""
    return window_forward_flops(config, arch, stage, original_length) * stage.windows


# FLOPs of a backward per FLOP of the forward, by kind, with the weights frozen (workers/scorer.py
# `score_with_gradient` sets requires_grad False, so autograd computes input gradients only). A linear layer's
# backward is then one matmul, for its input, not two: Kaplan et al. 2020's backward = 2 x forward (the 6N of
# training) counts the weight gradients too. Attention's two matmuls (Q K^T, A V) have activations on both sides,
# so each backward is two: 2 x with eager attention, which keeps the softmax; flash kernels (SDPA, flash-attention)
# recompute the scores in the backward, 5 matmuls against the forward's 2: 2.5 x (FlashAttention-2, Dao 2023,
# section 4.1: "the backward pass FLOPs are 2.5 times the forward"). lm_head: one matmul, for the hidden states.
BACKWARD_PER_FORWARD = {"linear": 1.0, "attention_eager": 2.0, "attention_flash": 2.5, "lm_head": 1.0}
# Elementwise traffic of the backward per byte of the forward's: each op's backward reads the incoming gradient and
# the saved inputs and writes the input gradients, about twice the forward's reads and writes; a first-principles
# count like `elementwise_bytes`, not fitted.
BACKWARD_ELEMENTWISE_PER_FORWARD = 2.0


def backward_flops(config: JobConfig, arch: Architecture, stage: StageBudget, original_length: int) -> Flops:
    """FLOPs a window's gradient pass spends beyond its forward (`recompute_flops` + the backward proper,
    BACKWARD_PER_FORWARD), less what autograd never runs: the first layer's input (the frozen embeddings) carries no
    gradient, so its q, k and v projections have no backward, and with eager attention neither has A V's value
    side (v gets no rotation, so no gradient reaches it there; a flash kernel is counted whole). A whole gradient
    pass comes to about 2.7 forwards (mostly linear) to 4.5 (mostly flash attention). Exact against torch's FLOP
    counter on the scorer with eager attention (tests/test_estimate.py)."""
    d, length, layers = arch.hidden_size, stage.length, arch.num_layers
    forward = window_forward_flops(config, arch, stage, original_length)
    recompute = recompute_flops(arch, forward, length)
    eager = attention_fraction(config.model.attn_implementation) == 1.0
    first_qkv = 2.0 * length * d * (arch.num_heads + 2 * arch.num_kv_heads) * arch.head_dim
    first_values = forward.attention / layers / 2 if eager else 0.0  # A V (half a layer) backward once, not twice
    attention = BACKWARD_PER_FORWARD["attention_eager" if eager else "attention_flash"]
    return Flops(
        linear=recompute.linear + forward.linear * BACKWARD_PER_FORWARD["linear"] - first_qkv,
        attention=recompute.attention + forward.attention * attention - first_values,
        lm_head=recompute.lm_head + forward.lm_head * BACKWARD_PER_FORWARD["lm_head"],
    )


def window_forward_flops(config: JobConfig, arch: Architecture, stage: StageBudget, original_length: int) -> Flops:
    """One window's forward in a stage (`stage_flops` is a candidate's: this times its windows)."""
    causal = attention_fraction(config.model.attn_implementation)
    lm_tokens = objective_loss_tokens(config, stage.length, original_length)
    return forward_flops(arch, stage.length, loss_tokens=lm_tokens, causal=causal)


def recompute_flops(arch: Architecture, forward: Flops, length: int) -> Flops:
    """The checkpointed forward run again in the backward, less each layer's down projection: non-reentrant
    torch.utils.checkpoint stops recomputing once every tensor the backward needs is back (its default
    early_stop), and a frozen linear layer's output is saved by nothing after the MLP's product, so down_proj is
    never rerun (2 T d I FLOPs a layer)."""
    down = 2.0 * length * arch.hidden_size * arch.intermediate_size * arch.num_layers
    return Flops(linear=forward.linear - down, attention=forward.attention, lm_head=forward.lm_head)


# ----------------------------------------------------------------------------------------------------- memory


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


def worker_memory(arch: Architecture, shape: ForwardShape, dtype: str, attn_implementation: str) -> Memory:
    """Peak memory of a worker scoring one forward (inference mode: no activations are kept for a backward).

    - weights: parameters x dtype bytes.
    - keys_values: one layer's keys and values, 2 R T K Q bytes. The scorer calls the model with
      use_cache=False, so no layer's keys and values outlive the layer (with a DynamicCache all L layers' would
      be alive at the last layer: L times this).
    - layer_activations: R T bytes x (residual stream d + the layer input d + max(attention: normed input d,
      q and the attention output 2 H Q; MLP: normed input d, SiLU(gate), up and their product 3 I)) + RoPE's
      cos and sin (2 R T Q).
    - attention_matrix: eager only, R H T^2 x (scores + the float32 softmax + its cast back: 2 bytes + 4)
      plus the float mask R T^2 bytes; SDPA's flash kernels and flash-attention never hold it.
    - loss_chunk: after the forward, the last hidden states R T d and one chunk of 1024 positions' logits
      (dtype), their float32 copy (none when already float32) and cross-entropy's float32 log-softmax: the
      full [T, V] logits never exist (workers/scorer.py chunked_loss).
    Not counted: the CUDA context and allocator slack (add about 1 GiB on a GPU)."""
    size = DTYPE_BYTES[dtype]
    rows, tokens, d = shape.rows, shape.tokens, arch.hidden_size
    q_out, kv_out, width = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim, arch.intermediate_size
    per_position = 2 * d + max(d + 2 * q_out, d + 3 * width) + 2 * arch.head_dim
    matrix = 0.0
    if attn_implementation == "eager":
        matrix = rows * tokens * tokens * (arch.num_heads * (2 * size + 4) + size)
    chunk = min(LOSS_CHUNK_TOKENS, rows * tokens)
    logits = chunk * arch.vocab_size * (size + (4 if size != 4 else 0) + 4)
    return Memory(
        weights=float(parameter_count(arch) * size),
        keys_values=float(2 * rows * tokens * kv_out * size),
        layer_activations=float(rows * tokens * per_position * size),
        attention_matrix=float(matrix),
        loss_chunk=float(rows * tokens * d * size + logits),
    )


def gradient_memory(arch: Architecture, shape: ForwardShape, dtype: str, attn_implementation: str) -> Memory:
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

    The forward's peak and one layer's backward are added, not maxed: the recomputed layer's transient buffers
    coexist with the incoming gradient (an upper bound). Not counted: cos/sin and their gradients (4 R T Q
    float32 values, less than one hidden state), the parameters' gradients (none: frozen)."""
    forward = worker_memory(arch, shape, dtype, attn_implementation)
    size, positions, d = DTYPE_BYTES[dtype], shape.rows * shape.tokens, arch.hidden_size
    q_out, kv_out, width = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim, arch.intermediate_size
    in_flight = (d + max(3 * width, 2 * q_out + 2 * kv_out)) * size
    matrix = 0.0
    if attn_implementation == "eager":
        matrix = 2.0 * shape.rows * arch.num_heads * shape.tokens * shape.tokens * size
    chunk = min(LOSS_CHUNK_TOKENS, positions)
    return forward.model_copy(
        update={
            "checkpoints": float(arch.num_layers * positions * d * size),
            "layer_backward": float(positions * (saved_bytes_per_position(arch, dtype) + in_flight) + matrix),
            "loss_chunk": forward.loss_chunk + positions * d * size + chunk * arch.vocab_size * 4,
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


def worker_dtype(config: JobConfig, device: Literal["cpu", "gpu"]) -> str:
    """workers/models.py resolve_dtype: 'auto' is bfloat16 on a GPU and float32 on the CPU."""
    if config.model.dtype != "auto":
        return config.model.dtype
    return "bfloat16" if device == "gpu" else "float32"


def worker_threads(config: JobConfig, omp_num_threads: str | None = None) -> int:
    """Torch threads a CPU worker scores with: workers/pool.py sets torch's count to OMP_NUM_THREADS, which Ray
    sets in an actor to floor(num_cpus), at least 1, unless the environment already sets it (ray/_private/utils.py
    set_omp_num_threads_if_unset); `omp_num_threads` is that environment value, if any."""
    if omp_num_threads and omp_num_threads.strip().isdigit() and int(omp_num_threads) >= 1:
        return int(omp_num_threads)
    return max(1, int(config.workers.num_cpus_per_worker))


# ----------------------------------------------------------------------------------------------------- time


class Gpu(Frozen):
    name: str
    bf16_tflops: float  # peak dense (no 2:4 sparsity) bf16 tensor-core rate, from the vendor's datasheet
    memory_gib: float


GPUS = {
    gpu.name.lower(): gpu
    for gpu in (
        Gpu(name="A100", bf16_tflops=312, memory_gib=80),  # A100 datasheet (SXM and PCIe; 40 GB parts exist)
        Gpu(name="H100-SXM", bf16_tflops=989, memory_gib=80),  # H100 datasheet: 1979 with sparsity
        Gpu(name="H100-PCIe", bf16_tflops=756, memory_gib=80),
        Gpu(name="H200", bf16_tflops=989, memory_gib=141),  # H100's compute, more HBM
        Gpu(name="B200", bf16_tflops=2250, memory_gib=180),
        Gpu(name="L40S", bf16_tflops=362, memory_gib=48),  # L40S datasheet: 733 with sparsity
        Gpu(name="A10", bf16_tflops=125, memory_gib=24),  # A10 datasheet; AWS's A10G is this chip at lower clocks
        Gpu(name="L4", bf16_tflops=121, memory_gib=24),
    )
}
GPU_ALIASES = {"h100": "h100-sxm", "a10g": "a10"}
# Above this share of a candidate's time in forwards' fixed cost, no time is given (`withheld_time`). Measured by
# bench/estimate_accuracy.py (reference model, one window a forward, wall and thread-CPU clocks), estimated / real
# was 0.82-0.83 at 11-19% of fixed cost, 0.79-0.80 at 25-27%, 0.75-0.80 at 35-36% and 0.73-0.74 at 40%: a quarter
# stays below the shares where it reached the target's 0.75 edge, with a margin for single rounds' +-0.1 spread.
FIXED_COST_SHARE_LIMIT = 0.25
# Model FLOPs utilisation assumed when none is given: an assumption, not a measurement (no GPU on the machine
# that wrote this). Long-context prefill is matmul- and flash-attention-bound; FlashAttention-2 (Dao 2023)
# reports its forward at 50-73% of an A100's peak and dense bf16 GEMMs reach 60-80%, less the memory-bound
# norms, RoPE and the loss: 0.4 is a deliberately round, cautious middle. Measure yours and pass --mfu.
DEFAULT_MFU = 0.4


def find_gpu(name: str) -> Gpu:
    key = name.lower()
    gpu = GPUS.get(GPU_ALIASES.get(key, key))
    if gpu is None:
        known = ", ".join([*(gpu.name for gpu in GPUS.values()), "cpu"])
        raise JobConfigError(f"--gpu {name!r}: unknown GPU (known: {known})")
    return gpu


class Rates(Frozen):
    """Sustained rates a device runs each kind of work at (FLOP/s, bytes/s for the memory-bound ops)."""

    source: str
    linear: float
    attention: float
    lm_head: float
    memory: float | None = None  # None: the elementwise traffic is folded into the MFU (GPUs)
    square_matmul: float | None = None  # CPU: a 2048 x 2048 float32 matmul's rate, the efficiencies' yardstick
    forward_fixed_cost: float | None = None  # CPU: seconds every forward costs whatever its size (estimate_cpu.py)


def gpu_rates(gpu: Gpu, mfu: float) -> Rates:
    """One rate for every matmul: peak x MFU (MFU counts model FLOPs over peak, memory-bound time included)."""
    rate = gpu.bf16_tflops * 1e12 * mfu
    return Rates(source=f"{gpu.name} {gpu.bf16_tflops:g} TFLOP/s bf16 peak x MFU {mfu:g}", linear=rate,
                 attention=rate, lm_head=rate)  # fmt: skip


def seconds(flops: Flops, rates: Rates, traffic_bytes: float = 0.0, forwards: float = 0.0) -> float:
    """Each kind of work at its own rate, plus the elementwise traffic at the memory rate and `forwards` times the
    fixed cost of a forward (each when the rates give one)."""
    time = flops.linear / rates.linear + flops.attention / rates.attention + flops.lm_head / rates.lm_head
    time += traffic_bytes / rates.memory if rates.memory else 0.0
    return time + forwards * (rates.forward_fixed_cost or 0.0)


def read_config_json(path: Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A model's config.json as a dict, the job's `model.config_overrides` applied (as the load applies them)."""
    return {**read_config_file(Path(path)), **(overrides or {})}


def model_config_path(path: str | Path) -> Path:
    """A config.json, or a directory holding one."""
    path = Path(path)
    return path / "config.json" if path.is_dir() else path


# ----------------------------------------------------------------------------------------------------- the job


class StageEstimate(Frozen):
    length: int
    candidates: int
    windows: int
    flops_per_candidate: Flops
    elementwise_bytes_per_candidate: float  # in the model dtype of the first device
    backward_windows: int = 0  # gradient and hybrid: window passes with a backward, beyond the forwards above
    flops_per_backward_window: Flops | None = None  # what such a pass adds to its forward (`backward_flops`)
    elementwise_bytes_per_backward_window: float = 0.0

    @computed_field
    @property
    def total_flops(self) -> float:
        extra = self.flops_per_backward_window.total * self.backward_windows if self.backward_windows else 0.0
        return self.flops_per_candidate.total * self.candidates + extra


class DeviceEstimate(Frozen):
    device: str
    dtype: str
    rates: Rates
    rows_per_forward: int  # at the longest stage
    memory: Memory  # at the longest stage
    memory_capacity_gib: float | None
    forwards_per_candidate: float  # at the target
    fixed_cost_share: float | None  # the largest share of a candidate's time that is forwards' fixed cost (CPU)
    time_withheld: str | None  # why the times below are None (`withheld_time`)
    seconds_per_candidate: float | None  # at the target (last stage)
    hours: float | None  # device-hours of the whole job, every candidate on every window (upper bound)
    hours_racing: float | None  # with racing: the expected device-hours (README's measured racing share)
    devices_in_parallel: float | None  # GPUs the config's workers use at once (wall hours = hours / this)
    gradient_memory: Memory | None = None  # gradient and hybrid: a gradient pass at the longest stage
    gradient_rows_per_forward: int | None = None
    seconds_per_backward_window: float | None = None  # at the target: a gradient pass beyond its forward

    @computed_field
    @property
    def fits(self) -> bool | None:
        if self.memory_capacity_gib is None:
            return None
        peaks = [self.memory.peak] + ([self.gradient_memory.peak] if self.gradient_memory else [])
        return max(peaks) <= self.memory_capacity_gib * 2**30


class JobEstimate(Frozen):
    model: str
    model_source: str
    parameters: int
    original_length: int
    stages: tuple[StageEstimate, ...]
    candidates: int
    window_evaluations: float
    window_evaluations_racing: float | None
    racing_child_fraction: tuple[float, float, float] | None
    devices: tuple[DeviceEstimate, ...]
    gradient_steps: int = 0  # per search (stage): steps with a backward (`gradient_steps`)
    gradient_windows: int = 0  # windows each such step differentiates (`gradient_windows`)
    backward_window_passes: int = 0  # the whole job: window passes with a backward


def resolve_original_length(config: JobConfig, arch: Architecture) -> int:
    original = config.original_length or arch.original_length
    if original is None:
        raise JobConfigError(
            "original_length: not in the job config and the model config has no max_position_embeddings"
        )
    if config.target_length <= original:
        raise JobConfigError(
            f"target_length: must be greater than original_length ({original}), got {config.target_length}"
        )
    return original


def stage_estimates(config: JobConfig, arch: Architecture, original: int, dtype: str) -> tuple[StageEstimate, ...]:
    budget = search_budget(config, original)
    return tuple(
        StageEstimate(
            length=stage.length,
            candidates=stage.candidates,
            windows=stage.windows,
            flops_per_candidate=stage_flops(config, arch, stage, original),
            elementwise_bytes_per_candidate=elementwise_bytes(arch, stage.length, DTYPE_BYTES[dtype]) * stage.windows,
            backward_windows=stage.backward_windows,
            flops_per_backward_window=backward_flops(config, arch, stage, original) if stage.backward_windows else None,
            elementwise_bytes_per_backward_window=elementwise_bytes(arch, stage.length, DTYPE_BYTES[dtype])
            * (1 + BACKWARD_ELEMENTWISE_PER_FORWARD)
            * bool(stage.backward_windows),
        )
        for stage in budget.stages
    )


def backward_window_seconds(
    config: JobConfig, stage: StageEstimate, rates: Rates, device: Literal["cpu", "gpu"]
) -> float:
    """Time a gradient pass adds to its window's forward: its FLOPs and elementwise traffic at the device's rates,
    and on a CPU two forwards' fixed cost per gradient forward (the checkpointed recompute is a forward; the
    backward walks as many autograd nodes as the forward ran ops), shared by the windows stacked in it."""
    if not stage.backward_windows:
        return 0.0
    rows = gradient_shape(config, stage.length, device).rows
    return seconds(stage.flops_per_backward_window, rates, stage.elementwise_bytes_per_backward_window, 2 / rows)


def device_estimate(
    config: JobConfig, arch: Architecture, original: int, device: str, rates: Rates, capacity_gib: float | None
) -> DeviceEstimate:
    """Time, hours and memory on one device. Time per candidate = sum over kinds of FLOPs / rate (+ traffic /
    bandwidth and forwards x a forward's fixed cost on a CPU); hours = sum over stages of candidates x that time
    (racing: the initial population in full, each child at the measured share of its windows). Times are None
    where `withheld_time` says the model does not hold."""
    kind: Literal["cpu", "gpu"] = "cpu" if device == "cpu" else "gpu"
    dtype = worker_dtype(config, kind)
    stages = stage_estimates(config, arch, original, dtype)
    budget = search_budget(config, original)
    forwards = [forwards_per_candidate(config, s.length, s.windows, kind) for s in stages]
    per_candidate = [
        seconds(s.flops_per_candidate, rates, s.elementwise_bytes_per_candidate, count)
        for s, count in zip(stages, forwards, strict=True)
    ]
    shares = [count * (rates.forward_fixed_cost or 0.0) / t for count, t in zip(forwards, per_candidate, strict=True)]
    withheld = withheld_time(stages, shares, rates)
    per_backward = [backward_window_seconds(config, s, rates, kind) for s in stages]
    hours = sum(s.candidates * t + s.backward_windows * b for s, t, b in zip(stages, per_candidate, per_backward,
                                                                             strict=True)) / 3600  # fmt: skip
    hours_racing = None
    if budget.racing_child_fraction is not None:
        children = config.search.generations * (config.search.mutations + config.search.crossovers)
        share = budget.racing_child_fraction[0]
        racing = [(s.candidates - children + children * share) * t for s, t in zip(stages, per_candidate, strict=True)]
        hours_racing = sum(racing) / 3600
    longest = max(stages, key=lambda s: s.length)
    shape = forward_shape(config, longest.length, longest.windows, kind)
    gpus = config.workers.num_workers * config.workers.num_gpus_per_worker
    return DeviceEstimate(
        device=device,
        dtype=dtype,
        rates=rates,
        rows_per_forward=shape.rows,
        memory=worker_memory(arch, shape, dtype, config.model.attn_implementation),
        memory_capacity_gib=capacity_gib,
        forwards_per_candidate=forwards[-1],
        fixed_cost_share=max(shares) if rates.forward_fixed_cost is not None else None,
        time_withheld=withheld,
        seconds_per_candidate=None if withheld else per_candidate[-1],
        hours=None if withheld else hours,
        hours_racing=None if withheld else hours_racing,
        devices_in_parallel=gpus if kind == "gpu" and gpus > 0 else None,
        **gradient_device_fields(config, arch, longest, dtype, kind, None if withheld else per_backward[-1]),
    )


def gradient_device_fields(
    config: JobConfig,
    arch: Architecture,
    longest: StageEstimate,
    dtype: str,
    kind: Literal["cpu", "gpu"],
    seconds_per_backward: float | None,
) -> dict[str, Any]:
    """DeviceEstimate's gradient fields: none unless the optimizer takes backward passes."""
    if not longest.backward_windows:
        return {}
    shape = gradient_shape(config, longest.length, kind)
    return {
        "gradient_memory": gradient_memory(arch, shape, dtype, config.model.attn_implementation),
        "gradient_rows_per_forward": shape.rows,
        "seconds_per_backward_window": seconds_per_backward,
    }


def withheld_time(stages: tuple[StageEstimate, ...], shares: list[float], rates: Rates) -> str | None:
    """Why no time is given, or None. Above FIXED_COST_SHARE_LIMIT of a candidate's time in a forward's fixed
    cost, the estimate rests on its least certain term (a difference of two sub-millisecond timings, which leaves
    out what tiny ops cost beyond dispatch) and bench/estimate_accuracy.py measured it off by more than 25%."""
    worst = max(range(len(stages)), key=lambda i: shares[i])
    if shares[worst] <= FIXED_COST_SHARE_LIMIT:
        return None
    return (
        f"at {stages[worst].length} tokens a candidate's time is {shares[worst]:.0%} forwards' fixed cost "
        f"({(rates.forward_fixed_cost or 0.0) * 1e3:.2g} ms each on this CPU: Python, module calls, op dispatch); "
        f"above {FIXED_COST_SHARE_LIMIT:.0%} the estimate missed real scoring by over 25% "
        "(bench/estimate_accuracy.py). Time a short real run instead: longrope search CONFIG --set "
        "search.generations=0"
    )


def job_estimate(
    config: JobConfig, arch: Architecture, source: str, devices: list[tuple[str, Rates, float | None]]
) -> JobEstimate:
    """Everything `longrope estimate` prints, for each (device name, rates, memory GiB or None)."""
    original = resolve_original_length(config, arch)
    budget = search_budget(config, original)
    first = "cpu" if devices and devices[0][0] == "cpu" else "gpu"
    fraction = budget.racing_child_fraction
    return JobEstimate(
        model=arch.name,
        model_source=source,
        parameters=parameter_count(arch),
        original_length=original,
        stages=stage_estimates(config, arch, original, worker_dtype(config, first)),
        candidates=budget.candidates,
        window_evaluations=window_evaluations(config, budget),
        window_evaluations_racing=None if fraction is None else window_evaluations(config, budget, fraction[0]),
        racing_child_fraction=fraction,
        devices=tuple(device_estimate(config, arch, original, *device) for device in devices),
        gradient_steps=gradient_steps(config),
        gradient_windows=gradient_windows(config) if gradient_steps(config) else 0,
        backward_window_passes=sum(stage.backward_windows for stage in budget.stages),
    )
