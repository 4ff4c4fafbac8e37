"""A sliding window shorter than the target is the user's decision, and what was scored is what gets deployed.

Mistral and Phi-3 put one window on every layer. Scored with it, a 256-token window's perplexity measures attention
over the last 32 tokens. `model.sliding_window` says which behaviour to score (`keep` or `full`), and the export
carries it: `export --into` turns the window off for `full`. Gemma 2 and 3's local layers are windowed by design
and keep it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from family_models import (
    ORIGINAL,
    TARGET,
    VOCAB,
    byte_job,
    save_family_model,
    transformers_window_nll,
    with_config,
)
from test_families import rising_candidate

from longrope.search.cli.main import main
from longrope.search.config.factors_file import factors_file_for
from longrope.search.export.factors_export import config_with_block
from longrope.workers.families import full_attention_overrides, window_problem
from longrope.workers.models import load_model
from longrope.workers.scorer import Scorer

WINDOW = 32
MISTRAL = {"model_type": "mistral", "sliding_window": WINDOW}


def test_a_window_on_every_layer_shorter_than_the_target_needs_a_decision():
    problem = window_problem(MISTRAL, TARGET, None)
    assert "model.sliding_window" in problem and f"last {WINDOW} tokens" in problem and str(TARGET) in problem
    assert window_problem(MISTRAL, TARGET, "keep") is None
    assert window_problem(MISTRAL, TARGET, "full") is None
    assert window_problem(MISTRAL, WINDOW, None) is None  # the window covers every scored token


def test_local_layers_by_design_keep_their_window_and_full_is_refused_there():
    gemma = {"model_type": "gemma2", "sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]}
    assert window_problem(gemma, TARGET, None) is None
    assert "local by design" in window_problem(gemma, TARGET, "full")
    qwen_off = {"model_type": "qwen2", "sliding_window": WINDOW, "use_sliding_window": False}
    assert window_problem(qwen_off, TARGET, None) is None
    assert "not set" in window_problem({"model_type": "llama"}, TARGET, "full")


@pytest.mark.parametrize("family", ["mistral", "phi3"])
@pytest.mark.parametrize("choice", ["keep", "full"])
def test_what_was_scored_is_what_the_export_deploys(family, choice, tmp_path):
    """The scorer loads the model as the choice says; the export into config.json then gives transformers the
    same per-window NLL. With `full`, the model as shipped (window on) gives another NLL: the window matters."""
    model_dir = save_family_model(family, tmp_path / "model")
    shipped = json.loads((model_dir / "config.json").read_text())
    shipped["sliding_window"] = WINDOW
    model_dir = with_config(model_dir, shipped, tmp_path / "windowed")
    overrides = full_attention_overrides(shipped) if choice == "full" else {}
    model, rope = load_model(model_dir, device="cpu", dtype="float32", config_overrides=overrides)
    windows = torch.randint(0, VOCAB, (2, TARGET + 1), generator=torch.Generator().manual_seed(2))
    candidate = rising_candidate(rope)
    ours = torch.tensor(Scorer(model, windows, rope.method.original_inv_freq()).score([candidate])[0].nll).double()

    factors = factors_file_for(
        candidate, method_name="candidate", target_length=TARGET, original_length=ORIGINAL, created_by="t"
    ).model_copy(update={"sliding_window": choice})
    exported = with_config(model_dir, config_with_block(shipped, factors), tmp_path / "exported")
    assert ((ours - transformers_window_nll(exported, windows)).abs() / ours).max() < 1e-5
    window_on = factors.model_copy(update={"sliding_window": "keep"})
    windowed = with_config(model_dir, config_with_block(shipped, window_on), tmp_path / "window-on")
    as_windowed = transformers_window_nll(windowed, windows)
    assert (((ours - as_windowed).abs() / ours).max() > 1e-3) == (choice == "full")


def test_validate_refuses_the_target_without_the_setting_and_takes_it_with(tmp_path, capsys):
    model_dir = save_family_model("mistral", tmp_path / "model")
    config = json.loads((model_dir / "config.json").read_text())
    with_config(model_dir, {**config, "sliding_window": WINDOW}, tmp_path / "windowed")
    documents = tmp_path / "docs"
    documents.mkdir()
    for index in range(3):
        (documents / f"{index}.txt").write_text(" ".join(f"word{index}{n}" for n in range(400)))
    job = byte_job(tmp_path / "windowed", documents, TARGET)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    capsys.readouterr()
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "model.sliding_window" in err and f"last {WINDOW} tokens" in err
    job["model"]["sliding_window"] = "full"
    path.write_text(yaml.safe_dump(job))
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(("choice", "local_layers"), [("keep", 2), ("full", 0)])
def test_estimate_prices_the_model_as_the_workers_load_it(choice, local_layers, tmp_path):
    """A Qwen2 with `use_sliding_window` and a window on both layers: `keep` prices two windowed layers, `full`
    none, and the settings it prices are those the workers load (the window, its switch and the layer types off)."""
    from longrope.search.cli.estimate_command import resolve_architecture
    from longrope.search.optimizers.factory import load_job_config

    model_dir = save_family_model("qwen2", tmp_path / "model")
    config = json.loads((model_dir / "config.json").read_text())
    windowed = {**config, "use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 0}
    windowed["layer_types"] = ["sliding_attention"] * config["num_hidden_layers"]
    with_config(model_dir, windowed, tmp_path / "windowed")
    settings = [f"model.path={tmp_path / 'windowed'}", f"model.sliding_window={choice}", f"target_length={TARGET}"]
    job = load_job_config(None, settings)
    arch, _, settings = resolve_architecture(job, None)
    assert arch.local_layers == local_layers
    if choice == "full":
        assert settings["sliding_window"] is None and settings["use_sliding_window"] is False
        assert set(settings["layer_types"]) == {"full_attention"}


@pytest.mark.parametrize(
    ("setting", "overrides", "exported"),
    [
        (None, {"sliding_window": None}, "full"),  # the window turned off at load: deployed off too
        ("keep", {}, "keep"),
        ("full", {}, "full"),
        (None, {"rms_norm_eps": 1e-5}, None),  # no window decision: nothing for the export to carry
    ],
)
def test_the_export_records_the_window_the_model_was_scored_with(setting, overrides, exported):
    from longrope.search.config.inputs import ModelConfig

    model = ModelConfig.model_validate({"path": "m", "sliding_window": setting, "config_overrides": overrides})
    assert model.scored_window() == exported


@pytest.mark.parametrize("setting", ["keep", "full", None])
def test_export_of_a_run_writes_the_window_its_config_scored_with(setting, tmp_path, capsys):
    """`longrope export RUN` names the run's window decision in the factors JSON (none where it made none)."""
    from search_helpers import known_problem_run

    overrides = [] if setting is None else [f"model.sliding_window={setting}"]
    run = known_problem_run(tmp_path / "run", *overrides)
    out = tmp_path / "factors.json"
    assert main(["export", str(run), "-o", str(out)]) == 0, capsys.readouterr().err
    assert json.loads(out.read_text()).get("sliding_window") == setting


def test_the_shipped_phi3_config_says_which_window_it_scores():
    """Phi-3-mini-4k's config.json has a 2047-token window on every layer: the shipped job for it must decide, and
    decides `full`, as Microsoft's LongRoPE release scores it (`--attn-sliding-window 131072`)."""
    from transformers import Phi3Config

    from longrope.search.optimizers.factory import load_job_config

    job = load_job_config(str(Path(__file__).parents[1] / "configs" / "phi3-mini-128k.yaml"), [])
    phi3 = Phi3Config(sliding_window=2047, max_position_embeddings=4096).to_dict()
    assert "sliding_window" in window_problem(phi3, job.target_length, None)
    assert job.model.sliding_window == "full" and window_problem(phi3, job.target_length, "full") is None
