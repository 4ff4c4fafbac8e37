"""The model's shape, read from a config.json without weights: what every cost is computed from.

`Architecture` covers decoder-only transformers with a gated MLP (Llama, Mistral, Qwen2, Phi-3, Gemma layouts);
KNOWN_MODELS are published configs, so `longrope estimate` prices a job for a model that is not on this machine.
"""

from __future__ import annotations

from pathlib import Path, PurePath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from longrope.search.config.strict import JobConfigError
from longrope.workers.errors import ModelLoadError
from longrope.workers.families import attention_window
from longrope.workers.models import model_rope, read_config_file


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Architecture(Frozen):
    """The shape of a decoder-only transformer with a gated MLP (Llama, Mistral, Qwen2, Phi-3, Gemma layouts)."""

    name: str = ""
    hidden_size: int = Field(ge=1)
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    original_length: int | None = None  # the pre-training context, as the rope reader resolves it
    dtype: str | None = None  # the checkpoint's dtype, from config.json
    # layers that attend within a sliding window (Gemma 3's 15 of 18 `sliding_attention` layers; every layer of a
    # Mistral whose window is kept), and that window: the scorer's blockwise attention reads only those keys
    local_layers: int = Field(default=0, ge=0)
    local_window: int | None = Field(default=None, ge=1)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str = "") -> Architecture:
        """From a transformers config.json (as a dict); a missing key is one JobConfigError naming it."""
        try:
            hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
            original = pretrained_length(config)
            bias = bool(config.get("attention_bias", False))
            local_layers, local_window = windowed_layers(config)
            return cls(
                name=name or str(config.get("_name_or_path") or config.get("model_type") or ""),
                hidden_size=hidden,
                num_layers=int(config["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate_size=int(config["intermediate_size"]),
                vocab_size=int(config["vocab_size"]),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                qkv_bias=bias or config.get("model_type") == "qwen2",  # Qwen2 always has q/k/v biases
                o_bias=bias,
                mlp_bias=bool(config.get("mlp_bias", False)),
                original_length=int(original) if original else None,
                dtype=config.get("dtype") or config.get("torch_dtype"),
                local_layers=local_layers,
                local_window=local_window,
            )
        except KeyError as exc:
            raise JobConfigError(f"model config{f' {name}' if name else ''}: no {exc.args[0]!r}") from exc
        except (TypeError, ValueError) as exc:
            raise JobConfigError(f"model config{f' {name}' if name else ''}: {exc}") from exc


def windowed_layers(config: dict[str, Any]) -> tuple[int, int | None]:
    """(layers with a sliding window, the window), as transformers applies the config (workers/families.py
    `attention_window`): the `sliding_attention` layers of `layer_types`, or every layer when the window has no
    layer types beside it."""
    window = attention_window(config)
    if window is None:
        return 0, None
    layer_types = config.get("layer_types") or ["sliding_attention"] * int(config["num_hidden_layers"])
    return sum(kind == "sliding_attention" for kind in layer_types), window.tokens


# Public architecture numbers (each model's config.json on the Hugging Face hub), so that the shipped configs,
# whose model paths name checkpoints that are not on a laptop, can be estimated before renting a GPU.
_LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}
_PHI3 = {
    "model_type": "phi3",
    "hidden_size": 3072,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 8192,
    "vocab_size": 32064,
    "rope_theta": 10000.0,
    "dtype": "bfloat16",
}
KNOWN_MODELS: dict[str, dict[str, Any]] = {
    "Llama-2-7b-hf": {
        **_LLAMA,
        "num_key_value_heads": 32,
        "intermediate_size": 11008,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "dtype": "float16",
    },
    "Meta-Llama-3-8B": {
        **_LLAMA,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "dtype": "bfloat16",
    },
    "Mistral-7B-v0.1": {
        **_LLAMA,
        "model_type": "mistral",
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,  # sliding_window 4096 is ignored: the shipped config turns it off
        "rope_theta": 10000.0,
        "dtype": "bfloat16",
    },
    # HuggingFaceTB/SmolLM2-135M(-Instruct); `longrope model get smollm2-135m DIR` writes the same config.json
    "SmolLM2-135M": {
        "model_type": "llama",
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "intermediate_size": 1536,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
    },
    "Phi-3-mini-4k-instruct": {**_PHI3, "max_position_embeddings": 4096},
    "Phi-3-mini-128k-instruct": {**_PHI3, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096},
}
KNOWN_ALIASES = {
    "llama-2-7b": "Llama-2-7b-hf",
    "llama-3-8b": "Meta-Llama-3-8B",
    "mistral-7b": "Mistral-7B-v0.1",
    "smollm2-135m": "SmolLM2-135M",
}


def known_model(name: str) -> str | None:
    """The table's key for a model path or name (its last path part, case-insensitive), or None."""
    last = PurePath(name.rstrip("/")).name.lower()
    keys = {key.lower(): key for key in KNOWN_MODELS}
    return keys.get(last) or KNOWN_ALIASES.get(last)


def parameter_count(arch: Architecture) -> int:
    """Every parameter, a tied lm_head counted once (what `sum(p.numel() for p in model.parameters())` gives):
    per layer the attention's d H Q + 2 d K Q + H Q d, the MLP's 3 d I, two RMSNorm weights of d, and biases;
    then the embedding V d, the final norm d and, untied, the lm_head V d."""
    d, q_out, kv_out = arch.hidden_size, arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    attention = d * q_out + 2 * d * kv_out + q_out * d
    attention += (q_out + 2 * kv_out) * arch.qkv_bias + d * arch.o_bias
    mlp = 3 * d * arch.intermediate_size + (2 * arch.intermediate_size + d) * arch.mlp_bias
    per_layer = attention + mlp + 2 * d
    embeddings = arch.vocab_size * d * (1 if arch.tie_word_embeddings else 2)
    return arch.num_layers * per_layer + embeddings + d


def linear_weights_per_layer(arch: Architecture) -> int:
    """Weights a token meets in one layer's matmuls (q, k, v, o, gate, up, down): the 'N' of 2N per layer."""
    d, q_out, kv_out = arch.hidden_size, arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    return d * q_out + 2 * d * kv_out + q_out * d + 3 * d * arch.intermediate_size


def read_config_json(path: Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A model's config.json as a dict, the job's `model.config_overrides` applied (as the load applies them)."""
    return {**read_config_file(Path(path)), **(overrides or {})}


def model_config_path(path: str | Path) -> Path:
    """A config.json, or a directory holding one."""
    path = Path(path)
    return path / "config.json" if path.is_dir() else path


def pretrained_length(config: dict[str, Any]) -> int | None:
    """The pre-training context as the job reads it (`workers.models.model_rope`: a top-level
    original_max_position_embeddings first, as transformers; a YaRN block's own; Gemma 3's linear scaling's
    max_position_embeddings / factor), so that estimate and search agree; a config whose RoPE the scorer refuses
    (a family it is not checked against, an estimate of a bare shape) falls back to its keys."""
    try:
        return model_rope(config).original_length
    except ModelLoadError:
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        original = (
            config.get("original_max_position_embeddings")
            or (rope.get("original_max_position_embeddings") if isinstance(rope, dict) else None)
            or config.get("max_position_embeddings")
        )
        return int(original) if original else None
