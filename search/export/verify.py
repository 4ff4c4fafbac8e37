"""`longrope verify FACTORS.json --model DIR`: do transformers, vLLM and llama.cpp apply an exported block as we
scored it?

Four formulations of the same block are compared on the model's own shape:
- ours: the block read with `encodings.from_hf`, its cos/sin from the encodings (`RopeMethod.cos_sin`, the one
  place positional-encoding math lives), the call the scorer's rotary module makes for every candidate it scores
  (workers/rope_patch.py); the logits check below runs the scorer's module itself;
- transformers: the model's own rotary class, built by plain transformers from a temporary copy of the model's
  config.json with the block in force (`export.config_with_block`), at a short prompt (L0 positions: short
  factors) and at the target length (long factors), since transformers switches on `max(position_ids) + 1 > L0`;
  and, unless `--no-logits`, the model's logits with each rotary module in place, on one window of random token
  ids at the target length, at its last LOGITS_POSITIONS positions (`logits_to_keep`): each attends to every
  earlier one, so a rotary difference anywhere in the window reaches them, while the whole [T, vocab] logits of
  Gemma 3 (262,144 tokens) at 64k would take 64 GiB;
- vLLM: its `get_rope(...)` tables when vLLM is importable. Otherwise a stand-in for vLLM: its tables rebuilt
  from the keys vLLM 0.33 reads, by a copy of the formula of its `Phi3LongRoPEScaledRotaryEmbedding`
  (`vllm_stand_in_tables`; short table: L0 rows of short factors x short_mscale; long table:
  max_position_embeddings rows of long factors x long_mscale; either mscale defaults to sqrt(1 + ln(P / L0) /
  ln L0)), and the line says so. That copy is vLLM's side only, never ours: it is what would catch our
  encodings departing from vLLM, so it must not share their code.
- llama.cpp: its logits on a random llama GGUF exported with the factors (`export --gguf`) against transformers',
  when llama-cpp-python is importable; else ggml's cos/sin rebuilt from the exported values (llama_cpp_row.py, which
  also gives its tolerances and why they differ from these).
cos/sin match within 1e-5 (float32), logits within 1e-3 x max |logit| (the same weights, the same kernels).
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
from pathlib import Path
from types import SimpleNamespace

from pydantic import BaseModel

from longrope.encodings import LongRope, from_hf
from longrope.encodings.lazy_import import torch
from longrope.search.config.factors_file import FactorsFile
from longrope.search.export.factors_export import check_same_shape, config_with_block
from longrope.search.export.gguf_export import ARCHITECTURE_REFUSALS
from longrope.search.export.llama_cpp_row import LlamaCppRow, llama_cpp_row
from longrope.workers.families import Family, decoder_of, family_of
from longrope.workers.models import check_weights, load_model, model_rope, read_model_config

COS_SIN_TOLERANCE = 1e-5
# the model types whose GGUF export llama.cpp runs with the graph the export writes (its `llama` architecture)
GGUF_MODEL_TYPES = ("llama",)
LOGITS_RELATIVE_TOLERANCE = 1e-3
LOGITS_SEED = 0
LOGITS_POSITIONS = 256  # the window's last positions whose logits are compared (the module docstring says why)


class RuntimeCheck(BaseModel):
    """One runtime's agreement with our scorer: the largest |difference| of cos and sin per regime, and of the
    logits (None when not checked)."""

    runtime: str
    source: str  # what was compared: the installed library, or a formula rebuilt from its source
    cos_sin_max_diff: dict[str, float]  # regime ("short", "long") -> max |diff| over cos and sin
    logits_max_diff: float | None = None
    logits_tolerance: float | None = None
    cos_sin_tolerance: float | None = None  # None: COS_SIN_TOLERANCE
    ok: bool

    def line(self) -> str:
        if not self.cos_sin_max_diff and self.logits_max_diff is None:  # nothing compared: the source says why
            return f"{self.runtime}: {self.source}"
        regimes = ", ".join(f"{regime} {diff:.1e}" for regime, diff in self.cos_sin_max_diff.items())
        text = f"{self.runtime} ({self.source}): cos/sin max |diff| {regimes}"
        if self.cos_sin_tolerance is not None:
            text += f" (tolerance {self.cos_sin_tolerance:.1e})"
        if self.logits_max_diff is not None:
            text += f"; logits max |diff| {self.logits_max_diff:.1e} (tolerance {self.logits_tolerance:.1e})"
        return f"{text}: {'match' if self.ok else 'MISMATCH'}"


class VerifyReport(BaseModel):
    factors: str
    model: str
    original_length: int
    target_length: int
    checks: list[RuntimeCheck]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


def verify(
    factors: FactorsFile, factors_path: str, model_dir: Path, *, logits: bool = True, device: str = "cpu"
) -> VerifyReport:
    config = read_model_config(model_dir)
    check_same_shape(factors, model_rope(config), f"--model {str(model_dir)!r}")
    if logits:
        check_weights(model_dir)  # a truncated checkpoint: one line now, not after the cos/sin checks have run
    hf_config = transformers_config(config_with_block(config, factors))
    ours = our_method(factors, hf_config)
    regimes = {"short": ours.original_max_position_embeddings, "long": factors.max_position_embeddings}
    family = family_of(config)
    their_rotary = transformers_rotary(hf_config, family)
    mine = {regime: our_cos_sin(ours, length) for regime, length in regimes.items()}
    theirs = {regime: module_cos_sin(their_rotary, length, family) for regime, length in regimes.items()}
    transformers_check = compare_cos_sin("transformers", transformers_source(), mine, theirs)
    if logits:
        transformers_check = with_logits(transformers_check, model_dir, ours, their_rotary, regimes["long"], device)
    vllm_tables, source = vllm_cos_sin(factors, ours)
    vllm_check = compare_cos_sin("vllm", source, {r: half(mine[r]) for r in regimes}, vllm_tables)
    row = (
        llama_cpp_row(factors, ours, lambda length: half(our_cos_sin(ours, length)), transformers_config, logits=logits)
        if config.get("model_type") in GGUF_MODEL_TYPES
        else no_gguf_row(config.get("model_type"))
    )
    llama_cpp = RuntimeCheck(runtime="llama.cpp", **row.model_dump())
    return VerifyReport(
        factors=factors_path,
        model=str(model_dir),
        original_length=ours.original_max_position_embeddings,
        target_length=factors.max_position_embeddings,
        checks=[transformers_check, vllm_check, llama_cpp],
    )


def transformers_config(config: dict):
    """The config as plain transformers reads it from disk: written to a temporary directory and loaded with
    `AutoConfig.from_pretrained`, so its own rope validation and key handling apply."""
    from transformers import AutoConfig  # transformers: only when verifying

    with tempfile.TemporaryDirectory(prefix="longrope-verify-") as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        return AutoConfig.from_pretrained(folder, local_files_only=True)


def transformers_source() -> str:
    import transformers  # transformers: only when verifying

    return f"transformers {transformers.__version__}"


def our_method(factors: FactorsFile, hf_config) -> LongRope:
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    return from_hf(
        factors.rope_parameters.model_dump(exclude_none=True),
        head_dim=head_dim,
        max_position_embeddings=factors.max_position_embeddings,
    )


def transformers_rotary(hf_config, family: Family):
    """The model's own rotary class, as transformers builds it for this config (the model skeleton on the meta
    device finds the class without allocating weights; the rotary module itself is built on the CPU), where the
    family keeps it (`model.model`, GPT-NeoX's `model.gpt_neox`)."""
    from transformers import AutoModelForCausalLM  # transformers: only when verifying

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_config)
    return type(getattr(skeleton, family.decoder).rotary_emb)(config=hf_config)


def no_gguf_row(model_type: str | None) -> LlamaCppRow:
    """llama.cpp's row for a family the GGUF export does not write: it writes llama.cpp's `llama` graph, and another
    family's graph (Gemma 3's local and global layers, Cohere's interleaved rotation) reads other keys and tensors."""
    reason = (
        f"not exportable to a GGUF: the GGUF export writes llama.cpp's llama graph, and model_type {model_type!r} "
        "runs its own graph there, which the export does not write"
    )
    architecture = GGUF_ARCHITECTURES.get(model_type or "")
    if architecture in ARCHITECTURE_REFUSALS:
        reason = f"not exportable to a GGUF: {ARCHITECTURE_REFUSALS[architecture]}"
    return LlamaCppRow(source=reason, cos_sin_max_diff={}, ok=True)


# a model_type's llama.cpp architecture, where it has its own refusal (`gguf_export.ARCHITECTURE_REFUSALS`)
GGUF_ARCHITECTURES = {"gemma3_text": "gemma3", "gemma3": "gemma3"}


def positions(length: int):
    return torch.arange(length, dtype=torch.long)[None]


def module_cos_sin(rotary, length: int, family: Family):
    """cos, sin [1, length, rotary_dim] (rotate_half layout) of a transformers-style rotary module, float32: for
    the searched layer type of a per-layer-type module (Gemma 3's `full_attention`), and an interleaved family's
    tables (Cohere's, each frequency twice in place) put in rotate_half order, as ours are."""
    dummy = torch.zeros(1, dtype=torch.float32)
    layer_type = () if family.searched_layer_type is None else (family.searched_layer_type,)
    with torch.no_grad():
        cos, sin = rotary(dummy, positions(length), *layer_type)
    if family.layout == "interleaved":
        cos, sin = (torch.cat((table[..., ::2], table[..., ::2]), dim=-1) for table in (cos, sin))
    return cos.float(), sin.float()


def our_cos_sin(method: LongRope, length: int):
    """cos, sin [1, length, rotary_dim] (rotate_half layout, float32) for a window of `length` tokens, from the
    encodings: the frequencies in force at `length` (short factors up to L0, long past it), times the attention
    factor, the first n_hat positions on the original frequencies. The scorer's rotary module makes this call
    for each candidate (`rotary_cos_sin` over `candidate_rows`, workers/rope_patch.py)."""
    with torch.no_grad():
        cos, sin = method.cos_sin(positions(length), seq_len=length)
    return cos.float(), sin.float()


def half(cos_sin):
    """The first half of rotate_half cos/sin: one column per frequency, as vLLM stores its tables."""
    cos, sin = cos_sin
    pairs = cos.shape[-1] // 2
    return cos[0, :, :pairs], sin[0, :, :pairs]


def max_diff(a, b) -> float:
    a = (a[0].reshape(-1, a[0].shape[-1]), a[1].reshape(-1, a[1].shape[-1]))
    b = (b[0].reshape(-1, b[0].shape[-1]), b[1].reshape(-1, b[1].shape[-1]))
    if a[0].shape != b[0].shape:
        return math.inf
    return max(float((a[i] - b[i]).abs().max()) for i in (0, 1))


def compare_cos_sin(runtime: str, source: str, mine: dict, theirs: dict) -> RuntimeCheck:
    diffs = {regime: max_diff(mine[regime], theirs[regime]) for regime in mine}
    return RuntimeCheck(
        runtime=runtime,
        source=source,
        cos_sin_max_diff=diffs,
        ok=all(diff < COS_SIN_TOLERANCE for diff in diffs.values()),
    )


def with_logits(
    check: RuntimeCheck, model_dir: Path, ours: LongRope, their_rotary, length: int, device: str
) -> RuntimeCheck:
    """The model's logits at the last LOGITS_POSITIONS positions of one window of random ids at `length`, with
    transformers' rotary module for the block and with the scorer's, on the same weights (loaded once, float32,
    on `device`)."""
    from longrope.workers.rope_patch import patched_rotary  # torch: only for the logits check

    model, rope = load_model(model_dir, device=device, dtype="float32")
    generator = torch.Generator().manual_seed(LOGITS_SEED)
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=generator).to(model.device)
    their_rotary = their_rotary.to(model.device)
    with torch.no_grad(), patched_rotary(model, rope.method.original_inv_freq()) as patched:
        patched.set_candidates([ours], seq_len=length)
        mine = model(input_ids=ids, logits_to_keep=LOGITS_POSITIONS).logits.float()
    decoder_of(model).rotary_emb = their_rotary
    with torch.no_grad():
        theirs = model(input_ids=ids, logits_to_keep=LOGITS_POSITIONS).logits.float()
    diff = float((mine - theirs).abs().max())
    tolerance = LOGITS_RELATIVE_TOLERANCE * max(1.0, float(theirs.abs().max()))
    return check.model_copy(
        update={"logits_max_diff": diff, "logits_tolerance": tolerance, "ok": check.ok and diff <= tolerance}
    )


def vllm_cos_sin(factors: FactorsFile, ours: LongRope) -> tuple[dict, str]:
    """vLLM's short and long cos/sin tables for the block: from vLLM itself when importable, else rebuilt."""
    block = factors.rope_parameters.model_dump(exclude_none=True)
    try:
        import vllm  # optional: where vLLM is installed (it needs a CUDA torch)
        from vllm.model_executor.layers.rotary_embedding import get_rope
    except ImportError:
        return vllm_stand_in_tables(block, ours.rotary_dim, factors.max_position_embeddings), (
            "vllm not installed: stand-in tables from the keys vLLM 0.33 reads, by a copy of its Phi3LongRoPE formula"
        )
    with vllm_engine_config(factors.max_position_embeddings):
        rope = get_rope(
            ours.head_dim,
            factors.max_position_embeddings,
            is_neox_style=True,
            rope_parameters=block,  # partial_rotary_factor, when not 1, is in the block as vLLM reads it
            dtype=torch.float32,
        )
    cache = rope.long_short_cos_sin_cache.float()
    short, long = cache[: ours.original_max_position_embeddings], cache[ours.original_max_position_embeddings :]
    return {"short": short.chunk(2, dim=-1), "long": long.chunk(2, dim=-1)}, f"vllm {vllm.__version__} get_rope"


@contextlib.contextmanager
def vllm_engine_config(max_model_len: int):
    """vLLM's LongRoPE module reads `max_model_len` from the engine config in force to pick its regime; verify
    has no engine, so the module sees one with max_model_len = the target. Both tables are built either way."""
    from vllm.model_executor.layers.rotary_embedding import phi3_long_rope_scaled_rope as module  # vLLM: optional

    original = module.get_current_vllm_config
    module.get_current_vllm_config = lambda: SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len))
    try:
        yield
    finally:
        module.get_current_vllm_config = original


def vllm_stand_in_tables(block: dict, rotary_dim: int, max_position: int) -> dict:
    """A STAND-IN FOR vLLM, used only when vLLM is not importable: a copy of the formula of vLLM 0.33's
    `Phi3LongRoPEScaledRotaryEmbedding` (vllm/model_executor/layers/rotary_embedding/phi3_long_rope_scaled_rope.py),
    deliberately not our encodings' code, building its caches from the keys it reads (and nothing else):
    inv_freq = 1 / (factor_i * base ** (2i / rotary_dim)); table[t] = (cos, sin)(t * inv_freq) * mscale; the
    short table has L0 rows (short factors, short_mscale), the long one max_position rows (long factors,
    long_mscale); each mscale defaults to sqrt(1 + ln(max_position / L0) / ln L0), 1 when the ratio <= 1."""
    original = block["original_max_position_embeddings"]
    ratio = max_position / original
    default = 1.0 if ratio <= 1.0 else math.sqrt(1 + math.log(ratio) / math.log(original))
    base = block.get("rope_theta", 10000)

    def table(rows: int, factors: list[float], mscale: float):
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim
        inv_freq = 1.0 / (torch.tensor(factors, dtype=torch.float32) * base**exponents)
        freqs = torch.einsum("i,j -> ij", torch.arange(rows, dtype=torch.float), inv_freq)
        return freqs.cos() * mscale, freqs.sin() * mscale

    return {
        "short": table(original, block["short_factor"], block.get("short_mscale", default)),
        "long": table(max_position, block["long_factor"], block.get("long_mscale", default)),
    }
