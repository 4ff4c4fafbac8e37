"""`longrope estimate` for the gradient optimizers: the budget of steps, polishes and backward window passes worked
by hand, backward FLOPs against torch's counter on the gradient scorer, saved bytes against torch's saved
tensors, and memory and time per device worked by hand."""

from __future__ import annotations

import json

import pytest
import torch
from estimate_helpers import (
    DEMO,
    counted_flops,
    cpu_rates,
    tiny_llama,
)

from longrope.encodings import LongRope
from longrope.search.cli.main import main
from longrope.search.cost.architecture import Architecture
from longrope.search.cost.budget import backward_flops, search_budget, window_evaluations
from longrope.search.cost.estimate import device_estimate
from longrope.search.cost.flops import elementwise_bytes
from longrope.search.cost.memory import (
    ForwardShape,
    gradient_memory,
    saved_bytes_per_position,
    worker_memory,
)
from longrope.search.optimizers.factory import load_job_config
from longrope.workers.models import load_model, read_model_config
from longrope.workers.random_llama import save_random_llama
from longrope.workers.reference_recipe import reference_model_dir
from longrope.workers.scorer import Scorer


def test_gradient_budget_worked_by_hand():
    """The demo (8 search windows, seeds pi/ntk/yarn, 20 generations of 16 after 32) with the gradient optimizers:
    gradient: 3 seeds + 60 steps + the best on the grid = 64 points on all 8 windows = 512 window evaluations,
    and 60 steps x (8 - 2 held out) = 360 backward window passes (240 with 4 windows a step); two seed files add
    at most 2 seeds each; hybrid: 32 + 20 x 16 = 352 GA candidates + 1 polish of the final best x (10 steps + 1 on
    the grid) = 363 points, 10 x 6 = 60 passes; polishing every 5 generations: 20 / 5 = 4 polishes, 352 + 44 =
    396 points, 240 passes; every 3: after 3, 6, .., 18 and the last, 7 polishes, 352 + 77 = 429, 420 passes."""
    gradient = load_job_config(DEMO, ["search.optimizer=gradient"])
    stage = search_budget(gradient, 128).stages[-1]
    assert (stage.candidates, stage.windows, stage.backward_windows) == (64, 8, 360)
    assert window_evaluations(gradient, search_budget(gradient, 128)) == 512
    fewer = load_job_config(DEMO, ["search.optimizer=gradient", "search.gradient.windows_per_step=4"])
    assert search_budget(fewer, 128).stages[-1].backward_windows == 240
    files = load_job_config(DEMO, ["search.optimizer=gradient", "search.seed_files=[a.json, b]"])
    assert search_budget(files, 128).stages[-1].candidates == 3 + 4 + 60 + 1
    hybrid = search_budget(load_job_config(DEMO, ["search.optimizer=hybrid"]), 128).stages[-1]
    assert (hybrid.candidates, hybrid.backward_windows) == (363, 60)
    for every, candidates, passes in [(5, 396, 240), (3, 429, 420)]:
        config = load_job_config(DEMO, ["search.optimizer=hybrid", f"search.gradient.polish_every={every}"])
        stage = search_budget(config, 128).stages[-1]
        assert (stage.candidates, stage.backward_windows) == (candidates, passes)
    assert search_budget(load_job_config(DEMO), 128).stages[-1].backward_windows == 0, "the GA takes no backward"


def gradient_flop_counts(tmp_path, attn_implementation: str) -> tuple[int, int]:
    """torch's counter on the project's Scorer: (one window's forward, its gradient pass), 256 tokens."""
    save_random_llama(tmp_path, tiny_llama())
    model, rope = load_model(tmp_path, device="cpu", attn_implementation=attn_implementation)
    scorer = Scorer(model, torch.randint(0, 300, (1, 257)), rope.method.original_inv_freq())
    candidate = LongRope.from_factors(torch.linspace(1, 2, 8), head_dim=16, original_length=128, target_length=256)
    forward = counted_flops(lambda: scorer.score([candidate]))
    return forward, counted_flops(lambda: scorer.score_with_gradient(candidate))


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_backward_flops_match_torchs_counter_on_the_gradient_scorer(tmp_path, implementation):
    """What a gradient pass adds to its forward, as `Scorer.score_with_gradient` spends it (checkpoint recompute
    without down_proj, input gradients only, the first layer's q/k/v and values without a backward): exact with
    eager attention; with SDPA the counter does not see the CPU flash kernel, so only linear and lm_head compare."""
    base = {"target_length": 256, "original_length": 128, "model": {"attn_implementation": implementation},
            "data": {"search_windows": 3}, "search": {"optimizer": "gradient"}}  # fmt: skip
    config = load_job_config(None, base=base)
    arch = Architecture.from_hf_config(tiny_llama().to_dict())
    stage = search_budget(config, 128).stages[-1]
    forward, gradient = gradient_flop_counts(tmp_path, implementation)
    extra = backward_flops(config, arch, stage, 128)
    expected = extra.total if implementation == "eager" else extra.linear + extra.lm_head
    assert gradient - forward == pytest.approx(expected, rel=1e-9)
    if implementation == "eager":  # by hand: recompute 90570752 - 2 x 2 x 256 x 64 x 176 (down_proj); backward
        # linear 47185920 - 2 x 256 x 64 x 128 (layer 0's q/k/v), attention 2 x 33554432 - 8388608, lm_head 9830400
        assert expected == 90570752 - 11534336 + 47185920 - 4194304 + 67108864 - 8388608 + 9830400


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_saved_bytes_per_position_equal_torchs_saved_tensors(dtype):
    """A transformers Llama layer past the first (input and cos/sin carrying autograd, weights frozen), SDPA: the
    bytes of every new storage autograd saves (not the input, cos/sin or weights), per position."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    for changes in ({}, {"num_attention_heads": 8, "hidden_size": 128, "intermediate_size": 300}):
        config = tiny_llama(**changes)
        config._attn_implementation = "sdpa"
        torch_dtype = getattr(torch, dtype)
        layer = LlamaDecoderLayer(config, layer_idx=1).eval().requires_grad_(False).to(torch_dtype)
        hidden = torch.randn(2, 48, config.hidden_size, dtype=torch_dtype, requires_grad=True)
        angles = torch.rand(2, 48, config.head_dim, requires_grad=True)
        cos, sin = angles.cos().to(torch_dtype), angles.sin().to(torch_dtype)
        known = {t.untyped_storage().data_ptr() for t in (hidden, cos, sin, *layer.parameters())}
        saved: dict[int, int] = {}

        def pack(tensor, known=known, saved=saved):
            if tensor.untyped_storage().data_ptr() not in known:
                saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            layer(hidden, attention_mask=None, position_embeddings=(cos, sin))
        arch = Architecture.from_hf_config(config.to_dict())
        assert sum(saved.values()) / (2 * 48) == saved_bytes_per_position(arch, dtype)


def test_gradient_memory_worked_by_hand():
    """d 64, 2 layers, 4 heads and 2 key/value heads of 16, MLP 128, vocabulary 100; 2 rows of 256 positions,
    float32, SDPA: the forward's memory (test_worker_memory_worked_by_hand) plus the gradient's."""
    arch = Architecture(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                        vocab_size=100)  # fmt: skip
    shape = ForwardShape(tokens=256, rows=2)
    forward = worker_memory(arch, shape, "float32", "sdpa")
    memory = gradient_memory(arch, shape, "float32", "sdpa")
    checkpoints = 2 * 512 * 64 * 4  # a hidden state per layer
    # saved per position: (4 x 64 + 4 x 32 + 3 x 128) x 4 + the second norm's input 64 x 4 + (4 + 2) float32 = 3352;
    # in flight: (64 + max(3 x 128, 2 x 64 + 2 x 32)) x 4 = 1792
    layer_backward = 512 * (3352 + 1792)
    loss = forward.loss_chunk + 512 * 64 * 4 + 512 * 100 * 4  # + the hidden states' and a chunk's logits' gradients
    assert (memory.checkpoints, memory.layer_backward, memory.loss_chunk) == (checkpoints, layer_backward, loss)
    assert memory.peak == forward.weights + checkpoints + max(forward.forward_peak + layer_backward, loss)
    assert forward.peak == forward.weights + max(forward.forward_peak, forward.loss_chunk), "forward-only: unchanged"


def test_gradient_time_and_memory_per_device():
    """The demo with the gradient optimizer on a CPU priced by hand (rates 1e10, fixed cost 1 ms): a backward
    window pass costs its FLOPs and 3 x the forward's elementwise bytes at those rates, plus 2 fixed costs per
    gradient forward shared by its 2 stacked windows of 1024; the job's hours add 360 of them to 64 candidates
    (3 seeds, 60 steps, the best on the grid)."""
    config = load_job_config(DEMO, ["search.optimizer=gradient"])
    arch = Architecture.from_hf_config(read_model_config(reference_model_dir()))
    device = device_estimate(config, arch, 128, "cpu", cpu_rates(1e-3), None)
    stage = search_budget(config, 128).stages[-1]
    extra = backward_flops(config, arch, stage, 128)
    backward = extra.total / 1e10 + 3 * elementwise_bytes(arch, 1024, 4) / 1e10 + 2 * 1e-3 / 2
    assert device.gradient_rows_per_forward == 2 and device.seconds_per_backward_window == pytest.approx(backward)
    assert device.hours == pytest.approx((64 * device.seconds_per_candidate + 360 * backward) / 3600)
    assert device.gradient_memory == gradient_memory(arch, ForwardShape(tokens=1024, rows=2), "float32", "sdpa")
    assert device_estimate(load_job_config(DEMO), arch, 128, "cpu", cpu_rates(1e-3), None).gradient_memory is None


def test_cli_prints_the_gradient_budget(capsys):
    assert main(["estimate", str(DEMO), "--set", "search.optimizer=gradient", "--gpu", "H100"]) == 0
    text = capsys.readouterr().out
    assert (
        "64 (3 seeds + 60 steps + 1 on the grid" in text
        and "360 backward window passes" in text
        and "memory/grad." in text
    )
    assert main(["estimate", str(DEMO), "--set", "search.optimizer=hybrid", "--json", "--gpu", "H100"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["backward_window_passes"] == 60 and result["candidates"] == 363
    assert result["devices"][0]["gradient_memory"]["checkpoints"] > 0


def test_chunked_mlp_memory_worked_by_hand():
    """The arch of test_gradient_memory_worked_by_hand with the MLP in chunks of 128 tokens (2 rows: 64 positions
    each, 128 in all): the forward keeps 3 d a position for the MLP (normed input, the chunks' outputs, their
    concatenation) and one chunk's 3 I; the gradient saves the chunks' inputs (d) for the products (3 I) and holds
    one chunk's products and their gradients."""
    arch = Architecture(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                        vocab_size=100)  # fmt: skip
    shape = ForwardShape(tokens=256, rows=2)
    forward = worker_memory(arch, shape, "float32", "sdpa", chunk_tokens=128)
    # per position: residual 64 + input 64 + max(attention 64 + 2 x 64, MLP 3 x 64) + cos/sin 2 x 16 = 352
    assert forward.layer_activations == (512 * 352 + 128 * 3 * 128) * 4
    memory = gradient_memory(arch, shape, "float32", "sdpa", chunk_tokens=128)
    saved = 3352 - (3 * 128 - 64) * 4  # test_gradient_memory_worked_by_hand's 3352, the chunk inputs for the products
    in_flight = (64 + 2 * 64 + 2 * 32) * 4
    assert memory.layer_backward == 512 * (saved + in_flight) + 2 * 128 * 3 * 128 * 4
    unchunked = gradient_memory(arch, shape, "float32", "sdpa", chunk_tokens=512)  # one chunk: as before
    assert unchunked == gradient_memory(arch, shape, "float32", "sdpa") and memory.peak < unchunked.peak


def test_checkpoints_go_to_the_host_past_a_third_of_the_free_memory():
    """A GPU of 40 GiB, weights 5 GiB and the CUDA context's 1 GiB: 34 GiB free, so checkpoints of 11 GiB stay on
    the GPU (under 34 / 3) and 12 GiB go to the host, leaving the peak 12 GiB lower; the estimate's printed line
    says where they are."""
    from longrope.search.cli.estimate_command import _checkpoints_text
    from longrope.search.cost.memory import Memory, offloaded

    gib = 2**30
    base = {"keys_values": gib, "layer_activations": gib, "attention_matrix": 0.0, "loss_chunk": gib}
    staying = Memory(weights=5 * gib, checkpoints=11 * gib, **base)
    assert offloaded(staying, 40 * gib) == staying
    moving = Memory(weights=5 * gib, checkpoints=12 * gib, **base)
    moved = offloaded(moving, 40 * gib)
    assert (moved.checkpoints, moved.host_checkpoints) == (0.0, 12 * gib) and moved.peak == moving.peak - 12 * gib
    assert "12 GiB in host memory" in _checkpoints_text(moved)
