"""Every RoPE method against transformers' own ROPE_INIT_FUNCTIONS (and rotary modules) over a grid."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from conftest import hf_inv_freq, hf_rotary_module

from longrope.encodings import from_hf

HEAD_DIMS = (64, 96, 128)
PARTIAL = (1.0, 0.75, 0.5)
THETAS = (1e4, 5e5, 1e6)
FACTORS = (2.0, 3.5, 4.0, 8.0, 16.0, 32.0, 64.0)
SHAPES = list(itertools.product(HEAD_DIMS, PARTIAL, THETAS))


def assert_matches_hf(params: dict, *, head_dim: int, max_pos: int, seq_len: int | None = None) -> None:
    ours = from_hf(params, head_dim=head_dim, max_position_embeddings=max_pos)
    ref_inv_freq, ref_attention = hf_inv_freq(
        params, head_dim=head_dim, max_position_embeddings=max_pos, seq_len=seq_len
    )
    context = f"{params} head_dim={head_dim} max_pos={max_pos} seq_len={seq_len}"
    torch.testing.assert_close(ours.inv_freq(seq_len), ref_inv_freq, rtol=1e-6, atol=0, msg=lambda m: f"{context}: {m}")
    assert ours.attention_factor == pytest.approx(ref_attention, rel=1e-6), context


def base(theta: float, prf: float) -> dict:
    return {"rope_theta": theta, "partial_rotary_factor": prf}


@pytest.mark.parametrize(("head_dim", "prf", "theta"), SHAPES)
def test_default(head_dim, prf, theta):
    assert_matches_hf({"rope_type": "default", **base(theta, prf)}, head_dim=head_dim, max_pos=4096)


@pytest.mark.parametrize(("head_dim", "prf", "theta"), SHAPES)
def test_linear(head_dim, prf, theta):
    for factor in FACTORS:
        params = {"rope_type": "linear", "factor": factor, **base(theta, prf)}
        assert_matches_hf(params, head_dim=head_dim, max_pos=4096)


@pytest.mark.parametrize(("head_dim", "prf", "theta"), SHAPES)
def test_dynamic_below_and_above_original_length(head_dim, prf, theta):
    length = 2048
    for factor, seq_len in itertools.product(
        FACTORS, (None, 1, length // 2, length, length + 1, 3 * length, 8 * length)
    ):
        params = {"rope_type": "dynamic", "factor": factor, **base(theta, prf)}
        assert_matches_hf(params, head_dim=head_dim, max_pos=length, seq_len=seq_len)


YARN_VARIANTS = (
    {},
    {"truncate": False},
    {"truncate": True},
    {"mscale": 1.0, "mscale_all_dim": 1.0},
    {"mscale": 0.707, "mscale_all_dim": 1.0},
    {"mscale": 1.0, "mscale_all_dim": 0.0},
    {"beta_fast": 64, "beta_slow": 2, "truncate": False},
    {"attention_factor": 1.5},
)


@pytest.mark.parametrize(("head_dim", "prf", "theta"), SHAPES)
def test_yarn(head_dim, prf, theta):
    for factor, variant, original in itertools.product(FACTORS, YARN_VARIANTS, (2048, 4096)):
        params = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original}
        params.update(base(theta, prf), **variant)
        assert_matches_hf(params, head_dim=head_dim, max_pos=int(original * factor))


def monotone_factors(pairs: int, top: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return sorted(round(rng.uniform(1.0, top), 2) for _ in range(pairs))


@pytest.mark.parametrize(("head_dim", "prf", "theta"), SHAPES)
def test_longrope_both_sides_of_the_switch(head_dim, prf, theta):
    original = 4096
    pairs = int(head_dim * prf) // 2
    for seed, factor in enumerate(FACTORS):
        long_factor, short_factor = monotone_factors(pairs, 1.25 * factor, seed), monotone_factors(pairs, 1.1, -seed)
        params = {
            "rope_type": "longrope",
            "long_factor": long_factor,
            "short_factor": short_factor,
            "original_max_position_embeddings": original,
            **base(theta, prf),
        }
        target = int(original * factor)
        for extra, seq_len in itertools.product(
            ({}, {"factor": factor}, {"attention_factor": 1.3}), (None, 1, original, original + 1, target)
        ):
            assert_matches_hf({**params, **extra}, head_dim=head_dim, max_pos=target, seq_len=seq_len)


@pytest.mark.parametrize(("head_dim", "prf", "theta"), SHAPES)
def test_llama3(head_dim, prf, theta):
    bands = ((1.0, 4.0), (2.0, 8.0), (0.5, 1.0))
    for factor, (low, high), original in itertools.product(FACTORS, bands, (2048, 8192)):
        params = {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low,
            "high_freq_factor": high,
            "original_max_position_embeddings": original,
            **base(theta, prf),
        }
        assert_matches_hf(params, head_dim=head_dim, max_pos=int(original * factor))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_ntk_equals_default_with_changed_base(head_dim):
    """Second formulation: transformers has no static NTK type; its `default` with theta * a^(d/(d-2)) is it."""
    for theta, alpha in itertools.product(THETAS, FACTORS):
        ours = from_hf(
            {"rope_type": "ntk", "factor": alpha, "rope_theta": theta}, head_dim=head_dim, max_position_embeddings=4096
        )
        reference = {"rope_type": "default", "rope_theta": theta * alpha ** (head_dim / (head_dim - 2))}
        ref_inv_freq, _ = hf_inv_freq(reference, head_dim=head_dim, max_position_embeddings=4096)
        torch.testing.assert_close(ours.inv_freq(), ref_inv_freq, rtol=1e-6, atol=0)
        assert ours.to_hf() == reference


ROTARY_MODULE_CASES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    "llama3": {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
    "longrope": {
        "rope_type": "longrope",
        "long_factor": monotone_factors(32, 5.0, 1),
        "short_factor": monotone_factors(32, 1.1, 2),
        "original_max_position_embeddings": 256,
    },
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
}


@pytest.mark.parametrize("name", sorted(ROTARY_MODULE_CASES))
@pytest.mark.parametrize("length", [100, 256, 257, 1024])
def test_cos_sin_equal_transformers_rotary_module(name, length):
    """End to end: our cos/sin (frequencies, per-length switch, attention factor) equal the HF module's output."""
    params = ROTARY_MODULE_CASES[name]
    max_pos = 256 if name == "dynamic" else 1024
    module = hf_rotary_module(params, head_dim=64, max_position_embeddings=max_pos)
    positions = torch.arange(length)[None]
    ref_cos, ref_sin = module(torch.zeros(1, dtype=torch.float32), positions)
    cos, sin = from_hf(params, head_dim=64, max_position_embeddings=max_pos).cos_sin(positions)
    # Past its original length transformers' dynamic module grows the base in float32 (seq_len is a tensor there);
    # ours is float64, so angles differ by float32 rounding of the base times the position (~1e-7 relative).
    atol = 3e-5 if name == "dynamic" and length > max_pos else 1e-6
    torch.testing.assert_close(cos, ref_cos, rtol=1e-6, atol=atol)
    torch.testing.assert_close(sin, ref_sin, rtol=1e-6, atol=atol)


def test_longrope_switch_is_at_original_length():
    params = ROTARY_MODULE_CASES["longrope"]
    method = from_hf(params, head_dim=64, max_position_embeddings=1024)
    short, long = method.inv_freq(256), method.inv_freq(257)
    theta = method.original_inv_freq()
    torch.testing.assert_close(short, theta / torch.tensor(params["short_factor"]), rtol=1e-6, atol=0)
    torch.testing.assert_close(long, theta / torch.tensor(params["long_factor"]), rtol=1e-6, atol=0)
    torch.testing.assert_close(method.inv_freq(None), short)


# ---- Published test vectors, worked independently of transformers ----
# Each was checked numerically against transformers 5.24 when it was written down; here they are worked from the
# formulas alone, so a change in transformers cannot move both sides of the comparison.


def test_yarn_reference_vector():
    """YaRN (Peng et al. 2023, arXiv 2309.00071; transformers `_compute_yarn_parameters`) at d 128, b 1e4, L0 4096,
    s 8: cdim(r) = d ln(L0 / (2 pi r)) / (2 ln b) gives cdim(32) = 20.944 -> floor 20 and cdim(1) = 45.027 -> ceil
    46; pairs up to 20 kept, from 46 divided by 8, a ramp linear in the pair index between; attention factor
    0.1 ln 8 + 1."""
    method = from_hf(
        {"rope_type": "yarn", "factor": 8, "original_max_position_embeddings": 4096},
        head_dim=128,
        max_position_embeddings=32768,
    )
    low, high = method.correction_range()
    assert (low, high) == (20, 46)
    factors = method.factors()
    assert torch.all(factors[:21] == 1.0)
    assert torch.allclose(factors[46:], torch.tensor(8.0), rtol=1e-6)
    assert [round(float(f), 3) for f in factors[21:23]] == [1.035, 1.072]
    assert round(float(factors[45]), 3) == 6.303
    assert method.attention_factor == 0.1 * math.log(8) + 1 == pytest.approx(1.2079441541679836, abs=1e-15)


def test_llama3_reference_vector():
    """Llama 3.1 (Meta llama-models `models/llama3/model.py` `apply_scaling`; transformers
    `_compute_llama3_parameters`) at d 128, b 5e5, s 8, bands 1 / 4, L0 8192: wavelengths below 2048 tokens kept
    (i <= 28), above 8192 divided by 8 (i >= 35), and between theta' = (1 - g) theta / s + g theta with
    g = (L0 / wavelength - 1) / (4 - 1)."""
    method = from_hf(
        {
            "rope_type": "llama3",
            "factor": 8,
            "low_freq_factor": 1,
            "high_freq_factor": 4,
            "original_max_position_embeddings": 8192,
            "rope_theta": 500000.0,
        },
        head_dim=128,
        max_position_embeddings=131072,
    )
    factors = method.factors()
    assert torch.allclose(factors[:29], torch.tensor(1.0))
    assert [round(float(f), 3) for f in factors[29:35]] == [1.207, 1.553, 2.026, 2.695, 3.684, 5.257]
    assert torch.allclose(factors[35:], torch.tensor(8.0), rtol=1e-6)


def test_dynamic_reference_bases():
    method = from_hf({"rope_type": "dynamic", "factor": 2}, head_dim=128, max_position_embeddings=4096)
    # transformers `_compute_dynamic_ntk_parameters`: b' = b (s L / L0 - (s - 1)) ** (d / (d - 2)); by hand
    # b' = 1e4 * (2 * L / 4096 - 1) ** (128 / 126): 30527.7 at 8192 and 72195.7 at 16384 (the latter as
    # transformers' float32 computation rounds it).
    assert method.scaled_theta(8192) == pytest.approx(1e4 * 3 ** (128 / 126), rel=1e-12)
    assert method.scaled_theta(8192) == pytest.approx(30527.7, abs=0.1)
    assert method.scaled_theta(16384) == pytest.approx(1e4 * 7 ** (128 / 126), rel=1e-12)
    assert method.scaled_theta(16384) == pytest.approx(72195.7, rel=5e-6)
    assert method.scaled_theta(100) == 10000.0


def test_longrope_phi3_attention_factor():
    """transformers `_compute_longrope_parameters` without `factor`: s = max_position_embeddings / L0 (the Phi-3
    convention), attention factor sqrt(1 + ln s / ln L0); Phi-3-mini-128k's s = 131072 / 4096 = 32."""
    method = from_hf(
        {
            "rope_type": "longrope",
            "short_factor": [1.0] * 48,
            "long_factor": [1.0] * 48,
            "original_max_position_embeddings": 4096,
        },
        head_dim=96,
        max_position_embeddings=131072,
    )
    assert method.attention_factor == pytest.approx(1.1902380714238083, rel=1e-15)


def test_deepseek_v3_yarn_cos_sin_factor_is_one():
    """DeepSeek-V3's YaRN block (transformers models/deepseek_v3): the cos/sin factor is
    get_mscale(s, mscale) / get_mscale(s, mscale_all_dim), 1 when the two are equal (its softmax scale carries
    the temperature instead)."""
    method = from_hf(
        {
            "rope_type": "yarn",
            "factor": 40,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
        },
        head_dim=64,
        max_position_embeddings=163840,
    )
    assert method.attention_factor == 1.0
