"""The dry run's stand-ins for SmolLM2 and the manuals: a random tiny Llama written as a GGUF quantized as SmolLM2's is
(token embedding Q8_0, every matrix Q4_1, norms F32), converted into its reference directory by the project's own
converter (`workers.gguf_model.convert_gguf`, transformers' GGUF loader: what `make real-model` runs), and the
shipped corpus (`corpus:search`, `corpus:test`) read at 4x and 8x its training length of 64 tokens. So the dry run
checks on every CI run that `gguf_weights` (the GPU side's converter) gives the weights transformers gives.
"""

from __future__ import annotations

from pathlib import Path

ORIGINAL = 64
TARGETS = (256, 512)
SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_hidden_layers=2,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    initializer_range=0.1,
    tie_word_embeddings=True,
)


def tiny_gguf(path: Path, seed: int = 0) -> Path:
    """A random tiny Llama (vocabulary: search/export/llama_gguf.py's byte-level tokenizer) as a quantized GGUF."""
    import gguf
    import torch
    from transformers import LlamaForCausalLM

    from longrope.search.export.llama_gguf import (
        LLAMA,
        add_hyperparameters,
        add_tokenizer,
        finish,
        gguf_tensors,
        vocab_size,
    )
    from longrope.workers.random_llama import llama_config

    config = llama_config(vocab_size=vocab_size(), max_position_embeddings=ORIGINAL, **SHAPE)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    writer = gguf.GGUFWriter(str(path), LLAMA)
    add_hyperparameters(writer, config, ORIGINAL)
    add_tokenizer(writer)
    for name, data in gguf_tensors(model).items():
        if data.ndim == 1:
            writer.add_tensor(name, data)
            continue
        qtype = gguf.GGMLQuantizationType.Q8_0 if name == "token_embd.weight" else gguf.GGMLQuantizationType.Q4_1
        writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    return finish(writer, path)


def reference_dir(gguf_path: Path, folder: Path) -> Path:
    """The GGUF (this tiny Llama, or dry_gemma3's tiny Gemma 3) converted as `longrope model get` converts the real
    one, tokenizer too (the windows are cut with it)."""
    from longrope.workers.gguf_model import convert_gguf

    convert_gguf(gguf_path, folder, where="dry run")
    return folder
