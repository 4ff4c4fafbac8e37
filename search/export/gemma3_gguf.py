"""A transformers Gemma 3 text model written as a gemma3-architecture GGUF, as llama.cpp's converter writes one
(convert_hf_to_gguf.py, `Gemma3Model`, in the llama.cpp that llama-cpp-python 0.3.36 vendors): what the tests and the
GPU table's dry run hand to the project's GGUF reader (`workers.gguf_model`) and to llama.cpp, so the weights and
keys a real Gemma 3 file holds are checked on a model small enough for CI.

What the converter does and this copies:
- tensor names from gguf-py's map (`gguf.get_tensor_name_map(MODEL_ARCH.GEMMA3, n_layers)`); no `output.weight`
  (the embeddings are tied, llama.cpp reads `token_embd` for the output);
- every `*norm.weight` stored as weight + 1, float32: Gemma's RMSNorm multiplies by (1 + weight), llama.cpp's by the
  stored weight (`Gemma3Model.modify_tensors`);
- q and k rows as transformers keeps them: llama.cpp's gemma3 graph rotates halves (LLAMA_ROPE_TYPE_NEOX), as
  transformers does;
- the hyperparameters under `gemma3.*`: context_length, embedding_length, block_count, feed_forward_length,
  attention.head_count(_kv), attention.key_length / value_length (head_dim), layer_norm_rms_epsilon, the
  full-attention layers' rope.freq_base and attention.sliding_window.
The tokenizer is a sentencepiece ("llama") vocabulary, the smallest both llama.cpp and transformers' GGUF tokenizer
converter accept for a Gemma: Gemma's four special tokens (ids 0..3: pad, eos, bos, unk), the 256 byte tokens and a
few pieces. Token ids are fed straight to both runtimes, so text never matters.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from longrope.search.export.llama_gguf import finish

GEMMA3 = "gemma3"
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>"]  # Gemma's ids 0..3
PIECES = ["\u2581", "\u2581t", "he", "\u2581the", "a", "e"]
# sentencepiece token types (llama.cpp's LLAMA_TOKEN_TYPE_*)
CONTROL, UNKNOWN, BYTE, NORMAL = 3, 2, 6, 1


def tokenizer_vocab() -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types): the special tokens (control, unknown), the 256 byte tokens `<0xNN>`, then the
    pieces, each scored below the one before it."""
    tokens = [*SPECIAL, *(f"<0x{b:02X}>" for b in range(256)), *PIECES]
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN] + [BYTE] * 256 + [NORMAL] * len(PIECES)
    return tokens, [-float(i) for i in range(len(tokens))], types


def vocab_size() -> int:
    return len(SPECIAL) + 256 + len(PIECES)


def tensor_names(config):
    """gguf-py's gemma3 name map for `config`'s layers: `names.get_name(hf_name, try_suffixes=...)`."""
    import gguf  # the gguf extra

    return gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, config.num_hidden_layers)


def gemma3_writer(path: Path, config, file_type):
    """A GGUFWriter at `path` holding `config`'s gemma3.* keys, `file_type` (a `gguf.LlamaFileType`) and the
    tokenizer: the tensors are the caller's to add (float32 here, the real file's quantization types in the dry run)."""
    import gguf  # the gguf extra

    writer = gguf.GGUFWriter(str(path), GEMMA3)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(config.rope_parameters["full_attention"]["rope_theta"]))
    writer.add_sliding_window(config.sliding_window)
    writer.add_file_type(file_type)
    tokens, scores, types = tokenizer_vocab()
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_pad_token_id(SPECIAL.index("<pad>"))
    writer.add_eos_token_id(SPECIAL.index("<eos>"))
    writer.add_bos_token_id(SPECIAL.index("<bos>"))
    writer.add_unk_token_id(SPECIAL.index("<unk>"))
    writer.add_add_bos_token(True)
    return writer


def stored_weights(model):
    """(gguf name, transformers name, float32 array as llama.cpp stores it) for each tensor of `model` the file holds:
    `lm_head` left out (tied), norms as weight + 1."""
    names = tensor_names(model.config)
    for name, value in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        data = value.detach().float().numpy()
        if name.endswith("norm.weight"):
            data = data + 1.0
        yield names.get_name(name, try_suffixes=(".weight", ".bias")), name, np.ascontiguousarray(data)


def write_gemma3_gguf(model, path: Path) -> Path:
    """Write `model` (a Gemma3ForCausalLM with vocab_size() tokens) to `path` as an F32 GGUF."""
    import gguf  # the gguf extra

    if model.config.vocab_size != vocab_size():
        raise ValueError(f"vocab_size {model.config.vocab_size}: a model written here has {vocab_size()} tokens")
    writer = gemma3_writer(path, model.config, gguf.LlamaFileType.ALL_F32)
    for gguf_name, _, data in stored_weights(model):
        writer.add_tensor(gguf_name, data)
    return finish(writer, path)
