"""A llama or Gemma 3 GGUF file as a Hugging Face model directory: config.json, model.safetensors (dequantized to
float32), the tokenizer, and provenance.json saying where it came from.

Why a conversion and not transformers' own GGUF loading: a model transformers loads with `gguf_file=` refuses
`save_pretrained` ("quantized with gguf and is not serializable"), and every worker would dequantize the file
again. So the model is built from the GGUF's config (`AutoConfig.from_pretrained(dir, gguf_file=...)`) and given
the state dict transformers' `load_gguf_checkpoint` dequantizes (which also undoes llama.cpp's q/k row
permutation, `convert_hf_to_gguf.LlamaModel.permute`), then saved the ordinary way. A `.gguf` named as
`model.path` is converted once into a cache folder keyed by the file's sha256.

Gemma 3 (`general.architecture = gemma3`) goes the same way: transformers reads it as a text-only Gemma3TextConfig
(modeling_gguf_pytorch_utils.load_gguf_checkpoint renames the model type gemma3 to gemma3_text) and undoes
llama.cpp's `norm + 1` on every `*norm.weight` (`Gemma2TensorProcessor`, registered for gemma3 there), since
Gemma's RMSNorm multiplies by `1 + weight` (models/gemma3/modeling_gemma3.py, Gemma3RMSNorm) and llama.cpp stores
the sum (convert_hf_to_gguf.py, Gemma3Model.modify_tensors); Gemma's q/k rows are not permuted. What llama.cpp
fixes for gemma3 without a key (llama-model.cpp, load_hparams: 6-layer pattern, sliding layers at rope base 10000)
is what Gemma3TextConfig defaults to (`sliding_window_pattern` 6, `default_theta["local"]`); the keys llama.cpp
reads that transformers' mapping (integrations/ggml.py, GGUF_CONFIG_MAPPING["gemma3"]) drops are refused
(`gemma3_unmapped`), as RoPE scaling is for both architectures.

Needs the `gguf` extra (the `gguf` and `accelerate` packages); without it, one line says how to install it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from longrope.workers.atomic_files import umask_mode
from longrope.workers.errors import ModelLoadError, one_line

GGUF_MAGIC = b"GGUF"
PROVENANCE_FILE = "provenance.json"
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's per-pair frequency divisors (Llama 3.1's scaling, our GGUF export)
PLAIN_SCALING_TYPES = ("none", "linear")  # rope.scaling.type values under which ggml's angles are unscaled
# llama.cpp's architecture names whose GGUF transformers maps, with the model class it builds from it
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "gemma3": "Gemma3ForCausalLM"}
GEMMA3_SWA_BASE = 10000.0  # llama.cpp's and transformers' rope base of Gemma 3's sliding-window layers
GEMMA3_27B_LAYERS = 62  # llama.cpp scales 27B's attention by 1/sqrt(hidden / heads), the others by 1/sqrt(head_dim)
GEMMA3_QUERY_SCALAR = 256  # Gemma3TextConfig's query_pre_attn_scalar default, which a GGUF's config keeps
INSTALL_HINT = "pip install 'longrope-search[gguf]' (make install and make real-model include it)"


class ModelProvenance(BaseModel):
    """provenance.json: what a converted model directory was made from, so its numbers can be traced."""

    model_config = ConfigDict(extra="forbid")

    gguf_file: str
    gguf_sha256: str
    architecture: str
    dtype: str = "float32"
    package: str | None = None  # the PyPI package whose wheel held the GGUF (the first, when there are several)
    version: str | None = None
    wheel_sha256: str | None = None
    wheels: dict[str, str] | None = None  # every wheel the GGUF came from: "package==version" -> its sha256
    transformers_version: str
    gguf_version: str
    written_by: str


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def cache_root() -> Path:
    """Where downloads and conversions are kept: $LONGROPE_CACHE, else $XDG_CACHE_HOME/longrope, else
    ~/.cache/longrope."""
    if os.environ.get("LONGROPE_CACHE"):
        return Path(os.environ["LONGROPE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "longrope"


def require_gguf_extra(what: str) -> None:
    try:
        import accelerate  # noqa: F401  (only probed: transformers' GGUF loading uses it)
        import gguf  # noqa: F401
    except ImportError as exc:
        raise ModelLoadError(f"{what} needs the {exc.name!r} package: {INSTALL_HINT}") from exc


def open_gguf(path: Path, where: str):
    """A GGUFReader of the file, or one ModelLoadError naming `where` when it is not a whole GGUF file (wrong
    magic, truncated tensor data, unreadable metadata: GGUFReader maps every tensor when it opens)."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{where}: {str(path)!r} does not exist")
    with open(path, "rb") as stream:
        if stream.read(4) != GGUF_MAGIC:
            raise ModelLoadError(f"{where}: {str(path)!r} is not a GGUF file (it does not start with 'GGUF')")
    require_gguf_extra(where)
    import gguf  # the gguf extra, checked above

    try:
        return gguf.GGUFReader(path)
    except Exception as exc:  # gguf raises ValueError, IndexError, struct errors on a damaged file
        raise ModelLoadError(
            f"{where}: {str(path)!r} is not a readable GGUF file: truncated or damaged ({one_line(exc, 160)})"
        ) from exc


def field_value(reader, name: str, default=None):
    """A GGUF metadata value (`GGUFReader` field contents), or `default` when the key is absent."""
    field = reader.get_field(name)
    return default if field is None else field.contents()


def rope_scaling_found(reader, architecture: str) -> str | None:
    """What rescales the GGUF's RoPE beyond its plain frequencies (`rope_freqs.weight`, a rope.scaling type other
    than none/linear, a scaling factor or attention factor other than 1), in words, or None when it is plain.
    llama.cpp applies each of these (llama_model::load_hparams, get_rope_factors); transformers' GGUF loader maps
    none of them for llama (integrations/ggml.py has no rope.scaling keys for it, and load_gguf_checkpoint skips
    tensors it cannot name), so a converted model would silently read with plain RoPE."""
    if any(tensor.name == ROPE_FREQS for tensor in reader.tensors):
        return f"{ROPE_FREQS}, per-pair frequency factors as in Llama 3.1 or a `longrope export --gguf` file"
    scaling = field_value(reader, f"{architecture}.rope.scaling.type", "none")
    if scaling not in PLAIN_SCALING_TYPES:
        return f"{architecture}.rope.scaling.type = {scaling!r}"
    linear = field_value(reader, f"{architecture}.rope.scale_linear", 1.0)
    factor = field_value(reader, f"{architecture}.rope.scaling.factor", linear)
    if factor not in (0.0, 1.0):
        return f"{architecture}.rope.scaling.factor = {factor:g}"
    attention = field_value(reader, f"{architecture}.rope.scaling.attn_factor", 1.0)
    if attention != 1.0:
        return f"{architecture}.rope.scaling.attn_factor = {attention:g}"
    return None


def gemma3_unmapped(reader) -> str | None:
    """What in a gemma3 GGUF llama.cpp reads but transformers' GGUF loader does not map, in words, or None when
    both read the file alike. llama.cpp (llama-model.cpp, load_hparams, LLM_ARCH_GEMMA3) runs sliding-window layers
    only when `attention.sliding_window` is set, reads `final_logit_softcapping`, and scales attention by
    1/sqrt(head_dim) (1/sqrt(hidden / heads) for the 62-layer 27B); transformers (integrations/ggml.py,
    GGUF_CONFIG_MAPPING["gemma3"]) maps none of these, so its Gemma3TextConfig defaults (a 4096 window on 5 layers of
    6, no softcapping, query_pre_attn_scalar 256) would silently stand in. A `rope.freq_base_swa` other than the
    10000 both assume is refused the same way. Gemma 3 270M, 1B, 4B and 12B (head_dim 256) pass."""
    window = field_value(reader, "gemma3.attention.sliding_window", 0)
    if not window:
        return "no gemma3.attention.sliding_window: llama.cpp runs every layer with full attention"
    softcap = field_value(reader, "gemma3.final_logit_softcapping", 0.0)
    if softcap:
        return f"gemma3.final_logit_softcapping = {softcap:g}"
    swa_base = field_value(reader, "gemma3.rope.freq_base_swa", GEMMA3_SWA_BASE)
    if swa_base != GEMMA3_SWA_BASE:
        return f"gemma3.rope.freq_base_swa = {swa_base:g}"
    hidden, heads = field_value(reader, "gemma3.embedding_length"), field_value(reader, "gemma3.attention.head_count")
    head_dim = field_value(reader, "gemma3.attention.key_length", hidden // heads)
    scalar = hidden // heads if field_value(reader, "gemma3.block_count") == GEMMA3_27B_LAYERS else head_dim
    if scalar != GEMMA3_QUERY_SCALAR:
        return f"an attention scale of 1/sqrt({scalar}) (transformers' query_pre_attn_scalar is {GEMMA3_QUERY_SCALAR})"
    return None


def check_gguf(path: Path, where: str) -> str:
    """A GGUF whose weights transformers dequantizes into a model (GGUF_ARCHITECTURES) with the same RoPE and
    attention llama.cpp gives it; returns its architecture."""
    reader = open_gguf(path, where)
    architecture = field_value(reader, "general.architecture")
    if architecture is None:
        raise ModelLoadError(f"{where}: {str(path)!r} has no general.architecture key")
    if architecture not in GGUF_ARCHITECTURES:
        names = ", ".join(GGUF_ARCHITECTURES)
        raise ModelLoadError(
            f"{where}: {str(path)!r} is a {architecture!r} GGUF; only {' and '.join(GGUF_ARCHITECTURES)} GGUF files "
            f"are read (general.architecture = {names})"
        )
    scaling = rope_scaling_found(reader, architecture)
    if scaling is not None:
        raise ModelLoadError(
            f"{where}: {str(path)!r} carries RoPE scaling ({scaling}), which transformers' GGUF loader drops: "
            "the converted model would read with plain RoPE, not as llama.cpp runs this file; give the GGUF of "
            "the model with plain RoPE (the one the factors are to be searched for)"
        )
    unmapped = gemma3_unmapped(reader) if architecture == "gemma3" else None
    if unmapped is not None:
        raise ModelLoadError(
            f"{where}: {str(path)!r} has {unmapped}, which transformers' GGUF loader does not map: the converted "
            "model would not run as llama.cpp runs this file"
        )
    return str(architecture)


def convert_gguf(path: Path, out_dir: Path, *, where: str, package: dict | None = None) -> ModelProvenance:
    """Write `out_dir` (which must not exist) as a Hugging Face directory of the GGUF's model. Built in a temp
    folder beside it and renamed into place, so a failure leaves no half-written directory."""
    path, out_dir = Path(path), Path(out_dir)
    architecture = check_gguf(path, where)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with staged_folder(out_dir) as staging:
        provenance = _write_hf_directory(path, staging, architecture, package or {})
        (staging / PROVENANCE_FILE).write_text(provenance.model_dump_json(indent=2) + "\n")
    return provenance


@contextlib.contextmanager
def staged_folder(out_dir: Path) -> Iterator[Path]:
    """A temp folder beside `out_dir` to build it in: renamed into place when the block ends (`publish_folder`),
    removed when it raises, so a failure leaves no half-written folder."""
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        yield staging
        publish_folder(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def publish_folder(staging: Path, out_dir: Path) -> None:
    """Rename a finished staging folder into place, with the modes a plain mkdir and open would give (mkdtemp
    makes it 0700, and some writers make files 0600)."""
    file_mode = umask_mode()
    for path in staging.rglob("*"):
        path.chmod(file_mode | (file_mode >> 2 & 0o111) if path.is_dir() else file_mode)
    staging.chmod(file_mode | (file_mode >> 2 & 0o111))
    os.replace(staging, out_dir)


def _write_hf_directory(path: Path, out: Path, architecture: str, package: dict) -> ModelProvenance:
    import gguf  # the gguf extra (checked by check_gguf)
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_config(config)
        if type(model).__name__ != GGUF_ARCHITECTURES[architecture]:
            raise ValueError(f"it builds a {type(model).__name__}, not a {GGUF_ARCHITECTURES[architecture]}")
        tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:  # transformers' GGUF support raises many types for a file it cannot map
        raise ModelLoadError(f"model file: transformers cannot read {str(path)!r} ({one_line(exc, 200)})") from exc
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ModelLoadError(
            f"model file: {str(path)!r} does not match its config: missing {sorted(set(missing) - tied)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}"
        )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return ModelProvenance(
        gguf_file=path.name,
        gguf_sha256=sha256_file(path),
        architecture=architecture,
        transformers_version=transformers.__version__,
        gguf_version=_package_version("gguf", gguf),
        written_by="longrope (workers/gguf_model.py)",
        **package,
    )


def _package_version(name: str, module) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return getattr(module, "__version__", "unknown")


def gguf_model_dir(path: Path, where: str = "model.path") -> Path:
    """The Hugging Face directory of a `.gguf` file, converted on first use into cache_root()/gguf/<sha256>/."""
    path = Path(path)
    check_gguf(path, where)
    out = cache_root() / "gguf" / sha256_file(path)[:24]
    if (out / PROVENANCE_FILE).is_file():
        return out
    try:
        convert_gguf(path, out, where=where)
    except OSError:
        if (out / PROVENANCE_FILE).is_file():
            return out  # another job on the same file finished the same conversion first: its folder serves both
        if not out.is_dir():
            raise
        # a folder without provenance.json is no conversion of ours (conversions appear whole, by rename): only
        # now, with no finished one to delete, is it replaced
        shutil.rmtree(out)
        convert_gguf(path, out, where=where)
    return out
