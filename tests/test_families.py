"""Every model family the scorer accepts gives transformers' own NLL, and every other one is refused by name.

For each family a tiny random model is built with transformers' config class. A LongRoPE candidate (rising long
factors, an attention factor of 1.1) is scored at 4x the original length by the scorer, and the same candidate is
exported into the model's config.json (`config_with_block`, what `export --into` writes). transformers' eager
forward of that exported model must give the same per-window NLL. A family whose rotary layout, output head or
original length the scorer got wrong departs by whole percent (Cohere's interleaved pairs did, by 34%).
"""

from __future__ import annotations

import json

import pytest
import torch
from family_models import (
    FAMILY_CONFIGS,
    TARGET,
    VOCAB,
    byte_job,
    exported_model,
    rising_candidate,
    save_family_model,
    transformers_window_nll,
)

from longrope.search.cli.main import main
from longrope.search.config.factors_file import factors_file_for
from longrope.workers.errors import ModelLoadError
from longrope.workers.families import FAMILIES, family_of
from longrope.workers.models import check_model, load_model, model_rope
from longrope.workers.scorer import Scorer

TOLERANCE = 1e-5  # relative, float32


@pytest.fixture(scope="module")
def windows() -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, TARGET + 1), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_the_scorer_equals_transformers_with_the_export_applied(family, windows, tmp_path):
    model_dir = save_family_model(family, tmp_path / "model")
    check_model(model_dir, device="cpu")
    model, rope = load_model(model_dir, device="cpu", dtype="float32")
    candidate = rising_candidate(rope)
    scorer = Scorer(model, windows, rope.method.original_inv_freq())
    ours, plain = (torch.tensor(score.nll, dtype=torch.float64) for score in scorer.score([candidate, rope.method]))

    exported = exported_model(model_dir, candidate, rope.original_length, tmp_path / "exported")
    theirs = transformers_window_nll(exported, windows)

    assert ((ours - theirs).abs() / theirs).max() < TOLERANCE
    assert ((ours - plain).abs() / plain).max() > 10 * TOLERANCE, "the candidate must move the NLL"


def test_the_model_as_shipped_is_what_transformers_runs(windows, tmp_path):
    """The scorer's reading of each family's own RoPE (its config class's defaults and renamed keys included):
    the model's method scored unchanged equals transformers' forward of the untouched model."""
    for family in ("phi (partial rotary)", "gpt_neox (rotary_pct)", "cohere (interleaved, logit_scale)"):
        model_dir = save_family_model(family, tmp_path / family)
        model, rope = load_model(model_dir, device="cpu", dtype="float32")
        ours = torch.tensor(Scorer(model, windows, rope.method.original_inv_freq()).score([rope.method])[0].nll)
        theirs = transformers_window_nll(model_dir, windows)
        assert ((ours.double() - theirs).abs() / theirs).max() < TOLERANCE, family


@pytest.mark.parametrize(
    ("family", "dropped", "expected_pairs"),
    [("phi (partial rotary)", "partial_rotary_factor", 4), ("stablelm", "partial_rotary_factor", 2)],
)
def test_a_config_without_the_family_default_reads_as_its_config_class_does(family, dropped, expected_pairs, tmp_path):
    """A config.json that leaves out a key whose default is the family's own (Phi's partial rotary factor is 0.5,
    StableLM's 0.25 in transformers' config classes) is read with that default, not the generic 1.0."""
    from family_models import family_config

    config = family_config(family).to_dict()
    config.pop(dropped, None)
    config.get("rope_parameters", {}).pop(dropped, None)
    from transformers import AutoConfig

    theirs = AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items() if k != "model_type"})
    their_factor = theirs.rope_parameters.get("partial_rotary_factor", getattr(theirs, "partial_rotary_factor", 1.0))
    rope = model_rope(config)
    assert rope.rotary_dim // 2 == expected_pairs
    assert rope.rotary_dim == int(rope.head_dim * their_factor)


def test_gpt_neox_reads_its_own_key_names():
    """An older GPT-NeoX config.json (Pythia) names the partial rotary factor `rotary_pct` and the base
    `rotary_emb_base`: read as transformers' GPTNeoXConfig renames them."""
    config = {
        "model_type": "gpt_neox",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        "rotary_pct": 0.5,
        "rotary_emb_base": 5000,
    }
    rope = model_rope(config)
    assert (rope.rotary_dim, rope.rope_theta) == (8, 5000)


def test_a_top_level_original_length_wins_as_in_transformers():
    """Phi3Config writes a top-level `original_max_position_embeddings`, which transformers puts into the block:
    the factors must be searched for the length at which transformers switches to them."""
    config = {
        "model_type": "phi3",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
    }
    assert model_rope(config).original_length == 4096


@pytest.mark.parametrize(
    ("model_type", "named"),
    [
        ("deepseek_v3", "qk_rope_head_dim"),
        ("gemma3", "gemma3_text"),
        ("internlm2", "not a family the scorer is checked against"),
        (None, "not a family"),
    ],
)
def test_a_family_the_scorer_cannot_reproduce_is_refused_by_name(model_type, named):
    config = {"model_type": model_type, "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 64}
    with pytest.raises(ModelLoadError) as caught:
        model_rope({**config, "rope_theta": 10000.0})
    message = str(caught.value)
    assert f"model_type {model_type!r}" in message and named in message and "\n" not in message


def test_every_family_in_the_registry_is_tested_or_refused():
    """A family added to the registry without a test here would be accepted unchecked."""
    import transformers

    tested = {family_config_type(name, transformers) for name in FAMILY_CONFIGS}
    accepted = {name for name, family in FAMILIES.items() if family.refused is None}
    assert tested == accepted
    for name in accepted:
        family_of({"model_type": name})


def family_config_type(name: str, transformers) -> str:
    return getattr(transformers, FAMILY_CONFIGS[name][0]).model_type


@pytest.mark.parametrize(
    "family", ["gemma3 (local and global)", "cohere (interleaved, logit_scale)", "gpt_neox (rotary_pct)", "phi3"]
)
def test_verify_checks_the_export_against_the_family_own_rotary_module(family, tmp_path):
    """`longrope verify`: transformers' own rotary module for the family (Gemma 3's for its full_attention layers,
    Cohere's interleaved tables) against ours, and the logits of one window both ways; llama.cpp's row names why a
    family other than llama gets no GGUF."""
    from longrope.search.export.verify import verify

    model_dir = save_family_model(family, tmp_path / "model")
    rope = model_rope(json.loads((model_dir / "config.json").read_text()))
    factors = factors_file_for(
        rising_candidate(rope),
        method_name="candidate",
        target_length=TARGET,
        original_length=rope.original_length,
        created_by="t",
    )
    report = verify(factors, "factors.json", model_dir)
    transformers_check, _, llama_cpp = report.checks
    assert transformers_check.ok and transformers_check.logits_max_diff <= transformers_check.logits_tolerance
    assert max(transformers_check.cos_sin_max_diff.values()) < 1e-5
    assert "not exportable to a GGUF" in llama_cpp.source
    # Gemma 3's reason is llama.cpp's own gemma3 graph's; the others', that the export writes the llama graph alone
    why = "src/models/gemma3.cpp" if family.startswith("gemma3") else "model_type"
    assert why in llama_cpp.source


def test_validate_refuses_deepseek_v3_in_one_line_naming_it(tmp_path, capsys):
    """transformers' own DeepseekV3Config (rotary on a qk_rope_head_dim slice, YaRN): `validate` exits non-zero
    with one line naming the family and why, before any weight is read (the directory holds none)."""
    import transformers
    import yaml

    config = transformers.DeepseekV3Config(
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=2,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    )
    model_dir = tmp_path / "deepseek"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config.to_dict()))
    documents = tmp_path / "docs"
    documents.mkdir()
    for index in range(2):
        (documents / f"{index}.txt").write_text("w " * 2000)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(byte_job(model_dir, documents, 1024)))
    capsys.readouterr()
    assert main(["validate", str(path)]) != 0
    error = capsys.readouterr().err.strip()
    assert "model_type 'deepseek_v3'" in error and "qk_rope_head_dim" in error and "\n" not in error
