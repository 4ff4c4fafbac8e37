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
    assert set(watch.spent) == {"linear", "attention", "local_attention", "elementwise", "outside"}
    assert watch.spent["outside"] == watch.spent["local_attention"] == 0


@pytest.mark.parametrize(
    ("tokens", "rows", "replayed"),
    [(131072, 1, (32768, 1)), (32768, 1, (32768, 1)), (1024, 4, (1024, 4)), (16384, 4, (16384, 2)),
     (65536, 3, (32768, 1))],
)  # fmt: skip
def test_a_long_forward_is_replayed_at_32768_positions(tokens, rows, replayed):
    """Worked by hand: a row is cut to 32768 positions, and rows of one length are dropped until they hold 32768."""
    from longrope.search.cost.cpu_rates import replay_shape

    shape = replay_shape(ForwardShape(tokens=tokens, rows=rows))
    assert (shape.tokens, shape.rows) == replayed


def test_a_layer_attending_a_prefix_gives_the_full_layers_outputs_there():
    """Causal attention on the first 16 of 40 positions: those 16 outputs are the full layer's (a later key is never
    seen), and torch's counter finds the projections of all 40 positions but attention over 16."""
    from longrope.search.cost.cpu_rates import Stopwatch, decoder_layer, layer_weights

    arch = Architecture.from_hf_config(tiny_llama().to_dict())
    weights = layer_weights(arch, "float32")
    hidden, cos, sin = torch.randn(2, 40, arch.hidden_size), *torch.rand(2, 2, 40, arch.head_dim)
    watch = Stopwatch(time.perf_counter)
    with torch.inference_mode():
        full = decoder_layer(arch, weights, hidden, cos, sin, 0.5, watch)
        prefix = decoder_layer(arch, weights, hidden, cos, sin, 0.5, watch, attended=16)
    torch.testing.assert_close(prefix[:, :16], full[:, :16], rtol=1e-5, atol=1e-6)
    assert prefix.shape == full.shape and not torch.allclose(prefix[:, 16:], full[:, 16:])
    counted = counted_flops(lambda: decoder_layer(arch, weights, hidden, cos, sin, 1.0, watch, attended=16))
    linear, attention = forward_flops(arch, 40, causal=1.0).linear, forward_flops(arch, 16, causal=1.0).attention
    assert counted == pytest.approx(2 * (linear + attention) / arch.num_layers, rel=1e-6)


def test_rates_divide_the_replayed_forwards_flops_by_its_time(monkeypatch):
    """A 1M-token job's rates are its replay's FLOPs and bytes over the replay's time (attention's over the 8192
    positions it attends): counting the job's own FLOPs over a shorter replay's seconds would overstate every rate
    (by 32x for linear at 1M / 32768)."""
    from longrope.search.cost import cpu_rates as cpu_rates_module

    replayed = []

    def timed(arch, shape, dtype, causal, repeats, clock, attended):
        replayed.append((shape, attended))
        return {"linear": 2.0, "attention": 3.0, "local_attention": 0.0, "elementwise": 5.0}

    monkeypatch.setattr(cpu_rates_module, "forward_seconds", timed)
    arch = Architecture.from_hf_config(read_model_config(reference_model_dir()))
    rates = cpu_rates_module.measure_cpu_rates(arch, ForwardShape(tokens=2**20, rows=1), "float32", threads=1)
    assert replayed == [(ForwardShape(tokens=32768, rows=1), 8192)]
    linear, attention = forward_flops(arch, 32768, causal=0.5).linear, forward_flops(arch, 8192, causal=0.5).attention
    assert rates.linear == pytest.approx(linear / 2.0) and rates.attention == pytest.approx(attention / 3.0)
    assert rates.memory == pytest.approx(elementwise_bytes(arch, 32768, 4) / 5.0)
    assert "1 x 32768 positions, attention on 8192" in rates.source and rates.local_attention is None


GEMMA3_SHAPE = {"hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 2, "num_key_value_heads": 1,
                "head_dim": 32, "intermediate_size": 128, "vocab_size": 256, "sliding_window": 16,
                "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}  # fmt: skip


@pytest.mark.parametrize(
    ("local", "layers", "replayed", "windowed"),
    [(15, 18, 18, 15), (15, 18, 1, 0), (4, 4, 4, 4), (4, 4, 1, 1), (2, 4, 3, 2), (1, 4, 4, 1), (0, 4, 4, 0)],
)
def test_windowed_layers_replayed_worked_by_hand(local, layers, replayed, windowed):
    """The model's share of the replayed layers, at least one of each kind it has: 15 of 18 at 18 replayed is 15,
    at 1 none (the windowed layers then go at the full layers' rate); 2 of 4 at 3 is round(1.5) = 2, one full left."""
    from longrope.search.cost.cpu_rates import windowed_replay

    arch = Architecture(
        name="x", hidden_size=64, num_layers=layers, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=128,
        vocab_size=256, local_layers=local, local_window=16 if local else None,
    )  # fmt: skip
    assert windowed_replay(arch, replayed) == windowed


def test_a_windowed_layer_replays_the_sliding_window():
    """The replay's windowed attention is attention within the window: SDPA with transformers' sliding-window mask
    (key <= query and key > query - window) gives the same output, on 40 positions (queries past several blocks)."""
    import torch.nn.functional as F

    from longrope.search.cost.cpu_rates import windowed_attention
    from longrope.workers import families

    arch = Architecture.from_hf_config({"model_type": "gemma3_text", **GEMMA3_SHAPE})
    q, k, v = torch.randn(1, 2, 40, 32), torch.randn(1, 1, 40, 32), torch.randn(1, 1, 40, 32)
    query, key = torch.arange(40)[:, None], torch.arange(40)[None]
    mask = (key <= query) & (key > query - 16)
    expected = F.scaled_dot_product_attention(q, k.expand(1, 2, 40, 32), v.expand(1, 2, 40, 32), attn_mask=mask)
    original_block = families.QUERY_BLOCK
    try:
        families.QUERY_BLOCK = 8  # several query blocks at this size
        torch.testing.assert_close(windowed_attention(arch, q, k, v, 16), expected, rtol=1e-5, atol=1e-6)
    finally:
        families.QUERY_BLOCK = original_block


def test_a_model_with_windowed_layers_gets_their_rate_apart():
    """A Gemma 3-shaped model (5 windowed layers, 1 full) is timed with both kernels: each rate is its kind's FLOPs
    at the attended positions over that kind's measured seconds, and `seconds` prices each kind at its own rate."""
    from longrope.search.cost.cpu_rates import measure_cpu_rates
    from longrope.search.cost.hardware import seconds

    arch = Architecture.from_hf_config({"model_type": "gemma3_text", **GEMMA3_SHAPE})
    rates = measure_cpu_rates(arch, ForwardShape(tokens=256, rows=1), "float32", threads=1, repeats=1)
    assert rates.local_attention is not None and rates.local_attention > 0 and rates.attention > 0
    flops = forward_flops(arch, 256)
    assert flops.local_attention == 5 * 4 * 2 * 32 * 256 * min(128, 1024 + 16 - 1) and flops.attention > 0
    by_kind = flops.linear / rates.linear + flops.attention / rates.attention + flops.lm_head / rates.lm_head
    assert seconds(flops, rates) == pytest.approx(by_kind + flops.local_attention / rates.local_attention)
    assert seconds(flops, rates.model_copy(update={"local_attention": None})) == pytest.approx(
        by_kind + flops.local_attention / rates.attention
    )


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
