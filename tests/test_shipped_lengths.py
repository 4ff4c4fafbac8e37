"""Where each shipped RoPE scaling starts: the length its model was pre-trained at, the length it serves, and its
scaling moved to a longer target, for every rope_type a config ships, read through transformers' own config classes.

The lengths are worked by hand from each method's definition: YaRN's factor is post-yarn over pre-yarn length
(Qwen2.5: factor 4 over 32,768 serves 131,072 with max_position_embeddings left at 32,768); linear and dynamic serve
factor x max_position_embeddings (transformers' RoPE docs, vLLM's max_model_len); Llama 3 and LongRoPE serve
max_position_embeddings; Gemma 3 serves max_position_embeddings under linear (vLLM skips the factor for gemma3). The
moved methods' frequencies are compared with transformers' own RoPE init at the moved factor.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers
import yaml
from conftest import hf_inv_freq
from family_models import ORIGINAL, byte_job, save_family_model, with_config

from longrope.search.cli.main import main
from longrope.search.job.job_context import OWN_SCALING, SHIPPED, JobContext
from longrope.search.optimizers.factory import load_job_config
from longrope.workers.errors import ModelLoadError
from longrope.workers.models import model_rope

SHAPE = dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128)


def read(class_name: str, **fields):
    """model_rope of the config transformers' class writes (its to_dict, as config.json holds it)."""
    config = getattr(transformers, class_name)(**SHAPE, **fields)
    return model_rope(config.to_dict())


def yarn(factor: float, original: int) -> dict:
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original, "rope_theta": 1e6}


@pytest.mark.parametrize(
    ("class_name", "max_position", "factor", "serving"),
    [("Qwen2Config", 32768, 4.0, 131072), ("Qwen3Config", 40960, 4.0, 131072)],
    ids=["qwen2.5 (max_position_embeddings = original)", "qwen3 (40960 over 32768)"],
)
def test_yarn_serves_factor_times_its_original_and_moves_to_target_over_original(
    class_name, max_position, factor, serving
):
    rope = read(class_name, max_position_embeddings=max_position, rope_parameters=yarn(factor, 32768))
    assert (rope.original_length, rope.serving_length) == (32768, serving)
    assert rope.shipped_scaling is rope.method
    moved = rope.method.moved_to(262144)
    assert moved.factor == 8.0  # 262144 / 32768, YaRN's own definition
    assert moved.attention_factor == pytest.approx(0.1 * math.log(8) + 1, rel=1e-12)
    theirs, attention = hf_inv_freq(yarn(8.0, 32768), head_dim=128, max_position_embeddings=262144)
    torch.testing.assert_close(moved.inv_freq(262144).double(), theirs.double(), rtol=1e-6, atol=0)
    assert attention == pytest.approx(moved.attention_factor, rel=1e-6)


def test_linear_serves_factor_times_max_position_and_moves_to_target_over_it():
    rope = read("LlamaConfig", max_position_embeddings=4096, rope_parameters={"rope_type": "linear", "factor": 4.0})
    assert (rope.original_length, rope.serving_length) == (4096, 16384)
    moved = rope.method.moved_to(65536)
    assert moved.factor == 16.0 and moved.serving_length == 65536
    theirs, _ = hf_inv_freq({"rope_type": "linear", "factor": 16.0}, head_dim=128, max_position_embeddings=4096)
    torch.testing.assert_close(moved.inv_freq(65536).double(), theirs.double(), rtol=1e-6, atol=0)


def test_dynamic_serves_factor_times_max_position_and_its_rule_holds_at_the_target_unchanged():
    block = {"rope_type": "dynamic", "factor": 2.0}
    rope = read("LlamaConfig", max_position_embeddings=4096, rope_parameters=block)
    assert (rope.original_length, rope.serving_length) == (4096, 8192)
    moved = rope.method.moved_to(32768)
    assert moved == rope.method
    theirs, _ = hf_inv_freq(block, head_dim=128, max_position_embeddings=4096, seq_len=32768)
    torch.testing.assert_close(moved.inv_freq(32768).double(), theirs.double(), rtol=1e-6, atol=0)


def test_gemma3_serves_its_max_position_under_linear_scaling():
    """Gemma 3 4B-27B: linear factor 8 on the global layers, max_position_embeddings 131072 already served."""
    rope = read("Gemma3TextConfig", max_position_embeddings=131072, rope_parameters=GEMMA3_LINEAR)
    assert (rope.original_length, rope.serving_length) == (16384, 131072)
    moved = rope.method.moved_to(262144)
    assert moved.factor == 16.0
    theirs, _ = hf_inv_freq(
        {"rope_type": "linear", "factor": 16.0, "rope_theta": 1e6}, head_dim=128, max_position_embeddings=16384
    )
    torch.testing.assert_close(moved.inv_freq(262144).double(), theirs.double(), rtol=1e-6, atol=0)


def test_plain_rope_starts_at_its_max_position():
    rope = read("LlamaConfig", max_position_embeddings=4096)
    assert (rope.original_length, rope.serving_length, rope.shipped_scaling) == (4096, 4096, None)


def test_a_model_shipping_yarn_over_its_max_position_is_started_from_what_it_serves(tmp_path, capsys):
    """A tiny Qwen2 whose config ships YaRN at factor 4 over its 64 tokens, max_position_embeddings left at 64:
    validate starts at the 256 it serves, and compare's `none` row is that YaRN, not plain RoPE."""
    model_dir = save_family_model("qwen2", tmp_path / "plain")
    config = json.loads((model_dir / "config.json").read_text())
    config["rope_parameters"] = yarn(4.0, ORIGINAL) | {"rope_theta": config["rope_parameters"]["rope_theta"]}
    model_dir = with_config(model_dir, config, tmp_path / "yarn")
    documents = tmp_path / "docs"
    documents.mkdir()
    for index in range(3):
        (documents / f"{index}.txt").write_text(" ".join(f"w{index}{n % 97}" for n in range(500)))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(byte_job(model_dir, documents, 16 * ORIGINAL, name="yarn-shipped")))
    assert main(["validate", str(path)]) == 0
    assert f"{4 * ORIGINAL} -> {16 * ORIGINAL} tokens (scale 4)" in capsys.readouterr().out
    context = JobContext.resolve(load_job_config(str(path), []))
    baselines = context.baselines()
    assert baselines[SHIPPED] == context.method and context.method.rope_type == "yarn"
    assert baselines[OWN_SCALING].factor == 16.0


GEMMA3_LINEAR = {
    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
}


def gemma3_config(**changes) -> dict:
    return {
        "model_type": "gemma3_text",
        "hidden_size": 256,
        "num_attention_heads": 2,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "rope_parameters": GEMMA3_LINEAR,
        **changes,
    }


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"max_position_embeddings": 0}, "max_position_embeddings: expected a positive integer"),
        ({"max_position_embeddings": 131071}, "max_position_embeddings: 131071 is not a whole multiple"),
        ({"rope_parameters": {**GEMMA3_LINEAR, "full_attention": {"rope_type": "linear", "factor": "8"}}}, "factor"),
        ({"rope_parameters": {**GEMMA3_LINEAR, "full_attention": {"rope_type": "linear", "factor": True}}}, "factor"),
    ],
    ids=["no length", "not a multiple", "a string factor", "a bool factor"],
)
def test_a_bad_length_or_factor_is_one_error_naming_it(changes, named):
    with pytest.raises(ModelLoadError) as caught:
        model_rope(gemma3_config(**changes))
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_a_linear_factor_moved_to_a_target_serves_exactly_that_target():
    """2.5 x 4097 tokens is not whole: the moved factor divides the unrounded span, so it serves the target."""
    rope = read("LlamaConfig", max_position_embeddings=4097, rope_parameters={"rope_type": "linear", "factor": 2.5})
    assert rope.serving_length == round(2.5 * 4097)
    moved = rope.method.moved_to(20484)
    assert moved.factor == pytest.approx(20484 / 4097, rel=1e-15) and moved.serving_length == 20484


def test_estimate_reads_the_pretrained_length_as_the_job_does():
    from longrope.search.cost.architecture import Architecture

    config = gemma3_config()
    assert (
        Architecture.from_hf_config(
            {**config, "intermediate_size": 512, "num_hidden_layers": 6, "vocab_size": 300}
        ).original_length
        == model_rope(config).original_length
        == 16384
    )


def test_validate_shows_a_short_factor_search_reading_windows_of_the_pretrained_length():
    """The span starts where the model serves; a short-factor search's windows are of the pre-trained length."""
    from longrope.search.cli.search_commands import validation_summary
    from longrope.search.job.validation_checks import validation_check

    config = load_job_config(None, ["target_length=1024", "search.factor=short", "search.long_factors=f.json"])
    checks = [
        validation_check("search.seeds", ["ones"], "ok", "resolved"),
        validation_check("data.search_source", "docs", "ok", "3 documents"),
        validation_check("data.test_source", "docs", "ok", "3 documents"),
    ]
    lines = validation_summary(config, {"original_length": 64, "serving_length": 256}, checks)
    assert "256 -> 1024 tokens (scale 4)" in lines[0]
    assert "search windows of 64 tokens" in lines[2]
