"""The dry run's stand-in for Gemma 3 270M: a random tiny gemma3_text model (transformers' own Gemma3TextConfig and
Gemma3ForCausalLM) written as a GGUF the way llama.cpp writes Gemma 3's and quantized with the real file's types, then
converted into its reference directory by the project's converter (`workers.gguf_model.convert_gguf`, transformers'
GGUF loader: what `longrope model get gemma3-270m` runs). So every CI run checks that `gguf_weights` (the GPU side's
converter, gguf-py alone) gives the weights transformers gives for a gemma3 file: the name map, llama.cpp's
`norm + 1` undone, and every quantization type Gemma 3's Q4_K_M file holds.

The shape keeps what makes Gemma 3 Gemma 3 for the scorer: sliding-window layers (5 of 6, a window of 32 tokens,
shorter than the dry run's 256 and 512) beside a full-attention layer, rope bases 10,000 and 1,000,000, head_dim 256
(the attention scale llama.cpp and transformers agree on), one KV head, tied embeddings; trained context 128, read at
2x and 4x as the real model's 32k at 64k and 128k.

How llama.cpp writes it (convert_hf_to_gguf.py, Gemma3Model): gguf-py's gemma3 tensor names, every `*norm.weight` as
weight + 1, q/k rows as transformers keeps them, no output.weight (tied), gemma3.* keys with the sliding window, and
a sentencepiece ("llama") vocabulary; here Gemma's four special tokens, the 256 byte tokens and a few pieces. The
types are the real file's (gemma-3-270m-q4_k_m.gguf: token_embd Q8_0; attn_q, attn_k, ffn_gate, ffn_up Q5_0;
attn_v Q8_0; attn_output Q4_K; ffn_down Q6_K; norms F32). gguf-py quantizes to Q8_0 and Q5_0 but has no K-quant
quantizer (`gguf.quants.quantize` raises NotImplementedError for Q4_K and Q6_K), so those two tensors are random
K-quant blocks with small scales instead of the model's own values: the model is random either way, and the reference
is what the file holds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from longrope.search.export import gemma3_gguf
from longrope.search.export.llama_gguf import finish

ORIGINAL = 128
TARGETS = (256, 512)
WINDOW = 32
SHAPE = dict(
    hidden_size=64,
    intermediate_size=256,  # a K-quant row is a multiple of 256 values: ffn_down's rows are this long
    num_hidden_layers=6,  # transformers' and llama.cpp's pattern: every 6th layer full attention
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=256,
    sliding_window=WINDOW,
    max_position_embeddings=ORIGINAL,
    initializer_range=0.1,  # transformers' 0.02 makes attention nearly uniform: positions would hardly move the loss
)
# the GGUF's type of each tensor kind, as gemma-3-270m-q4_k_m.gguf has it
QUANT = {
    "token_embd": "Q8_0",
    "attn_q": "Q5_0",
    "attn_k": "Q5_0",
    "attn_v": "Q8_0",
    "attn_output": "Q4_K",
    "ffn_gate": "Q5_0",
    "ffn_up": "Q5_0",
    "ffn_down": "Q6_K",
}


def random_k_blocks(rows: int, columns: int, qtype, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_K or Q6_K data of a [rows, columns] tensor, as uint8 [rows, bytes per row], its f16 super-block
    scales set small so the values are a few hundredths (gguf-py's block layouts: Q4_K is d, dmin, 12 bytes of 6-bit
    scales and mins, 128 of 4-bit values; Q6_K is 128 + 64 bytes of 6-bit values, 16 int8 scales, then d)."""
    import gguf

    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows, columns // block_size, type_size), dtype=np.uint8)
    if qtype == gguf.GGMLQuantizationType.Q4_K:
        blocks[..., 0:4] = np.array([1e-4, 1e-3], dtype=np.float16).view(np.uint8)  # d, dmin
    else:
        blocks[..., type_size - 2 :] = np.array([2e-5], dtype=np.float16).view(np.uint8)  # d
    return blocks.reshape(rows, -1)


def tiny_model(seed: int = 0):
    """The random tiny Gemma3ForCausalLM, its norm weights random too (Gemma initialises them to 0, which would hide
    a missing - 1)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=gemma3_gguf.vocab_size(), **SHAPE)
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, value in model.named_parameters():
            if name.endswith("norm.weight"):
                value.normal_(0.0, 0.3)
    return model


def tiny_gguf(path: Path, seed: int = 0) -> Path:
    """The tiny model as a gemma3 GGUF quantized as Gemma 3 270M's Q4_K_M file is."""
    import gguf

    model = tiny_model(seed)
    writer = gemma3_gguf.gemma3_writer(path, model.config, gguf.LlamaFileType.MOSTLY_Q4_K_M)
    rng = np.random.default_rng(seed)
    for gguf_name, name, data in gemma3_gguf.stored_weights(model):
        if name.endswith("norm.weight"):
            writer.add_tensor(gguf_name, data)  # F32, as llama.cpp stores norms
            continue
        qtype = getattr(gguf.GGMLQuantizationType, QUANT[gguf_name.split(".")[-2]])
        if qtype in (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K):
            writer.add_tensor(gguf_name, random_k_blocks(*data.shape, qtype, rng), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    return finish(writer, path)
