"""`longrope estimate`: parameter counts against real models, FLOPs against torch's own counter, memory worked
by hand, the candidate budget, and the command line (one error line, exit 2, the demo config)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from longrope.encodings import LongRope
from longrope.search.cli import main
from longrope.search.estimate import (
    KNOWN_MODELS,
    Architecture,
    ForwardShape,
    forward_flops,
    parameter_count,
    search_budget,
    stage_flops,
    worker_memory,
)
from longrope.search.job_config import load_job_config
from longrope.workers.models import load_model, model_rope
from longrope.workers.scorer import Scorer

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo.yaml"


def tiny_llama(**changes) -> LlamaConfig:
    settings = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    return LlamaConfig(**{**settings, **changes})


def meta_parameters(config) -> int:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "changes",
    [{}, {"tie_word_embeddings": True}, {"attention_bias": True}, {"mlp_bias": True}, {"num_key_value_heads": 4}],
)
def test_parameter_count_equals_a_real_llama(changes):
    config = tiny_llama(**changes)
    assert parameter_count(Architecture.from_hf_config(config.to_dict())) == meta_parameters(config)


@pytest.mark.parametrize("model_type", ["qwen2", "mistral", "phi3"])
def test_parameter_count_equals_other_families(model_type):
    config = CONFIG_MAPPING[model_type](**{k: v for k, v in tiny_llama().to_dict().items() if k != "model_type"})
    assert parameter_count(Architecture.from_hf_config(config.to_dict())) == meta_parameters(config)


@pytest.mark.parametrize("name", list(KNOWN_MODELS))
def test_known_architectures_build_and_count(name):
    """The table's numbers make the model transformers builds, counted the same (on the meta device)."""
    settings = KNOWN_MODELS[name]
    config = CONFIG_MAPPING[settings["model_type"]](**{k: v for k, v in settings.items() if k != "model_type"})
    assert parameter_count(Architecture.from_hf_config(settings)) == meta_parameters(config)


def counted_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("tokens", [64, 200])
def test_forward_flops_match_torchs_counter(tokens):
    """Eager attention multiplies the whole T x T matrix, which torch counts (f = 1); with SDPA the counter does
    not see the CPU flash kernel, so only the linear and lm_head parts are comparable there."""
    config = tiny_llama()
    arch = Architecture.from_hf_config(config.to_dict())
    ids = torch.randint(0, config.vocab_size, (1, tokens))
    for implementation in ("eager", "sdpa"):
        model = LlamaForCausalLM(config).eval()
        model.config._attn_implementation = implementation
        with torch.inference_mode():
            counted = counted_flops(lambda m=model: m(input_ids=ids))
        estimate = forward_flops(arch, tokens, causal=1.0)
        expected = estimate.total if implementation == "eager" else estimate.linear + estimate.lm_head
        assert counted == pytest.approx(expected, rel=0.02)


def test_candidate_flops_match_the_scorer_under_torchs_counter(tmp_path):
    """A candidate's FLOPs as the project's Scorer spends them (rope patch, chunked loss) on a job's windows."""
    LlamaForCausalLM(tiny_llama()).save_pretrained(tmp_path, safe_serialization=True)
    model, rope = load_model(tmp_path, device="cpu", attn_implementation="eager")
    config = load_job_config(
        None,
        base={
            "target_length": 256,
            "original_length": 128,
            "model": {"attn_implementation": "eager"},
            "data": {"search_windows": 3},
        },
    )
    arch = Architecture.from_hf_config(tiny_llama().to_dict())
    stage = search_budget(config, 128).stages[-1]
    windows = torch.randint(0, arch.vocab_size, (stage.windows, stage.length + 1))
    scorer = Scorer(model, windows, rope.method.original_inv_freq(), candidates_per_forward=1)
    pairs = rope.rotary_dim // 2
    candidate = LongRope.from_factors(
        torch.linspace(1, 2, pairs), head_dim=rope.head_dim, original_length=128, target_length=256
    )
    counted = counted_flops(lambda: scorer.score([candidate]))
    assert counted == pytest.approx(stage_flops(config, arch, stage, 128).total, rel=0.02)


def test_worker_memory_worked_by_hand():
    """d 64, 2 layers, 4 heads and 2 key/value heads of 16, MLP 128, vocabulary 100, untied; 2 rows of 256
    positions, float32 (4 bytes)."""
    arch = Architecture(
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=100,
    )
    shape = ForwardShape(tokens=256, rows=2)
    # per layer: q 64x64, k and v 64x32 each, o 64x64, MLP 3 x 64x128, two norms of 64 -> 36992
    # all: 2 layers + embedding 100x64 + lm_head 100x64 + final norm 64 -> 86848 parameters
    weights = (2 * (4096 + 2 * 2048 + 4096 + 3 * 8192 + 128) + 2 * 6400 + 64) * 4
    keys_values = 2 * (2 * 256) * 32 * 4  # one layer's keys and values (no cache), 512 positions, 2 x 16 wide
    # per position: residual 64 + layer input 64 + the MLP's (normed 64 + 3 x 128) > attention's (64 + 2 x 64),
    # + RoPE cos and sin 2 x 16
    layer = (2 * 256) * (64 + 64 + 64 + 3 * 128 + 2 * 16) * 4
    loss = (2 * 256) * 64 * 4 + 512 * 100 * (4 + 4)  # last hidden states + a chunk's logits and log-softmax
    memory = worker_memory(arch, shape, "float32", "sdpa")
    assert (memory.weights, memory.keys_values, memory.layer_activations, memory.loss_chunk) == (
        weights,
        keys_values,
        layer,
        loss,
    )
    assert memory.peak == weights + max(keys_values + layer, loss)
    eager = worker_memory(arch, shape, "float32", "eager")
    assert eager.attention_matrix == 2 * 256 * 256 * (4 * (4 + 4 + 4) + 4)  # scores, softmax, cast; the mask


def test_budget_counts_stages_and_short_searches():
    config = load_job_config(DEMO, ["search.stages=[256, 512]"])
    budget = search_budget(config, 128)
    per_search = config.search.population + config.search.generations * (
        config.search.mutations + config.search.crossovers
    )
    assert [stage.length for stage in budget.stages] == [256, 512, config.target_length]
    assert budget.candidates == 3 * per_search
    short = load_job_config(
        DEMO, ["search.factor=short", "search.long_factors=x.json", "search.attention_factor.mode=longrope"]
    )
    assert [stage.length for stage in search_budget(short, 128).stages] == [128]


def test_cli_prints_the_demo_config(capsys):
    assert main(["estimate", str(DEMO)]) == 0
    text = capsys.readouterr().out
    assert "FLOPs/cand." in text and "memory/worker" in text and "H100-SXM" in text and "A100" in text
    assert main(["estimate", str(DEMO), "--json", "--gpu", "H200"]) == 0
    result = json.loads(capsys.readouterr().out)
    model, rope = load_model(Path(__file__).resolve().parent.parent / "workers" / "reference_model", device="cpu")
    assert result["parameters"] == sum(p.numel() for p in model.parameters())
    assert result["original_length"] == rope.original_length
    config = load_job_config(DEMO)
    assert result["stages"][-1]["windows"] == config.data.search_windows
    assert [device["device"] for device in result["devices"]] == ["H200"]


def test_cli_cpu_mode_measures_this_machine(capsys):
    assert main(["estimate", str(DEMO), "--set", "target_length=256", "--gpu", "cpu", "--json"]) == 0
    device = json.loads(capsys.readouterr().out)["devices"][0]
    assert device["device"] == "cpu" and device["dtype"] == "float32"
    assert device["rates"]["square_matmul"] > 0 and device["seconds_per_candidate"] > 0


def test_known_architecture_for_a_missing_model_path(capsys):
    config = ROOT / "configs" / "llama3-8b-64k.yaml"
    assert main(["estimate", str(config), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "Meta-Llama-3-8B"
    assert result["original_length"] == model_rope(KNOWN_MODELS["Meta-Llama-3-8B"]).original_length


@pytest.mark.parametrize(
    "argv",
    [
        ["--set", "target_length=64"],
        ["--set", "search.population=0"],
        ["--set", "model.path=/nowhere/at-all"],
        ["--model-config", "/nowhere/config.json"],
        ["--gpu", "V100"],
        ["--mfu", "1.5"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, capsys, tmp_path):
    assert main(["estimate", str(DEMO), *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("longrope: error: ") and captured.err.count("\n") == 1


def test_bad_model_config_json_is_one_line(capsys, tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    assert main(["estimate", str(DEMO), "--model-config", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_estimate_modules_import_neither_torch_nor_ray():
    code = (
        "import sys; import longrope.search.estimate, longrope.search.cli_estimate; "
        "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
