"""Tiny random-weight models of each family the scorer accepts, built with transformers' own config classes, and
transformers' own per-window NLL for them: the reference the scorer must equal (tests/test_families.py).

`initializer_range` 0.3 (not transformers' 0.02) makes positions move the NLL by whole nats, so a rotary layout,
an original length or a logit scale gotten wrong shows far above the tolerance.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

ORIGINAL = 64
TARGET = 256
VOCAB = 300
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=ORIGINAL,
    tie_word_embeddings=False,
    initializer_range=0.3,
)
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": ORIGINAL,
}
MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}

# family name -> (transformers config class name, its fields beyond SHAPE); the name is the docs table's row
FAMILY_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "llama (llama3 scaling)": ("LlamaConfig", {"max_position_embeddings": 4 * ORIGINAL, "rope_parameters": LLAMA3}),
    "mistral": ("MistralConfig", {"sliding_window": None}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {}),
    "qwen2_moe": ("Qwen2MoeConfig", {"num_experts": 4, "shared_expert_intermediate_size": 32, **MOE}),
    "qwen3_moe": ("Qwen3MoeConfig", {"num_experts": 4, **MOE}),
    "phi3": ("Phi3Config", {"original_max_position_embeddings": ORIGINAL, "pad_token_id": 0}),
    "phi3 (longrope)": (
        "Phi3Config",
        {
            "original_max_position_embeddings": ORIGINAL,
            "max_position_embeddings": 2 * ORIGINAL,
            "pad_token_id": 0,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.05 * i for i in range(8)],
                "long_factor": [1.0 + 0.2 * i for i in range(8)],
                "original_max_position_embeddings": ORIGINAL,
            },
        },
    ),
    "phi (partial rotary)": ("PhiConfig", {"partial_rotary_factor": 0.5, "head_dim": None}),
    "stablelm": ("StableLmConfig", {"partial_rotary_factor": 0.5, "head_dim": None}),
    "gpt_neox (rotary_pct)": ("GPTNeoXConfig", {"rotary_pct": 0.5, "head_dim": None}),
    "gemma": ("GemmaConfig", {}),
    "gemma2 (softcaps)": (
        "Gemma2Config",
        {"sliding_window": 32, "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0},
    ),
    "gemma3 (local and global)": (
        "Gemma3TextConfig",
        {"sliding_window": 32, "layer_types": ["sliding_attention", "full_attention"]},
    ),
    "cohere (interleaved, logit_scale)": ("CohereConfig", {"logit_scale": 0.5, "head_dim": None}),
    "granite (multipliers)": (
        "GraniteConfig",
        {"embedding_multiplier": 2.0, "logits_scaling": 4.0, "residual_multiplier": 0.5, "attention_multiplier": 0.3},
    ),
    "olmo2": ("Olmo2Config", {}),
}


def family_config(name: str):
    import transformers

    class_name, fields = FAMILY_CONFIGS[name]
    fields = {**SHAPE, **fields}
    if fields["head_dim"] is None:
        del fields["head_dim"]
    return getattr(transformers, class_name)(**fields)


def save_family_model(name: str, folder: Path, *, seed: int = 0) -> Path:
    """The family's tiny model with random weights (seeded), saved as a user's model directory."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(name))
    model.save_pretrained(folder, safe_serialization=True)
    return Path(folder)


def with_config(model_dir: Path, config: dict[str, Any], copy: Path) -> Path:
    """A copy of the model directory with this config.json, as a user edits one in place."""
    shutil.copytree(model_dir, copy)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def byte_job(model_dir: Path, documents: Path, target: int, **sections: dict[str, Any]) -> dict[str, Any]:
    """A job config for a tiny family model: one UTF-8 byte a token (the tiny vocabulary holds them), 2 search
    windows from `documents`, which are the test documents too, and `sections` merged in."""
    data = {"tokenizer": "bytes", "search_source": str(documents), "test_source": str(documents), "search_windows": 2}
    job = {
        "model": {"path": str(model_dir), "device": "cpu"},
        "target_length": target,
        "data": {**data, "test_windows": 2},
    }
    for name, section in sections.items():
        job[name] = {**job.get(name, {}), **section} if isinstance(section, dict) else section
    return job


def rising_candidate(rope) -> Any:
    """The LongRoPE candidate the family tests export: long factors rising from 1 to 4 over the model's rotary pairs
    and an attention factor of 1.1, written for both runtimes (`for_both_runtimes`: vLLM's mscales equal to it), as
    `longrope export` writes a run's best. `rope` is the model's `ModelRope`."""
    from longrope.encodings import LongRope

    pairs = rope.rotary_dim // 2
    return LongRope.from_factors(
        [1.0 + 3.0 * i / (pairs - 1) for i in range(pairs)],
        head_dim=rope.head_dim,
        original_length=rope.original_length,
        target_length=TARGET,
        rope_theta=rope.rope_theta,
        partial_rotary_factor=rope.method.partial_rotary_factor,
        attention_factor=1.1,
    ).for_both_runtimes()


def exported_model(model_dir: Path, candidate, original_length: int, copy: Path) -> Path:
    """A copy of the model directory with `candidate` exported into its config.json, as `longrope export --into`
    writes it (`factors_file_for`, then `config_with_block`)."""
    from longrope.search.config.factors_file import factors_file_for
    from longrope.search.export.factors_export import config_with_block

    factors = factors_file_for(
        candidate, method_name="candidate", target_length=TARGET, original_length=original_length, created_by="t"
    )
    config = config_with_block(json.loads((model_dir / "config.json").read_text()), factors)
    return with_config(model_dir, config, copy)


def transformers_window_nll(model_dir: Path, windows: torch.Tensor) -> torch.Tensor:
    """Per-window summed NLL of each window's last len - 1 tokens by transformers alone: the family's own
    `ForCausalLM.forward` (its logit scale and softcap included), eager attention, float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(input_ids=windows[:, :-1]).logits.float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), windows[:, 1:], reduction="none")
    return nll.sum(dim=1).double()
