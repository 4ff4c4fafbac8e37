"""`verify`'s llama.cpp row: does llama.cpp apply a GGUF export of the factors (`gguf_export`) as transformers
applies the block?

With llama-cpp-python importable (`make test` builds 0.3.36 from source into .llama-cpp-site), llama.cpp's own code
runs: a random llama of the model's RoPE shape (its head_dim and rope_theta; 2 layers, 2 query heads sharing one
key/value head, float32) is written as an F32 GGUF the way llama.cpp's converter writes one (`llama_gguf`), exported
with the factors by `write_gguf_export` itself, and its logits from llama.cpp (`llama_cpp_logits`) are compared with
transformers' logits for the same weights with the block as `rope_parameters` (the config `verify` builds), on one
window of random token ids of `check_length` tokens: past L0, so transformers uses the long factors, as llama.cpp
does at every length. Without llama-cpp-python (or with `--no-logits`) the row rebuilds ggml's cos/sin from the
values the export writes, by a copy of `ggml_rope_cache_init` / `rope_yarn` (ggml/src/ggml-cpu/ops.cpp) that never
shares our encodings' code, and compares them with ours; the line says so.

Tolerances, and why they are not verify's 1e-5 and 1e-3:
- cos/sin: ggml computes angles in float32 as theta_0 = p, theta_{i+1} = theta_i * powf(base, -2/n_rot), each
  divided by its factor, where torch multiplies p by a float32 inverse frequency. Both round to float32, whose
  spacing at an angle near p is p * 2^-23, so at position p they may differ by a few of those steps; the bound is
  COS_SIN_ULPS steps at the window's last position (cos and sin are 1-Lipschitz in the angle): 4.9e-4 at 1024.
- logits: LOGITS_RELATIVE_TOLERANCE x max |logit|. Both run float32 weights and activations (the KV cache is kept
  in float32, not llama.cpp's default float16), but ggml's matrix products, softmax and RMSNorm accumulate in
  another order, and the angle differences above change the attention scores by |q||k| times them. Measured on
  this row's model (llama-cpp-python 0.3.36, transformers 5.24): 4.6e-5 x max |logit| at 1024 tokens (64-dim
  heads, theta 1e4), 3.7e-4 at 9216 and 4.5e-4 at 16384 (SmolLM2-135M's 64-dim heads, theta 1e5, L0 8192), the
  growth the angles' float32 spacing predicts; the GGUF without the factors, or without the attention factor,
  misses by 500-800 times the tolerance (tests/test_llama_cpp.py).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from longrope.encodings import LongRope
from longrope.encodings.lazy_import import torch
from longrope.search.config.factors_file import FactorsFile
from longrope.search.export.factors_export import ExportError, config_with_block
from longrope.search.export.gguf_export import GgufRope, check_expressible, gguf_rope, write_gguf_export
from longrope.search.export.llama_gguf import vocab_size, write_llama_gguf
from longrope.workers.model_build import quiet_transformers

PACKAGE = "llama_cpp"
BEYOND_ORIGINAL = 1024  # positions checked past L0 (all of them when the target is closer)
COS_SIN_ULPS = 4  # measured: 1.1 steps on SmolLM2-135M's shape (64-dim heads, theta 1e5) at 1k-16k tokens
LOGITS_RELATIVE_TOLERANCE = 2e-3
BATCH = 512  # tokens per llama.cpp decode call
SEED = 0
WEIGHT_STD = 0.1  # sharper attention than transformers' 0.02 init, so positions visibly move the logits


def check_length(ours: LongRope) -> int:
    """The window checked: L0 + BEYOND_ORIGINAL tokens, or the target when it is closer."""
    return min(ours.max_position_embeddings, ours.original_max_position_embeddings + BEYOND_ORIGINAL)


def cos_sin_tolerance(length: int) -> float:
    return COS_SIN_ULPS * (length - 1) * 2.0**-23


def ggml_cos_sin(rope: GgufRope, *, rope_theta: float, length: int) -> tuple[np.ndarray, np.ndarray]:
    """A STAND-IN FOR llama.cpp, used when it is not run: cos, sin [length, n_rot/2] as ggml's CPU rope builds its
    cache for positions 0..length-1 with ext_factor 0 and freq_scale 1 (ggml_rope_cache_init, rope_yarn):
    theta_scale = powf(base, -2/n_rot); theta starts at p and is multiplied by theta_scale per pair; pair i gets
    cos(theta / freq_factors[i]) * attn_factor, likewise sin; all in float32."""
    pairs = len(rope.freq_factors)
    f32 = np.float32
    theta_scale = f32(rope_theta) ** f32(-2.0 / (2 * pairs))
    freq_factors = np.asarray(rope.freq_factors, dtype=f32)
    theta = np.arange(length, dtype=f32)
    cos, sin = np.empty((length, pairs), dtype=f32), np.empty((length, pairs), dtype=f32)
    for i in range(pairs):
        angle = theta / freq_factors[i]
        cos[:, i], sin[:, i] = np.cos(angle) * f32(rope.attn_factor), np.sin(angle) * f32(rope.attn_factor)
        theta = theta * theta_scale
    return cos, sin


def llama_cpp_module():
    """llama-cpp-python, or None where it is not installed."""
    try:
        return importlib.import_module(PACKAGE)
    except ImportError:
        return None


def tiny_llama(ours: LongRope, *, seed: int = SEED):
    """A random 2-layer Llama (plain RoPE) of the factors' head_dim and rope_theta, float32, L0 positions."""
    from transformers import LlamaForCausalLM  # transformers: only when verifying

    from longrope.workers.random_llama import llama_config

    config = llama_config(
        hidden_size=2 * ours.head_dim,
        intermediate_size=4 * ours.head_dim,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=ours.head_dim,
        vocab_size=vocab_size(),
        max_position_embeddings=ours.original_max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": ours.rope_theta},
        initializer_range=WEIGHT_STD,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float().eval()


def llama_cpp_model(path: Path, n_ctx: int, **params):
    """llama.cpp's model and context for `path`, as llama-cpp-python makes them, with a float32 KV cache; the rope
    parameters are left to the GGUF (rope_freq_base / rope_freq_scale 0: from the model, no yarn)."""
    llama_cpp = importlib.import_module(PACKAGE)
    settings = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32, **params}
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, n_batch=BATCH, n_ubatch=BATCH, verbose=False, seed=SEED, **settings
    )


def llama_cpp_batches(llm, ids: list[int]):
    """(start, logits [n, vocab] float32) for each batch of `ids` decoded as one sequence from position 0: what
    `Llama.eval` does (llama-cpp-python 0.3.36, llama_cpp/llama.py), with every token's logits copied out per batch
    instead of into an n_ctx x vocab array."""
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    vocab = llm.n_vocab()
    for start in range(0, len(ids), BATCH):
        batch = ids[start : start + BATCH]
        llm._batch.set_batch(batch=batch, n_past=start, logits_all=True)
        llm._ctx.decode(llm._batch)
        yield start, np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(len(batch), vocab)).copy()


def llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    llm = llama_cpp_model(path, n_ctx=len(ids))
    try:
        return np.concatenate([logits for _, logits in llama_cpp_batches(llm, ids)])
    finally:
        llm.close()


def transformers_logits(model, factors: FactorsFile, ids: list[int], read_config) -> np.ndarray:
    """transformers' logits for `model`'s weights with the block in force: its config.json with the block written
    in as `export --into` writes it, read back by `read_config` (verify's: transformers reading it from disk),
    float32."""
    from transformers import LlamaForCausalLM  # transformers: only when verifying

    with quiet_transformers(), torch.no_grad():  # its note that the mscales (vLLM's keys) are not its own
        config = read_config(config_with_block(model.config.to_dict(), factors))
        scaled = LlamaForCausalLM(config).float().eval()
        scaled.load_state_dict(model.state_dict())
        return scaled(input_ids=torch.tensor([ids])).logits[0].float().numpy()


def logits_diff(factors: FactorsFile, ours: LongRope, length: int, read_config) -> tuple[float, float]:
    """(max |diff|, tolerance) of llama.cpp's logits on the exported tiny GGUF against transformers'."""
    model = tiny_llama(ours)
    ids = torch.randint(0, vocab_size(), (length,), generator=torch.Generator().manual_seed(SEED)).tolist()
    with tempfile.TemporaryDirectory(prefix="longrope-llama-cpp-") as folder:
        plain = write_llama_gguf(model, Path(folder) / "plain.gguf")
        write_gguf_export(factors, plain, Path(folder) / "factors.gguf")
        theirs = llama_cpp_logits(Path(folder) / "factors.gguf", ids)
    reference = transformers_logits(model, factors, ids, read_config)
    tolerance = LOGITS_RELATIVE_TOLERANCE * max(1.0, float(np.abs(reference).max()))
    return float(np.abs(theirs - reference).max()), tolerance


def package_source(module) -> str:
    with contextlib.suppress(PackageNotFoundError):
        return f"llama-cpp-python {version('llama_cpp_python')}"
    return f"llama-cpp-python {getattr(module, '__version__', '?')}"


class LlamaCppRow(BaseModel):
    """verify's llama.cpp row (its RuntimeCheck's fields but the runtime's name)."""

    model_config = ConfigDict(extra="forbid")

    source: str  # what was compared: llama-cpp-python's version, or the stand-in
    cos_sin_max_diff: dict[str, float]  # "long": ggml's formula against ours
    cos_sin_tolerance: float | None = None
    logits_max_diff: float | None = None
    logits_tolerance: float | None = None
    ok: bool


def llama_cpp_row(factors: FactorsFile, ours: LongRope, our_cos_sin, read_config, *, logits: bool) -> LlamaCppRow:
    """`our_cos_sin(length)` is ours for a window of `length` tokens, as (cos, sin) [length, pairs]; `read_config`
    turns a config.json dict into transformers' config. Factors no GGUF export can carry get a row that says why,
    and no verdict."""
    try:
        check_expressible(factors)
        if ours.rotary_dim != ours.head_dim:
            raise ExportError("partial rotary: llama.cpp's llama graph rotates the whole head (n_rot = head_dim)")
    except ExportError as exc:
        return LlamaCppRow(source=f"not exportable to a GGUF: {exc}", cos_sin_max_diff={}, ok=True)
    length = check_length(ours)
    stand_in = ggml_cos_sin(gguf_rope(factors), rope_theta=ours.rope_theta, length=length)
    mine = our_cos_sin(length)
    cos_sin = max(float(np.abs(stand_in[i] - mine[i].numpy()).max()) for i in (0, 1))
    tolerance = cos_sin_tolerance(length)
    row = LlamaCppRow(
        source=f"stand-in: ggml's rope formula at {length} tokens",
        cos_sin_max_diff={"long": cos_sin},
        cos_sin_tolerance=tolerance,
        ok=cos_sin <= tolerance,
    )
    module = llama_cpp_module() if logits else None
    if module is None:
        reason = "--no-logits" if not logits else "llama-cpp-python not installed"
        return row.model_copy(update={"source": f"{row.source} ({reason})"})
    diff, logits_tolerance = logits_diff(factors, ours, length, read_config)
    return row.model_copy(
        update={
            "source": f"{package_source(module)}: logits of a random 2-layer llama GGUF export at {length} tokens; "
            f"cos/sin by {row.source}",
            "logits_max_diff": diff,
            "logits_tolerance": logits_tolerance,
            "ok": row.ok and diff <= logits_tolerance and math.isfinite(diff),
        }
    )
