"""NTK tuned on the search split: a fair, strong baseline for the searched factors.

NTK-aware scaling (bloc97, 2023: `theta' = theta * factor^(d/(d-2))`, as `encodings.NtkRope` computes it) at the
nominal factor (the job's scale) is often far from its best, and an oversized factor with an attention factor
(a temperature on cos and sin) does much better, so a comparison with nominal NTK alone would flatter the search.
compare tries the scale times NTK_SCALE_MULTIPLIERS with each attention factor in NTK_ATTENTION_FACTORS on the
search split at the target length, and keeps the lowest mean NLL; the test split never sees the choice.
"""

from __future__ import annotations

from longrope.encodings import NtkRope, RopeMethod
from longrope.search.reports.compare_scoring import ComparePool, Progress, no_progress
from longrope.search.run.job_context import JobContext

NTK_SCALE_MULTIPLIERS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
NTK_ATTENTION_FACTORS = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3)


def ntk_grid(context: JobContext) -> dict[tuple[float, float], RopeMethod]:
    """NTK at several scales and attention factors, each as LongRoPE factors at the target length."""
    shape = {
        "head_dim": context.method.head_dim,
        "rope_theta": context.method.rope_theta,
        "partial_rotary_factor": context.method.partial_rotary_factor,
        "max_position_embeddings": context.target_length,
    }
    grid = {}
    for multiplier in NTK_SCALE_MULTIPLIERS:
        factors = NtkRope(factor=context.scale * multiplier, **shape).factors().double()
        for attention in NTK_ATTENTION_FACTORS:
            grid[(multiplier, attention)] = context.longrope(factors, attention_factor=attention)
    return grid


def tuned_ntk(
    context: JobContext, pool: ComparePool, progress: Progress = no_progress
) -> tuple[RopeMethod, dict[str, float]]:
    """NTK's scale and attention factor picked on the search split at the target length."""
    grid = ntk_grid(context)
    tuning = ("tuning", context.target_length)
    methods = {str(key): method for key, method in grid.items()}
    scores = pool.score(methods, [tuning], progress, phase="NTK settings tried")[tuning]
    best = min(grid, key=lambda key: scores[str(key)].mean_nll)
    multiplier, attention = best
    # as it would be exported: its scale in the keys vLLM reads too, so its vLLM row differs only by regime
    tuned = grid[best].for_both_runtimes()
    return tuned, {"ntk_factor": context.scale * multiplier, "attention_factor": attention}
