"""`longrope estimate --gpu cpu`'s timing of this CPU: the replayed layer against transformers' own and against
torch's FLOP counter, the replay cut to 8192 positions with rates from its own counts, a forward's fixed cost for
each known family, and the one-thread clock. No wall-clock limit: the figures' accuracy is
bench/estimate_accuracy.py's."""

from __future__ import annotations

import time

import pytest
import torch
from estimate_helpers import counted_flops, tiny_llama

from longrope.search.cost.architecture import KNOWN_MODELS, Architecture
from longrope.search.cost.flops import elementwise_bytes, forward_flops
from longrope.search.cost.memory import ForwardShape
from longrope.workers.models import read_model_config
from longrope.workers.reference_recipe import reference_model_dir


def test_the_replayed_layer_is_transformers_llama_layer():
    """cpu_rates.decoder_layer, which the CPU rates are timed on, computes what transformers' LlamaDecoderLayer
    computes from the same weights (GQA, SDPA and eager, biases): it does the work the scorer's forward does."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from longrope.search.cost.cpu_rates import Stopwatch, decoder_layer

    for implementation in ("sdpa", "eager"):
        config = tiny_llama(attention_bias=True)
        config._attn_implementation = implementation
        layer = LlamaDecoderLayer(config, layer_idx=0).eval()
        arch = Architecture.from_hf_config(config.to_dict())
        attn, mlp = layer.self_attn, layer.mlp
        modules = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj, "o": attn.o_proj}
        modules |= {"gate": mlp.gate_proj, "up": mlp.up_proj, "down": mlp.down_proj}
        weights = {name: module.weight for name, module in modules.items()}
        weights |= {f"{name}_bias": module.bias for name, module in modules.items() if module.bias is not None}
        with torch.no_grad():  # norm weights other than ones, so a swapped or skipped weight shows
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
            layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
        weights |= {"norm_1": layer.input_layernorm.weight, "norm_2": layer.post_attention_layernorm.weight}
        hidden = torch.randn(2, 24, config.hidden_size)
        angles = torch.rand(2, 24, config.head_dim)
        cos, sin = angles.cos(), angles.sin()
        eager = implementation == "eager"
        mask = torch.full((24, 24), float("-inf")).triu(1)[None, None] if eager else None  # SDPA: is_causal
        watch = Stopwatch(time.perf_counter)
        with torch.inference_mode():
            expected = layer(hidden, attention_mask=mask, position_embeddings=(cos, sin))
            replayed = decoder_layer(arch, weights, hidden, cos, sin, 1.0 if eager else 0.5, watch)
        torch.testing.assert_close(replayed, expected, rtol=1e-5, atol=1e-5)


def test_the_replayed_layer_does_the_counted_flops():
    """The rates divide forward_flops by the replay's time: torch's counter, on the replayed eager layer, counts
    one layer's share of those FLOPs (linear + full-matrix attention) for the rows replayed."""
    from longrope.search.cost.cpu_rates import Stopwatch, decoder_layer, layer_weights

    arch = Architecture.from_hf_config(tiny_llama().to_dict())
    rows, tokens = 3, 40
    weights = layer_weights(arch, "float32")
    hidden, cos, sin = torch.randn(rows, tokens, arch.hidden_size), *torch.rand(2, rows, tokens, arch.head_dim)
    watch = Stopwatch(time.perf_counter)
    counted = counted_flops(lambda: decoder_layer(arch, weights, hidden, cos, sin, 1.0, watch))
    expected = forward_flops(arch, tokens, causal=1.0) * rows
    assert counted == pytest.approx((expected.linear + expected.attention) / arch.num_layers, rel=1e-6)
    assert set(watch.spent) == {"linear", "attention", "elementwise", "outside"} and watch.spent["outside"] == 0


@pytest.mark.parametrize(
    ("tokens", "rows", "replayed"),
    [(65536, 1, (8192, 1)), (8192, 1, (8192, 1)), (1024, 4, (1024, 4)), (4096, 4, (4096, 2)), (16384, 3, (8192, 1))],
)
def test_a_long_forward_is_replayed_at_8192_positions(tokens, rows, replayed):
    """Worked by hand: a row is cut to 8192 positions, and rows of one length are dropped until they hold 8192."""
    from longrope.search.cost.cpu_rates import replay_shape

    shape = replay_shape(ForwardShape(tokens=tokens, rows=rows))
    assert (shape.tokens, shape.rows) == replayed


def test_rates_divide_the_replayed_forwards_flops_by_its_time(monkeypatch):
    """A 1M-token job's rates are its replay's FLOPs and bytes over the replay's time: counting the job's own
    FLOPs over a shorter replay's seconds would overstate every rate (by 128x for linear at 1M / 8192)."""
    from longrope.search.cost import cpu_rates as cpu_rates_module

    replayed = []

    def timed(arch, shape, dtype, causal, repeats, clock):
        replayed.append(shape)
        return {"linear": 2.0, "attention": 3.0, "elementwise": 5.0}

    monkeypatch.setattr(cpu_rates_module, "forward_seconds", timed)
    arch = Architecture.from_hf_config(read_model_config(reference_model_dir()))
    rates = cpu_rates_module.measure_cpu_rates(arch, ForwardShape(tokens=2**20, rows=1), "float32", threads=1)
    assert replayed == [ForwardShape(tokens=8192, rows=1)]
    flops = forward_flops(arch, 8192, causal=0.5)
    assert rates.linear == pytest.approx(flops.linear / 2.0) and rates.attention == pytest.approx(flops.attention / 3)
    assert rates.memory == pytest.approx(elementwise_bytes(arch, 8192, 4) / 5.0)
    assert "1 x 8192 positions" in rates.source


@pytest.mark.parametrize("name", ["reference", *KNOWN_MODELS])
def test_forward_fixed_cost_is_measured_for_each_family(name):
    """The toy-width model builds and scores for the reference model and every known architecture (Llama,
    Mistral, Phi-3 with its LongRoPE factors): same model type, layers and head size, one head."""
    from longrope.search.cost.cpu_rates import forward_fixed_cost_seconds, toy_model_config

    settings = read_model_config(reference_model_dir()) if name == "reference" else KNOWN_MODELS[name]
    arch = Architecture.from_hf_config(settings)
    toy = Architecture.from_hf_config(toy_model_config(settings, arch))
    assert (toy.num_layers, toy.head_dim, toy.num_heads, toy.hidden_size) == (arch.num_layers, arch.head_dim, 1,
                                                                              arch.head_dim)  # fmt: skip
    assert forward_fixed_cost_seconds(settings, arch, "float32", "sdpa", 1, time.perf_counter) >= 0


def test_one_thread_is_timed_in_its_own_cpu_time():
    """A one-thread worker's forward is timed in thread CPU time, which other processes' load does not reach (the
    wall clock put the demo at 4.7 s a candidate instead of 0.3 with two test suites running beside it); several
    threads work outside the calling thread, so they keep the wall clock. Checked here by burning CPU in another
    thread while timing: thread CPU time does not see it."""
    import threading

    from longrope.search.cost.cpu_rates import worker_clock

    assert worker_clock(1) is time.thread_time and worker_clock(2) is time.perf_counter
    stop = threading.Event()
    burner = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)], daemon=True)
    started_cpu, started_wall = time.thread_time(), time.perf_counter()
    burner.start()
    time.sleep(0.3)  # this thread sleeps: no CPU of its own, while the burner holds the GIL and a core
    stop.set()
    burner.join()
    assert time.thread_time() - started_cpu < 0.1 < time.perf_counter() - started_wall
