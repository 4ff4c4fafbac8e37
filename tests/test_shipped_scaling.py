"""A model that ships RoPE scaling is extended from what it runs today, not from plain RoPE.

The case is Llama 3.1's: a `llama3` block with factor 4, pre-trained at 64 tokens and serving 256, asked for 1024.
The search starts at the 256 tokens it serves, its own scaling moved to the target (factor 16) is a seed and a
compare row, compare's `none` row is the model as its config.json runs it, and the export keeps the shipped model's
frequencies up to 256 tokens, so that only the attention factor differs there.
"""

from __future__ import annotations

import json
import math

import pytest
import ray
import torch
import yaml
from conftest import hf_inv_freq
from family_models import LLAMA3, ORIGINAL, byte_job, save_family_model, transformers_window_nll, with_config

from longrope.encodings import from_hf_config
from longrope.search.cli.main import main
from longrope.search.config.factors_file import FactorsFile
from longrope.search.export.factors_export import config_with_block, factors_json
from longrope.search.job.job_context import OWN_SCALING, JobContext
from longrope.search.optimizers.factory import load_job_config
from longrope.workers.models import model_rope

SERVING = 4 * ORIGINAL
TARGET = 4 * SERVING


@pytest.fixture(scope="module", autouse=True)
def embedded_ray():
    ray.shutdown()
    yield
    ray.shutdown()


def test_llama3_moved_to_the_target_is_transformers_llama3_at_factor_times_target_over_serving():
    shipped = from_hf_config({"rope_parameters": LLAMA3, "head_dim": 16, "max_position_embeddings": SERVING})
    moved = shipped.moved_to(TARGET)
    assert moved.factor == LLAMA3["factor"] * TARGET / SERVING == 16
    theirs, _ = hf_inv_freq({**LLAMA3, "factor": 16.0}, head_dim=16, max_position_embeddings=TARGET)
    torch.testing.assert_close(moved.inv_freq(TARGET).double(), theirs.double(), rtol=1e-6, atol=0)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A tiny Llama with llama3 scaling, documents for bytes, and a small search config asking for 4x its serving."""
    root = tmp_path_factory.mktemp("shipped")
    model_dir = save_family_model("llama (llama3 scaling)", root / "model")
    documents = root / "docs"
    documents.mkdir()
    for index in range(6):
        (documents / f"{index}.txt").write_text(" ".join(f"w{index}{n % 97}" for n in range(500)))
    config = byte_job(
        model_dir,
        documents,
        TARGET,
        name="shipped",
        data={"test_windows": 3},
        search={"population": 6, "parents": 3, "mutations": 2, "crossovers": 2, "generations": 1},
        workers={"num_workers": 1, "num_cpus_per_worker": 1, "local_num_cpus": 2, "batch_size": 2},
        output_dir=str(root / "run"),
    )
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, model_dir


def test_the_start_is_the_serving_length_and_the_own_scaling_is_a_seed_and_a_row(job):
    path, model_dir = job
    rope = model_rope(json.loads((model_dir / "config.json").read_text()))
    assert (rope.original_length, rope.serving_length) == (ORIGINAL, SERVING)
    context = JobContext.resolve(load_job_config(str(path), []))
    assert context.start_length == SERVING and context.original_length == ORIGINAL
    baselines = context.baselines()
    assert baselines["none"] == rope.method  # the model as its config.json runs it, not plain RoPE
    assert baselines[OWN_SCALING] == rope.method.moved_to(TARGET)
    assert OWN_SCALING in [seed.name for seed in context.seeds()]


def test_validate_reports_the_serving_length_as_the_start(job, capsys):
    path, _ = job
    capsys.readouterr()
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{SERVING} -> {TARGET} tokens (scale 4)" in out
    assert main(["validate", "--json", str(path)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["original_length"], document["serving_length"]) == (ORIGINAL, SERVING)


@pytest.mark.slow
def test_the_export_reads_as_the_shipped_model_below_its_serving_length(job, tmp_path, capsys):
    """Searched, exported and compared: below 256 tokens transformers with the export equals the model as shipped
    once the attention factor is taken out (its cost is the difference); compare has the shipped model's rows."""
    path, model_dir = job
    assert main(["search", "--no-progress", str(path)]) == 0, capsys.readouterr().err
    run = yaml.safe_load(path.read_text())["output_dir"]
    factors_path = tmp_path / "factors.json"
    assert main(["export", run, "-o", str(factors_path)]) == 0, capsys.readouterr().err
    factors = FactorsFile.model_validate_json(factors_path.read_text())
    block = factors.rope_parameters
    shipped = json.loads((model_dir / "config.json").read_text())
    own = model_rope(shipped).method.factors(SERVING).double().tolist()
    assert block.original_max_position_embeddings == SERVING
    assert block.short_factor == pytest.approx(own, rel=1e-12)

    windows = torch.randint(0, 256, (2, SERVING), generator=torch.Generator().manual_seed(3))
    as_shipped = transformers_window_nll(model_dir, windows)
    no_attention = factors.model_copy(
        update={"rope_parameters": block.model_copy(update={"attention_factor": 1.0, "short_mscale": 1.0})}
    )
    exported = with_config(model_dir, config_with_block(shipped, no_attention), tmp_path / "exported")
    torch.testing.assert_close(transformers_window_nll(exported, windows), as_shipped, rtol=1e-5, atol=0)
    with_attention = with_config(model_dir, config_with_block(shipped, factors), tmp_path / "with-attention")
    cost = transformers_window_nll(with_attention, windows) - as_shipped
    assert block.attention_factor == 1.0 or bool(cost.abs().max() > 1e-3), "the attention factor's cost shows"

    no_attention_path = tmp_path / "no-attention.json"
    no_attention_path.write_text(factors_json(no_attention))
    out_dir = tmp_path / "compare"
    args = ["compare", str(path), "--factors", str(factors_path), "--factors", str(no_attention_path)]
    code = main(
        [*args, "--lengths", f"{SERVING},{TARGET}", "--tuning-grid", "coarse", "--no-needles", "-o", str(out_dir)]
    )
    assert code == 0, capsys.readouterr().err
    result = json.loads((out_dir / "compare.json").read_text())
    methods = result["methods"]
    assert {"none", OWN_SCALING, "file:factors.json", "file:no-attention.json"} <= set(methods)
    for name in ("none", OWN_SCALING):
        assert all(math.isfinite(v[0]) for v in methods[name]["perplexity"].values())
    # the cost column: at the serving length the export without its attention factor is the shipped model (as
    # transformers showed above), so its cost is 0; with it, the cost is the attention factor's, window by window
    assert result["start_length"] == SERVING
    assert methods["file:no-attention.json"]["paired_difference_to_shipped"] == pytest.approx([0, 0, 0], abs=1e-5)
    file_windows = torch.tensor(methods["file:factors.json"]["nll_per_window"][str(SERVING)], dtype=torch.float64)
    shipped_windows = torch.tensor(methods["none"]["nll_per_window"][str(SERVING)], dtype=torch.float64)
    cost_column = methods["file:factors.json"]["paired_difference_to_shipped"]
    assert cost_column[0] == pytest.approx(float((file_windows - shipped_windows).mean()), rel=1e-9)
    assert block.attention_factor == 1.0 or abs(cost_column[0]) > 1e-4
    assert f"Δ NLL vs none @ {SERVING}" in (out_dir / "compare.md").read_text()


def test_a_model_config_as_a_seed_file_gives_its_scaling_moved_to_the_target(job, tmp_path):
    """`search.seed_files` takes a model's config.json (Llama 3.1's, say): its scaling at the target is a seed; one
    of another rope_theta is refused in one line naming it."""
    path, model_dir = job
    config_path = str(model_dir / "config.json")
    context = JobContext.resolve(load_job_config(str(path), [f"search.seed_files=[{config_path}]"]))
    seeds = {seed.name: seed for seed in context.seeds()}
    own = model_rope(json.loads((model_dir / "config.json").read_text())).method.moved_to(TARGET)
    assert seeds["file:config.json"].factors.tolist() == pytest.approx(own.factors(TARGET).double().tolist())
    other = tmp_path / "other" / "config.json"
    other.parent.mkdir()
    shipped = json.loads((model_dir / "config.json").read_text())
    other.write_text(json.dumps({**shipped, "rope_parameters": {**LLAMA3, "rope_theta": 500000.0}}))
    context = JobContext.resolve(load_job_config(str(path), [f"search.seed_files=[{other}]"]))
    with pytest.raises(ValueError, match="rope_theta 500000, this job's model has 10000"):
        context.seeds()
