"""A transformers `LlamaForCausalLM` written as a llama-architecture GGUF with float32 weights, as llama.cpp's own
converter writes one (convert_hf_to_gguf.py; `LlamaModel` in conversion/llama.py of the llama.cpp that
llama-cpp-python 0.3.36 vendors): what `verify`'s llama.cpp row and the tests hand to llama.cpp, so its logits can be
compared with transformers' on the same weights.

What the converter does and this copies:
- tensor names from gguf-py's map (`gguf.get_tensor_name_map(MODEL_ARCH.LLAMA, n_layers)`: `q_proj` ->
  `blk.N.attn_q`, `embed_tokens` -> `token_embd`, ...); `lm_head` is left out when the embeddings are tied (llama.cpp
  then reads `token_embd` for the output, src/models/llama.cpp `load_arch_tensors`, TENSOR_DUPLICATED);
- q_proj and k_proj rows permuted (`LlamaModel.permute`): transformers rotates the halves of a head (rotate_half,
  pair i is dims i and i + d/2), llama.cpp's llama graph rotates adjacent dims (LLAMA_ROPE_TYPE_NORM, pair i is dims
  2i and 2i + 1, `llama_model_rope_type` in src/llama-model.cpp), so each head's rows are reordered
  [0, d/2, 1, d/2 + 1, ...]: rows.reshape(heads, 2, d/2, -1).swapaxes(1, 2); k_proj with the key/value heads;
- the hyperparameters under `llama.*` (context_length, embedding_length, block_count, feed_forward_length,
  rope.dimension_count, attention.head_count(_kv), attention.layer_norm_rms_epsilon, rope.freq_base, vocab_size),
  key_length / value_length when head_dim is not hidden_size / heads, general.file_type ALL_F32.
The tokenizer is the smallest that both llama.cpp (src/llama-vocab.cpp: a "gpt2" model needs tokens and merges) and
transformers' GGUF tokenizer converter accept: the 256 byte-level tokens of GPT-2's byte-to-unicode table, one
merge, one control token used as BOS and EOS. Token ids are fed straight to both runtimes, so text never matters.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from longrope.encodings.lazy_import import torch

LLAMA = "llama"
END_OF_TEXT = "<|endoftext|>"
# GPT-2's byte-level BPE: bytes that print as themselves keep their character, the others shift past 255
_PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]


def byte_tokens() -> list[str]:
    """GPT-2's `bytes_to_unicode` table as a token list: token b is the character byte b maps to."""
    shifted = iter(range(256, 512))
    return [chr(b) if b in _PRINTABLE else chr(next(shifted)) for b in range(256)]


def tokenizer_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): the byte tokens, the one merge's token ("Ġt"), END_OF_TEXT (a control
    token, type 3; the others are normal, type 1)."""
    tokens = [*byte_tokens(), "Ġt", END_OF_TEXT]
    return tokens, [1] * (len(tokens) - 1) + [3], ["Ġ t"]


def vocab_size() -> int:
    """The vocabulary a model written here must have: one row per token of `tokenizer_vocab`."""
    return len(tokenizer_vocab()[0])


def permute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's `LlamaModel.permute`: each head's rows from rotate_half order to adjacent pairs."""
    rows = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, rows, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """The model's state dict under llama.cpp's names, float32, q/k permuted, as the converter writes it."""
    import gguf  # the gguf extra: only when a GGUF is written

    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    tensors = {}
    for name, value in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = value.detach().to(torch.float32).cpu().numpy()
        if name.endswith("self_attn.q_proj.weight"):
            data = permute_rows(data, config.num_attention_heads)
        elif name.endswith("self_attn.k_proj.weight"):
            data = permute_rows(data, config.num_key_value_heads)
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise ValueError(f"{name}: no llama.cpp tensor name for it")
        tensors[mapped] = np.ascontiguousarray(data)
    return tensors


def add_hyperparameters(writer, config, context_length: int) -> None:
    import gguf  # the gguf extra

    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer.add_context_length(context_length)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_rope_dimension_count(head_dim)
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    if head_dim != config.hidden_size // heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)


def add_tokenizer(writer) -> None:
    tokens, types, merges = tokenizer_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(len(tokens) - 1)
    writer.add_eos_token_id(len(tokens) - 1)


def write_llama_gguf(model, path: Path, *, context_length: int | None = None) -> Path:
    """Write `model` (a LlamaForCausalLM with plain RoPE, vocab_size() tokens) to `path` as an F32 GGUF whose
    context length is `context_length` (default: the config's max_position_embeddings)."""
    import gguf  # the gguf extra

    config = model.config
    if config.vocab_size != vocab_size():
        raise ValueError(f"vocab_size {config.vocab_size}: a model written here has {vocab_size()} tokens")
    writer = gguf.GGUFWriter(str(path), LLAMA)
    add_hyperparameters(writer, config, context_length or config.max_position_embeddings)
    add_tokenizer(writer)
    for name, data in gguf_tensors(model).items():
        writer.add_tensor(name, data)
    return finish(writer, path)


def finish(writer, path: Path) -> Path:
    """Write a GGUFWriter's header, keys and tensors (added with `add_tensor`) to its file and close it: `path`."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
