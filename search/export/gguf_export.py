"""`longrope export RUN --gguf IN.gguf -o OUT.gguf`: a copy of a llama-architecture GGUF that llama.cpp runs with
the run's factors, applied by llama.cpp's own code. IN.gguf is only read.

What llama.cpp reads, and so what the copy holds (llama.cpp as vendored by llama-cpp-python 0.3.36):
- `rope_freqs.weight`, F32 {n_rot/2} = the long factors. The llama architecture creates this optional tensor in
  `llama_model_llama::load_arch_tensors` (src/models/llama.cpp) unless the GGUF's rope.scaling.type is "longrope";
  `llama_model::get_rope_factors` (src/llama-model.cpp) returns it ahead of Phi-3's long/short pair, and the llama
  graph passes it to `ggml_rope_ext` for Q and K. In ggml's rope (`ggml_rope_cache_init` and `rope_yarn`,
  ggml/src/ggml-cpu/ops.cpp) pair i's angle is p * base^(-2i/n_rot) / freq_factors[i], times freq_scale: LongRoPE's
  p / (lambda_i * base^(2i/d)) (arXiv 2402.13753, eq. 3) when freq_scale = 1, which it is when the GGUF has no
  rope.scaling.factor and the user passes no --rope-freq-scale / --rope-scale (llama-cpp-python: rope_freq_scale
  0.0, its default). This is the tensor llama.cpp's converter writes for Llama 3.1's rope scaling
  (convert_hf_to_gguf.py; `LlamaModel.generate_extra_tensors` in conversion/llama.py of this llama.cpp).
- `llama.rope.scaling.attn_factor` = the attention factor. `llama_model::load_hparams` reads it into
  `hparams.rope_attn_factor` (src/llama-model.cpp), the context multiplies `cparams.yarn_attn_factor` by it
  (`llama_context::llama_context`, src/llama-context.cpp), the graph hands that to `ggml_rope_ext` as attn_factor
  (`llm_graph_context`, src/llama-graph.cpp), and `rope_yarn` multiplies cos and sin by it. ext_factor is 0 unless
  YaRN is asked for (`llama_context::llama_context`), and with freq_scale 1 YaRN changes neither the angles nor this
  scale. That is transformers' LongRoPE cos/sin scale (`_compute_longrope_parameters`, modeling_rope_utils.py), so
  nothing is lost. A user's yarn_attn_factor multiplies it (llama-cpp-python's default is 1.0). One llama.cpp
  caveat, not measured here: a KV-cache shift (context shift, `kv_cache_seq_shift`) rotates the cached keys again
  with the same attn_factor (`build_rope_shift`, src/llama-kv-cache.cpp), scaling shifted keys twice, as it does
  for any model with an attention factor (Phi-3's LongRoPE, YaRN).
- `llama.context_length` = the target length: llama.cpp's default context size (n_ctx 0) and its "training
  context" warning read it (n_ctx_train, src/llama-context.cpp).
- `longrope.factors`: the factors file `longrope export` writes (JSON), so the copy says where its factors came from.
Every other key and tensor is copied as read: quantized tensors as their raw blocks with their ggml type.

What does not carry over: transformers switches to the long factors when a sequence passes L0 tokens (short factors
below it); llama.cpp applies rope_freqs at every length, as vLLM applies the long factors when its max_model_len
exceeds L0. So a run whose short factors are not all 1 is refused, and prompts shorter than L0 see the long factors.

Refused in one line (nothing written): a file that is no whole GGUF; an architecture other than llama (llama.cpp
creates rope_freqs for apertus, arcee, deci, exaone, granite, llama4, minicpm, mistral3 and more, but only the
llama graph's q/k layout is the one the factors were checked against here); a GGUF that already has
rope_freqs.weight (Llama 3.1's scaling: the factors were searched on the plain frequencies) or any rope scaling
(rope.scaling.type other than none/linear, or a rope.scaling.factor other than 1, which ggml multiplies into every
angle); rotary pairs (rope.dimension_count / 2), rope.freq_base or context length (the original L0) other than the
run's; and -o naming IN.gguf itself (through links too).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from longrope.search.config.factors_file import FactorsFile
from longrope.search.export.factors_export import ExportError, export_path, factors_json
from longrope.search.export.output_paths import write_output
from longrope.workers.gguf_model import GGUF_MAGIC, PLAIN_SCALING_TYPES, ROPE_FREQS, field_value

ARCHITECTURE = "llama"
PROVENANCE_KEY = "longrope.factors"
DEFAULT_FREQ_BASE = 10000.0  # llama_model::load_hparams' default when rope.freq_base is absent


class GgufRope(BaseModel):
    """What the copy carries for llama.cpp: the tensor's values, and the two keys set."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    freq_factors: list[float]  # rope_freqs.weight
    attn_factor: float  # llama.rope.scaling.attn_factor
    context_length: int  # llama.context_length


def gguf_rope(factors: FactorsFile) -> GgufRope:
    """The values a GGUF export writes for `factors` (the long factors: see the module docstring)."""
    block = factors.rope_parameters
    return GgufRope(
        freq_factors=list(block.long_factor),
        attn_factor=block.attention_factor,
        context_length=factors.max_position_embeddings,
    )


def key(name: str) -> str:
    return f"{ARCHITECTURE}.{name}"


def read_gguf(path: Path, where: str):
    """A GGUFReader of the whole file, or one ExportError: missing, not GGUF, unreadable, truncated."""
    if not os.path.isfile(path):
        raise ExportError(f"{where}: no such file")
    with open(path, "rb") as stream:
        if stream.read(4) != GGUF_MAGIC:
            raise ExportError(f"{where}: not a GGUF file (it does not start with 'GGUF')")
    try:
        import gguf  # the gguf extra
    except ImportError as exc:
        raise ExportError(f"{where}: reading it needs the 'gguf' package: pip install 'longrope-search[gguf]'") from exc
    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:  # gguf raises ValueError, IndexError, struct errors on a damaged file
        detail = " ".join(str(exc).split())[:160]
        raise ExportError(f"{where}: not a whole GGUF file: truncated or damaged ({detail})") from exc
    size = os.path.getsize(path)
    for tensor in reader.tensors:
        if tensor.data_offset + tensor.n_bytes > size:
            raise ExportError(
                f"{where}: truncated: tensor {tensor.name!r} ends at byte "
                f"{tensor.data_offset + tensor.n_bytes}, the file has {size}"
            )
    return reader


# Why an architecture whose model the scorer handles gets no GGUF, where llama.cpp's own graph says so (llama.cpp as
# vendored by llama-cpp-python 0.3.36)
ARCHITECTURE_REFUSALS = {
    "gemma3": "llama.cpp's gemma3 graph (src/models/gemma3.cpp) has no per-pair rope factors: its load_arch_tensors "
    "never creates rope_freqs.weight (a GGUF holding one fails to load: 'wrong number of tensors'), it passes nullptr "
    "factors to ggml_rope_ext, and rope.scaling.attn_factor would reach the local layers too, where transformers "
    "scales only rope_parameters.full_attention",
}


def check_architecture(reader, where: str) -> None:
    architecture = field_value(reader, "general.architecture")
    if architecture in ARCHITECTURE_REFUSALS:
        raise ExportError(f"{where}: general.architecture is {architecture!r}: {ARCHITECTURE_REFUSALS[architecture]}")
    if architecture != ARCHITECTURE:
        raise ExportError(
            f"{where}: general.architecture is {architecture!r}; only {ARCHITECTURE!r} GGUF files are exported "
            "(the architecture whose rope_freqs.weight llama.cpp's llama graph applies)"
        )


def check_unscaled(reader, where: str) -> None:
    """The GGUF's RoPE is plain: no rope_freqs yet, no scaling type or factor that llama.cpp would add on top."""
    if any(tensor.name == ROPE_FREQS for tensor in reader.tensors):
        raise ExportError(
            f"{where}: already has {ROPE_FREQS} (rescaled frequencies, as Llama 3.1's); the factors were searched "
            "on the model's plain RoPE frequencies: export into the GGUF of the model the run searched"
        )
    scaling = field_value(reader, key("rope.scaling.type"), "none")
    if scaling not in PLAIN_SCALING_TYPES:
        raise ExportError(
            f"{where}: {key('rope.scaling.type')} is {scaling!r}; llama.cpp would scale its RoPE that way as well "
            "(and with 'longrope' would not read rope_freqs at all); export into a GGUF with plain RoPE"
        )
    factor = field_value(reader, key("rope.scaling.factor"), field_value(reader, key("rope.scale_linear"), 1.0))
    if factor not in (0.0, 1.0):
        raise ExportError(
            f"{where}: {key('rope.scaling.factor')} is {factor:g}; llama.cpp multiplies every angle by its inverse "
            "on top of rope_freqs; export into a GGUF with plain RoPE"
        )


def rotary_pairs(reader) -> int:
    """n_rot / 2: rope.dimension_count, defaulting as llama.cpp does to the head dim (attention.key_length, else
    embedding_length / head_count; llama_model::load_hparams)."""
    heads = field_value(reader, key("attention.head_count"), 0)
    head_dim = field_value(reader, key("attention.key_length"))
    if head_dim is None:
        head_dim = field_value(reader, key("embedding_length"), 0) // heads if heads else 0
    return int(field_value(reader, key("rope.dimension_count"), head_dim)) // 2


def check_shape(reader, factors: FactorsFile, where: str) -> None:
    """The GGUF's rotary pairs, RoPE base and context length (its L0) are the run's."""
    block = factors.rope_parameters
    pairs = rotary_pairs(reader)
    if pairs != len(block.long_factor):
        raise ExportError(
            f"{where}: {key('rope.dimension_count')} gives {pairs} rotary pairs, the factors are for "
            f"{len(block.long_factor)}; export into the GGUF of the model the run searched"
        )
    base = float(field_value(reader, key("rope.freq_base"), DEFAULT_FREQ_BASE))
    if not math.isclose(base, block.rope_theta, rel_tol=1e-6):
        raise ExportError(
            f"{where}: {key('rope.freq_base')} is {base:g}, the factors' rope_theta is {block.rope_theta:g}; "
            "export into the GGUF of the model the run searched"
        )
    length = field_value(reader, key("context_length"))
    if length != block.original_max_position_embeddings:
        raise ExportError(
            f"{where}: {key('context_length')} is {length}, the factors' original length is "
            f"{block.original_max_position_embeddings}; export into the GGUF of the model the run searched"
        )


def check_expressible(factors: FactorsFile) -> None:
    block = factors.rope_parameters
    if any(value != 1.0 for value in block.short_factor):
        raise ExportError(
            "--gguf: these factors have searched short factors (applied up to L0 tokens by transformers); llama.cpp "
            f"applies {ROPE_FREQS} at every length, so they cannot be expressed; export JSON for transformers or vLLM"
        )


def check_not_input(source: Path, out: Path, where: str) -> None:
    """-o must not be IN.gguf: not the same name, nor a link to it, nor another name of the same file."""
    same = os.path.realpath(source) == os.path.realpath(out)
    if not same and os.path.exists(out):
        same = os.path.samefile(source, out)
    if same:
        raise ExportError(f"{where}: is the --gguf input itself, which is never modified; give another file name")


def check_gguf_export(factors: FactorsFile, source: Path, out: Path):
    """Every refusal, before anything is written; returns the reader of IN.gguf."""
    where_in, where_out = f"--gguf {str(source)!r}", f"-o {str(out)!r}"
    if Path(out).suffix.lower() != ".gguf":
        raise ExportError(f"{where_out}: with --gguf the output is a GGUF file; name it .gguf")
    check_expressible(factors)
    reader = read_gguf(source, where_in)
    check_architecture(reader, where_in)
    check_unscaled(reader, where_in)
    check_shape(reader, factors, where_in)
    export_path(out, where_out)
    check_not_input(source, out, where_out)
    return reader


def copied_fields(reader, rope: GgufRope, provenance: str) -> list[tuple[str, object, list]]:
    """(name, value, types) of every key of the copy in IN's order, the context length replaced, the attention
    factor and provenance set; the reader's own GGUF.* fields and general.architecture are the writer's."""
    import gguf  # the gguf extra

    changed = {
        key("context_length"): rope.context_length,
        key("rope.scaling.attn_factor"): rope.attn_factor,
        PROVENANCE_KEY: provenance,
    }
    types = {
        key("rope.scaling.attn_factor"): [gguf.GGUFValueType.FLOAT32],
        PROVENANCE_KEY: [gguf.GGUFValueType.STRING],
    }
    fields = []
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = changed.pop(field.name, None)
        fields.append((field.name, field.contents() if value is None else value, list(field.types)))
    fields += [(name, value, types[name]) for name, value in changed.items()]
    return fields


def write_gguf_copy(reader, rope: GgufRope, provenance: str, path: str) -> None:
    """The copy, through gguf's writer: rope_freqs.weight first (where llama.cpp's converter puts it), then IN's
    tensors in IN's order as their raw bytes and ggml type (the way gguf-py's gguf_new_metadata.py copies)."""
    import gguf  # the gguf extra
    import numpy as np

    writer = gguf.GGUFWriter(path, ARCHITECTURE, endianess=reader.endianess)
    alignment = field_value(reader, "general.alignment")
    if alignment is not None:
        writer.data_alignment = alignment
    for name, value, types in copied_fields(reader, rope, provenance):
        writer.add_key_value(name, value, types[0], sub_type=types[-1] if len(types) > 1 else None)
    freqs = np.asarray(rope.freq_factors, dtype=np.float32)
    writer.add_tensor_info(ROPE_FREQS, freqs.shape, freqs.dtype, freqs.nbytes, gguf.GGMLQuantizationType.F32)
    for tensor in reader.tensors:
        data = tensor.data
        writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.write_tensor_data(freqs)
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()


def write_gguf_export(factors: FactorsFile, source: str | Path, out: str | Path) -> GgufRope:
    """Check everything (`check_gguf_export`), then write OUT atomically (a temp file beside it, renamed over it;
    a link at OUT is written through, as every -o is); returns what the copy carries."""
    source, out = Path(source), Path(out)
    reader = check_gguf_export(factors, source, out)
    rope = gguf_rope(factors)
    provenance = factors_json(factors)
    write_output(out, lambda tmp: write_gguf_copy(reader, rope, provenance, tmp.name), f"-o {str(out)!r}", "wb")
    return rope
