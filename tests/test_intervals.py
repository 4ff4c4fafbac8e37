"""The 95% interval over windows is Student's t with n - 1 degrees of freedom: its quantile against the closed forms
for 1 and 2 degrees of freedom, against the t CDF written with the incomplete beta function (mpmath), against
printed tables, and the interval of six windows worked by hand."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from longrope.search.reports import compare
from longrope.search.reports.intervals import Z95, interval, paired_difference, student_t_quantile

PROBABILITIES = (0.55, 0.8, 0.9, 0.975, 0.995, 0.9999)


@pytest.mark.parametrize("p", PROBABILITIES)
def test_one_and_two_degrees_of_freedom_have_closed_forms(p):
    assert student_t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-12)  # Cauchy
    assert student_t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-12)


@pytest.mark.parametrize("df", [*range(1, 41), 63, 200])
def test_the_quantile_is_where_the_incomplete_beta_cdf_reaches_p(df):
    """P(T <= t) = 1 - I_{df / (df + t^2)}(df / 2, 1 / 2) / 2 for t >= 0 (Abramowitz & Stegun 26.7.1, 26.5.27)."""
    mpmath.mp.dps = 30
    for p in PROBABILITIES:
        t = student_t_quantile(p, df)
        cdf = 1 - mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True) / 2
        assert float(cdf) == pytest.approx(p, abs=1e-12), (df, p)


def test_printed_table_values_and_the_normal_limit():
    """t(0.975; df) as printed in statistics tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2), to 3 decimals."""
    printed = {1: 12.706, 2: 4.303, 5: 2.571, 7: 2.365, 15: 2.131, 30: 2.042, 100: 1.984}
    assert {df: round(student_t_quantile(0.975, df), 3) for df in printed} == printed
    assert student_t_quantile(0.975, 100_000) == pytest.approx(Z95, abs=1e-4)


def test_the_interval_of_six_windows_by_hand():
    """Windows 1..6: mean 3.5, sd sqrt(3.5), half-width 2.5706 * sqrt(3.5) / sqrt(6) = 1.9633 (with 1.96 it would be
    1.4970: a quarter too narrow)."""
    mean, low, high = interval(np.arange(1.0, 7.0))
    assert mean == 3.5
    assert (high - mean, mean - low) == (pytest.approx(1.9633, abs=1e-4), pytest.approx(1.9633, abs=1e-4))
    diff = paired_difference([2.0, 3.0, 5.0], [1.0, 1.0, 1.0])  # differences 1, 2, 4: mean 7/3, sd sqrt(7/3)
    assert diff[0] == pytest.approx(7 / 3)
    assert diff[2] - diff[0] == pytest.approx(4.3027 * math.sqrt(7 / 3) / math.sqrt(3), abs=1e-4)
    assert interval(np.array([2.0]))[1:] == (-math.inf, math.inf)


@pytest.mark.parametrize(("p", "df"), [(0.5, 3), (1.0, 3), (0.975, 0)])
def test_a_quantile_outside_its_domain_is_refused(p, df):
    with pytest.raises(ValueError, match=r"needs 0\.5 < p < 1 and df >= 1"):
        student_t_quantile(p, df)


def test_a_saved_compare_result_is_restated_from_its_per_window_nlls():
    """Its statistics computed again (worked here by hand), every other field as it was."""
    yarn = {"1024": [1.0, 1.2, 1.4], "512": [1.0, 1.1]}
    mine = {"1024": [0.9, 1.2, 1.2], "512": [1.05, 1.05]}
    stale = [0.0, 0.0, 0.0]
    result = {
        "target_length": 1024,
        "lengths": [512, 1024],
        "best_baseline": "yarn",
        "methods": {
            name: {"perplexity": {"512": stale, "1024": stale}, "factors": [1.0], "nll_per_window": nll}
            for name, nll in (("yarn", yarn), ("file:f.json", mine))
        },
    }
    restated = compare.restated(result)
    row = restated["methods"]["file:f.json"]
    half = 4.302653 * 0.1 / math.sqrt(3)  # differences -0.1, 0, -0.2: sd 0.1
    assert row["paired_difference_to_best_baseline"] == pytest.approx([-0.1, -0.1 - half, -0.1 + half], abs=1e-6)
    half_512 = 12.706205 * 0.0 / math.sqrt(2)  # equal windows: no spread
    assert row["perplexity"]["512"] == pytest.approx([math.exp(1.05)] * 2 + [math.exp(1.05 + half_512)])
    yarn_half = 4.302653 * 0.2 / math.sqrt(3)
    assert restated["methods"]["yarn"]["perplexity"]["1024"] == pytest.approx(
        [math.exp(1.2), math.exp(1.2 - yarn_half), math.exp(1.2 + yarn_half)], rel=1e-6
    )
    assert restated["methods"]["yarn"]["paired_difference_to_best_baseline"] == [0.0, 0.0, 0.0]
    assert {k: v for k, v in row.items() if k not in ("perplexity", "paired_difference_to_best_baseline")} == {
        "factors": [1.0],
        "nll_per_window": mine,
    }
    assert result["methods"]["file:f.json"]["perplexity"]["512"] == stale  # the input is left as it was
