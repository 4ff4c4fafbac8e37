"""`longrope encodings list|factors`, run as a user runs them: the console script, from another directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import hf_inv_freq

from longrope.encodings import from_hf
from longrope.encodings.catalog import catalog_entries
from longrope.search.config.factors_file import FactorsFile

LONGROPE = shutil.which("longrope", path=str(Path(sys.executable).parent))


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    assert LONGROPE, "the longrope console script is not installed next to this interpreter"
    return subprocess.run([LONGROPE, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_list_names_every_method(tmp_path):
    result = run_cli("encodings", "list", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [m["name"] for m in json.loads(result.stdout)] == [m.name for m in catalog_entries()]
    table = run_cli("encodings", "list", cwd=tmp_path)
    assert table.returncode == 0 and all(m.name in table.stdout for m in catalog_entries())


FACTOR_CASES = {
    "yarn": (["--factor", "8"], {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096}),
    "linear": (["--factor", "8"], {"rope_type": "linear", "factor": 8.0}),
    "ntk": (["--factor", "8", "--theta", "500000"], {"rope_type": "ntk", "factor": 8.0, "rope_theta": 5e5}),
    "llama3": (
        ["--factor", "8", "--theta", "500000"],
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 4096,
            "rope_theta": 5e5,
        },
    ),
    "dynamic": (["--factor", "8"], {"rope_type": "dynamic", "factor": 8.0}),
}


@pytest.mark.parametrize("method", sorted(FACTOR_CASES))
def test_factors_json_drops_into_transformers(method, tmp_path):
    """The printed block, loaded by transformers as rope_type longrope at the target length, gives the same
    frequencies and attention factor as the method itself."""
    extra, params = FACTOR_CASES[method]
    result = run_cli(
        "encodings", "factors", method, "--original-length", "4096", "--head-dim", "128", *extra, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    exported = FactorsFile.model_validate_json(result.stdout)
    assert exported.max_position_embeddings == 32768
    block = exported.rope_parameters.model_dump(exclude_none=True)
    hf_freq, hf_attention = hf_inv_freq(block, head_dim=128, max_position_embeddings=32768, seq_len=32768)
    max_pos = 4096 if method == "dynamic" else 32768
    source = from_hf(params, head_dim=128, max_position_embeddings=max_pos)
    torch.testing.assert_close(hf_freq, source.inv_freq(32768), rtol=1e-6, atol=0)
    assert hf_attention == pytest.approx(source.attention_factor, rel=1e-12)
    assert block["short_factor"] == [1.0] * 64
    assert exported.provenance.method == method


FLAG_CASES = {
    "yarn": (
        ["--beta-fast", "64", "--beta-slow", "2", "--no-truncate", "--attention-factor", "1.5"],
        {"beta_fast": 64.0, "beta_slow": 2.0, "truncate": False, "attention_factor": 1.5},
    ),
    "llama3": (
        ["--low-freq-factor", "2", "--high-freq-factor", "8"],
        {"low_freq_factor": 2.0, "high_freq_factor": 8.0},
    ),
}


@pytest.mark.parametrize("method", sorted(FLAG_CASES))
def test_a_methods_own_flags_set_its_rope_parameters(method, tmp_path):
    """Each flag sets its key over the nominal setting: the printed block, read by transformers as longrope at the
    target, gives transformers' own frequencies and attention factor for the method with those keys."""
    flags, keys = FLAG_CASES[method]
    args = ["--factor", "8", "--original-length", "4096", "--head-dim", "128", *flags]
    result = run_cli("encodings", "factors", method, *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    block = FactorsFile.model_validate_json(result.stdout).rope_parameters.model_dump(exclude_none=True)
    nominal = {"rope_type": method, "factor": 8.0, "original_max_position_embeddings": 4096}
    nominal |= {"llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0}}.get(method, {})
    shape = {"head_dim": 128, "max_position_embeddings": 32768, "seq_len": 32768}
    expected, got = hf_inv_freq({**nominal, **keys}, **shape), hf_inv_freq(block, **shape)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-6, atol=0)
    assert got[1] == pytest.approx(expected[1], rel=1e-12)
    assert not torch.allclose(got[0], hf_inv_freq(nominal, **shape)[0]), "the flags must change the frequencies"


def test_a_baselines_name_is_its_method(tmp_path):
    """pi is Position Interpolation (rope_type linear), none plain RoPE (default)."""
    for name, rope_type in (("pi", "linear"), ("none", "default")):
        result = run_cli(
            "encodings", "factors", name, "--factor", "4", "--original-length", "64", "--head-dim", "8", cwd=tmp_path
        )
        assert FactorsFile.model_validate_json(result.stdout).provenance.method == rope_type, result.stderr


def test_factors_yarn_matches_reference_vector(tmp_path):
    result = run_cli(
        "encodings", "factors", "yarn", "--factor", "8", "--original-length", "4096", "--head-dim", "128", cwd=tmp_path
    )
    block = json.loads(result.stdout)["rope_parameters"]
    assert block["long_factor"][:21] == [1.0] * 21 and block["long_factor"][46:] == pytest.approx([8.0] * 18)
    assert block["attention_factor"] == pytest.approx(1.2079441541679836)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["linear", "--factor", "0.5"], "--factor: must be greater than or equal to 1, got 0.5"),
        (["warp", "--factor", "2"], "method: unknown value 'warp'"),
        (["yarn", "--factor", "nan"], "--factor: must be a finite number in (0, 10000], got nan"),
        (["yarn", "--factor", "4", "--param", "beta_fast"], "--param: expected KEY=VALUE"),
        (["yarn", "--factor", "4", "--param", "warp=2"], "--param warp: not a key of rope_type yarn (its own: "),
        (["pi", "--factor", "4", "--beta-fast", "64"], "--beta-fast: a setting of yarn, not of linear"),
        (["llama3", "--factor", "4", "--high-freq-factor", "0.5"], "--high-freq-factor: must be greater than"),
        (["yarn", "--factor", "4", "--theta", "1"], "--theta: must be greater than 1, got 1.0"),
        (["yarn", "--factor", "4", "--head-dim", "0"], "--head-dim: must be greater than 0, got 0"),
        (
            ["longrope", "--factor", "4", "--param", "long_factor=[1, 2]", "--param", "short_factor=[1, 1]"],
            "--param short_factor: expected 64 values",
        ),
    ],
)
def test_factors_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    result = run_cli("encodings", "factors", "--original-length", "4096", "--head-dim", "128", *args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("longrope: error:")
