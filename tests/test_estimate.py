"""`longrope estimate`: parameter counts against real models, FLOPs against torch's own counter, memory worked
by hand, the candidate budget, and the command line (one error line, exit 2, the demo config); for `--gpu cpu`,
elementwise bytes and time worked by hand, forwards counted on the Scorer, and the time withheld where forwards'
fixed cost dominates (how the CPU is timed: tests/test_cpu_rates.py). No wall-clock limit: the CPU figures'
accuracy is bench/estimate_accuracy.py's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from estimate_helpers import (
    DEMO,
    ROOT,
    SMALL_FORWARD_BYTES,
    SMALL_FORWARD_FLOPS,
    counted_flops,
    cpu_rates,
    meta_parameters,
    small_forward_config,
    tiny_llama,
)
from transformers import LlamaForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from longrope.encodings import LongRope
from longrope.search.cli.main import main
from longrope.search.cost.architecture import KNOWN_MODELS, Architecture, parameter_count
from longrope.search.cost.budget import search_budget, stage_flops
from longrope.search.cost.estimate import device_estimate
from longrope.search.cost.flops import elementwise_bytes, forward_flops
from longrope.search.cost.hardware import FIXED_COST_SHARE_LIMIT, Rates, find_gpu, gpu_rates
from longrope.search.cost.memory import (
    ForwardShape,
    forwards_per_candidate,
    worker_memory,
    worker_threads,
)
from longrope.search.optimizers.factory import load_job_config
from longrope.workers.models import load_model, model_rope, read_model_config
from longrope.workers.random_llama import save_random_llama
from longrope.workers.reference_recipe import reference_model_dir
from longrope.workers.scorer import Scorer


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
    save_random_llama(tmp_path, tiny_llama())
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
    """The time printed is the time model at the rates it printed, and those rates are this machine's: its 2048
    matmul rate within 3x of the same matmul timed here, on one thread as a demo worker has."""
    assert main(["estimate", str(DEMO), "--set", "target_length=256", "--gpu", "cpu", "--json"]) == 0
    device = json.loads(capsys.readouterr().out)["devices"][0]
    assert device["device"] == "cpu" and device["dtype"] == "float32"
    config = load_job_config(DEMO, ["target_length=256"])
    arch = Architecture.from_hf_config(read_model_config(reference_model_dir()))
    again = device_estimate(config, arch, 128, "cpu", Rates(**device["rates"]), None)
    assert again.seconds_per_candidate == pytest.approx(device["seconds_per_candidate"], rel=1e-9)
    assert again.fixed_cost_share == pytest.approx(device["fixed_cost_share"], rel=1e-9)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a @ b
        seconds = []
        for _ in range(3):  # in this thread's CPU time, as estimate times one thread: the machine's load left out
            started = time.thread_time()
            a @ b
            seconds.append(time.thread_time() - started)
    finally:
        torch.set_num_threads(threads)
    assert 1 / 3 < device["rates"]["square_matmul"] / (2 * 2048**3 / min(seconds)) < 3


def test_known_architecture_for_a_missing_model_path(capsys):
    config = ROOT / "configs" / "llama3-8b-64k.yaml"
    assert main(["estimate", str(config), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "Meta-Llama-3-8B"
    assert result["original_length"] == model_rope(KNOWN_MODELS["Meta-Llama-3-8B"]).original_length


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set", "target_length=64"], "target_length: must be greater than original_length (128), got 64"),
        (["--set", "search.population=0"], "search.population = 0: Input should be greater than or equal to 2"),
        (["--set", "model.path=/nowhere/at-all"], "model.path: no config.json at '/nowhere/at-all'"),
        (["--model-config", "/nowhere/config.json"], "--model-config '/nowhere/config.json': no such file"),
        (["--gpu", "V100"], "--gpu 'V100': unknown GPU (known: A100, H100-SXM"),
        (["--mfu", "1.5"], "--mfu = 1.5: must be in (0, 1]"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    """Each names the flag or field and the value given."""
    assert main(["estimate", str(DEMO), *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("longrope: error: ") and captured.err.count("\n") == 1
    assert message in captured.err


def test_bad_model_config_json_is_one_line(capsys, tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    assert main(["estimate", str(DEMO), "--model-config", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"'{tmp_path / 'config.json'}' is not valid JSON (Expecting property name" in err


def test_estimate_modules_import_neither_torch_nor_ray():
    code = (
        "import sys; import longrope.search.cost.estimate, longrope.search.cli.estimate_command; "
        "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ----------------------------------------------------------------------------------------------------- CPU time


def test_elementwise_bytes_worked_by_hand():
    """d 64, 2 layers, 4 heads and 2 key/value heads of 16, MLP 128; 10 positions."""
    arch = Architecture(
        hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=100
    )
    # per layer and position: norms 2 x 7 x 64, residual adds 2 x 3 x 64, RoPE 12 x (64 + 32), transpose copy
    # 2 x 64, SiLU 2 x 128 and gate * up 3 x 128 = 896 + 384 + 1152 + 128 + 640 = 3200 values
    # per forward and position: embedding 2 x 64 + final norm 7 x 64 = 576 values at the dtype, cos/sin tables
    # 10.5 x 16 = 168 float32 values, and in bfloat16 their cast: 2 x 16 x (4 + 2) bytes
    assert elementwise_bytes(arch, 10, 4) == 10 * (2 * 3200 * 4 + 576 * 4 + 168 * 4)
    assert elementwise_bytes(arch, 10, 2) == 10 * (2 * 3200 * 2 + 576 * 2 + 168 * 4 + 2 * 16 * 6)


@pytest.mark.parametrize(
    ("batch", "group", "windows", "tokens", "forwards"),
    [(2, 4, 8, 1024, 8), (4, 4, 8, 256, 4), (5, 4, 8, 256, 5), (3, 1, 3, 512, 3), (1, 1, 8, 64, 1)],
)
def test_forwards_per_candidate_as_the_scorer_runs_them(tmp_path, batch, group, windows, tokens, forwards):
    """Forwards of one call of `batch` candidates, worked by hand and counted on the project's Scorer (CPU, 2048
    tokens a forward): the demo's 2 candidates share 8 forwards of 2 rows (one window each); 4 candidates x 2
    windows of 256 fill a forward (4); 5 in groups of 4 and 1 take 4 + 1 (the last stacks all 8 windows)."""
    config = load_job_config(
        None,
        base={
            "target_length": tokens,
            "original_length": 32,
            "data": {"search_windows": windows},
            "workers": {"candidates_per_forward": group, "batch_size": batch},
        },
    )
    estimated = forwards_per_candidate(config, tokens, windows, "cpu")
    assert estimated == pytest.approx(forwards / batch)
    model = LlamaForCausalLM(tiny_llama(max_position_embeddings=32)).eval()
    arch = Architecture.from_hf_config(tiny_llama().to_dict())
    scorer = Scorer(model, torch.randint(0, arch.vocab_size, (windows, tokens + 1)), torch.ones(arch.head_dim // 2),
                    candidates_per_forward=group)  # fmt: skip
    calls = []
    original = model.model.forward
    model.model.forward = lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
    candidate = LongRope.from_factors(torch.ones(arch.head_dim // 2), head_dim=arch.head_dim, original_length=32,
                                      target_length=tokens)  # fmt: skip
    scorer.score([candidate] * batch)
    assert len(calls) == forwards


def test_worker_threads_follow_ray():
    """Ray gives an actor OMP_NUM_THREADS = floor(num_cpus), at least 1, unless the environment sets it."""
    config = load_job_config(DEMO)
    assert worker_threads(config) == 1
    assert worker_threads(load_job_config(DEMO, ["workers.num_cpus_per_worker=2.5"])) == 2
    assert worker_threads(load_job_config(DEMO, ["workers.num_cpus_per_worker=0.5"])) == 1
    assert worker_threads(config, "3") == 3 and worker_threads(config, "") == 1 and worker_threads(config, "x") == 1


def test_time_adds_forwards_fixed_cost_worked_by_hand():
    config = small_forward_config()
    arch = Architecture.from_hf_config(read_model_config(reference_model_dir()))
    device = device_estimate(config, arch, 16, "cpu", cpu_rates(1e-4), None)
    assert device.forwards_per_candidate == 1
    work = SMALL_FORWARD_FLOPS / 1e10 + SMALL_FORWARD_BYTES / 1e10
    assert device.seconds_per_candidate == pytest.approx(work + 1e-4)
    assert device.fixed_cost_share == pytest.approx(1e-4 / (work + 1e-4))
    assert device.time_withheld is None


def test_time_is_withheld_where_forwards_fixed_cost_dominates():
    """Over FIXED_COST_SHARE_LIMIT (a tenth) of a candidate's time in fixed cost, no time: 1 ms of fixed cost
    against 6.186 ms of work is a 14% share; 0.5 ms is 7.5%, under it."""
    config = small_forward_config()
    arch = Architecture.from_hf_config(read_model_config(reference_model_dir()))
    device = device_estimate(config, arch, 16, "cpu", cpu_rates(1e-3), None)
    assert FIXED_COST_SHARE_LIMIT == 0.10 and device.fixed_cost_share == pytest.approx(1 / 7.186, abs=1e-3)
    assert device.seconds_per_candidate is None and device.hours is None and device.hours_racing is None
    assert "14% forwards' fixed cost" in device.time_withheld and "above 10%" in device.time_withheld
    assert "bench/estimate_accuracy.py" in device.time_withheld and "search.generations=0" in device.time_withheld
    work = SMALL_FORWARD_FLOPS / 1e10 + SMALL_FORWARD_BYTES / 1e10  # 6.186 ms
    assert device_estimate(config, arch, 16, "cpu", cpu_rates(5e-4), None).seconds_per_candidate == pytest.approx(
        work + 5e-4
    )
    # on a GPU the same forward is launch-bound: (40 ops x 4 layers + 20) x 10 us = 1.8 ms against 0.15 us of
    # FLOPs at the datasheet's dense bf16 rate (989 TFLOP/s) x MFU 0.4
    gpu = device_estimate(config, arch, 16, "H100-SXM", gpu_rates(find_gpu("H100"), 0.4), 80)
    flops_time = SMALL_FORWARD_FLOPS / (989e12 * 0.4)
    assert gpu.fixed_cost_share == pytest.approx(1.8e-3 / (1.8e-3 + flops_time))
    assert gpu.seconds_per_candidate is None and "1.8 ms each assumed" in gpu.time_withheld


def test_gpu_time_is_the_flops_at_peak_x_mfu_and_launch_overhead_only_withholds():
    """Llama-2-7B at 32k (configs/llama2-7b-32k.yaml, 5 windows, one a forward): the time is the FLOPs at 989
    TFLOP/s x 0.4, and the assumed launch overhead, 5 forwards x (40 x 32 + 20) x 10 us = 65 ms, is a share
    of it and the time together, far under a quarter."""
    config = load_job_config(ROOT / "configs" / "llama2-7b-32k.yaml")
    arch = Architecture.from_hf_config(KNOWN_MODELS["Llama-2-7b-hf"])
    gpu = device_estimate(config, arch, 4096, "H100-SXM", gpu_rates(find_gpu("H100"), 0.4), 80)
    stage = search_budget(config, 4096).stages[-1]
    flops = stage_flops(config, arch, stage, 4096).total
    assert gpu.seconds_per_candidate == pytest.approx(flops / (989e12 * 0.4), rel=1e-9)
    assert gpu.forwards_per_candidate == 5
    assert gpu.fixed_cost_share == pytest.approx(0.065 / (0.065 + gpu.seconds_per_candidate))


def test_cli_says_in_one_line_why_no_time(capsys, monkeypatch):
    from longrope.search.cost import cpu_rates as cpu_rates_module

    monkeypatch.setattr(cpu_rates_module, "measure_cpu_rates", lambda *args, **kwargs: cpu_rates(3e-3))
    argv = ["estimate", str(DEMO), "--gpu", "cpu", "--set", "original_length=16", "--set", "target_length=32",
            "--set", "data.search_windows=1", "--set", "workers.batch_size=1"]  # fmt: skip
    assert main(argv) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("time")]
    assert len(lines) == 1 and "not estimated: at 32 tokens" in lines[0] and "s per candidate" not in lines[0]
    assert main([*argv, "--json"]) == 0
    device = json.loads(capsys.readouterr().out)["devices"][0]
    assert device["seconds_per_candidate"] is None and device["time_withheld"].startswith("at 32 tokens")
