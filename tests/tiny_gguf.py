"""Tiny llama GGUF files for the GGUF export and llama.cpp tests, and llama-cpp-python for the tests marked
`llama_cpp`.

A random transformers `LlamaForCausalLM` (kept, so a test can compare) is written as an F32 GGUF by
`search/export/llama_gguf.py`, the way llama.cpp's convert_hf_to_gguf.py writes one (gguf-py's tensor names, q/k
rows permuted, llama.* keys, a byte-level gpt2 tokenizer); `verify`'s llama.cpp row writes its GGUF the same way.
Variants of such a file (another architecture, rope scaling keys, a quantized tensor) are made by
`rewritten_gguf`, which copies a GGUF through gguf's writer with keys and tensors changed.

`tiny_gemma3_gguf` writes a random transformers `Gemma3ForCausalLM` as an F32 gemma3 GGUF by
`search/export/gemma3_gguf.py`, the way llama.cpp's convert_hf_to_gguf.py writes a Gemma 3 (`Gemma3Model`).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from longrope.search.export import gemma3_gguf
from longrope.search.export.llama_gguf import finish, vocab_size, write_llama_gguf
from longrope.workers.random_llama import llama_config

REQUIRE_LLAMA_CPP = "LONGROPE_REQUIRE_LLAMA_CPP"  # set by `make test`: llama-cpp-python missing there fails
REQUIREMENTS = Path(__file__).with_name("llama-cpp-requirements.txt")


def pinned_llama_cpp_version() -> str:
    lines = REQUIREMENTS.read_text().splitlines()
    return next(line.split("==")[1].strip() for line in lines if line.startswith("llama-cpp-python=="))


def require_llama_cpp():
    """llama_cpp, or a skip where it is not installed (a plain `pytest`); under `make test`
    (LONGROPE_REQUIRE_LLAMA_CPP=1) its absence is an error, and the version must be the pinned one."""
    if os.environ.get(REQUIRE_LLAMA_CPP) != "1":
        return pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed; `make test` builds it")
    llama_cpp = importlib.import_module("llama_cpp")
    assert llama_cpp.__version__ == pinned_llama_cpp_version(), f"{llama_cpp.__file__} is {llama_cpp.__version__}"
    return llama_cpp


def tiny_llama(
    *,
    head_dim: int = 32,
    rope_theta: float = 10000.0,
    original: int = 64,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    seed: int = 0,
    std: float = 0.1,
):
    """A random float32 Llama with plain RoPE (defaults: the shape of search_helpers' JOB_RECORD: 16 rotary pairs,
    theta 10000, L0 64), grouped-query attention, untied embeddings; `std` is the init's (transformers' 0.02 makes
    attention nearly uniform, so positions would hardly move the logits)."""
    from transformers import LlamaForCausalLM

    config = llama_config(
        hidden_size=heads * head_dim,
        intermediate_size=2 * heads * head_dim,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab_size(),
        max_position_embeddings=original,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        initializer_range=std,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float().eval()


def tiny_gguf(path: Path, **shape) -> tuple[Path, object]:
    """(the GGUF written at `path`, the transformers model it holds)."""
    model = tiny_llama(**shape)
    return write_llama_gguf(model, path), model


def fields(path: Path) -> dict[str, tuple]:
    """Every key of a GGUF but gguf-py's GGUF.* header fields: name -> (value types, value)."""
    reader = gguf.GGUFReader(path)
    return {
        name: (tuple(field.types), field.contents())
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    }


def tensors(path: Path) -> dict[str, tuple]:
    """Every tensor of a GGUF: name -> (ggml type, shape, raw bytes)."""
    reader = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type, tuple(int(n) for n in t.shape), bytes(np.asarray(t.data))) for t in reader.tensors}


def rewritten_gguf(
    source: Path,
    out: Path,
    *,
    architecture: str | None = None,
    set_keys: dict[str, tuple] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
    quantize: dict[str, gguf.GGMLQuantizationType] | None = None,
) -> Path:
    """A copy of `source` with keys renamed to `architecture`'s prefix, `set_keys` (name -> (value, GGUFValueType))
    set, `extra_tensors` added and the tensors named in `quantize` quantized (gguf.quants) to the type given."""
    reader = gguf.GGUFReader(source)
    old = reader.get_field("general.architecture").contents()
    new = architecture or old
    writer = gguf.GGUFWriter(out, new)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        types = list(field.types)
        renamed = new + name[len(old) :] if name.startswith(f"{old}.") else name
        if renamed in (set_keys or {}):
            continue
        writer.add_key_value(renamed, field.contents(), types[0], sub_type=types[-1] if len(types) > 1 else None)
    for name, (value, value_type) in (set_keys or {}).items():
        writer.add_key_value(name, value, value_type)
    for name, data in (extra_tensors or {}).items():
        writer.add_tensor(name, data)
    for tensor in reader.tensors:
        data = np.array(tensor.data)
        if tensor.name in (quantize or {}):
            qtype = quantize[tensor.name]
            writer.add_tensor(tensor.name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(tensor.name, data, raw_dtype=tensor.tensor_type)
    return finish(writer, out)


def tiny_gemma3(*, layers: int = 6, window: int = 16, original: int = 128, seed: int = 0, std: float = 0.1):
    """A random float32 Gemma 3 text model, head_dim 256 (as Gemma 3 up to 12B; llama.cpp scales attention by
    1/sqrt(head_dim), transformers by query_pre_attn_scalar, 256), `window`-token sliding windows on 5 layers of 6,
    random norm weights (Gemma initialises them to 0, which would hide a missing - 1)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=gemma3_gguf.vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=256,
        max_position_embeddings=original,
        sliding_window=window,
        initializer_range=std,
    )
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, value in model.named_parameters():
            if name.endswith("norm.weight"):
                value.normal_(0.0, 0.3)
    return model


def tiny_gemma3_gguf(path: Path, **shape) -> tuple[Path, object]:
    """(the Gemma 3 GGUF written at `path`, the transformers model it holds)."""
    model = tiny_gemma3(**shape)
    return gemma3_gguf.write_gemma3_gguf(model, path), model
