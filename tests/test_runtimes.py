"""Exports that both runtimes apply exactly: short_mscale / long_mscale, vLLM's fixed regime, `longrope verify`."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from cli_checks import write_factors_file
from search_helpers import JOB_RECORD, finished_run

from longrope.encodings import LongRope, from_hf
from longrope.search.cli.main import main
from longrope.search.config.factors_file import FactorsFile, read_factors_file
from longrope.search.export import verify as verify_module
from longrope.search.export.verify import verify, vllm_stand_in_tables

HEAD_DIM, PAIRS, ORIGINAL, TARGET = 32, 16, 64, 512
SEARCHED = [1.0 + 0.25 * i for i in range(PAIRS)]


def searched(attention_factor: float | None = 1.37) -> LongRope:
    return LongRope.from_factors(
        SEARCHED, head_dim=HEAD_DIM, original_length=ORIGINAL, target_length=TARGET, attention_factor=attention_factor
    )


def factors_file(method: LongRope, path) -> str:
    block = method.to_hf()
    provenance = {"created_by": "test", "method": "longrope", "method_rope_parameters": block}
    path = write_factors_file(
        path, block, max_position_embeddings=method.max_position_embeddings, provenance=provenance
    )
    return str(path)


def test_export_writes_one_scale_for_both_runtimes(tmp_path):
    run_dir = finished_run(tmp_path / "run")
    (run_dir / "job.json").write_text(json.dumps(JOB_RECORD))
    assert main(["export", str(run_dir), "-o", str(tmp_path / "f.json")]) == 0
    block = json.loads((tmp_path / "f.json").read_text())["rope_parameters"]
    assert block["short_mscale"] == block["long_mscale"] == block["attention_factor"]
    assert block["factor"] == JOB_RECORD["target_length"] / JOB_RECORD["original_length"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the keys are known everywhere we read a longrope block
        method = from_hf(block, head_dim=HEAD_DIM, max_position_embeddings=JOB_RECORD["target_length"])
    assert method.vllm_mscale(long=True) == method.vllm_mscale(long=False) == method.attention_factor


def test_vllm_default_mscale_is_not_a_searched_attention_factor():
    method = searched(1.37)
    default = math.sqrt(1 + math.log(TARGET / ORIGINAL) / math.log(ORIGINAL))  # vLLM's, from P / L0
    assert method.vllm_mscale(long=True) == pytest.approx(default)
    assert method.for_both_runtimes().vllm_mscale(long=True) == 1.37
    assert method.for_both_runtimes().attention_factor == method.attention_factor == 1.37


def test_vllm_stand_in_tables_worked_by_hand():
    block = searched(1.37).for_both_runtimes().to_hf()
    tables = vllm_stand_in_tables(block, rotary_dim=HEAD_DIM, max_position=TARGET)
    cos_long, sin_long = tables["long"]
    cos_short, _ = tables["short"]
    assert cos_long.shape == (TARGET, PAIRS) and cos_short.shape == (ORIGINAL, PAIRS)
    pair, position = 3, 300
    angle = position / (SEARCHED[pair] * 10000.0 ** (2 * pair / HEAD_DIM))
    assert float(cos_long[position, pair]) == pytest.approx(1.37 * math.cos(angle), abs=1e-5)
    assert float(sin_long[position, pair]) == pytest.approx(1.37 * math.sin(angle), abs=1e-5)
    angle = 50 / 10000.0 ** (2 * pair / HEAD_DIM)  # short table: short factors (ones)
    assert float(cos_short[50, pair]) == pytest.approx(1.37 * math.cos(angle), abs=1e-5)


def test_vllm_regime_applies_long_factors_and_long_mscale_at_short_lengths():
    method = searched(1.37)
    positions = torch.arange(ORIGINAL)[None]
    vllm_cos, _ = method.vllm_regime().cos_sin(positions)  # a short prompt: max position + 1 = L0
    long_cos, _ = method.cos_sin(positions, seq_len=TARGET)  # what transformers applies past L0
    short_cos, _ = method.cos_sin(positions)  # what transformers applies to this prompt
    torch.testing.assert_close(vllm_cos, long_cos * method.vllm_mscale(long=True) / method.attention_factor)
    assert not torch.allclose(vllm_cos, short_cos)


@pytest.fixture(scope="module")
def model_64(tmp_path_factory):
    from conftest import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=ORIGINAL, layers=1)


def test_verify_passes_for_an_export_with_a_searched_attention_factor(model_64, tmp_path, capsys):
    path = factors_file(searched(1.37).for_both_runtimes(), tmp_path / "f.json")
    assert main(["verify", path, "--model", str(model_64)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("transformers") and lines[1].startswith("vllm")
    assert all(line.endswith(": match") for line in lines)
    report = verify(read_factors_file(path), path, model_64)
    transformers_check, vllm_check = report.checks
    assert max(transformers_check.cos_sin_max_diff.values()) < 1e-5
    assert transformers_check.logits_max_diff is not None and transformers_check.logits_max_diff < 1e-4
    assert max(vllm_check.cos_sin_max_diff.values()) < 1e-5


def test_verify_fails_when_vllm_would_apply_its_default_mscale(model_64, tmp_path, capsys):
    """The block transformers reads as 1.37 but without the mscales vLLM reads: vLLM's scale differs."""
    path = factors_file(searched(1.37), tmp_path / "f.json")
    assert "long_mscale" not in read_factors_file(path).rope_parameters.model_dump(exclude_none=True)
    assert main(["verify", path, "--model", str(model_64), "--no-logits"]) == 1
    out = capsys.readouterr().out
    assert "transformers" in out and out.splitlines()[1].endswith("MISMATCH")
    report = verify(read_factors_file(path), path, model_64, logits=False)
    default = math.sqrt(1 + math.log(TARGET / ORIGINAL) / math.log(ORIGINAL))
    assert report.checks[1].cos_sin_max_diff["long"] == pytest.approx(1.37 - default, abs=1e-3)


def test_verify_catches_a_scorer_that_departs_from_transformers(model_64, tmp_path, monkeypatch):
    """With our side perturbed (one pair's factor), cos/sin and logits both report the difference."""
    path = factors_file(searched(1.37).for_both_runtimes(), tmp_path / "f.json")
    real = verify_module.our_method

    def perturbed(factors: FactorsFile, hf_config):
        method = real(factors, hf_config)
        long = list(method.long_factor)
        long[-1] *= 1.5
        return method.model_copy(update={"long_factor": long})

    monkeypatch.setattr(verify_module, "our_method", perturbed)
    report = verify(read_factors_file(path), path, model_64)
    transformers_check = report.checks[0]
    assert not report.ok and transformers_check.cos_sin_max_diff["long"] > 1e-3
    assert transformers_check.cos_sin_max_diff["short"] < 1e-5  # the short factors were not touched
    assert transformers_check.logits_max_diff > 0


def test_verify_refuses_factors_of_another_shape(model_64, tmp_path, capsys):
    other = LongRope.from_factors([2.0] * 8, head_dim=16, original_length=ORIGINAL, target_length=TARGET)
    path = factors_file(other.for_both_runtimes(), tmp_path / "f.json")
    assert main(["verify", path, "--model", str(model_64)]) == 2
    assert "the model has 16 rotary pairs" in capsys.readouterr().err


def test_vllm_get_rope_matches_when_installed(model_64, tmp_path):
    pytest.importorskip("vllm", reason="the vLLM half runs where vLLM is installed (it needs a CUDA torch)")
    path = factors_file(searched(1.37).for_both_runtimes(), tmp_path / "f.json")
    report = verify(read_factors_file(path), path, model_64, logits=False)
    assert report.checks[1].source.startswith("vllm ") and report.checks[1].ok
