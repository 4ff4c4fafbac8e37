"""bfloat16 against float32: does a bfloat16 worker rank candidates as a float32 one does?

The search keeps the candidate with the lowest mean NLL, so what bfloat16 must keep is the order, not the value.
Each part scores one candidate set (benchlib.ranking_candidates: PI, NTK-aware and YaRN at the scale, power curves,
and near ties, children of YaRN's factors as close as a converging GA's) with the project's Scorer in float32 and
in bfloat16, and compares them (bench/rank_agreement.py: Kendall's tau, the best and best 5 the same, the
largest NLL difference and the spread of the differences about their median, which is what can reorder).

To find where a disagreement comes from, bfloat16 is also scored with one suspected cause removed at a time:
- `rotation32`: q and k rotated in float32 with float32 cos/sin, then cast back (transformers'
  `apply_rotary_pos_emb` wrapped): removes the cast of cos/sin to bfloat16 and the rotation's rounding;
- `logits32`: the lm_head run in float32 on the bfloat16 hidden state (the scorer's `chunk_losses` wrapped):
  removes the rounding of the logits to bfloat16 before the float32 log-softmax.
Angles (position x inv_freq) are float32 in both dtypes (encodings/rotary.py `rotary_cos_sin`, as transformers and
vLLM compute them) and the NLL is summed in float64, so neither can reorder one dtype against the other.

Parts:
1. `reference`: the shipped reference model as configs/demo.yaml reads it: 128 -> 1024 tokens, the 8 search
   windows of the embedded corpus, 24 near ties; 2 torch threads.
2. `wide`: a random-weight Llama at Llama-3-8B width (d_model 4096, 32 heads x 128, 8 key/value heads, MLP 14336,
   32k vocabulary) with one layer, its weights x 2 so that positions visibly matter, pre-trained length 2048,
   read at 8192 tokens (scale 4): one window of random tokens, 6 near ties.

Run: .venv/bin/python bench/bf16_ranking.py [--parts reference wide] [--out bench/results/bf16_ranking.json]
(about 4 min for `reference`, 15 for `wide` on 2 cores).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers.models.llama.modeling_llama as modeling_llama
from benchlib import RESULTS, ROOT, provenance, ranking_candidates, save_json
from rank_agreement import rank_agreement

import longrope.workers.scorer as scorer_module
from longrope.search.job.job_context import JobContext
from longrope.search.optimizers.factory import load_job_config
from longrope.workers.models import load_model, model_rope, read_model_config
from longrope.workers.random_llama import llama_config, save_random_llama
from longrope.workers.scorer import Scorer

OUT = RESULTS / "bf16_ranking.json"
THREADS = 2
VARIANTS = ("bfloat16", "rotation32", "logits32")


@contextmanager
def variant(name: str) -> Iterator[None]:
    """The scoring code with one cause of bfloat16 disagreement removed (`bfloat16`, `float32`: as it is)."""
    rotate, chunk_losses = modeling_llama.apply_rotary_pos_emb, scorer_module.chunk_losses

    def rotation32(q, k, cos, sin, unsqueeze_dim=1):
        q32, k32 = rotate(q.float(), k.float(), cos.float(), sin.float(), unsqueeze_dim)
        return q32.to(q.dtype), k32.to(k.dtype)

    def logits32(hidden, targets, lm_head, transform, count_misses):
        weight = lm_head.weight.float()
        return chunk_losses(hidden.float(), targets, lambda h: F.linear(h, weight), transform, count_misses)

    if name == "rotation32":
        modeling_llama.apply_rotary_pos_emb = rotation32
    if name == "logits32":
        scorer_module.chunk_losses = logits32
    try:
        yield
    finally:
        modeling_llama.apply_rotary_pos_emb, scorer_module.chunk_losses = rotate, chunk_losses


def mean_nll(model_dir: Path, windows: np.ndarray, candidates: dict, dtype: str, name: str) -> tuple[list, float]:
    """Mean NLL per token of each candidate (the search's fitness), and the seconds the scoring took."""
    model, rope = load_model(model_dir, device="cpu", dtype=dtype)
    scorer = Scorer(model, torch.from_numpy(windows), rope.method.original_inv_freq(), candidates_per_forward=2)
    with variant(name), torch.inference_mode():
        started = time.perf_counter()
        scores = scorer.score(list(candidates.values()))
        seconds = time.perf_counter() - started
    return [s.mean_nll for s in scores], seconds


def compare(model_dir: Path, windows: np.ndarray, target: int, near_ties: int, variants) -> dict:
    rope = model_rope(read_model_config(model_dir))
    candidates = ranking_candidates(rope, target, near_ties)
    reference, seconds = mean_nll(model_dir, windows, candidates, "float32", "float32")
    print(f"  float32: {len(candidates)} candidates in {seconds:.0f} s", flush=True)
    result = {"candidates": list(candidates), "float32": {"mean_nll": reference, "seconds": seconds}}
    for name in variants:
        scores, seconds = mean_nll(model_dir, windows, candidates, "bfloat16", name)
        agreement = rank_agreement(reference, scores).as_dict()
        result[name] = {"mean_nll": scores, "seconds": seconds, **agreement}
        print(
            f"  {name:10s}: tau {agreement['kendall_tau']:.3f}, best the same {agreement['best_same']}, best 5 "
            f"{agreement['best_k_same']}, max |dNLL| {agreement['max_abs_difference']:.5f}, spread "
            f"{agreement['difference_spread']:.5f} (median gap of float32 scores {agreement['reference_gap']:.5f})",
            flush=True,
        )
    return result


def reference_part() -> dict:
    with tempfile.TemporaryDirectory() as work:
        config = load_job_config(ROOT / "configs" / "demo.yaml", [f"output_dir={work}"])
        context = JobContext.resolve(config)
        windows = context.windows(config.data.search_source, config.target_length, config.data.search_windows)
        print(f"reference: {len(windows.tokens)} windows of {config.target_length} tokens", flush=True)
        result = compare(context.model_dir, windows.tokens, config.target_length, 24, VARIANTS)
    return {"model": "reference (configs/demo.yaml)", "tokens": config.target_length, "windows": 8, **result}


def wide_part() -> dict:
    shape = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=1, num_attention_heads=32)
    shape |= dict(num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=2048)
    target = 8192
    with tempfile.TemporaryDirectory() as folder:
        save_random_llama(Path(folder), llama_config(**shape), weight_scale=2.0)
        windows = np.random.default_rng(0).integers(0, shape["vocab_size"], size=(1, target + 1))
        print(f"wide: d_model 4096, 1 layer, 1 window of {target} tokens", flush=True)
        result = compare(Path(folder), windows, target, 6, ("bfloat16", "rotation32"))
    return {"model": "random Llama, Llama-3-8B width, 1 layer, weights x 2", "shape": shape, "tokens": target,
            "windows": 1, **result}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=["reference", "wide"], default=["reference", "wide"])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    parts = {"reference": reference_part, "wide": wide_part}
    result = {**provenance(), "torch_threads": THREADS}
    result |= {name: parts[name]() for name in args.parts}
    save_json(args.out, result)


if __name__ == "__main__":
    main()
