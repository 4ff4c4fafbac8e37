"""Loading a Hugging Face causal LM from a local directory, and reading what the rope patch needs from it.

Only local files are read (`local_files_only`), `trust_remote_code` stays off unless the job asks, and a model
whose rotary module the patch cannot drive is refused before any scoring starts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrope.encodings import EncodingConfigError, RopeMethod, from_hf_config
from longrope.encodings.lazy_import import torch
from longrope.workers.devices import device_problem
from longrope.workers.errors import ModelLoadError, one_line
from longrope.workers.user_files import read_head, read_text_capped, regular_file_size

ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")


@dataclass(frozen=True)
class ModelRope:
    """The model's own RoPE, read from its config: what every candidate's factors divide."""

    method: RopeMethod
    original_length: int  # the context the model was pre-trained at

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
        raise ModelLoadError(f"model config: {str(path)!r} is not valid JSON ({one_line(exc)})") from None
    except OSError as exc:
        raise ModelLoadError(f"model config: cannot read {str(path)!r} ({exc.strerror or exc})") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"model config: {str(path)!r} holds a JSON {type(config).__name__}, not an object")
    return config


def model_rope(config: dict[str, Any]) -> ModelRope:
    """The model's RoPE; refuses configs the rope patch cannot drive (multi-axis, per-layer, no RoPE)."""
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
        raise ModelLoadError(f"model config: {exc}") from None
    original = getattr(method, "original_max_position_embeddings", None) or config["max_position_embeddings"]
    return ModelRope(method=method, original_length=int(original))


def rope_with_overrides(file_config: dict[str, Any], config_overrides: dict[str, Any] | None) -> ModelRope:
    """The RoPE of the model the workers load: config.json's with the job's `model.config_overrides` in it (top-level
    keys replaced, as `model_config` builds the class), so that `head_dim: 16` changes the pairs searched too. A
    file whose own RoPE is fine but whose overrides break it is blamed on the overrides."""
    if not config_overrides:
        return model_rope(file_config)
    try:
        return model_rope({**file_config, **config_overrides})
    except ModelLoadError as exc:
        raise ModelLoadError(f"{override_names(config_overrides, mentioned(config_overrides, exc))}: {exc}") from None


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
        raise ModelLoadError(f"device {device!r}: {one_line(exc)}") from None


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto' is bfloat16 on a GPU and float32 on the CPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in choices:
        raise ModelLoadError(f"dtype: unknown value {dtype!r}; expected auto or one of {sorted(choices)}")
    return choices[dtype]


WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def check_weights(model_dir: Path) -> None:
    """Safetensors weights must be there, and whole. A pickle checkpoint (pytorch_model.bin) can run code when
    loaded, so it is refused by name instead of being handed to `torch.load`. Each safetensors file transformers
    will read (`weight_files`) has its header read and its tensors' extent matched with the file's size
    (`check_safetensors`), so an empty file or a truncated download is one line from validate and search, before
    anything is written, instead of a SafetensorError in every worker. No tensor is read."""
    names = [p.name for p in Path(model_dir).iterdir() if p.is_file()]
    if any(name.endswith(WEIGHT_SUFFIXES) for name in names):
        for path in weight_files(Path(model_dir)):
            check_safetensors(path)
        return
    pickles = sorted(name for name in names if name.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise ModelLoadError(
            f"model directory: {str(model_dir)!r} holds only pickle checkpoints ({', '.join(pickles[:3])}); "
            "longrope loads safetensors only (convert with `model.save_pretrained(dir, safe_serialization=True)`)"
        )
    raise ModelLoadError(f"model directory: {str(model_dir)!r} has no weights (*.safetensors)")


SINGLE_WEIGHTS = "model.safetensors"  # transformers' SAFE_WEIGHTS_NAME, read first when present
INDEX_SUFFIX = ".safetensors.index.json"  # a sharded checkpoint's index (SAFE_WEIGHTS_INDEX_NAME's form)
MAX_INDEX_BYTES = 16 << 20  # an index maps each tensor name to a shard: ~100 KB for a 70B model
# the safetensors format (huggingface/safetensors, README "Format"): 8 bytes, an unsigned little-endian length N;
# N bytes of UTF-8 JSON, {tensor name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"?: {...}},
# offsets counted from the byte after the header; then the tensors, which must cover the rest of the file exactly
# (safe_open refuses a file with bytes to spare: "incomplete metadata, file not fully covered")
SAFETENSORS_LENGTH_BYTES = 8
SAFETENSORS_MAX_HEADER = 100_000_000  # the safetensors library refuses a longer header (its MAX_HEADER_SIZE)


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files transformers reads from `model_dir`: model.safetensors when present, else the shards
    every *.safetensors.index.json names (a missing shard is refused), else whatever *.safetensors is there."""
    if (model_dir / SINGLE_WEIGHTS).exists():
        return [model_dir / SINGLE_WEIGHTS]
    indexes = sorted(model_dir.glob(f"*{INDEX_SUFFIX}"))
    if not indexes:
        return sorted(model_dir.glob("*.safetensors"))
    shards: list[Path] = []
    for index in indexes:
        for name in index_shards(index):
            if not (model_dir / name).exists():
                raise ModelLoadError(f"model weights: {str(index)!r} names the shard {name!r}, which is missing")
            shards.append(model_dir / name)
    return list(dict.fromkeys(shards))


def index_shards(index: Path) -> list[str]:
    """The shard file names a sharded checkpoint's index maps its tensors to (its `weight_map` values)."""
    where = f"model weights: {str(index)!r}"
    text = read_text_capped(index, MAX_INDEX_BYTES, "an index", where, ModelLoadError)
    try:
        weight_map = json.loads(text).get("weight_map")
    except (json.JSONDecodeError, RecursionError, AttributeError) as exc:
        raise ModelLoadError(f"{where}: not a safetensors index ({one_line(exc)})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(name, str) for name in weight_map.values()):
        raise ModelLoadError(f"{where}: not a safetensors index (no weight_map of tensor -> shard file names)")
    return list(dict.fromkeys(weight_map.values()))


def check_safetensors(path: Path) -> dict[str, dict]:
    """A safetensors file's tensors as its header lists them ({name: {"dtype", "shape", "data_offsets"}}), after
    refusing a file that safe_open would refuse, in one line naming it and what is wrong: empty, a header longer
    than the file, a header that is not a JSON object of tensors, or tensors that do not end where the file does
    (a truncated download). Reads the 8-byte length and the header only."""
    where = f"model weights: {str(path)!r}"
    size = regular_file_size(path, where, ModelLoadError)
    if size == 0:
        raise ModelLoadError(f"{where} is empty (0 bytes)")
    if size < SAFETENSORS_LENGTH_BYTES:
        raise ModelLoadError(f"{where} is {size} bytes, shorter than a safetensors header's length field")
    header_bytes = int.from_bytes(read_head(path, SAFETENSORS_LENGTH_BYTES, where, ModelLoadError), "little")
    after_length = size - SAFETENSORS_LENGTH_BYTES
    if header_bytes > SAFETENSORS_MAX_HEADER:
        raise ModelLoadError(
            f"{where}: its header length field says {header_bytes} bytes, more than safetensors allows "
            f"({SAFETENSORS_MAX_HEADER}); not a safetensors file"
        )
    if header_bytes > after_length:
        raise ModelLoadError(
            f"{where} is truncated: its header is {header_bytes} bytes long, the file holds {after_length} after "
            "its length"
        )
    raw = read_head(path, SAFETENSORS_LENGTH_BYTES + header_bytes, where, ModelLoadError)[SAFETENSORS_LENGTH_BYTES:]
    tensors = header_tensors(raw, where)
    need = max((entry["data_offsets"][1] for entry in tensors.values()), default=0)
    have = after_length - header_bytes
    if need > have:
        raise ModelLoadError(
            f"{where} is truncated: its tensors need {need} bytes after the header, the file holds {have}"
        )
    if need < have:
        raise ModelLoadError(
            f"{where}: its tensors end {need} bytes after the header, but the file holds {have}; not a whole "
            "safetensors file"
        )
    return tensors


def header_tensors(raw: bytes, where: str) -> dict[str, dict]:
    """The tensors of a safetensors header (its "__metadata__" left out), each with data_offsets [begin, end]."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ModelLoadError(f"{where}: its header is not valid JSON ({one_line(exc)})") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{where}: its header is not a JSON object (a {type(header).__name__})")
    tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
    for name, entry in tensors.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in offsets)
        ):
            raise ModelLoadError(f"{where}: its header's tensor {name!r} has no data_offsets [begin, end]")
    return tensors


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
        raise ModelLoadError(f"{where}: cannot build the model: {one_line(exc)}") from None
    check_rotary(model)
    check_weights(model_dir)  # after the build: the config's errors show first, whatever the weights files hold
    if config_overrides:
        check_weight_shapes(model, model_dir, config_overrides, trust_remote_code)


def model_config(model_dir: Path, *, trust_remote_code: bool = False, config_overrides: dict[str, Any] | None = None):
    """The transformers config a worker loads: the model's own config class built from config.json with the
    overrides in it, so that the class validates them (its strict field types, `validate_architecture`,
    `validate_rope`), then sizes it accepts but no model can have (`check_sizes`).

    transformers' own route, `from_pretrained(dir, **overrides)`, builds the class from the file and then sets
    each override with setattr (configuration_utils.py, `PreTrainedConfig.from_dict`), which validates nothing:
    `num_hidden_layers: -1` built a model with no layers and `head_dim: 7` failed only in the workers. A key that
    is no attribute of the class is refused, as the load refused it (from_pretrained passes it on to the model's
    constructor, which raises TypeError)."""
    from transformers import AutoConfig

    overrides = dict(config_overrides or {})
    try:
        with quiet_transformers():
            base = AutoConfig.from_pretrained(model_dir, local_files_only=True, trust_remote_code=trust_remote_code)
            file_dict, _ = type(base).get_config_dict(model_dir, local_files_only=True)
    except Exception as exc:  # transformers raises many types here; the user needs the message, not the type
        raise ModelLoadError(
            f"model directory: cannot read the config in {str(model_dir)!r}: {one_line(exc)}"
        ) from None
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
        ) from None
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


# safetensors' names of floating-point dtypes: a quantized checkpoint's packed integer tensors are never compared
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


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


def checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Each floating-point tensor's shape in the safetensors files transformers reads (every shard), from their
    headers as `check_weights` read and checked them: no weight is read."""
    return {
        name: tuple(entry.get("shape", ()))
        for path in weight_files(Path(model_dir))
        for name, entry in check_safetensors(path).items()
        if entry.get("dtype") in FLOAT_DTYPES
    }


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
    from transformers import AutoModelForCausalLM

    with quiet_transformers(), torch.device("meta"):
        return AutoModelForCausalLM.from_config(
            config, attn_implementation="eager", trust_remote_code=trust_remote_code
        )


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers logs and warns about configs it will then refuse; the refusal is the one line to show."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers draws a "Loading weights" bar per load: one per worker in a search, one in `verify`, each a
    line of carriage returns in a log. A local load from disk is too short to follow, so the bar is switched off
    for the load and restored after; transformers' warnings and errors are left as they are."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def check_rotary(model) -> None:
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None or not isinstance(getattr(rotary, "inv_freq", None), torch.Tensor):
        raise ModelLoadError(
            f"model class {type(model).__name__}: no rotary module at model.model.rotary_emb; the rope patch "
            "drives the standard transformers layout (Llama, Mistral, Qwen2, Phi-3, Gemma families)"
        )


def load_model(
    model_dir: Path,
    *,
    device: str = "auto",
    dtype: str = "auto",
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
    config_overrides: dict[str, Any] | None = None,
):
    """(model, ModelRope): an eval-mode causal LM on `device`, its rotary frequencies kept in float32.

    `config_overrides` change model config attributes at load (e.g. `sliding_window: None` for Mistral, so every
    token attends to the whole window being scored), through the config class as `check_model` checked them."""
    from transformers import AutoModelForCausalLM

    rope = rope_with_overrides(read_model_config(model_dir), config_overrides)
    check_weights(model_dir)
    torch_device = check_load_options(attn_implementation, device)
    config = model_config(model_dir, trust_remote_code=trust_remote_code, config_overrides=config_overrides)
    try:
        with no_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(
                model_dir,
                config=config,
                dtype=resolve_dtype(dtype, torch_device),
                attn_implementation=attn_implementation,
                trust_remote_code=trust_remote_code,
                local_files_only=True,
                use_safetensors=True,
            )
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"model directory: cannot load {str(model_dir)!r}: {exc}") from None
    check_rotary(model)
    return model.to(torch_device).eval(), rope
