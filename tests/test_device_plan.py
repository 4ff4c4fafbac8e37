"""A worker's model spread over its GPUs (`workers.num_gpus_per_worker` >= 2): the device plan worked by hand for a
70B on 80 GiB GPUs, accelerate's own map built from the plan's `max_memory` on the meta device (fake GPU ids: no GPU
needed), the scorer on a model wrapped in accelerate's hooks scoring exactly as the plain model, and the estimate's
lines and JSON for a 70B at 32k on 4 GPUs a worker, worked by hand."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from longrope.search.cli.main import main
from longrope.search.config.strict import JobConfigError
from longrope.search.optimizers.factory import load_job_config
from longrope.workers.device_plan import plan_devices

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30
# Meta-Llama-3-70B's config.json numbers
LLAMA3_70B = {
    "model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
    "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256, "max_position_embeddings": 8192,
    "rope_theta": 500000.0, "dtype": "bfloat16",
}  # fmt: skip
# By hand: a layer is attention 2 x 8192^2 + 2 x 8192 x 1024 = 150994944, MLP 3 x 8192 x 28672 = 704643072 and two
# norms of 8192: 855654400; x 80 layers + untied embedding and lm_head 2 x 128256 x 8192 + the final norm 8192
PARAMETERS_70B = 80 * 855654400 + 2 * 128256 * 8192 + 8192  # 70553706496
WEIGHTS_70B = 2 * PARAMETERS_70B  # bfloat16: 141107412992 bytes, 131.4 GiB


def test_a_70b_needs_three_80_gib_gpus_at_0_8_worked_by_hand():
    """131.4 GiB of weights over 0.8 x 80 = 64 GiB a GPU: 2.05, so 3 GPUs (the release's ceil rule)."""
    plan = plan_devices(WEIGHTS_70B, 80, 3, 80 * GIB)
    assert PARAMETERS_70B == 70553706496 and plan.gpus_needed == 3 and plan.fits
    assert plan.max_memory == {0: 64 * GIB, 1: 64 * GIB, 2: 64 * GIB}  # 68719476736 bytes each
    assert plan.layers_per_device == (27, 27, 26) and (plan.first_device, plan.last_device) == (0, 2)
    assert plan.weights_per_gpu == pytest.approx(WEIGHTS_70B / 3)
    two = plan_devices(WEIGHTS_70B, 80, 2, 80 * GIB)
    assert not two.fits and two.problem() == (
        "workers.num_gpus_per_worker = 2: the weights (131 GiB) need 3 GPUs of 80 GiB at 0.8 of each"
    )
    # Llama-3-8B, 8030261248 parameters in bfloat16 (15 GiB): one GPU
    assert plan_devices(2 * 8030261248, 32, 2, 80 * GIB).gpus_needed == 1
    # on 141 GiB H200s, 0.8 x 141 = 112.8 GiB a GPU: two
    assert plan_devices(WEIGHTS_70B, 80, 2, 141 * GIB).gpus_needed == 2


def test_accelerate_places_a_70b_within_the_plans_max_memory():
    """The map transformers builds for `device_map="auto"` with the plan's max_memory (integrations/accelerate.py
    `_get_device_map`: get_balanced_memory, then infer_auto_device_map), on the meta device with fake GPU ids: every
    module on the worker's GPUs, none on the CPU or disk, the embedding on the first, lm_head on the last, each GPU
    within a layer or two of the plan's even split and its weights within max_memory."""
    from accelerate.utils import compute_module_sizes, get_balanced_memory, infer_auto_device_map
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**LLAMA3_70B), dtype=torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS_70B
    for gpus in (3, 4):
        plan = plan_devices(WEIGHTS_70B, 80, gpus, 80 * GIB)
        split = model._no_split_modules
        balanced = get_balanced_memory(model, max_memory=plan.max_memory, no_split_module_classes=split)
        device_map = infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=split)
        assert set(device_map.values()) == set(range(gpus))
        assert device_map["model.embed_tokens"] == plan.first_device and device_map["lm_head"] == plan.last_device
        layers = Counter(where for name, where in device_map.items() if name.startswith("model.layers."))
        assert all(abs(layers[index] - expected) <= 2 for index, expected in enumerate(plan.layers_per_device))
        sizes = compute_module_sizes(model)
        held = Counter()
        for name, where in device_map.items():
            held[where] += sizes[name]
        assert all(held[index] <= plan.max_memory[index] for index in range(gpus))


def test_scores_and_gradients_through_accelerates_hooks_are_the_plain_models():
    """The reference model with the hooks a multi-GPU device map attaches (accelerate big_modeling.py
    `dispatch_model` -> hooks.py `attach_align_device_hook_on_blocks`: an AlignDevicesHook on each module of the map,
    the top one moving outputs back), here every one executing on the CPU, scores and differentiates exactly as the
    plain model, and the scorer's wrappers (checkpointed layers, chunked MLPs) compose with the hooks' instance
    forwards and give them back."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module
    from test_gradient_scorer import candidate, reference_windows

    from longrope.workers.models import load_model
    from longrope.workers.reference_recipe import reference_model_dir
    from longrope.workers.scorer import Scorer

    plain, rope = load_model(reference_model_dir(), device="cpu")
    hooked, _ = load_model(reference_model_dir(), device="cpu")
    layers = [f"model.layers.{index}" for index in range(len(hooked.model.layers))]
    names = ["model.embed_tokens", *layers, "model.norm", "model.rotary_emb", "lm_head"]
    modules = dict(hooked.named_modules())
    add_hook_to_module(hooked, AlignDevicesHook(io_same_device=True))
    for name in names:
        add_hook_to_module(modules[name], AlignDevicesHook(execution_device="cpu", place_submodules=True))
    forwards = [layer.__dict__["forward"] for layer in hooked.model.layers]  # the hooks' instance forwards
    mlps = [layer.mlp.__dict__.get("forward") for layer in hooked.model.layers]
    windows, inv_freq = reference_windows(3), rope.method.original_inv_freq()
    scores = []
    for model in (plain, hooked):
        scorer = Scorer(model, windows, inv_freq, mlp_chunk_tokens=64)
        other = candidate(top=5.0, attention=None, n_hat=8)  # n_hat: the original frequencies below position 8
        scores.append((scorer.score([candidate(), other]), scorer.score_with_gradient(candidate())))
    assert scores[0] == scores[1]
    assert [layer.__dict__["forward"] for layer in hooked.model.layers] == forwards
    assert [layer.mlp.__dict__.get("forward") for layer in hooked.model.layers] == mlps


def write_70b(tmp_path: Path) -> Path:
    path = tmp_path / "Llama-3-70B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA3_70B))
    return path


def estimate(capsys, model_config: Path, gpus: int, *json_flag: str) -> str:
    config = ROOT / "configs" / "llama2-7b-32k.yaml"
    sets = ["original_length=8192", "target_length=32768", f"workers.num_gpus_per_worker={gpus}"]
    argv = ["estimate", str(config), "--model-config", str(model_config), "--gpu", "H100", *json_flag]
    assert main([*argv, *(arg for value in sets for arg in ("--set", value))]) == 0
    return capsys.readouterr().out


def test_estimate_of_a_70b_at_32k_on_four_gpus_a_worker_worked_by_hand(capsys, tmp_path):
    """One 32k window a forward in bfloat16, by hand (search/cost/memory.py's terms): keys/values 2 x 32768 x 1024
    x 2 = 134217728; layer 2 x (32768 x (2 x 8192 + max(8192 + 2 x 8192, 3 x 8192) + 2 x 128) + 16384 x 3 x
    28672) = 5519704064; the loss 1850212352; headroom 2^30 + 2 x 32768 x 128 x 4 + 0.05 x 5653921792. The busiest
    GPU: 141107412992 / 4 + 5653921792 + 1389992345.6 = 42320767385.6 bytes (39.4 GiB) of 80 GiB. The weights
    need 3 GPUs at 0.8; the device time is 4 x one GPU's, the seconds per candidate and every memory term as N = 1."""
    model_config = write_70b(tmp_path)
    one = json.loads(estimate(capsys, model_config, 1, "--json"))["devices"][0]
    four = json.loads(estimate(capsys, model_config, 4, "--json"))["devices"][0]
    assert four["memory"] == one["memory"] and four["memory"]["weights"] == WEIGHTS_70B
    assert four["memory"]["forward_peak"] == 134217728 + 5519704064 and four["memory"]["loss_chunk"] == 1850212352
    headroom = GIB + 2 * 32768 * 128 * 4 + 0.05 * 5653921792
    assert four["headroom"] == pytest.approx(headroom, rel=1e-12)
    assert four["memory_per_gpu"] == pytest.approx(WEIGHTS_70B / 4 + 5653921792 + headroom, rel=1e-12)
    assert four["gpus_per_worker"] == 4 and four["fits"] is True
    plan = four["device_plan"]
    assert plan["gpus_needed"] == 3 and plan["fits"] and plan["max_memory"] == {str(i): 64 * GIB for i in range(4)}
    assert plan["layers_per_device"] == [20, 20, 20, 20]
    assert four["seconds_per_candidate"] == one["seconds_per_candidate"]
    assert four["hours"] == pytest.approx(4 * one["hours"], rel=1e-12)
    assert four["devices_in_parallel"] == 4 * one["devices_in_parallel"] == 32  # 8 workers x 4 GPUs
    # at N = 1 the new fields say nothing and the fit is the whole peak's, as before
    assert one["gpus_per_worker"] == 1 and one["device_plan"] is None and one["memory_per_gpu"] is None
    assert one["fits"] is False  # 131 GiB of weights on one 80 GiB GPU
    text = estimate(capsys, model_config, 4)
    assert (
        "  GPUs/worker    needs 3 x 80 GiB for the weights at 0.8 of each; 4 given (max_memory 64 GiB each, "
        "layers 20/20/20/20)" in text
    )
    assert "  memory/GPU     39.4 GiB of 80 GiB: fits (the busiest GPU: 1/4 of the weights 32.9 GiB" in text
    assert "  memory/worker  138 GiB over 4 GPUs (bfloat16 weights 131 GiB" in text
    pipeline = "  pipeline       layers split over 4 GPUs, one computing at a time: a candidate's device time is 4 x"
    assert pipeline in text
    assert "GPUs/worker" not in estimate(capsys, model_config, 1)


def test_more_than_one_gpu_a_worker_is_whole_gpus():
    config = ROOT / "configs" / "llama2-7b-32k.yaml"
    with pytest.raises(JobConfigError, match=r"num_gpus_per_worker.*whole number of GPUs"):
        load_job_config(config, ["workers.num_gpus_per_worker=1.5"])
    assert load_job_config(config, ["workers.num_gpus_per_worker=0.5"]).workers.num_gpus_per_worker == 0.5


def test_without_cuda_a_multi_gpu_worker_loads_on_the_cpu():
    """A Ray fake-GPU worker (CUDA_VISIBLE_DEVICES set, torch sees no CUDA) falls back to one CPU copy, as a
    one-GPU worker does; the same model as `gpus=1`."""
    from longrope.workers.models import load_model
    from longrope.workers.reference_recipe import reference_model_dir

    spread, _ = load_model(reference_model_dir(), device="auto", gpus=2)
    plain, _ = load_model(reference_model_dir(), device="auto")
    assert not hasattr(spread, "hf_device_map") or set(spread.hf_device_map.values()) <= {"cpu"}
    assert spread.state_dict().keys() == plain.state_dict().keys()
    assert all(torch.equal(spread.state_dict()[name], tensor) for name, tensor in plain.state_dict().items())


def test_the_workers_plan_counts_the_meta_model_and_refuses_before_reading_a_weight(monkeypatch, tmp_path):
    """`device_plan_for` counts the 70B's parameters on the meta device at the load's dtype and reads each GPU's memory
    (here 80 GiB, faked: no CUDA on this machine); `spread_over_gpus` refuses too few GPUs, and weights that need
    more GPUs than the worker has, in one line each, before transformers opens a file (the directory has none)."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    from longrope.workers.errors import ModelLoadError
    from longrope.workers.models import device_plan_for, spread_over_gpus

    config = AutoConfig.for_model(**LLAMA3_70B)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(total_memory=80 * GIB))
    plan = device_plan_for(config, 4, torch.bfloat16, False)
    assert (plan.weights, plan.layers, plan.gpus_needed, plan.gpus) == (WEIGHTS_70B, 80, 3, 4)
    options = dict(dtype=torch.bfloat16, attention="sdpa", trust_remote_code=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ModelLoadError, match=r"^workers.num_gpus_per_worker = 2: the worker sees 1 CUDA devices$"):
        spread_over_gpus(tmp_path, config, 2, **options)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ModelLoadError, match=r"the weights \(131 GiB\) need 3 GPUs of 80 GiB at 0.8 of each$"):
        spread_over_gpus(tmp_path, config, 2, **options)
