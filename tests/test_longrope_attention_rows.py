"""The closed forms read with LongRoPE's attention factor: compare's `ntk_longrope_attention` and
`yarn_longrope_attention` rows, and the tuning grids' `LONGROPE_ATTENTION` point. They tell what a searched
LongRoPE row wins by its per-pair factors from what it wins by its temperature alone."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from conftest import hf_inv_freq

from longrope.search.config.tuning_grids import TUNING_GRIDS
from longrope.search.job.job_context import JobContext
from longrope.search.optimizers.factory import load_job_config
from longrope.search.reports.compare_result import BASELINES
from longrope.search.reports.tuned_baselines import tuning_grids

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def demo_context(target: int = 1024) -> JobContext:
    """The reference model (pre-trained at 128 tokens) read at `target`."""
    return JobContext.resolve(load_job_config(CONFIGS / "demo.yaml", [f"target_length={target}"]))


def test_the_rows_take_transformers_yarn_and_ntk_frequencies_with_longropes_attention_factor():
    """At 8x of 128 tokens: the YaRN row's frequencies are transformers' own `yarn` ones, the NTK row's those of
    theta x 8^(d/(d-2)) worked by hand, and both rows' attention factor is sqrt(1 + ln 8 / ln 128) = 1.1952, not
    YaRN's 0.1 ln 8 + 1 = 1.2079 nor NTK's 1."""
    context = demo_context()
    rows = context.baselines()
    method = context.method
    head_dim, theta = method.head_dim, method.rope_theta
    yarn_inv_freq, yarn_attention = hf_inv_freq(
        {"rope_type": "yarn", "rope_theta": theta, "factor": 8.0, "original_max_position_embeddings": 128},
        head_dim=head_dim,
        max_position_embeddings=1024,
    )
    rotated = int(head_dim * method.partial_rotary_factor)
    ntk_theta = theta * 8.0 ** (rotated / (rotated - 2))
    ntk_inv_freq = 1.0 / ntk_theta ** (torch.arange(0, rotated, 2, dtype=torch.float64) / rotated)
    expected = math.sqrt(1 + math.log(8) / math.log(128))
    assert math.isclose(yarn_attention, 0.1 * math.log(8) + 1)  # YaRN's own, which the row replaces
    for name, inv_freq in (("yarn_longrope_attention", yarn_inv_freq), ("ntk_longrope_attention", ntk_inv_freq)):
        row = rows[name]
        torch.testing.assert_close(row.inv_freq(1024).double(), inv_freq.double(), rtol=1e-6, atol=0)
        assert math.isclose(row.attention_factor, expected, rel_tol=1e-12), name
    assert {"ntk_longrope_attention", "yarn_longrope_attention"} <= set(BASELINES)


def test_the_rows_apply_the_closed_forms_factors_at_and_below_the_original_length_too():
    """YaRN and NTK-aware apply their factors at every length, so the rows do as well (their short factors are
    the same factors): at 64 and 128 tokens (the reference model's original length) each row's frequencies are its
    closed form's, not the unscaled model's."""
    rows = demo_context().baselines()
    for length in (64, 128):
        for name in ("ntk", "yarn"):
            row, closed = rows[f"{name}_longrope_attention"], rows[name]
            torch.testing.assert_close(
                row.inv_freq(length).double(), closed.inv_freq(length).double(), rtol=1e-6, atol=0
            )
            assert not torch.equal(row.inv_freq(length), rows["none"].inv_freq(length)), (name, length)


def test_every_grid_tries_longropes_attention_factor_at_the_jobs_scale():
    """At 4x of 128 tokens the point is sqrt(1 + ln 4 / ln 128) = 1.1339 for every multiplier of both methods, in
    both grids, beside the grid's numeric points."""
    context = demo_context(512)
    expected = math.sqrt(1 + math.log(4) / math.log(128))
    for name in TUNING_GRIDS:
        for method_name, settings in tuning_grids(context, name).items():
            multipliers = {multiplier for multiplier, _ in settings}
            at_point = [m for (multiplier, point), m in settings.items() if point == "longrope"]
            assert len(at_point) == len(multipliers), (name, method_name)
            for method in at_point:
                assert math.isclose(method.attention_factor, expected, rel_tol=1e-12), (name, method_name)


def test_a_tuned_seed_name_seeds_every_setting_of_its_coarse_grid(capsys):
    """`search.seeds: [pi, ntk_tuned, yarn_tuned]`: every setting compare's coarse grid scores for NTK and YaRN
    (`tuning_grids`, compare's own builder) is a seed, with the same factors and attention factor, and validate's
    plan counts them among the seeds."""
    from longrope.search.cli.main import main

    overrides = ["target_length=1024", "search.seeds=[pi,ntk_tuned,yarn_tuned]"]
    context = JobContext.resolve(load_job_config(CONFIGS / "demo.yaml", overrides))
    seeds = {seed.name: seed for seed in context.seeds()}
    grids = tuning_grids(context, "coarse")
    expected = {f"{row} {setting}": method for row, grid in grids.items() for setting, method in grid.items()}
    assert set(seeds) == {"pi", *expected} and len(expected) == 15
    for name, method in expected.items():
        assert seeds[name].factors.tolist() == method.factors(1024).double().tolist()
        assert seeds[name].attention_factor == method.attention_factor
    capsys.readouterr()
    args = ["validate", "--offline", str(CONFIGS / "demo.yaml")] + [f"--set={o}" for o in overrides]
    assert main(args) == 0
    assert "seeds pi, ntk_tuned, yarn_tuned" in capsys.readouterr().out


def test_the_estimate_counts_a_tuned_seed_as_its_grid():
    """The budget counts `ntk_tuned` as the 9 settings of NTK's coarse line (3 multipliers x 3 attention points)
    and `yarn_tuned` as YaRN's 6: descent scores every seed before its first step."""
    search = load_job_config(CONFIGS / "demo.yaml", ["search.seeds=[pi,ntk_tuned,yarn_tuned]"]).search
    assert search.most_seeds() == 1 + 3 * 3 + 2 * 3
