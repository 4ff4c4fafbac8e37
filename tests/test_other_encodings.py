"""ALiBi, CoPE, sinusoidal, learned absolute, NoPE, 2D axial RoPE and M-RoPE."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from transformers import Qwen2VLConfig
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.distilbert.modeling_distilbert import create_sinusoidal_embeddings
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding, Qwen2VLVisionRotaryEmbedding
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

from longrope.encodings import PositionOutOfRangeError, RopeMethod, rotary_cos_sin
from longrope.encodings.absolute import LearnedAbsoluteEncoding, SinusoidalEncoding, sinusoidal_table
from longrope.encodings.alibi import ALiBiEncoding, alibi_bias, alibi_slopes
from longrope.encodings.catalog import catalog_entries
from longrope.encodings.cope import CoPE, CoPEEncoding, cope_positions
from longrope.encodings.interface import NoPE, PositionalEncoding, RotaryEncoding, reference_attention
from longrope.encodings.multi_axis import Axial2DRopeEncoding, MRopeEncoding, axial_2d_cos_sin, mrope_cos_sin

# ---- ALiBi ----


def test_alibi_slopes_hand_values():
    assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]
    assert alibi_slopes(6).tolist() == pytest.approx([1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8])
    assert alibi_slopes(12).tolist() == pytest.approx(
        [2.0**-k for k in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    )
    assert alibi_slopes(1).tolist() == [1 / 256]


@pytest.mark.parametrize("n_heads", range(1, 129))
def test_alibi_slopes_match_closed_form_and_bloom(n_heads):
    slopes = alibi_slopes(n_heads)
    if n_heads & (n_heads - 1) == 0:
        closed = torch.tensor([2 ** (-8 * h / n_heads) for h in range(1, n_heads + 1)])
        torch.testing.assert_close(slopes, closed)
    bloom = build_alibi_tensor(torch.ones(1, 2), n_heads, torch.float32)[:, 0, 1]  # slope * (position 1)
    torch.testing.assert_close(slopes, bloom, rtol=1e-6, atol=0)


def test_alibi_bias_causal_and_symmetric():
    causal, symmetric = alibi_bias(4, 5, 5, causal=True), alibi_bias(4, 5, 5, causal=False)
    slopes = alibi_slopes(4)
    for i in range(5):
        for j in range(5):
            torch.testing.assert_close(symmetric[:, i, j], -slopes * abs(i - j))
            if j <= i:
                torch.testing.assert_close(causal[:, i, j], -slopes * (i - j))


def test_alibi_attention_equals_reference_key_index_form(generator):
    """The paper's code adds +m*j to every row; under a causal mask softmax makes that the same attention."""
    q, k, v = torch.randn(3, 1, 4, 7, 16, generator=generator)
    ours = reference_attention(q, k, v, ALiBiEncoding(4), torch.arange(7))
    key_form = alibi_slopes(4)[:, None, None] * torch.arange(7.0)[None, None, :]
    logits = q @ k.transpose(-1, -2) / 4 + key_form
    logits = logits.masked_fill(torch.ones(7, 7).triu(1).bool(), float("-inf"))
    torch.testing.assert_close(ours, torch.softmax(logits, -1) @ v, rtol=1e-5, atol=1e-6)


# ---- CoPE ----


def test_cope_positions_count_gated_keys():
    """With gates saturated open on chosen keys and shut elsewhere, a position counts the open keys from j to i."""
    open_keys = torch.tensor([1, 0, 0, 1, 1, 0, 1, 0], dtype=torch.bool)
    gate_logits = torch.where(open_keys, 60.0, -60.0).expand(8, 8)
    mask = torch.ones(8, 8).tril()
    positions = cope_positions(gate_logits, mask, npos_max=100)
    for i in range(8):
        for j in range(i + 1):
            assert float(positions[i, j]) == pytest.approx(int(open_keys[j : i + 1].sum()), abs=1e-6)
        assert torch.all(positions[i, i + 1 :] == 0)


def test_cope_logits_interpolate_between_integer_positions(generator):
    cope = CoPE(npos_max=12, head_dim=8)
    with torch.no_grad():
        cope.pos_emb.normal_(generator=generator)
    q = torch.randn(1, 1, 6, 8, generator=generator)
    gate_logits = torch.randn(1, 1, 6, 6, generator=generator)
    mask = torch.ones(6, 6).tril()
    with torch.no_grad():
        out = cope(q, gate_logits, mask)
    positions = cope_positions(gate_logits, mask, 12)
    for i in range(6):
        for j in range(6):
            p = float(positions[0, 0, i, j])
            low, frac = math.floor(p), p - math.floor(p)
            table = cope.pos_emb.detach()
            emb = table[:, low] * (1 - frac) + table[:, min(low + 1, 11)] * frac
            assert float(out[0, 0, i, j]) == pytest.approx(float(q[0, 0, i] @ emb), abs=1e-5)


def test_cope_gradients_flow_to_table_queries_and_keys(generator):
    encoding = CoPEEncoding(npos_max=9, head_dim=8)
    with torch.no_grad():
        encoding.cope.pos_emb.normal_(generator=generator)
    q, k, v = (torch.randn(1, 2, 8, 8, generator=generator).requires_grad_() for _ in range(3))
    reference_attention(q, k, v, encoding, torch.arange(8)).square().sum().backward()
    for tensor in (encoding.cope.pos_emb, q, k):
        assert tensor.grad is not None and float(tensor.grad.abs().sum()) > 0
    # keys reach CoPE only through the gates: with attention's own k path cut, k still gets a gradient
    k2 = k.detach().requires_grad_()
    encoding.attention_bias(q.detach(), k2).sum().backward()
    assert float(k2.grad.abs().sum()) > 0


# ---- absolute encodings, NoPE ----


def test_sinusoidal_matches_paper_and_distilbert():
    table = sinusoidal_table(torch.arange(50), 16)
    assert float(table[1, 0]) == pytest.approx(math.sin(1.0))
    assert float(table[1, 1]) == pytest.approx(math.cos(1.0))
    assert float(table[3, 2]) == pytest.approx(math.sin(3 / 10000 ** (2 / 16)))
    distilbert = create_sinusoidal_embeddings(50, 16, torch.empty(50, 16))
    torch.testing.assert_close(table, distilbert)
    x = torch.zeros(2, 50, 16)
    torch.testing.assert_close(SinusoidalEncoding(16).add_to_embeddings(x, torch.arange(50)), table.expand(2, -1, -1))


def test_learned_absolute_past_its_length_raises_the_projects_error():
    encoding = LearnedAbsoluteEncoding(max_positions=32, d_model=8)
    out = encoding.add_to_embeddings(torch.zeros(1, 32, 8), torch.arange(32))
    torch.testing.assert_close(out[0], encoding.table.weight)
    with pytest.raises(PositionOutOfRangeError, match=r"cover 0\.\.31; got position 40"):
        encoding.add_to_embeddings(torch.zeros(1, 41, 8), torch.arange(41))


def test_nope_encoder_is_permutation_equivariant(generator):
    """Without a mask and without positions, attention cannot tell token order: permuting inputs permutes outputs."""
    q, k, v = torch.randn(3, 1, 2, 6, 8, generator=generator)
    perm = torch.randperm(6, generator=generator)
    out = reference_attention(q, k, v, NoPE(), torch.arange(6), causal=False)
    out_perm = reference_attention(
        q[..., perm, :], k[..., perm, :], v[..., perm, :], NoPE(), torch.arange(6), causal=False
    )
    torch.testing.assert_close(out_perm, out[..., perm, :])


def test_catalog_names_real_classes_of_the_stated_kind():
    for info in catalog_entries():
        module_name, _, attr = info.where.rpartition(".")
        target = getattr(importlib.import_module(f"longrope.encodings.{module_name}"), attr)
        if isinstance(target, type) and issubclass(target, PositionalEncoding):
            assert target.kind == info.kind, info.name
        else:
            assert info.kind == "rotary", info.name  # the RoPE methods plug in through RotaryEncoding
    assert {
        "sinusoidal",
        "learned",
        "alibi",
        "default",
        "nope",
        "linear",
        "ntk",
        "dynamic",
        "yarn",
        "longrope",
        "llama3",
        "mrope",
        "axial_2d",
        "cope",
    } <= {m.name for m in catalog_entries()}


# ---- M-RoPE and 2D axial RoPE ----


def test_mrope_with_equal_axes_equals_1d_rope():
    inv_freq = RopeMethod(head_dim=128, max_position_embeddings=4096, rope_theta=1e6).inv_freq()
    positions = torch.arange(300)[None].expand(2, -1)
    for interleaved, section in ((False, [16, 24, 24]), (True, [24, 20, 20])):
        cos, sin = mrope_cos_sin(inv_freq, positions[None].expand(3, -1, -1), section, interleaved=interleaved)
        ref_cos, ref_sin = rotary_cos_sin(inv_freq, positions)
        torch.testing.assert_close(cos, ref_cos, rtol=0, atol=0)
        torch.testing.assert_close(sin, ref_sin, rtol=0, atol=0)


def random_thw(generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 500, (3, 2, 40), generator=generator)


def test_mrope_matches_qwen2_vl(generator):
    config = Qwen2VLConfig(
        hidden_size=512,
        num_attention_heads=4,
        rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1e6},
    )
    position_ids = random_thw(generator)
    ref_cos, ref_sin = Qwen2VLRotaryEmbedding(config.text_config)(torch.zeros(1), position_ids)
    inv_freq = RopeMethod(head_dim=128, max_position_embeddings=4096, rope_theta=1e6).inv_freq()
    cos, sin = mrope_cos_sin(inv_freq, position_ids, [16, 24, 24])
    torch.testing.assert_close(cos, ref_cos)
    torch.testing.assert_close(sin, ref_sin)


def test_mrope_interleaved_matches_qwen3_vl(generator):
    config = Qwen3VLTextConfig(
        hidden_size=512,
        num_attention_heads=4,
        head_dim=128,
        rope_parameters={
            "rope_type": "default",
            "mrope_section": [24, 20, 20],
            "mrope_interleaved": True,
            "rope_theta": 5e5,
        },
    )
    position_ids = random_thw(generator)
    ref_cos, ref_sin = Qwen3VLTextRotaryEmbedding(config)(torch.zeros(1), position_ids)
    inv_freq = RopeMethod(head_dim=128, max_position_embeddings=4096, rope_theta=5e5).inv_freq()
    cos, sin = mrope_cos_sin(inv_freq, position_ids, [24, 20, 20], interleaved=True)
    torch.testing.assert_close(cos, ref_cos)
    torch.testing.assert_close(sin, ref_sin)


def test_axial_2d_matches_qwen2_vl_vision(generator):
    config = Qwen2VLVisionConfig(embed_dim=320, num_heads=4)  # head_dim 80
    position_ids = torch.randint(0, 40, (2, 64), generator=generator)
    ref_cos, ref_sin = Qwen2VLVisionRotaryEmbedding(config)(torch.zeros(1), position_ids.T)  # HF takes [N, 2]
    cos, sin = axial_2d_cos_sin(position_ids, head_dim=80)
    torch.testing.assert_close(cos, ref_cos)
    torch.testing.assert_close(sin, ref_sin)


def test_axial_2d_scores_depend_only_on_2d_offset(generator):
    q, k = torch.randn(2, 1, 1, 1, 32, generator=generator)
    encoding = Axial2DRopeEncoding(head_dim=32)

    def score(query_rc, key_rc):
        positions = torch.tensor([query_rc, key_rc]).T  # [2, 2]: rows, cols
        q_rot, k_rot = encoding.rotate(q.expand(1, 1, 2, 32), k.expand(1, 1, 2, 32), positions)
        return float(q_rot[0, 0, 0] @ k_rot[0, 0, 1])

    assert score((3, 4), (1, 1)) == pytest.approx(score((13, 24), (11, 21)), abs=1e-4)
    assert score((3, 4), (1, 1)) != pytest.approx(score((4, 3), (1, 1)), abs=1e-4)


def test_multi_axis_and_rotary_encodings_plug_into_attention(generator):
    q, k, v = torch.randn(3, 1, 2, 10, 128, generator=generator)
    method = RopeMethod(head_dim=128, max_position_embeddings=4096)
    text_positions = torch.arange(10)[None]
    one_d = reference_attention(q, k, v, RotaryEncoding(method), text_positions)
    m_rope = reference_attention(q, k, v, MRopeEncoding(method, [16, 24, 24]), text_positions[None].expand(3, -1, -1))
    torch.testing.assert_close(m_rope, one_d)
