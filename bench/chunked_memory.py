"""Peak tensor memory of a SmolLM2-135M-shaped model's forward and gradient pass through the scorer at 16k and 32k
tokens: each layer's MLP in chunks (the scorer's default, and a smaller chunk) against unchunked, side by side in one
run, with the ratios, and beside what `longrope estimate` prices for the same shapes.

Why a SmolLM2-shaped model with random weights: memory depends on the shapes alone (SmolLM2-135M's config.json,
search/cost/architecture.py KNOWN_MODELS), so no download is needed, and its MLP (3 x 1536 a position) against its
width (576) is the ratio that makes the MLP most of a layer's activations, as in Llama-3-8B (3 x 14336 against
4096). Memory is counted as the peak bytes of live tensors (bench/scoring.py `PeakTensorMemory`, close to what a
GPU's max_memory_allocated reports, and deterministic), float32, one window a forward.

  .venv/bin/python bench/chunked_memory.py                 # 16k and 32k: about 40 minutes on 2 cores
  .venv/bin/python bench/chunked_memory.py --lengths 512 --layers 2 --small-chunk 128   # the same code, tiny

saves bench/results/chunked_memory.json (the run with every length, with --lengths the file named for them).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from benchlib import RESULTS, provenance, save_json
from scoring import peak_tensor_mib

from longrope.encodings import LongRope
from longrope.search.cost.architecture import KNOWN_MODELS, Architecture
from longrope.search.cost.memory import ForwardShape, gradient_memory, worker_memory
from longrope.workers.models import load_model
from longrope.workers.random_llama import llama_config, save_random_llama
from longrope.workers.scorer import Scorer
from longrope.workers.sequence_chunks import DEFAULT_MLP_CHUNK_TOKENS

SMOLLM2 = KNOWN_MODELS["SmolLM2-135M"]
SMALL_CHUNK = 4096


def smollm2_shaped(folder: Path, layers: int) -> Path:
    """SmolLM2-135M's shapes (its `layers` first layers), random weights, float32."""
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")
    config = llama_config(
        **{key: SMOLLM2[key] for key in keys},
        num_hidden_layers=layers,
        max_position_embeddings=SMOLLM2["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": SMOLLM2["rope_theta"]},
        tie_word_embeddings=True,
    )
    return save_random_llama(folder, config)


def measure(model, rope, length: int, chunk: int | None) -> dict[str, float]:
    """Peak MiB of one window's forward (`score`) and gradient pass (`score_with_gradient`) at `length`."""
    windows = torch.randint(0, SMOLLM2["vocab_size"], (1, length + 1), generator=torch.Generator().manual_seed(0))
    scorer = Scorer(model, windows, rope.method.original_inv_freq(), mlp_chunk_tokens=chunk, checkpoints="device")
    pairs = rope.rotary_dim // 2
    original = SMOLLM2["max_position_embeddings"]
    method = LongRope.from_factors(
        [1.0 + 2.0 * i / (pairs - 1) for i in range(pairs)],
        head_dim=rope.head_dim,
        original_length=original,
        target_length=max(length, 2 * original),
        rope_theta=rope.rope_theta,
    )
    method = method.model_copy(update={"original_max_position_embeddings": min(original, length - 1)})
    return {
        "forward_mib": peak_tensor_mib(lambda: scorer.score([method])),
        "gradient_mib": peak_tensor_mib(lambda: scorer.score_with_gradient(method)),
    }


def estimated(arch: Architecture, length: int, chunk: int | None) -> dict[str, float]:
    """The estimate's forward and gradient peaks for the same shape, less the weights (which the tensor count, made
    after the load, does not see)."""
    shape, tokens = ForwardShape(tokens=length, rows=1), chunk or 2**62
    forward = worker_memory(arch, shape, "float32", "sdpa", tokens)
    gradient = gradient_memory(arch, shape, "float32", "sdpa", tokens)
    mib = 2**20
    return {
        "forward_mib": (forward.peak - forward.weights) / mib,
        "gradient_mib": (gradient.peak - gradient.weights) / mib,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="16384,32768", help="window lengths, comma-separated")
    parser.add_argument("--layers", type=int, default=SMOLLM2["num_hidden_layers"])
    parser.add_argument("--small-chunk", type=int, default=SMALL_CHUNK, help="the smaller chunk, in tokens")
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    chunks = {
        "unchunked": None,
        "default chunk": DEFAULT_MLP_CHUNK_TOKENS,
        f"chunk {args.small_chunk}": args.small_chunk,
    }
    rows = []
    with tempfile.TemporaryDirectory() as folder:  # the weights may be memory-mapped from it: kept to the end
        model, rope = load_model(smollm2_shaped(Path(folder), args.layers), device="cpu", dtype="float32")
        arch = Architecture.from_hf_config({**model.config.to_dict(), "num_hidden_layers": args.layers})
        for length in lengths:
            for name, chunk in chunks.items():
                measured = measure(model, rope, length, chunk)
                row = {"length": length, "mlp": name, "measured": measured, "estimated": estimated(arch, length, chunk)}
                rows.append(row)
                print(f"{length} {name}: {measured}", flush=True)
    for row in rows:
        base = next(r for r in rows if r["length"] == row["length"] and r["mlp"] == "unchunked")["measured"]
        row["ratio_to_unchunked"] = {key: row["measured"][key] / base[key] for key in base}
    name = (
        "chunked_memory.json" if args.lengths == "16384,32768" else f"chunked_memory_{'_'.join(map(str, lengths))}.json"
    )
    save_json(Path(args.results) / name, {**provenance(), "layers": args.layers, "rows": rows})
    for row in rows:
        forward, gradient = row["ratio_to_unchunked"]["forward_mib"], row["ratio_to_unchunked"]["gradient_mib"]
        print(f"{row['length']:>6} {row['mlp']:>14}: forward x{forward:.3f}, gradient x{gradient:.3f}")


if __name__ == "__main__":
    main()
