"""vLLM's own rotary code on the CPU, as a vLLM engine would build it for a model directory.

vLLM 0.33.0's wheel is built against a CUDA torch, but its rotary package imports and runs on our pinned CPU
torch when the wheel is installed with `--no-deps` next to the few modules its imports need
(tests/vllm-requirements.txt; `make test` installs them into .venv/vllm-site and runs the tests marked `vllm` with
that folder on PYTHONPATH). What the tests here read is vLLM's code end to end:
- `engine_rope`: the engine's config from the model's config.json (`vllm.config.ModelConfig`, which also derives
  `max_model_len` when none is given, in `_get_and_verify_max_len`, vllm/config/model.py), set as the current
  config, then `get_rope` called with the arguments vLLM's Llama attention passes
  (vllm/model_executor/models/llama.py: head_dim, `max_position=config.max_position_embeddings`,
  `rope_parameters=config.rope_parameters`, neox style, the default dtype);
- `applied_cos_sin`: the cos/sin the module's forward applies at positions 0..n-1, read off by rotating basis
  vectors (query head i is the unit vector e_i, so its output holds cos_i at i and sin_i at i + d/2): the forward
  picks the rows (vLLM's LongRoPE offsets them into its long table when the engine's max_model_len is past L0),
  so nothing of vLLM's indexing is copied here. On the CPU the forward is vLLM's PyTorch-native one
  (`RotaryEmbedding.forward_native`); its CUDA kernel reads the same `cos_sin_cache`;
- `applied_rotation`: the same forward on every unit vector of a head, for a family whose rotary dims, layout or
  mscale may differ from Llama's (tests/test_vllm_families.py builds its modules with the family's own model class,
  in `building_in` an `engine_config`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from pathlib import Path

import pytest
import torch
from conftest import hf_config
from transformers import AutoConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

REQUIRE_VLLM = "LONGROPE_REQUIRE_VLLM"  # set by `make test`: vLLM missing there is a failure, not a skip
REQUIREMENTS = Path(__file__).with_name("vllm-requirements.txt")


def pinned_vllm_version() -> str:
    lines = REQUIREMENTS.read_text().splitlines()
    return next(line.split("==")[1].strip() for line in lines if line.startswith("vllm=="))


def require_vllm():
    """vLLM, or a skip where it is not installed (a plain `pytest`); under `make test` (LONGROPE_REQUIRE_VLLM=1)
    its absence is an error, and the version must be the pinned one the README names."""
    if os.environ.get(REQUIRE_VLLM) != "1":
        return pytest.importorskip("vllm", reason="vLLM is not installed here; `make test` installs and runs it")
    vllm = importlib.import_module("vllm")
    assert vllm.__version__ == pinned_vllm_version(), f"{vllm.__file__} is vLLM {vllm.__version__}"
    return vllm


def write_model_config(
    folder: Path, block: dict, *, head_dim: int, max_position_embeddings: int, top_level_original: int | None = None
) -> Path:
    """A one-layer Llama's config.json with `block` as its rope_parameters, written as `longrope export` writes a
    block into a model's config (`factors_export.config_with_block`), no weights (neither runtime's rotary code
    reads any). `top_level_original` adds the Phi-3-style top-level `original_max_position_embeddings`."""
    plain = {"rope_type": "default", "rope_theta": 10000.0}
    config = hf_config(plain, head_dim=head_dim, max_position_embeddings=max_position_embeddings).to_dict()
    config["rope_parameters"] = dict(block)  # as export writes it, not as a LlamaConfig would normalise it
    config["architectures"] = ["LlamaForCausalLM"]
    if top_level_original is not None:
        config["original_max_position_embeddings"] = top_level_original
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def engine_config(model_dir: Path, max_model_len: int | None = None):
    """The engine's config for a model directory (`vllm.config.VllmConfig`): `max_model_len` None is an engine
    started without `--max-model-len`."""
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig

    model_config = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=max_model_len)
    # the CPU named: vLLM's CUDA wheel finds no platform of its own on a CPU torch
    return VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))


@contextlib.contextmanager
def building_in(engine):
    """The engine's config current, as while vLLM builds a model. vLLM memoises `get_rope` on its arguments, which
    do not include the engine's max_model_len that its LongRoPE reads at construction: one engine per process never
    notices, a test that builds several must empty that cache first, which this does."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers import rotary_embedding

    rotary_embedding._ROPE_DICT.clear()
    with set_current_vllm_config(engine):
        yield


def engine_rope(model_dir: Path, max_model_len: int | None = None):
    """(vLLM's rotary module for the model, the engine's max_model_len), `get_rope` called as vLLM's Llama
    attention calls it."""
    from vllm.model_executor.layers import rotary_embedding

    engine = engine_config(model_dir, max_model_len)
    hf_config = engine.model_config.hf_config
    with building_in(engine):
        rope = rotary_embedding.get_rope(
            hf_config.head_dim,
            max_position=hf_config.max_position_embeddings,
            rope_parameters=hf_config.rope_parameters,
            is_neox_style=True,
        )
    return rope, engine.model_config.max_model_len


def applied_cos_sin(rope, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, rotary_dim / 2] that vLLM's module applies at positions 0..length-1 (a prompt of
    `length` tokens), mscale included: its forward run on unit vectors."""
    pairs = rope.rotary_dim // 2
    index = torch.arange(pairs)
    probe = torch.zeros(length, pairs, rope.head_size)
    probe[:, index, index] = 1.0
    probe = probe.reshape(length, pairs * rope.head_size)
    with torch.no_grad():
        query, _ = rope(torch.arange(length), probe.clone(), probe.clone())
    query = query.view(length, pairs, rope.head_size)
    return query[:, index, index], query[:, index, index + pairs]


def applied_rotation(rope, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What vLLM's module does to one query head and one key head at positions 0..length-1: each
    [length, head_size, head_size], row h the image of the unit vector e_h (the forward run on one probe head per
    unit vector). Rotation is linear, so this is all of it: the angles, the mscale, which dims pair (neox halves
    or interleaved neighbours) and the dims past rotary_dim, which pass unchanged."""
    size = rope.head_size
    probe = torch.eye(size).repeat(length, 1, 1).reshape(length, size * size)
    with torch.no_grad():
        query, key = rope(torch.arange(length), probe.clone(), probe.clone())
    return query.view(length, size, size), key.view(length, size, size)


def transformers_cos_sin(model_dir: Path, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, rotary_dim / 2] that transformers applies to a prompt of `length` tokens: the same
    config.json read by `AutoConfig`, its Llama rotary module (which picks LongRoPE's factors per forward from
    max(position) + 1), the first half of its rotate_half layout."""
    rotary = LlamaRotaryEmbedding(AutoConfig.from_pretrained(model_dir, local_files_only=True))
    with torch.no_grad():
        cos, sin = rotary(torch.zeros(1), torch.arange(length)[None])
    pairs = cos.shape[-1] // 2
    return cos[0, :, :pairs], sin[0, :, :pairs]


def max_diff(a, b) -> float:
    return max(float((a[i] - b[i]).abs().max()) for i in (0, 1))
