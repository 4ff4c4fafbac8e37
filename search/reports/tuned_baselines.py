"""The closed forms compare tunes (NTK and YaRN today: each class's `tuned`), tuned on the search split: fair,
strong baselines for the searched factors.

NTK-aware scaling (bloc97, 2023: `theta' = theta * factor^(d/(d-2))`, as `encodings.NtkRope` computes it) at the
nominal factor (the job's scale) is often far from its best, and an oversized factor with an attention factor
(a temperature on cos and sin) does much better, so a comparison with nominal NTK alone would flatter the search.
YaRN (Peng et al. 2023, `encodings.YarnRope`: a ramp between interpolation and extrapolation by each pair's
rotations within the original length, beta_fast 32 / beta_slow 1, attention factor 0.1 ln(factor) + 1) likewise:
its factor and its temperature are tried over a grid. compare scores every setting of every tuned method on the
search split at the target length and keeps each method's lowest mean NLL; the test split never sees the choice.

The grids (`full`, the default, and `coarse`) are search/job/tuning_grid.py's; compare.json's `tuning_grid` counts
the settings tried.
"""

from __future__ import annotations

from collections.abc import Mapping

from longrope.encodings import LongRope, RopeMethod
from longrope.encodings.baselines import tuned_names, tuned_row
from longrope.search.config.tuning_grids import TUNING_GRIDS
from longrope.search.job.job_context import JobContext
from longrope.search.job.tuning_grid import method_grid
from longrope.search.reports.compare_scoring import ComparePool, Progress, no_progress


def tuning_grids(context: JobContext, grid_name: str) -> dict[str, dict[tuple, RopeMethod]]:
    """{tuned row: {setting: method}} ("ntk_tuned", "yarn_tuned", ...): every setting of the named grid tried for
    each tuned closed form of this job."""
    grid = TUNING_GRIDS[grid_name]
    return {tuned_row(name): method_grid(context, name, grid.line(name)) for name in tuned_names()}


def setting_label(name: str, setting: tuple) -> str:
    """A setting's label among the methods scored: e.g. "ntk_tuned (1.5, 1.1)"."""
    return f"{name} {setting}"


def pick_tuned(
    context: JobContext, grids: dict[str, dict[tuple, RopeMethod]], mean_nll: Mapping[str, float]
) -> tuple[dict[str, RopeMethod], dict[str, dict[str, float]]]:
    """({tuned row: method}, {tuned row: its setting}): for each tuned closed form, the setting of `grids`
    (`tuning_grids`) with the lowest mean NLL on the search split (`mean_nll`, by `setting_label`). A LongRoPE row
    (tuned NTK) states its scale in every key both runtimes read, as an export would, so its vLLM row differs only
    by regime."""
    tuned, settings = {}, {}
    for name in tuned_names():
        row = tuned_row(name)
        best = min(grids[row], key=lambda key, row=row: mean_nll[setting_label(row, key)])
        method = grids[row][best]
        tuned[row] = method.for_both_runtimes() if isinstance(method, LongRope) else method
        settings[row] = {f"{name}_factor": context.scale * best[0], "attention_factor": method.attention_factor}
    return tuned, settings


def tuned_baselines(
    context: JobContext, pool: ComparePool, grids: dict[str, dict[tuple, RopeMethod]], progress: Progress = no_progress
) -> tuple[dict[str, RopeMethod], dict[str, dict[str, float]]]:
    """`pick_tuned` over the grids (`tuning_grids`), every setting scored in one pass on the search split at the
    target length."""
    tuning = ("tuning", context.target_length)
    methods = {setting_label(name, key): method for name, found in grids.items() for key, method in found.items()}
    scores = pool.score(methods, [tuning], progress, phase=f"{' and '.join(tuned_names())} settings tried")[tuning]
    return pick_tuned(context, grids, {label: score.mean_nll for label, score in scores.items()})
