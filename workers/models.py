"""Loading a Hugging Face causal LM from a local directory, and reading what the rope patch needs from it.

Only local files are read (`local_files_only`), `trust_remote_code` stays off unless the job asks, and a model
whose rotary module the patch cannot drive is refused before any scoring starts. The checks `check_model` runs
in the driver live beside this module: the weights on disk in safetensors_check.py, the config with the job's
overrides and the meta-device build in model_build.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrope.encodings import EncodingConfigError, RopeMethod, from_hf_config
from longrope.encodings.lazy_import import torch
from longrope.workers.device_plan import DevicePlan, plan_devices
from longrope.workers.devices import device_problem
from longrope.workers.errors import ModelLoadError, one_line
from longrope.workers.families import BLOCKWISE, attention_for, decoder_of, family_of, rope_config
from longrope.workers.model_build import (
    blamed,
    build_on_meta,
    check_weight_shapes,
    mentioned,
    model_config,
    override_names,
)
from longrope.workers.safetensors_check import check_weights

ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")


@dataclass(frozen=True)
class ModelRope:
    """The model's own RoPE, read from its config: what every candidate's factors divide."""

    method: RopeMethod
    original_length: int  # the context the model was pre-trained at
    # the context it serves as shipped (`RopeMethod.serving_length`) for a model whose config scales its RoPE:
    # max_position_embeddings for Llama 3.1's llama3 and Phi-3-128k's longrope, factor x the original for Qwen2.5's
    # yarn, factor x max_position_embeddings for linear and dynamic; else the original length
    serving_length: int

    @property
    def shipped_scaling(self) -> RopeMethod | None:
        """The model's own RoPE scaling, when its config has one (None for plain RoPE)."""
        return self.method if self.serving_length > self.original_length else None

    @property
    def head_dim(self) -> int:
        return self.method.head_dim

    @property
    def rotary_dim(self) -> int:
        return self.method.rotary_dim

    @property
    def rope_theta(self) -> float:
        return self.method.rope_theta


def read_model_config(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not Path(model_dir).is_dir():
        raise ModelLoadError(f"model directory: {str(model_dir)!r} does not exist")
    if not path.is_file():
        raise ModelLoadError(f"model directory: {str(model_dir)!r} has no config.json")
    return read_config_file(path)


def read_config_file(path: Path) -> dict[str, Any]:
    """A model's config.json (at any path) as a dict; one clear error for unreadable, invalid or non-object JSON."""
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ModelLoadError(f"model config: {str(path)!r} is not valid JSON ({one_line(exc)})") from exc
    except OSError as exc:
        raise ModelLoadError(f"model config: cannot read {str(path)!r} ({exc.strerror or exc})") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"model config: {str(path)!r} holds a JSON {type(config).__name__}, not an object")
    return config


def model_rope(config: dict[str, Any]) -> ModelRope:
    """The model's RoPE, read as its family's config class reads it (`families.rope_config`); refuses a family
    the scorer does not reproduce and configs the rope patch cannot drive (multi-axis, per-layer, no RoPE).

    The original length is a top-level `original_max_position_embeddings` where the config has one: transformers
    gives it precedence over the block's (Phi-3; transformers 5.x modeling_rope_utils.py
    `RotaryEmbeddingConfigMixin.standardize_rope_params`), so the factors are searched for the length at which
    transformers switches to them. A scaled model's lengths are its method's (`RopeMethod.pretrained_length`,
    `serving_length`): a Qwen2.5 that ships YaRN at factor 4 over 32,768 tokens serves 131,072, and a linear or
    dynamic one serves factor x max_position_embeddings."""
    config = rope_config(config, family_of(config))
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if params and not ("rope_type" in params or "type" in params or "rope_theta" in params):
        raise ModelLoadError(f"rope_parameters: per-layer RoPE ({sorted(params)}) is not supported by the rope patch")
    if "mrope_section" in params:
        raise ModelLoadError("rope_parameters.mrope_section: multi-axis M-RoPE models are not supported by the patch")
    if not params and "rope_theta" not in config:
        raise ModelLoadError(f"model_type {config.get('model_type')!r}: the config declares no rotary embedding")
    try:
        method = from_hf_config(config)
    except EncodingConfigError as exc:
        raise ModelLoadError(f"model config: {exc}") from exc
    if method.rope_type == "default":
        original = int(config.get("original_max_position_embeddings") or method.max_position_embeddings)
    else:
        original = method.pretrained_length
    serving = method.serving_length if method.rope_type != "default" and method.serving_length > original else original
    return ModelRope(method=method, original_length=int(original), serving_length=serving)


def rope_with_overrides(file_config: dict[str, Any], config_overrides: dict[str, Any] | None) -> ModelRope:
    """The RoPE of the model the workers load: config.json's with the job's `model.config_overrides` in it (top-level
    keys replaced, as `model_config` builds the class), so that `head_dim: 16` changes the pairs searched too. A
    file whose own RoPE is fine but whose overrides break it is blamed on the overrides."""
    if not config_overrides:
        return model_rope(file_config)
    try:
        return model_rope({**file_config, **config_overrides})
    except ModelLoadError as exc:
        raise ModelLoadError(f"{override_names(config_overrides, mentioned(config_overrides, exc))}: {exc}") from exc


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' is CUDA when torch can use it, else the CPU (a Ray fake-GPU worker lands here too). A string torch
    would refuse or misread is refused first, by workers/devices.py's torch-free check."""
    problem = device_problem(device)
    if problem:
        raise ModelLoadError(f"device {device!r}: {problem}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device: {device!r} was asked for but torch sees no CUDA device")
    try:
        return torch.device(device)
    except RuntimeError as exc:  # a type torch lists but this build cannot make (privateuseone unregistered)
        raise ModelLoadError(f"device {device!r}: {one_line(exc)}") from exc


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto' is bfloat16 on a GPU and float32 on the CPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in choices:
        raise ModelLoadError(f"dtype: unknown value {dtype!r}; expected auto or one of {sorted(choices)}")
    return choices[dtype]


def check_load_options(attn_implementation: str, device: str, *, local: bool = True) -> torch.device | None:
    """The attention implementation's name always; flash-attn and the device only when `local` (this machine is
    the one that loads the model): a cluster's GPU nodes may have both where the driver has neither."""
    if attn_implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ModelLoadError(f"attn_implementation: unknown value {attn_implementation!r}")
    if not local:
        return None
    if attn_implementation == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ModelLoadError("attn_implementation: 'flash_attention_2' was asked for but flash-attn is not installed")
    return resolve_device(device)


def check_model(
    model_dir: Path,
    *,
    device: str = "auto",
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
    config_overrides: dict[str, Any] | None = None,
    check_device: bool = True,
) -> None:
    """Everything that would make `load_model` fail, checked in the driver without loading a weight: the config
    with its overrides (`model_config`), the attention implementation, the device string (its availability only
    where the workers share the driver's machine: `check_device`), the model built on the meta device (head
    counts, rotary module layout), then the weights' format and safetensors headers (`check_weights`) and, with
    overrides, their tensor shapes against the built model's.

    A worker that still fails reports its own exception (see `ScoringWorker`); this check only makes the common
    causes show in a second instead of after every worker has tried and been restarted."""
    file_config = read_model_config(model_dir)
    model_rope(file_config)
    rope_with_overrides(file_config, config_overrides)
    check_load_options(attn_implementation, device, local=check_device)
    config = model_config(model_dir, trust_remote_code=trust_remote_code, config_overrides=config_overrides)
    try:
        model = build_on_meta(config, trust_remote_code)
    except Exception as exc:  # transformers raises many types here; the user needs the message, not the type
        where = blamed(model_dir, config_overrides, exc, trust_remote_code)
        raise ModelLoadError(f"{where}: cannot build the model: {one_line(exc)}") from exc
    check_rotary(model)
    check_weights(model_dir)  # after the build: the config's errors show first, whatever the weights files hold
    if config_overrides:
        check_weight_shapes(model, model_dir, config_overrides, trust_remote_code)


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers draws a "Loading weights" bar per load: one per worker in a search, one in `verify`, each a
    line of carriage returns in a log. A local load from disk is too short to follow, so the bar is switched off
    for the load and restored after; transformers' warnings and errors are left as they are."""
    from transformers.utils import logging as hf_logging  # only where a model is loaded

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def check_rotary(model) -> None:
    """The rotary module where the family says it is, with the frequencies the patch replaces (Gemma 3's per
    layer type: `full_attention_inv_freq`)."""
    family = family_of(model.config.to_dict())
    rotary = getattr(getattr(model, family.decoder, None), "rotary_emb", None)
    prefix = f"{family.searched_layer_type}_" if family.searched_layer_type else ""
    if rotary is None or not isinstance(getattr(rotary, f"{prefix}inv_freq", None), torch.Tensor):
        raise ModelLoadError(
            f"model class {type(model).__name__}: no rotary module at model.{family.decoder}.rotary_emb with "
            f"{prefix}inv_freq, where its family ({model.config.model_type}) keeps it in transformers"
        )


def load_model(
    model_dir: Path,
    *,
    device: str = "auto",
    dtype: str = "auto",
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
    config_overrides: dict[str, Any] | None = None,
    gpus: int = 1,
):
    """(model, ModelRope): an eval-mode causal LM on `device`, its rotary frequencies kept in float32.

    `config_overrides` change model config attributes at load (e.g. `sliding_window: None` for Mistral, so every
    token attends to the whole window being scored), through the config class as `check_model` checked them.
    `gpus` >= 2 spreads the decoder's layers over that many GPUs (`spread_over_gpus`) where the device is CUDA; one
    (or no CUDA) keeps the whole model on `device`, loaded and then moved as it always was."""
    rope = rope_with_overrides(read_model_config(model_dir), config_overrides)
    check_weights(model_dir)
    torch_device = check_load_options(attn_implementation, device)
    config = model_config(model_dir, trust_remote_code=trust_remote_code, config_overrides=config_overrides)
    attention = attention_for(config.to_dict(), attn_implementation)
    if attention == BLOCKWISE:
        from longrope.workers.local_attention import register  # torch and transformers: only where a model loads

        register()
    torch_dtype = resolve_dtype(dtype, torch_device)
    options = dict(dtype=torch_dtype, attention=attention, trust_remote_code=trust_remote_code)
    if gpus >= 2 and torch_device.type == "cuda":  # without CUDA (a Ray fake-GPU worker) the CPU holds it all
        model = spread_over_gpus(model_dir, config, gpus, **options)
        check_rotary(model)
        return model.eval(), rope
    model = _from_pretrained(model_dir, config, **options)
    check_rotary(model)
    return model.to(torch_device).eval(), rope


def spread_over_gpus(model_dir: Path, config, gpus: int, **options):
    """The model's layers over GPUs 0 .. gpus - 1 (the worker's; Ray sets CUDA_VISIBLE_DEVICES), each holding at
    most `DevicePlan.max_memory` of weights (workers/device_plan.py: the LongRoPE release's 0.8 rule), loaded shard
    by shard onto their devices (`sharded_load`). Refused before a weight is read where the GPUs are missing or the
    weights do not fit them; never moved with `.to()` afterwards (accelerate's hooks move each layer's inputs)."""
    if torch.cuda.device_count() < gpus:
        seen = torch.cuda.device_count()
        raise ModelLoadError(f"workers.num_gpus_per_worker = {gpus}: the worker sees {seen} CUDA devices")
    plan = device_plan_for(config, gpus, options["dtype"], options["trust_remote_code"])
    if plan.problem():
        raise ModelLoadError(plan.problem())
    model = sharded_load(model_dir, config, device_map="auto", max_memory=plan.max_memory, **options)
    placed = set(getattr(model, "hf_device_map", {}).values())
    if not placed or not all(isinstance(where, int) for where in placed):
        raise ModelLoadError(f"workers.num_gpus_per_worker = {gpus}: the device map placed weights on {placed}")
    return model


def device_plan_for(config, gpus: int, dtype: torch.dtype, trust_remote_code: bool) -> DevicePlan:
    """The plan for this config on the worker's `gpus` GPUs (the smallest's memory), its weights counted on the
    meta device at the load's dtype."""
    meta = build_on_meta(config, trust_remote_code)
    weights = sum(param.numel() for param in meta.parameters()) * dtype.itemsize
    memory = min(torch.cuda.get_device_properties(index).total_memory for index in range(gpus))
    return plan_devices(weights, len(decoder_of(meta).layers), gpus, memory)


def sharded_load(model_dir: Path, config, *, device_map, max_memory=None, **options):
    """from_pretrained with a `device_map`: transformers builds the model on the meta device and reads the
    safetensors shard by shard, each tensor straight onto its device, so the host never holds a whole copy
    (`low_cpu_mem_usage` semantics: transformers 5.x always builds on meta and drops that argument as "not used
    anymore", modeling_utils.py `from_pretrained`; the map's dispatch is integrations/accelerate.py). The worker
    spreads a model over its GPUs with it; tests load onto the CPU with it to bound the host's peak."""
    return _from_pretrained(model_dir, config, device_map=device_map, max_memory=max_memory, **options)


def _from_pretrained(model_dir: Path, config, *, dtype, attention, trust_remote_code, **placement):
    from transformers import AutoModelForCausalLM  # only where a model is loaded

    try:
        with no_progress_bars():
            return AutoModelForCausalLM.from_pretrained(
                model_dir,
                config=config,
                dtype=dtype,
                attn_implementation=attention,
                trust_remote_code=trust_remote_code,
                local_files_only=True,
                use_safetensors=True,
                **placement,
            )
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"model directory: cannot load {str(model_dir)!r}: {exc}") from exc
