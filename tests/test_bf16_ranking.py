"""A bfloat16 worker ranks candidates as a float32 one does: the agreement measures worked by hand, and the
reference model scored in both dtypes by the project's Scorer. bench/bf16_ranking.py holds the figures at
1024 tokens and at 8192 tokens on a Llama-3-8B-wide random model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rank_agreement import kendall_tau, rank_agreement

from longrope.search.job.job_context import JobContext
from longrope.search.optimizers.factory import load_job_config
from longrope.workers.models import load_model
from longrope.workers.scorer import Scorer


def test_kendall_tau_worked_by_hand():
    """4 candidates, 6 pairs: one swapped pair is 5 concordant - 1 discordant = 4 / 6; reversed is -1; a pair tied
    in one list counts as neither: (5 - 0) / 6."""
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert kendall_tau([1, 2, 3, 4], [1, 1, 3, 4]) == pytest.approx(5 / 6)
    with pytest.raises(ValueError, match="same length"):
        kendall_tau([1, 2], [1, 2, 3])


def test_rank_agreement_worked_by_hand():
    """Differences 0.1, 0.1, 0.1, 0.5, 0.1 (+ 0.1 for all, 0.4 more for the fourth): median 0.1, spread
    sqrt(0.4^2 / 5); the fourth drops from third best to worst, passing two candidates: 2 discordant pairs of 10,
    tau (8 - 2) / 10; the best 3 differ, the best is kept."""
    reference = [1.0, 1.1, 1.3, 1.2, 1.4]
    other = [1.1, 1.2, 1.4, 1.7, 1.5]
    agreement = rank_agreement(reference, other, best_k=3)
    assert agreement.best_same and not agreement.best_k_same and agreement.candidates == 5
    assert agreement.median_difference == pytest.approx(0.1)
    assert agreement.max_abs_difference == pytest.approx(0.5)
    assert agreement.difference_spread == pytest.approx(np.sqrt(0.4**2 / 5))
    assert agreement.reference_gap == pytest.approx(0.1)
    assert agreement.kendall_tau == pytest.approx((8 - 2) / 10)
    assert agreement.best_regret == 0.0
    # the best lost: `other` keeps the second (1.1), which costs 0.1 in the reference's score
    assert rank_agreement(reference, [1.3, 1.2, 1.4, 1.5, 1.6]).best_regret == pytest.approx(0.1)


@pytest.mark.slow
def test_bfloat16_ranks_the_reference_models_candidates_as_float32(tmp_path):
    """The seeds a search starts from (PI, NTK, YaRN) at two attention factors, and 6 children of YaRN as close
    as a GA's late ones, on 4 search windows at 512 tokens: bfloat16 keeps the best, the best 3 and the order up to
    near ties (measured: tau 0.96-1.0 at 1024 tokens, bench/results/bf16_ranking.json), and no mean NLL moves by
    more than a few thousandths of a nat."""
    config = load_job_config(None, ["target_length=512", f"output_dir={tmp_path}"])
    context = JobContext.resolve(config)
    windows = torch.from_numpy(context.windows(config.data.search_source, 512, 4).tokens)
    yarn = next(seed.factors for seed in context.seeds() if seed.name == "yarn")
    rng = np.random.default_rng(0)
    factors = [(seed.factors, a) for seed in context.seeds() for a in (1.0, 1.2)]
    factors += [(yarn * np.exp(rng.normal(0.0, 0.006, len(yarn))), 1.2 + rng.normal(0.0, 0.003)) for _ in range(6)]
    candidates = [context.longrope(torch.from_numpy(np.maximum(f, 1.0)), attention_factor=a) for f, a in factors]
    scores = {}
    for dtype in ("float32", "bfloat16"):
        model, rope = load_model(context.model_dir, device="cpu", dtype=dtype)
        scorer = Scorer(model, windows, rope.method.original_inv_freq(), candidates_per_forward=4)
        scores[dtype] = [s.mean_nll for s in scorer.score(candidates)]
    agreement = rank_agreement(scores["float32"], scores["bfloat16"], best_k=3)
    assert agreement.best_same and agreement.best_k_same, agreement
    assert agreement.kendall_tau >= 0.9, agreement
    assert agreement.max_abs_difference < 0.005, agreement
