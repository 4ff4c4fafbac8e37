"""Adding a RoPE method is one class (its file) plus one line in `ROPE_METHODS`: the factory, a model config's
top-level original length, `longrope encodings list` and `longrope encodings factors` all take it from there."""

from __future__ import annotations

import json
import math
from typing import ClassVar

import pytest
import torch
from pydantic import Field

from longrope.encodings import ROPE_METHODS, RopeMethod, from_hf, from_hf_config
from longrope.encodings.catalog import catalog_entries
from longrope.search.cli.main import main


class LongWavesRope(RopeMethod):
    """A method written for this test: the pairs whose period 2 pi / inv_freq_i exceeds the original length are
    interpolated by `factor`; the others are kept (NTK-by-parts with a hard edge)."""

    rope_type: ClassVar[str] = "long_waves"
    summary: ClassVar[str] = "test method: interpolate only the pairs longer than the original length"
    hf_keys: ClassVar[tuple[str, ...]] = ("factor", "original_max_position_embeddings")
    factor: float = Field(ge=1.0)
    original_max_position_embeddings: int = Field(gt=0)

    def inv_freq(self, seq_len: int | None = None) -> torch.Tensor:
        base = self.original_inv_freq()
        long = 2 * math.pi / base > self.original_max_position_embeddings
        return torch.where(long, base / self.factor, base)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(ROPE_METHODS, LongWavesRope.rope_type, LongWavesRope)  # the one registry line


def test_the_factory_builds_it_and_a_model_configs_original_length_reaches_it(registered):
    """head_dim 8, theta 10000: inv_freq 1, 0.1, 0.01, 0.001 (periods 6.3, 63, 628, 6283 tokens); with an original
    length of 16 the last three are interpolated by 4, worked by hand."""
    config = {
        "hidden_size": 32,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        "original_max_position_embeddings": 16,  # top level, as Phi-3 keeps it
        "rope_parameters": {"rope_type": "long_waves", "factor": 4.0, "rope_theta": 10000.0},
    }
    method = from_hf_config(config)
    assert isinstance(method, LongWavesRope) and method.original_max_position_embeddings == 16
    expected = torch.tensor([1.0, 0.1 / 4, 0.01 / 4, 0.001 / 4])
    torch.testing.assert_close(method.inv_freq(), expected, rtol=1e-6, atol=0)
    assert from_hf(method.to_hf(), head_dim=8, max_position_embeddings=64) == method
    assert LongWavesRope.carries_original_length() and not ROPE_METHODS["linear"].carries_original_length()


def test_encodings_list_and_factors_know_it(registered, capsys):
    entry = next(m for m in catalog_entries() if m.name == "long_waves")
    assert (entry.kind, entry.hf_rope_type, entry.summary) == ("rotary", "long_waves", LongWavesRope.summary)
    assert entry.where == f"{__name__}.LongWavesRope"
    args = ["encodings", "factors", "long_waves", "--original-length", "16", "--head-dim", "8", "--factor", "4"]
    assert main(args) == 0
    factors = json.loads(capsys.readouterr().out)
    # as LongRoPE factors: the base frequency over the method's, pair by pair (1, 4, 4, 4)
    assert factors["rope_parameters"]["long_factor"] == pytest.approx([1.0, 4.0, 4.0, 4.0], rel=1e-6)
