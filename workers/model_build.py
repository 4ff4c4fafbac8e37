"""The transformers config a worker builds, with the job's `model.config_overrides` in it, and the model built from
it on the meta device: every module and shape, no weight read.

This is where an override is checked before any worker loads the model: through the config class's own
validation, against sizes no model can have (`check_sizes`), and against the checkpoint's tensor shapes
(`check_weight_shapes`); and where a failed build is blamed on the overrides or on the model directory.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from longrope.encodings.lazy_import import torch
from longrope.workers.errors import ModelLoadError, one_line
from longrope.workers.safetensors_check import checkpoint_shapes


def model_config(model_dir: Path, *, trust_remote_code: bool = False, config_overrides: dict[str, Any] | None = None):
    """The transformers config a worker loads: the model's own config class built from config.json with the
    overrides in it, so that the class validates them (its strict field types, `validate_architecture`,
    `validate_rope`), then sizes it accepts but no model can have (`check_sizes`).

    transformers' own route, `from_pretrained(dir, **overrides)`, builds the class from the file and then sets
    each override with setattr (configuration_utils.py, `PreTrainedConfig.from_dict`), which validates nothing:
    `num_hidden_layers: -1` built a model with no layers and `head_dim: 7` failed only in the workers. A key that
    is no attribute of the class is refused, as the load refused it (from_pretrained passes it on to the model's
    constructor, which raises TypeError)."""
    from transformers import AutoConfig  # only where a config is checked

    overrides = dict(config_overrides or {})
    try:
        with quiet_transformers():
            base = AutoConfig.from_pretrained(model_dir, local_files_only=True, trust_remote_code=trust_remote_code)
            file_dict, _ = type(base).get_config_dict(model_dir, local_files_only=True)
    except Exception as exc:  # transformers raises many types here; the user needs the message, not the type
        raise ModelLoadError(f"model directory: cannot read the config in {str(model_dir)!r}: {one_line(exc)}") from exc
    if not overrides:
        return base
    unknown = [key for key in overrides if not hasattr(base, key)]
    if unknown:
        raise ModelLoadError(f"{override_names(overrides, unknown)}: {type(base).__name__} has no such attribute")
    try:
        with quiet_transformers():
            config = type(base).from_dict({**file_dict, **overrides})
    except Exception as exc:  # the class's strict validation: StrictDataclass*ValidationError, ValueError ...
        raise ModelLoadError(
            f"{override_names(overrides, mentioned(overrides, exc))}: {type(base).__name__} refuses it: {one_line(exc)}"
        ) from exc
    check_sizes(config, overrides)
    return config


# Sizes a transformers config class accepts without a word and a model cannot have: a layer count of -1 builds a
# model with no layers (nn.ModuleList(range(-1)) is empty) that scores as if it were one; a vocabulary or MLP of 0
# builds too. An override of one must be at least 1 (a config.json's own values are left to the model build).
POSITIVE_SIZES = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "intermediate_size",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
)


def check_sizes(config, overrides: dict[str, Any]) -> None:
    """Overridden sizes no model can have: each of POSITIVE_SIZES at least 1, and the query heads in whole groups
    per key/value head (Llama-family attention repeats each key/value head num_attention_heads // num_key_value_heads
    times, transformers/models/llama/modeling_llama.py, `repeat_kv`: 4 heads over 3 builds, then fails at the first
    forward). The error names the override and its value."""
    for name in POSITIVE_SIZES:
        value = overrides.get(name)
        if isinstance(value, int) and value < 1:
            raise ModelLoadError(f"{override_names(overrides, [name])}: must be at least 1")
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if not (isinstance(heads, int) and isinstance(kv_heads, int) and heads % kv_heads):
        return
    if "num_key_value_heads" in overrides:
        where = override_names(overrides, ["num_key_value_heads"])
        raise ModelLoadError(f"{where}: must divide num_attention_heads ({heads})")
    if "num_attention_heads" in overrides:
        where = override_names(overrides, ["num_attention_heads"])
        raise ModelLoadError(f"{where}: must be a multiple of num_key_value_heads ({kv_heads})")


def check_weight_shapes(model, model_dir: Path, overrides: dict[str, Any], trust_remote_code: bool) -> None:
    """Overrides that change a size the checkpoint fixes (`head_dim: 16` on a model trained with 32) build on the
    meta device, and then every worker's load fails ("You set `ignore_mismatched_sizes` to `False`"). The meta
    model's tensors are compared with the checkpoint's, read from the safetensors headers only; a mismatch the file's
    own config has too (a quantized or converted checkpoint) is left to the load."""
    shapes = checkpoint_shapes(model_dir)
    wrong = mismatched_weights(model, shapes)
    if not wrong:
        return
    file_model = build_on_meta(model_config(model_dir, trust_remote_code=trust_remote_code), trust_remote_code)
    if mismatched_weights(file_model, shapes):
        return
    name, built, stored = wrong[0]
    raise ModelLoadError(
        f"{override_names(overrides, [])}: the model it builds has {name} of shape {list(built)}, the checkpoint's "
        f"is {list(stored)} ({len(wrong)} tensors differ); an override cannot change a size the weights fix"
    )


def mismatched_weights(model, shapes: dict[str, tuple[int, ...]]) -> list[tuple[str, tuple, tuple]]:
    """(name, the model's shape, the checkpoint's) for each tensor both have with different shapes."""
    return [
        (name, tuple(tensor.shape), shapes[name])
        for name, tensor in model.state_dict().items()
        if name in shapes and tuple(tensor.shape) != shapes[name]
    ]


def override_names(overrides: dict[str, Any], keys: list[str]) -> str:
    """`model.config_overrides.head_dim = 7` for each key (all overrides when none is known to be the cause)."""
    keys = keys or list(overrides)
    return ", ".join(f"model.config_overrides.{key} = {overrides[key]!r}" for key in keys)


def mentioned(overrides: dict[str, Any], exc: BaseException) -> list[str]:
    """The overrides an error message names (transformers names the field it refuses), in the order given."""
    text = str(exc)
    return [key for key in overrides if key in text]


def blamed(model_dir: Path, overrides: dict[str, Any] | None, exc: BaseException, trust_remote_code: bool) -> str:
    """Who a failed meta-device build is blamed on: the overrides when the file's own config builds, else the model
    directory (the file is built again only here, when the build has failed)."""
    if overrides:
        try:
            build_on_meta(model_config(model_dir, trust_remote_code=trust_remote_code), trust_remote_code)
        except Exception:  # the file's own config fails as well: the overrides are not the cause
            return f"model directory {str(model_dir)!r}"
        return override_names(overrides, mentioned(overrides, exc))
    return f"model directory {str(model_dir)!r}"


def build_on_meta(config, trust_remote_code: bool):
    """The model built on the meta device: every module and shape, no memory, no weight read."""
    from transformers import AutoModelForCausalLM  # only where a model is built

    with quiet_transformers(), torch.device("meta"):
        return AutoModelForCausalLM.from_config(
            config, attn_implementation="eager", trust_remote_code=trust_remote_code
        )


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers logs and warns about configs it will then refuse; the refusal is the one line to show."""
    from transformers.utils import logging as hf_logging  # only where a model is built

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
