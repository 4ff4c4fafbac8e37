"""The model families the scorer reproduces exactly, and the ones it refuses, keyed by config.json's `model_type`.

The scorer does not call a model's own `forward`: it runs the decoder, then the output head chunk by chunk, with its
own rotary module in place of the model's (workers/scorer.py, workers/rope_patch.py). So for each family it must
know what transformers' `...ForCausalLM.forward` does around the decoder and how the family lays out cos and sin.
A family missing here could differ in any of those ways without an error, which is why an unknown `model_type` is
refused rather than scored as a Llama: a refusal is honest, a wrong perplexity is not.

Each accepted family is checked in tests/test_families.py against transformers' own eager forward of a tiny
random model with the exported factors in its config.json; docs/models.md is the table users read. Sources are
transformers 5.x `models/<family>/modeling_<family>.py` and `configuration_<family>.py`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from longrope.encodings.rotary import Layout
from longrope.workers.errors import ModelLoadError


@dataclass(frozen=True)
class LogitTransform:
    """What a family's causal-LM head does to `lm_head(hidden)` before the loss: logits times `scale` (Cohere's
    `logit_scale`; Granite divides by `logits_scaling`), then `softcap * tanh(logits / softcap)` (Gemma 2 and 3's
    `final_logit_softcapping`)."""

    scale: float = 1.0
    softcap: float | None = None


@dataclass(frozen=True)
class Family:
    """How the scorer drives one `model_type`.

    - `decoder`: the attribute of the causal LM holding the embeddings, layers, final norm and rotary module
      (`model` for most; GPT-NeoX's is `gpt_neox`).
    - `layout`: how cos and sin are laid out over a head's rotary dims: `rotate_half` repeats the pair
      frequencies as two halves (`cat(freqs, freqs)`, Llama), `interleaved` repeats each one twice in place
      (`repeat_interleave(freqs, 2)`, Cohere's `CohereRotaryEmbedding`).
    - `searched_layer_type`: for a model whose rotary module serves several layer types (Gemma 3:
      `rotary_emb(x, position_ids, layer_type)`), the one whose RoPE is searched; the others keep their own.
    - `config_keys`: config.json keys the family's config class renames into `rope_parameters`
      (GPT-NeoX's `rotary_pct`, `rotary_emb_base`), and `rope_defaults` what that class assumes when a key is
      absent (Phi's partial rotary factor 0.5): the RoPE read must be the one transformers builds.
    - `attention_softcap_key`: the config key of attention logit softcapping (Gemma 2 and 3), which transformers' SDPA
      path refuses; when it is set the model loads with the scorer's blockwise attention, which applies it.
    - `serves_max_position`: the family's config holds the length it serves in `max_position_embeddings` even under
      `linear` scaling, whose factor elsewhere multiplies it (Gemma 3 4B-27B: linear factor 8 and 131,072; vLLM
      0.33 skips the factor for gemma3, vllm/config/model.py `_get_and_verify_max_len`). Its RoPE is then read as
      pre-trained at max_position_embeddings / factor, what linear's definition (served / pre-trained) implies.
    - `refused`: why the scorer cannot reproduce the family; `validate` says so in one line.
    """

    decoder: str = "model"
    layout: Layout = "rotate_half"
    logit_scale_key: str | None = None
    logit_divisor_key: str | None = None
    softcap_key: str | None = None
    searched_layer_type: str | None = None
    config_keys: Mapping[str, str] = field(default_factory=dict)
    rope_defaults: Mapping[str, Any] = field(default_factory=dict)
    attention_softcap_key: str | None = None
    serves_max_position: bool = False
    refused: str | None = None

    def logit_transform(self, config: Any) -> LogitTransform:
        """The head's transform read from a transformers config object (or anything with those attributes)."""
        scale = float(getattr(config, self.logit_scale_key)) if self.logit_scale_key else 1.0
        if self.logit_divisor_key:
            scale /= float(getattr(config, self.logit_divisor_key))
        softcap = getattr(config, self.softcap_key, None) if self.softcap_key else None
        return LogitTransform(scale=scale, softcap=float(softcap) if softcap else None)


LLAMA_LIKE = Family()
# Gemma 2 and 3 cap both the final logits and the attention logits (tanh softcapping)
GEMMA_SOFTCAPS = {"softcap_key": "final_logit_softcapping", "attention_softcap_key": "attn_logit_softcapping"}

FAMILIES: dict[str, Family] = {
    "llama": LLAMA_LIKE,
    "mistral": LLAMA_LIKE,
    "mixtral": LLAMA_LIKE,
    "qwen2": LLAMA_LIKE,
    "qwen3": LLAMA_LIKE,
    "qwen2_moe": LLAMA_LIKE,
    "qwen3_moe": LLAMA_LIKE,
    "phi3": LLAMA_LIKE,
    "olmo2": LLAMA_LIKE,
    "gemma": LLAMA_LIKE,
    "phi": Family(rope_defaults={"partial_rotary_factor": 0.5}),
    "stablelm": Family(rope_defaults={"partial_rotary_factor": 0.25}),
    "gpt_neox": Family(
        decoder="gpt_neox",
        config_keys={"rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"},
        rope_defaults={"partial_rotary_factor": 0.25},
    ),
    "gemma2": Family(**GEMMA_SOFTCAPS),
    "gemma3_text": Family(**GEMMA_SOFTCAPS, searched_layer_type="full_attention", serves_max_position=True),
    "cohere": Family(layout="interleaved", logit_scale_key="logit_scale"),
    "granite": Family(logit_divisor_key="logits_scaling"),
    "deepseek_v3": Family(
        refused="its rotary part is a separate qk_rope_head_dim slice of each head, in interleaved pairs, and YaRN's "
        "mscale enters the softmax scale, not cos and sin; the rope patch reproduces neither"
    ),
    "gemma3": Family(
        refused="the multimodal Gemma 3 checkpoint; score its text model (model_type gemma3_text, "
        "Gemma3ForCausalLM), which is what the 270M and 1B models are"
    ),
}


def family_of(config: Mapping[str, Any]) -> Family:
    """The family of a config.json dict, or one error naming the `model_type` and why it is not scored."""
    model_type = config.get("model_type")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        known = ", ".join(sorted(name for name, f in FAMILIES.items() if f.refused is None))
        raise ModelLoadError(
            f"model_type {model_type!r}: not a family the scorer is checked against transformers for, so its "
            f"perplexity could be wrong without a word; the checked ones: {known} (docs/models.md)"
        )
    if family.refused:
        raise ModelLoadError(f"model_type {model_type!r}: not supported: {family.refused}")
    return family


def rope_config(config: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """config.json as the family's config class reads its RoPE: renamed keys moved to their standard names,
    the class's defaults filled in, and for a per-layer-type `rope_parameters` (Gemma 3) the searched layer type's
    entry in its place. The result is what `from_hf_config` reads."""
    config = dict(config)
    for old, new in family.config_keys.items():
        if old in config:
            config.setdefault(new, config.pop(old))
    params = config.get("rope_parameters") or config.get("rope_scaling")
    if family.searched_layer_type and isinstance(params, Mapping) and family.searched_layer_type in params:
        config.pop("rope_scaling", None)
        params = config["rope_parameters"] = dict(params[family.searched_layer_type] or {})
    for key, value in family.rope_defaults.items():
        if key not in config and not (isinstance(params, Mapping) and key in params):
            config[key] = value
    served, factor = config.get("max_position_embeddings"), linear_factor(params)
    if family.serves_max_position and factor and type(served) is int and served > 0:
        if served % factor:
            raise ModelLoadError(
                f"max_position_embeddings: {served} is not a whole multiple of the linear factor {factor:g}; "
                f"model_type {config.get('model_type')!r} serves max_position_embeddings, pre-trained at it / factor"
            )
        config["max_position_embeddings"] = int(served // factor)
    return config


def linear_factor(params: Any) -> float | None:
    """A `linear` block's factor, where it is a number above 1 (anything else is left to the block's validation)."""
    if not isinstance(params, Mapping):
        return None
    factor = params.get("factor")
    linear = (params.get("rope_type") or params.get("type")) == "linear"
    number = isinstance(factor, int | float) and not isinstance(factor, bool) and 1 < factor < math.inf
    return float(factor) if linear and number else None


def model_family(model) -> Family:
    """The family of a loaded causal LM."""
    return family_of({"model_type": model.config.model_type})


def decoder_of(model) -> Any:
    """The decoder module (embeddings, layers, final norm, rotary module) of a loaded causal LM."""
    return getattr(model, model_family(model).decoder)


def attention_for(config: Mapping[str, Any], asked: str) -> str:
    """The attention implementation a model loads with: `asked`, except SDPA for a model with a sliding window or
    with attention softcapping (which SDPA refuses), which loads with the scorer's `blockwise` attention instead:
    the same arithmetic as eager, without the [T, T] mask transformers builds for a window
    (workers/local_attention.py)."""
    family = family_of(config)
    softcapped = bool(family.attention_softcap_key and config.get(family.attention_softcap_key))
    if asked == "sdpa" and (softcapped or attention_window(config) is not None):
        return BLOCKWISE
    return asked


WindowChoice = Literal["keep", "full"]
# the scorer's blockwise attention's name in transformers' registry (workers/local_attention.py `register`)
BLOCKWISE = "blockwise"
# queries per block of the scorer's blockwise attention (workers/local_attention.py), which the estimate counts too
QUERY_BLOCK = 1024


@dataclass(frozen=True)
class AttentionWindow:
    """A sliding attention window in a model's config: `tokens` back, on every layer (Mistral, Mixtral, Phi-3,
    Qwen2 with `use_sliding_window` and no full layers) or only on its local layers by design (Gemma 2 and 3,
    whose `layer_types` mix `sliding_attention` and `full_attention`)."""

    tokens: int
    every_layer: bool


def attention_window(config: Mapping[str, Any]) -> AttentionWindow | None:
    """The window transformers applies for this config.json (None: full attention everywhere). Qwen2's
    `sliding_window` counts only with `use_sliding_window` (Qwen2Config sets it to None otherwise)."""
    tokens = config.get("sliding_window")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or config.get("use_sliding_window") is False:
        return None
    layer_types = config.get("layer_types")
    every_layer = not layer_types or all(kind == "sliding_attention" for kind in layer_types)
    return AttentionWindow(tokens=tokens, every_layer=every_layer)


def full_attention_overrides(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config.json changes that turn a window on every layer off: `sliding_window` null, and where the config
    has them, `use_sliding_window` false and every layer type `full_attention`."""
    overrides: dict[str, Any] = {"sliding_window": None}
    if "use_sliding_window" in config:
        overrides["use_sliding_window"] = False
    if config.get("layer_types"):
        overrides["layer_types"] = ["full_attention"] * len(config["layer_types"])
    return overrides


def window_problem(config: Mapping[str, Any], length: int, choice: WindowChoice | None) -> str | None:
    """Why `length`-token windows cannot be scored on this model as configured, or None.

    A window on every layer shorter than `length` means the scored attention sees only its last `window` tokens:
    a perplexity of something other than what the user probably deploys, so they say which (`keep`: as the model
    runs today; `full`: attention over the whole length, the window turned off in the export too). A model whose
    windows are local by design keeps them; `full` is refused there, since its global layers already see all."""
    window = attention_window(config)
    if window is None or not window.every_layer:
        if choice == "full":
            why = "local by design (its other layers attend to everything)" if window else "not set"
            return f"model.sliding_window: 'full', but the model's sliding window is {why}; leave it unset or keep"
        return None
    if window.tokens >= length or choice is not None:
        return None
    return (
        f"model.sliding_window: every layer of the model attends to its last {window.tokens} tokens (config.json "
        f"sliding_window), fewer than the {length} scored; say which to score: keep (the window, as the model runs "
        "today) or full (attention over all of them; the export turns the window off)"
    )


def load_overrides(
    config_overrides: Mapping[str, Any], choice: WindowChoice | None, config: Mapping[str, Any]
) -> dict[str, Any]:
    """The config attributes a worker loads the model with: `full`'s window off, then the job's own
    `model.config_overrides` (which win: they are the more specific)."""
    window_off = full_attention_overrides(config) if choice == "full" else {}
    return {**window_off, **config_overrides}
