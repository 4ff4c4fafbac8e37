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


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' is CUDA when torch can use it, else the CPU (a Ray fake-GPU worker lands here too)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device: {device!r} was asked for but torch sees no CUDA device")
    return torch.device(device)


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


def check_safetensors(path: Path) -> None:
    """Refuse a safetensors file that safe_open would refuse, in one line naming it and what is wrong: empty, a
    header longer than the file, a header that is not a JSON object of tensors, or tensors that do not end where
    the file does (a truncated download). Reads the 8-byte length and the header only."""
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
    need = tensors_end(raw, where)
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


def tensors_end(raw: bytes, where: str) -> int:
    """Where the last tensor of a safetensors header ends, in bytes after the header (0 for no tensors)."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ModelLoadError(f"{where}: its header is not valid JSON ({one_line(exc)})") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{where}: its header is not a JSON object (a {type(header).__name__})")
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in offsets)
        ):
            raise ModelLoadError(f"{where}: its header's tensor {name!r} has no data_offsets [begin, end]")
        end = max(end, offsets[1])
    return end


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
    """Everything that would make `load_model` fail, checked in the driver without loading a weight: the config,
    the attention implementation, the device (only where the workers share the driver's machine:
    `check_device`), the model built on the meta device (head counts, rotary module layout), then the weights'
    format and safetensors headers (`check_weights`).

    A worker that still fails reports its own exception (see `ScoringWorker`); this check only makes the common
    causes show in a second instead of after every worker has tried and been restarted."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_rope(read_model_config(model_dir))
    check_load_options(attn_implementation, device, local=check_device)
    try:
        with quiet_transformers():
            config = AutoConfig.from_pretrained(
                model_dir, local_files_only=True, trust_remote_code=trust_remote_code, **(config_overrides or {})
            )
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(
                    config, attn_implementation="eager", trust_remote_code=trust_remote_code
                )
    except Exception as exc:  # transformers raises many types here; the user needs the message, not the type
        where = f"model directory: cannot build the model in {str(model_dir)!r}"
        raise ModelLoadError(f"{where}: {one_line(exc)}") from None
    check_rotary(model)
    check_weights(model_dir)  # last: the config's errors show first, whatever the weights files hold


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
    token attends to the whole window being scored)."""
    from transformers import AutoModelForCausalLM

    rope = model_rope(read_model_config(model_dir))
    check_weights(model_dir)
    torch_device = check_load_options(attn_implementation, device)
    try:
        with no_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(
                model_dir,
                dtype=resolve_dtype(dtype, torch_device),
                attn_implementation=attn_implementation,
                trust_remote_code=trust_remote_code,
                local_files_only=True,
                use_safetensors=True,
                **(config_overrides or {}),
            )
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"model directory: cannot load {str(model_dir)!r}: {exc}") from None
    check_rotary(model)
    return model.to(torch_device).eval(), rope
