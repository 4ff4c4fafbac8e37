"""Where a search's seeds come from besides the closed forms: a factors file, another run's directory, or a model's
config.json (`search.seed_files`), and the rule that scores each distinct start once. The job context builds the
seeds from these (job_context.py `JobContext.seeds`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from longrope.search.config.factors_file import read_factors_file
from longrope.search.optimizers.genome import Seed
from longrope.search.run.run_check import read_run
from longrope.search.run.run_store import RunDir
from longrope.search.run.stages import last_stage


def run_target_length(path: str) -> int:
    """The target length a seed file was searched for: a run directory's, or a factors file's
    max_position_embeddings (what `longrope export` writes: the run's target)."""
    if Path(path).is_dir():
        return RunDir(path).read_config().target_length
    return read_factors_file(path, f"search.seed_files: {path}").max_position_embeddings


def run_long_factors(run_dir: RunDir) -> tuple[np.ndarray, float | None]:
    """A run's long factors and attention factor: its best candidate's; a progressive job's last stage's; a
    short-factor run's kept long factors (its candidates are short factors). The run directory is read as every
    command reads it (`read_run`)."""
    if run_dir.read_config().search.stages:
        run_dir = last_stage(run_dir)
    run = read_run(run_dir)
    if run.job is not None and run.job.factor == "short":
        return np.asarray(run.job.long_factor, dtype=np.float64), run.job.attention_factor
    best = run.scored_best()
    return np.asarray(best.factors, dtype=np.float64), best.attention_factor


def is_model_config(path: str | Path) -> bool:
    """A seed file named config.json is a model's config (its RoPE scaling is the seed), never a factors file:
    `longrope export` writes factors under any other name."""
    return Path(path).name == "config.json"


def distinct_seeds(seeds: list[Seed]) -> list[Seed]:
    """The seeds less any whose factors (to float32 rounding: a closed form's own and its per-pair factors differ in
    the last bits) and attention factor equal an earlier one's (a tuned grid's nominal scale is the nominal closed form
    listed before it): each start is scored once, under its first name."""
    kept: list[Seed] = []
    for seed in seeds:
        if not any(
            np.allclose(seed.factors, other.factors, rtol=1e-6, atol=0)
            and seed.attention_factor == other.attention_factor
            for other in kept
        ):
            kept.append(seed)
    return kept
