"""What the estimate's tests share: small Llama configs, torch's FLOP counter, hand-set rates and the small
forward whose FLOPs and bytes are worked by hand."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, LlamaConfig

from longrope.search.cost.hardware import Rates
from longrope.search.optimizers.factory import load_job_config
from longrope.workers.random_llama import llama_config

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo.yaml"


def tiny_llama(**changes) -> LlamaConfig:
    shape = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4)
    shape.update(num_key_value_heads=2, head_dim=16, vocab_size=300, max_position_embeddings=128)
    return llama_config(**{**shape, **changes})


def meta_parameters(config) -> int:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def counted_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def cpu_rates(fixed_cost: float) -> Rates:
    return Rates(source="by hand", linear=1e10, attention=1e10, lm_head=1e10, memory=1e10, square_matmul=1e10,
                 forward_fixed_cost=fixed_cost)  # fmt: skip


def small_forward_config():
    """The reference model (d 128, 4 layers, 4 heads of 32, MLP 384, vocabulary 256), one candidate on one window
    of 32 tokens: one forward a candidate."""
    return load_job_config(
        DEMO,
        ["original_length=16", "target_length=32", "data.search_windows=1", "workers.batch_size=1"],
    )


# By hand for small_forward_config: linear 2 x 32 x 4 x (4 x 128^2 + 3 x 128 x 384) = 54525952, attention
# 4 x 4 x 4 x 32 x 32^2 / 2 = 1048576, lm_head 2 x 32 x 128 x 256 = 2097152 FLOPs; bytes per position: 4 layers x
# 7808 values + embedding and final norm 9 x 128 values, x 4 bytes, + cos/sin tables 10.5 x 32 x 4 = 130880.
SMALL_FORWARD_FLOPS = 54525952 + 1048576 + 2097152
SMALL_FORWARD_BYTES = 32 * 130880
