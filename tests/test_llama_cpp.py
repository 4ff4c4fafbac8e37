"""llama.cpp's own code applies `export --gguf` as transformers applies the block.

Marked `llama_cpp`: `make test` builds llama-cpp-python 0.3.36 from source into .llama-cpp-site and runs these last,
with LONGROPE_REQUIRE_LLAMA_CPP=1, where a missing llama-cpp-python fails instead of skipping (tests/tiny_gguf.py,
`require_llama_cpp`). A random 2-layer llama (64-dim heads, grouped-query attention, L0 256) is written as an F32
GGUF the way llama.cpp's converter writes it, exported with LongRoPE factors by `write_gguf_export`, and run by
llama.cpp on 1024 random token ids (two of its 512-token batches); the reference is transformers'
`LlamaForCausalLM` of the same weights with the block as its `rope_parameters`, which at 1024 > L0 tokens uses the
long factors, as llama.cpp does at every length. The tolerance (search/export/llama_cpp_row.py) is 2e-3 x max
|logit|; the same comparison with the factors left out, or with the attention factor left out, must miss it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_gguf import pinned_llama_cpp_version, require_llama_cpp, tiny_gguf

from longrope.search.config.factors_file import FactorsFile, LongRopeParameters, Provenance
from longrope.search.export.gguf_export import write_gguf_export
from longrope.search.export.llama_cpp_row import LOGITS_RELATIVE_TOLERANCE, llama_cpp_logits
from longrope.search.export.llama_gguf import vocab_size
from longrope.search.export.verify import verify

pytestmark = pytest.mark.llama_cpp

HEAD_DIM, ORIGINAL, TARGET = 64, 256, 1024
PAIRS = HEAD_DIM // 2
LONG = [1.0 + 3.0 * (i / (PAIRS - 1)) ** 2 for i in range(PAIRS)]  # 1 .. 4, non-decreasing
ATTENTION = 1.25


def factors(attention_factor: float = ATTENTION) -> FactorsFile:
    block = LongRopeParameters(
        rope_theta=10000.0,
        long_factor=LONG,
        short_factor=[1.0] * PAIRS,
        original_max_position_embeddings=ORIGINAL,
        factor=TARGET / ORIGINAL,
        attention_factor=attention_factor,
        short_mscale=attention_factor,  # what vLLM reads (export writes all three): verify's vLLM row agrees too
        long_mscale=attention_factor,
    )
    provenance = Provenance(created_by="test", method="by hand", method_rope_parameters={})
    return FactorsFile(rope_parameters=block, max_position_embeddings=TARGET, provenance=provenance)


def transformers_logits(model, block: LongRopeParameters, ids: list[int]) -> np.ndarray:
    """transformers' own Llama with the block as rope_parameters, on the same weights: the independent reference."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_parameters": block.model_dump(exclude_none=True), "max_position_embeddings": TARGET}
    config = LlamaConfig(**{**model.config.to_dict(), **rope})
    scaled = LlamaForCausalLM(config).float().eval()
    scaled.load_state_dict(model.state_dict())
    assert scaled.config.rope_parameters["rope_type"] == "longrope"
    with torch.no_grad():
        return scaled(input_ids=torch.tensor([ids])).logits[0].numpy()


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """(folder, the plain GGUF, its transformers model, the token ids, transformers' logits with the block)."""
    require_llama_cpp()
    folder = tmp_path_factory.mktemp("llama-cpp")
    plain, model = tiny_gguf(folder / "plain.gguf", head_dim=HEAD_DIM, original=ORIGINAL)
    ids = torch.randint(0, vocab_size(), (TARGET,), generator=torch.Generator().manual_seed(1)).tolist()
    return folder, plain, model, ids, transformers_logits(model, factors().rope_parameters, ids)


def tolerance(reference: np.ndarray) -> float:
    return LOGITS_RELATIVE_TOLERANCE * max(1.0, float(np.abs(reference).max()))


def test_llama_cpp_logits_on_the_export_equal_transformers(setting):
    folder, plain, _, ids, reference = setting
    exported = folder / "factors.gguf"
    write_gguf_export(factors(), plain, exported)
    diff = float(np.abs(llama_cpp_logits(exported, ids) - reference).max())
    print(f"llama.cpp vs transformers: max |diff| {diff:.2e}, tolerance {tolerance(reference):.2e}")
    assert diff <= tolerance(reference)


def test_the_tolerance_catches_a_gguf_without_the_factors(setting):
    _, plain, _, ids, reference = setting
    diff = float(np.abs(llama_cpp_logits(plain, ids) - reference).max())
    print(f"without the factors: max |diff| {diff:.2e}")
    assert diff > 10 * tolerance(reference), diff


def test_llama_cpp_reads_the_attention_factor(setting):
    """The same factors exported with attention factor 1: llama.cpp's logits move away from transformers' (with
    1.25), so the 1.25 that matched above came from llama.rope.scaling.attn_factor."""
    folder, plain, _, ids, reference = setting
    unscaled = folder / "unscaled.gguf"
    write_gguf_export(factors(attention_factor=1.0), plain, unscaled)
    diff = float(np.abs(llama_cpp_logits(unscaled, ids) - reference).max())
    print(f"without the attention factor: max |diff| {diff:.2e}")
    assert diff > 10 * tolerance(reference), diff


def test_verify_runs_llama_cpp_for_its_row(setting, tmp_path):
    _, _, model, _, _ = setting
    model.save_pretrained(tmp_path / "model")
    path = tmp_path / "factors.json"
    path.write_text(factors().model_dump_json())
    report = verify(factors(), str(path), tmp_path / "model")
    row = report.checks[2]
    assert row.runtime == "llama.cpp" and row.source.startswith(f"llama-cpp-python {pinned_llama_cpp_version()}:")
    assert row.logits_max_diff is not None and row.logits_max_diff <= row.logits_tolerance and row.ok
    assert report.ok, [check.line() for check in report.checks]
