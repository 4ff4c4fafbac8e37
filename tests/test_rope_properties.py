"""Properties of the RoPE family that hold whatever the implementation: checked by second formulations."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from longrope.encodings import (
    EncodingConfigError,
    LinearRope,
    LongRope,
    NtkRope,
    RopeMethod,
    YarnRope,
    apply_rotary,
    from_hf,
    rotary_cos_sin,
)
from longrope.encodings.baselines import baseline_methods, seed_names, tuned_names
from longrope.encodings.rope_methods import batch_cos_sin, registry
from longrope.encodings.rotary import interleaved_to_rotate_half_permutation

HEAD_DIM = 64


def methods() -> list[RopeMethod]:
    common = {"head_dim": HEAD_DIM, "max_position_embeddings": 4096}
    return [
        RopeMethod(**common),
        LinearRope(factor=4.0, **common),
        NtkRope(factor=8.0, **common),
        YarnRope(factor=8.0, original_max_position_embeddings=512, **common),
        LongRope.from_factors(torch.linspace(1.0, 9.0, 32), head_dim=HEAD_DIM, original_length=512, target_length=4096),
    ]


def score(q: torch.Tensor, k: torch.Tensor, method: RopeMethod, p: int, p_key: int, layout: str) -> torch.Tensor:
    positions = torch.tensor([p, p_key])
    cos, sin = rotary_cos_sin(method.inv_freq(4096), positions, attention_factor=method.attention_factor, layout=layout)
    q_rot = apply_rotary(q, cos[:, :1], sin[:, :1], layout=layout, head_axis=None)
    k_rot = apply_rotary(k, cos[:, 1:], sin[:, 1:], layout=layout, head_axis=None)
    return (q_rot * k_rot).sum()


@pytest.mark.parametrize("layout", ["rotate_half", "interleaved"])
@pytest.mark.parametrize("method", methods(), ids=lambda m: m.rope_type)
def test_scores_depend_only_on_relative_position(method, layout, generator):
    q, k = torch.randn(2, 1, 1, HEAD_DIM, generator=generator, dtype=torch.float64).float()
    for p, p_key, shift in ((5, 2, 100), (700, 0, 3000), (17, 17, 1234)):
        torch.testing.assert_close(
            score(q, k, method, p, p_key, layout),
            score(q, k, method, p + shift, p_key + shift, layout),
            rtol=2e-4,
            atol=2e-4,
        )


def test_pi_equals_dividing_positions_by_factor():
    pi = LinearRope(head_dim=HEAD_DIM, max_position_embeddings=4096, factor=4.0)
    plain = RopeMethod(head_dim=HEAD_DIM, max_position_embeddings=4096)
    positions = torch.arange(0, 4096, 7)
    cos, sin = pi.cos_sin(positions)
    cos_ref, sin_ref = rotary_cos_sin(plain.inv_freq(), positions.double() / 4.0)
    torch.testing.assert_close(cos, cos_ref, rtol=0, atol=2e-5)
    torch.testing.assert_close(sin, sin_ref, rtol=0, atol=2e-5)


@pytest.mark.parametrize("alpha", [2.0, 8.0, 64.0])
def test_ntk_keeps_highest_frequency_and_divides_lowest_by_alpha(alpha):
    factors = NtkRope(head_dim=128, max_position_embeddings=4096, factor=alpha).factors()
    assert factors[0] == 1.0
    assert float(factors[-1]) == pytest.approx(alpha, rel=1e-5)
    assert torch.all(factors[1:] >= factors[:-1])


def meta_interleaved_rope(x: torch.Tensor, inv_freq: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Meta's original formulation: pairs (2i, 2i+1) as complex numbers times polar(1, p * theta_i)."""
    freqs_cis = torch.polar(torch.ones(len(positions), len(inv_freq)), positions[:, None].float() * inv_freq)
    x_complex = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_complex * freqs_cis).flatten(-2)


def test_interleaved_layout_equals_meta_complex_form(generator):
    positions = torch.arange(50)
    x = torch.randn(50, HEAD_DIM, generator=generator)
    inv_freq = YarnRope(
        head_dim=HEAD_DIM, max_position_embeddings=4096, factor=4, original_max_position_embeddings=1024
    ).inv_freq()
    cos, sin = rotary_cos_sin(inv_freq, positions, layout="interleaved")
    ours = apply_rotary(x, cos[0], sin[0], layout="interleaved", head_axis=None)
    torch.testing.assert_close(ours, meta_interleaved_rope(x, inv_freq, positions), rtol=1e-5, atol=1e-5)


def test_rotate_half_layout_equals_transformers_apply(generator):
    q, k = torch.randn(2, 2, 4, 30, HEAD_DIM, generator=generator)
    cos, sin = methods()[3].cos_sin(torch.arange(30)[None].expand(2, -1))
    ref_q, ref_k = apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(apply_rotary(q, cos, sin), ref_q)
    torch.testing.assert_close(apply_rotary(k, cos, sin), ref_k)


def test_interleaved_and_rotate_half_agree_after_weight_permutation(generator):
    """A Meta-layout checkpoint run interleaved scores like its HF-permuted copy run rotate-half."""
    heads, d_in, length = 3, 40, 25
    w_q, w_k = torch.randn(2, heads * HEAD_DIM, d_in, generator=generator)
    x = torch.randn(length, d_in, generator=generator)
    perm = interleaved_to_rotate_half_permutation(HEAD_DIM)
    permute_rows = torch.cat([h * HEAD_DIM + perm for h in range(heads)])
    cos_i, sin_i = methods()[1].cos_sin(torch.arange(length), layout="interleaved")
    cos_h, sin_h = methods()[1].cos_sin(torch.arange(length), layout="rotate_half")

    def scores(w_q, w_k, cos, sin, layout):
        q = (x @ w_q.T).view(length, heads, HEAD_DIM).transpose(0, 1)
        k = (x @ w_k.T).view(length, heads, HEAD_DIM).transpose(0, 1)
        q, k = (
            apply_rotary(q, cos, sin, layout=layout, head_axis=0),
            apply_rotary(k, cos, sin, layout=layout, head_axis=0),
        )
        return q @ k.transpose(-1, -2)

    interleaved = scores(w_q, w_k, cos_i[0], sin_i[0], "interleaved")
    rotate_half = scores(w_q[permute_rows], w_k[permute_rows], cos_h[0], sin_h[0], "rotate_half")
    torch.testing.assert_close(interleaved, rotate_half, rtol=1e-4, atol=1e-4)


def test_partial_rotary_leaves_the_tail_unrotated(generator):
    method = RopeMethod(head_dim=HEAD_DIM, max_position_embeddings=4096, partial_rotary_factor=0.25)
    x = torch.randn(1, 2, 10, HEAD_DIM, generator=generator)
    cos, sin = method.cos_sin(torch.arange(10))
    assert cos.shape[-1] == 16
    rotated = apply_rotary(x, cos, sin)
    torch.testing.assert_close(rotated[..., 16:], x[..., 16:], rtol=0, atol=0)
    assert not torch.allclose(rotated[..., 1:, :16], x[..., 1:, :16])


@pytest.mark.parametrize("layout", ["rotate_half", "interleaved"])
def test_batched_cos_sin_equal_per_candidate(layout):
    candidates = [
        *methods()[1:],
        LongRope.from_factors(
            torch.linspace(1.0, 5.0, 32),
            head_dim=HEAD_DIM,
            original_length=512,
            target_length=4096,
            n_hat=16,
            attention_factor=1.3,
        ),
    ]
    positions = torch.arange(600)
    cos, sin = batch_cos_sin(candidates, positions, layout=layout)
    assert cos.shape == (len(candidates), 600, HEAD_DIM)
    for row, method in enumerate(candidates):
        one_cos, one_sin = method.cos_sin(positions, layout=layout)
        torch.testing.assert_close(cos[row], one_cos[0], rtol=0, atol=0)
        torch.testing.assert_close(sin[row], one_sin[0], rtol=0, atol=0)


def test_n_hat_positions_use_original_frequencies():
    n_hat = 8
    method = LongRope.from_factors(
        torch.linspace(1.0, 9.0, 32), head_dim=HEAD_DIM, original_length=512, target_length=4096, n_hat=n_hat
    )
    plain = RopeMethod(head_dim=HEAD_DIM, max_position_embeddings=4096)
    positions = torch.arange(1000)
    cos, sin = method.cos_sin(positions)
    plain_cos, plain_sin = plain.cos_sin(positions)
    torch.testing.assert_close(cos[:, :n_hat], plain_cos[:, :n_hat], rtol=0, atol=0)
    torch.testing.assert_close(sin[:, :n_hat], plain_sin[:, :n_hat], rtol=0, atol=0)
    scaled_cos, _ = rotary_cos_sin(method.inv_freq(1000), positions, attention_factor=method.attention_factor)
    torch.testing.assert_close(cos[:, n_hat:], scaled_cos[:, n_hat:], rtol=0, atol=0)
    assert not torch.allclose(cos[:, n_hat:], plain_cos[:, n_hat:])


def test_attention_factor_scales_logits_by_its_square(generator):
    q, k = torch.randn(2, 1, 1, HEAD_DIM, generator=generator)
    base = LongRope.from_factors(
        torch.ones(32), head_dim=HEAD_DIM, original_length=512, target_length=4096, attention_factor=1.0
    )
    hot = base.model_copy(update={"attention_factor_override": 1.5})
    ratio = score(q, k, hot, 300, 100, "rotate_half") / score(q, k, base, 300, 100, "rotate_half")
    assert float(ratio) == pytest.approx(2.25, rel=1e-5)


@pytest.mark.parametrize("method", methods(), ids=lambda m: m.rope_type)
def test_round_trip_through_transformers_dict(method):
    from longrope.encodings import from_hf

    again = from_hf(method.to_hf(), head_dim=method.head_dim, max_position_embeddings=method.max_position_embeddings)
    torch.testing.assert_close(again.inv_freq(4096), method.inv_freq(4096), rtol=0, atol=0)
    assert again.attention_factor == method.attention_factor


def test_the_nominal_closed_forms_are_their_published_settings():
    """At 8x of 128 tokens, as transformers states each (theta 1e4, head_dim 64): PI, Dynamic NTK (read at its
    original length), YaRN with its own betas and Llama 3.1's bands 1 / 4; NTK-aware is `default` with theta x
    8^(64/62); plain RoPE unchanged; only PI, NTK, YaRN and Llama 3 seed a search, only NTK and YaRN are tuned."""
    methods = baseline_methods(head_dim=64, rope_theta=1e4, partial_rotary_factor=1.0, original=128, target=1024)
    original = {"original_max_position_embeddings": 128}
    assert {name: method.to_hf() for name, method in methods.items()} == {
        "none": {"rope_type": "default", "rope_theta": 1e4},
        "pi": {"rope_type": "linear", "rope_theta": 1e4, "factor": 8.0},
        "ntk": {"rope_type": "default", "rope_theta": pytest.approx(1e4 * 8 ** (64 / 62), rel=1e-12)},
        "dynamic": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 8.0},
        "yarn": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0, **original},
        "llama3": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, **original},
    }  # fmt: skip
    assert [m.max_position_embeddings for m in methods.values()] == [1024, 1024, 1024, 128, 1024, 1024]
    assert seed_names() == ("pi", "ntk", "yarn", "llama3") and tuned_names() == ("ntk", "yarn")


def test_the_registry_refuses_a_method_without_a_baseline_name_of_its_own():
    class Forgetful(LinearRope):  # inherits PI's baseline name
        rope_type: ClassVar[str] = "forgetful"

    with pytest.raises(TypeError, match="two methods share the baseline 'pi'"):
        registry(RopeMethod, LinearRope, Forgetful)


@pytest.mark.parametrize(("fast", "slow", "message"), [(1, 32, r"\(32\), got 1 "), (0.5, None, r"\(1\), got 0.5 ")])
def test_yarn_refuses_a_ramp_that_runs_backwards(fast, slow, message):
    """beta_fast counts the rotations of the pairs kept, beta_slow of those interpolated: fast at or below slow
    (given, or the default 1) would put the kept pairs past the interpolated ones."""
    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": fast}
    with pytest.raises(EncodingConfigError, match=r"beta_fast: must be greater than beta_slow " + message):
        from_hf({**params, "beta_slow": slow}, head_dim=32, max_position_embeddings=256)
