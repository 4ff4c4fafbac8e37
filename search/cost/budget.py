"""How much a search scores: candidates, window evaluations and their FLOPs, per stage of a job.

The GA's budget is its population plus (mutations + crossovers) per generation; racing stops a share of each
child's windows (RACING_CHILD_FRACTIONS, measured); gradient descent scores its seeds, its steps and the best
point rounded to the grid, each step with a backward pass over its gradient windows (BACKWARD_PER_FORWARD: the
backward of a matmul is two matmuls of the forward's size, Kaplan et al. 2020 2.1; of flash attention 2.5x,
Dao 2023 table 1's fwd+bwd / fwd).
"""

from __future__ import annotations

from longrope.search.config.job_config import JobConfig
from longrope.search.cost.architecture import Architecture, Frozen
from longrope.search.cost.flops import Flops, attention_fraction, forward_flops, loss_tokens, recompute_flops
from longrope.search.optimizers.factory import search_plan

# Racing, measured by bench/search_cost.py (docs/search-cost.md: 2163, 2198 and 1885 window evaluations of 2816
# on seeds 0-2; generation 0, 32 x 8 = 256 of them, is never raced): the share of a raced child's windows that
# are scored, (evals - 256) / (2816 - 256), at 8 search windows, min_windows 3, z 2.
RACING_CHILD_FRACTIONS = (0.745, 0.759, 0.636)


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
    """Upper bound (no early stop, no patience): points scored forward on every search window, as the configured
    optimizer plans them (`plan` of its class in search/optimizers/)."""
    return search_plan(config.search, config.search.most_seeds()).candidates


def raced_children(config: JobConfig) -> int:
    """Candidates racing may stop in one search: every one after the initial population (which has no parents to
    race against)."""
    return candidates_per_search(config) - config.search.population


def gradient_steps(config: JobConfig) -> int:
    """Steps with a backward pass in one search (descent's steps, a hybrid's polish steps; none for the others)."""
    return search_plan(config.search, config.search.most_seeds()).backward_steps


def per_search_text(config: JobConfig) -> str:
    """How one search's candidate count is made up, in words."""
    return search_plan(config.search, config.search.most_seeds()).text


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
    total, children = 0.0, raced_children(config)
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
    side (v gets no rotation, so no gradient reaches it there; a flash kernel is counted whole). Windowed layers'
    blockwise attention is eager arithmetic, autograd's backward twice its forward. A whole gradient
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
        local_attention=recompute.local_attention + forward.local_attention * BACKWARD_PER_FORWARD["attention_eager"],
    )


def window_forward_flops(config: JobConfig, arch: Architecture, stage: StageBudget, original_length: int) -> Flops:
    """One window's forward in a stage (`stage_flops` is a candidate's: this times its windows)."""
    causal = attention_fraction(config.model.attn_implementation)
    lm_tokens = objective_loss_tokens(config, stage.length, original_length)
    return forward_flops(arch, stage.length, loss_tokens=lm_tokens, causal=causal)


def backward_cost(config: JobConfig, arch: Architecture, original_length: int) -> float:
    """c, what a window's backward pass costs in forwards of it (`run.trajectory`'s window-equivalents: such a
    window costs 1 + c): the FLOPs `backward_flops` prices beyond the forward over `window_forward_flops`, at the
    length of the search's (last) stage. About 1.7 (mostly linear) to 3.5 (mostly flash attention); 2.38 for the
    demo, where bench/backward_cost.py measured 2.82 on a CPU."""
    stage = search_budget(config, original_length).stages[-1]
    forward = window_forward_flops(config, arch, stage, original_length).total
    return backward_flops(config, arch, stage, original_length).total / forward
