"""A llama or Gemma 3 GGUF's weights as the Hugging Face state dict, made on the GPU machine, and a digest that says
the weights made there are the ones `longrope model get` (`make real-model`) made here.

Why not the project's converter (workers/gguf_model.py, transformers' `load_gguf_checkpoint`) there: the GPU image
has another transformers (5.17 when last listed) than this checkout is tested with, and its GGUF loader is the part
of transformers that changes most; a lease is too short to find out there. What a llama conversion does is small and
fixed, so it is done here with gguf-py alone (a carried wheel, the version `make install` pins), as
transformers does it for llama: each tensor dequantized by `gguf.dequantize`, named through gguf-py's tensor name map
(`get_tensor_name_map(MODEL_ARCH.LLAMA, layers)`, the map `search/export/llama_gguf.py` writes with), and the q/k rows
put back from llama.cpp's adjacent pairs to transformers' rotate-half order (`LlamaTensorProcessor.
_reverse_permute_weights`; the inverse of `llama_gguf.permute_rows`). The result must hash (`weights_digest`) to
what the reference directory's model.safetensors hashes to, or nothing is scored.

Gemma 3 (config.json's model_type `gemma3_text`, the GGUF's architecture `gemma3`) goes the same way with gguf-py's
gemma3 name map and one change of values instead of the q/k rows: llama.cpp stores each RMSNorm weight as `weight + 1`
(convert_hf_to_gguf.py, Gemma3Model.modify_tensors; Gemma's norm multiplies by `1 + weight`), and transformers'
loader subtracts the 1 again from every `*norm.weight` (modeling_gguf_pytorch_utils.py, `Gemma2TensorProcessor`,
registered for gemma3), in float32 as here. Gemma's q/k rows are stored in transformers' order.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np


def reverse_permute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's adjacent-pair rows of a q or k projection back in transformers' rotate-half order."""
    rows = weight.shape[0] // heads // 2
    return weight.reshape(heads, rows, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


# config.json's model_type -> the GGUF's general.architecture, which names gguf-py's tensor name map
GGUF_ARCHITECTURES = {"llama": "llama", "gemma3_text": "gemma3"}


def gguf_architecture(config: dict) -> str:
    model_type = config.get("model_type")
    if model_type not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"model_type {model_type!r}: only {', '.join(GGUF_ARCHITECTURES)} GGUF weights are converted here"
        )
    return GGUF_ARCHITECTURES[model_type]


def hf_names(config: dict) -> list[str]:
    """The state dict's names of the causal LM of this config.json (LlamaForCausalLM, Gemma3ForCausalLM), built on the
    meta device (no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = {key: value for key, value in config.items() if key != "model_type"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **settings))
    names = list(model.state_dict())
    if config.get("tie_word_embeddings"):
        names.remove("lm_head.weight")  # saved once, as the embedding (save_pretrained does the same)
    return names


def gguf_state_dict(gguf_path: Path, config: dict) -> dict[str, np.ndarray]:
    """{transformers name: float32 array} of every weight of the GGUF, dequantized."""
    import gguf  # a carried wheel on the GPU machine; the gguf extra here

    architecture = gguf_architecture(config)
    reader = gguf.GGUFReader(str(gguf_path))
    found = reader.get_field("general.architecture")
    if found is None or found.contents() != architecture:
        written = None if found is None else found.contents()
        raise ValueError(f"{gguf_path}: a {written!r} GGUF, but config.json's model is {architecture!r}")
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    arch = {"llama": gguf.MODEL_ARCH.LLAMA, "gemma3": gguf.MODEL_ARCH.GEMMA3}[architecture]
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    state = {}
    for name in hf_names(config):
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped not in tensors:
            raise ValueError(f"{gguf_path}: no tensor {mapped!r} for {name}")
        tensor = tensors[mapped]
        data = np.asarray(gguf.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if architecture == "gemma3" and name.endswith("norm.weight"):
            data = data - 1  # llama.cpp's norm + 1 undone, as transformers' Gemma2TensorProcessor does
        elif architecture == "llama" and name.endswith("self_attn.q_proj.weight"):
            data = reverse_permute_rows(data, config["num_attention_heads"])
        elif architecture == "llama" and name.endswith("self_attn.k_proj.weight"):
            data = reverse_permute_rows(data, config["num_key_value_heads"])
        state[name] = np.ascontiguousarray(data)
    return state


def weights_digest(state: dict[str, np.ndarray]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order: equal only for equal weights, however
    the file holding them was written (safetensors' header and order may differ between writers)."""
    digest = hashlib.sha256()
    for name in sorted(state):
        array = np.ascontiguousarray(state[name])
        digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def safetensors_digest(path: Path) -> str:
    """`weights_digest` of a model.safetensors file (the reference directory's, here)."""
    from safetensors.numpy import load_file

    return weights_digest(load_file(str(path)))


def write_model_dir(state: dict[str, np.ndarray], config_text: str, folder: Path) -> Path:
    """config.json (the reference's text, byte for byte) and model.safetensors: a directory `load_model` reads."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config_text)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
