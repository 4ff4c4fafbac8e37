"""Exports that both runtimes apply exactly: short_mscale / long_mscale, vLLM's fixed regime, `longrope verify`;
and, in the tests marked `vllm` (`make test` runs them last, with vLLM 0.33.0 installed), vLLM's own rotary code
against transformers' for every export shape."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from cli_checks import write_factors_file
from search_helpers import JOB_RECORD, known_problem_run
from vllm_engine import applied_cos_sin, engine_rope, max_diff, require_vllm, transformers_cos_sin, write_model_config

from longrope.encodings import LongRope, NtkRope, from_hf
from longrope.encodings.baselines import baseline_methods
from longrope.search.cli.main import main
from longrope.search.config.factors_file import FactorsFile, read_factors_file
from longrope.search.export import verify as verify_module
from longrope.search.export.verify import COS_SIN_TOLERANCE, half, our_cos_sin, verify, vllm_stand_in_tables

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
    run_dir = known_problem_run(tmp_path / "run")
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
    assert [line.split(" ")[0] for line in lines] == ["transformers", "vllm", "llama.cpp"]
    assert all(line.endswith(": match") for line in lines)
    report = verify(read_factors_file(path), path, model_64)
    transformers_check, vllm_check, llama_cpp_check = report.checks
    assert llama_cpp_check.ok  # its own tests: test_llama_cpp.py
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


@pytest.mark.vllm
def test_verify_reads_vllm_get_rope_when_installed(model_64, tmp_path):
    vllm = require_vllm()
    path = factors_file(searched(1.37).for_both_runtimes(), tmp_path / "f.json")
    report = verify(read_factors_file(path), path, model_64, logits=False)
    assert report.checks[1].source == f"vllm {vllm.__version__} get_rope" and report.checks[1].ok


# vLLM's own code against transformers' own, one export shape at a time, each side built from the same config.json
# (tests/vllm_engine.py). With vLLM 0.33.0 and transformers 5.24 every comparison that expects agreement measured
# max |diff| 0; the differences asserted are the runtimes' real ones, each stated where it is asserted.

SHORT_SEARCHED = [1.0 + 0.02 * i for i in range(PAIRS)]  # a short-factor search's result (the Phi-3 recipe)
SHAPE = {"head_dim": HEAD_DIM, "original_length": ORIGINAL, "target_length": TARGET}
LONGROPE_EXPORTS = {
    # `longrope export` writes `for_both_runtimes().to_hf()` of the run's best (factors_export.factors_file_of_run)
    "searched factors": lambda: LongRope.from_factors(SEARCHED, short_factor=SHORT_SEARCHED, **SHAPE),
    "searched attention factor": lambda: searched(1.37),
    # compare's tuned NTK (reports/ntk_tuning.py): NTK's factors at a multiple of the scale, its attention factor
    "tuned NTK": lambda: LongRope.from_factors(
        NtkRope(factor=2 * TARGET / ORIGINAL, head_dim=HEAD_DIM, max_position_embeddings=TARGET).factors().double(),
        attention_factor=1.2,
        **SHAPE,
    ),
    # LongRoPE2's n_hat: the scorer keeps the first n_hat positions on the original cos/sin. The block here keeps
    # the key (provenance's method_rope_parameters does; `export --allow-n-hat` drops it): both runtimes ignore it
    "n_hat": lambda: LongRope.from_factors(SEARCHED, attention_factor=1.37, n_hat=8, **SHAPE),
}


def model_with(tmp_path, method, **top_level) -> Path:
    block, positions = method.to_hf(), method.max_position_embeddings
    return write_model_config(
        tmp_path / "model", block, head_dim=HEAD_DIM, max_position_embeddings=positions, **top_level
    )


def ours(method, length: int):
    return half(our_cos_sin(method, length))


def rows(cos_sin, start: int = 0, stop: int | None = None):
    return cos_sin[0][start:stop], cos_sin[1][start:stop]


@pytest.mark.vllm
@pytest.mark.parametrize("name", ["none", "pi", "ntk", "yarn", "llama3"])
def test_vllm_applies_each_baseline_as_transformers_does(name, tmp_path):
    """PI (vLLM divides the positions, transformers the frequencies: the same floats at a power-of-two scale),
    NTK (plain RoPE with the raised rope_theta it is exported as), YaRN, Llama 3: one table at every length."""
    require_vllm()
    method = baselines()[name]
    rope, _ = engine_rope(model_with(tmp_path, method))
    for length in (ORIGINAL, TARGET):
        theirs = transformers_cos_sin(tmp_path / "model", length)
        assert max_diff(applied_cos_sin(rope, length), theirs) < COS_SIN_TOLERANCE
        assert max_diff(ours(method, length), theirs) < COS_SIN_TOLERANCE


@pytest.mark.vllm
@pytest.mark.parametrize("name", list(LONGROPE_EXPORTS))
def test_vllm_applies_longrope_exports_in_its_fixed_regime(name, tmp_path):
    """vLLM reads the same factors and, through short_mscale = long_mscale = attention_factor, the same scale, but
    fixes the regime per engine: one with max_model_len past L0 (the default without a top-level
    `original_max_position_embeddings`) applies the long factors to every prompt, where transformers applies the
    short ones up to L0 tokens, as `compare`'s (vLLM) rows score it (`LongRope.vllm_regime`); one with
    max_model_len = L0 applies the short ones, as transformers does there."""
    require_vllm()
    method = LONGROPE_EXPORTS[name]().for_both_runtimes()
    model_dir = model_with(tmp_path, method)
    plain = method.model_copy(update={"n_hat_positions": 0})  # what both runtimes apply
    long_theirs, short_theirs = transformers_cos_sin(model_dir, TARGET), transformers_cos_sin(model_dir, ORIGINAL)
    rope, max_model_len = engine_rope(model_dir)
    assert max_model_len == TARGET and rope.use_long_rope
    assert max_diff(applied_cos_sin(rope, TARGET), long_theirs) < COS_SIN_TOLERANCE
    assert max_diff(ours(plain, TARGET), long_theirs) < COS_SIN_TOLERANCE
    short_prompt = applied_cos_sin(rope, ORIGINAL)  # the difference: the long factors at L0 tokens
    assert max_diff(short_prompt, rows(long_theirs, 0, ORIGINAL)) < COS_SIN_TOLERANCE
    assert max_diff(short_prompt, ours(plain.vllm_regime(), ORIGINAL)) < COS_SIN_TOLERANCE
    assert max_diff(short_prompt, short_theirs) > 0.1
    # its cached tables: the short one L0 rows, the long one max_position_embeddings rows
    short_table, long_table = rope.long_short_cos_sin_cache.split([ORIGINAL, TARGET])
    assert max_diff(short_table.chunk(2, dim=-1), short_theirs) < COS_SIN_TOLERANCE
    assert max_diff(long_table.chunk(2, dim=-1), long_theirs) < COS_SIN_TOLERANCE
    rope, _ = engine_rope(model_dir, max_model_len=ORIGINAL)
    assert not rope.use_long_rope
    assert max_diff(applied_cos_sin(rope, ORIGINAL), short_theirs) < COS_SIN_TOLERANCE
    if method.n_hat:  # ours alone keeps the first n_hat positions on the original, unscaled cos/sin
        mine, original = ours(method, TARGET), ours(baselines()["none"], TARGET)
        assert max_diff(rows(mine, method.n_hat), rows(long_theirs, method.n_hat)) < COS_SIN_TOLERANCE
        assert max_diff(rows(mine, 0, method.n_hat), rows(original, 0, method.n_hat)) < COS_SIN_TOLERANCE
        assert max_diff(rows(mine, 1, method.n_hat), rows(long_theirs, 1, method.n_hat)) > 0.1


@pytest.mark.vllm
def test_vllm_default_max_model_len_picks_the_regime(tmp_path):
    """Without `--max-model-len`, vLLM 0.33 starts a LongRoPE model at its config's top-level
    `original_max_position_embeddings` (Phi-3 has one; export keeps it) and else at max_position_embeddings
    (vllm/config/model.py, `_get_and_verify_max_len`): the short factors at every length in the first case, the
    long ones in the second."""
    require_vllm()
    method = searched(1.37).for_both_runtimes()
    rope, max_model_len = engine_rope(model_with(tmp_path, method, top_level_original=ORIGINAL))
    assert max_model_len == ORIGINAL and not rope.use_long_rope
    assert max_diff(applied_cos_sin(rope, ORIGINAL), transformers_cos_sin(tmp_path / "model", ORIGINAL)) == 0


@pytest.mark.vllm
def test_vllm_applies_its_default_mscale_to_a_block_without_the_mscales(tmp_path):
    """vLLM never reads `attention_factor` or `factor`: a block with a searched 1.37 but no mscales gets
    sqrt(1 + ln(P / L0) / ln L0) from vLLM, P = max_position_embeddings (phi3_long_rope_scaled_rope.py)."""
    require_vllm()
    method = searched(1.37)
    rope, _ = engine_rope(model_with(tmp_path, method))
    default = math.sqrt(1 + math.log(TARGET / ORIGINAL) / math.log(ORIGINAL))
    theirs = transformers_cos_sin(tmp_path / "model", TARGET)
    scaled = (theirs[0] * default / 1.37, theirs[1] * default / 1.37)
    assert max_diff(applied_cos_sin(rope, TARGET), scaled) < COS_SIN_TOLERANCE
    assert rope.long_mscale == rope.short_mscale == pytest.approx(method.vllm_mscale(long=True))


@pytest.mark.vllm
def test_vllm_dynamic_ntk_table_ends_at_max_position_embeddings(tmp_path):
    """transformers raises Dynamic NTK's base past max_position_embeddings P, per length. vLLM 0.33's
    `DynamicNTKScalingRotaryEmbedding` (dynamic_ntk_scaling_rope.py) builds one table of P rows with base
    b * (s * P / max_trained_positions - (s - 1)) ** (d / (d - 2)), which is b itself when the config has no
    max_trained_positions, while its engine derives max_model_len = P * s: up to P both apply plain RoPE; a
    position past P indexes past the table's end (IndexError on the CPU)."""
    require_vllm()
    method = baselines()["dynamic"]
    rope, max_model_len = engine_rope(model_with(tmp_path, method))
    assert method.max_position_embeddings == ORIGINAL and max_model_len == TARGET
    assert rope.cos_sin_cache.shape[0] == ORIGINAL
    plain = ours(baselines()["none"], ORIGINAL)
    assert max_diff(applied_cos_sin(rope, ORIGINAL), transformers_cos_sin(tmp_path / "model", ORIGINAL)) == 0
    assert max_diff(applied_cos_sin(rope, ORIGINAL), plain) < COS_SIN_TOLERANCE
    assert max_diff(transformers_cos_sin(tmp_path / "model", TARGET), ours(method, TARGET)) < COS_SIN_TOLERANCE
    with pytest.raises(IndexError):
        applied_cos_sin(rope, ORIGINAL + 1)


def baselines():
    return baseline_methods(
        head_dim=HEAD_DIM, rope_theta=1e4, partial_rotary_factor=1.0, original=ORIGINAL, target=TARGET
    )
