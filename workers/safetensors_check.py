"""Checking a model's weights on disk before any worker loads them: safetensors only, whole, and their shapes.

A pickle checkpoint can run code when it is loaded, so it is refused by name; a safetensors file is checked by
its header alone (no tensor is read), so an empty file, a truncated download or a missing shard is one line
from `validate` and `search` instead of a SafetensorError in every worker.
"""

from __future__ import annotations

import json
from pathlib import Path

from longrope.workers.errors import ModelLoadError, one_line
from longrope.workers.user_files import read_head, read_text_capped, regular_file_size

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
        raise ModelLoadError(f"{where}: not a safetensors index ({one_line(exc)})") from exc
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
        raise ModelLoadError(f"{where}: its header is not valid JSON ({one_line(exc)})") from exc
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


# safetensors' names of floating-point dtypes: a quantized checkpoint's packed integer tensors are never compared
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


def checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Each floating-point tensor's shape in the safetensors files transformers reads (every shard), from their
    headers as `check_weights` read and checked them: no weight is read."""
    return {
        name: tuple(entry.get("shape", ()))
        for path in weight_files(Path(model_dir))
        for name, entry in check_safetensors(path).items()
        if entry.get("dtype") in FLOAT_DTYPES
    }
