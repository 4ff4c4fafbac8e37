"""`longrope estimate --gpu cpu` against real scoring on this CPU: estimated and measured seconds per candidate.

Cases: the reference model as configs/demo.yaml scores it (1024 tokens, 8 windows, 2 candidates a call), and a
random-weight Llama (d_model 1024, 2 layers, 8 heads x 128, 4 key/value heads, MLP 2816, 32k vocabulary) with
one candidate on one window of 2048, 4096 and 8192 tokens. Each round measures the estimate's CPU rates at the
case's shapes (search/estimate_cpu.py: micro-benchmarks, nothing fitted to the scorer) and then really scores a
batch with the project's Scorer (float32); the two alternate so the shared machine's load hits both alike. The
ratio printed is estimated / measured per round, its median over the rounds. Target: within 25% (0.75-1.25).

Run: .venv/bin/python bench/estimate_accuracy.py [--rounds 2] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from scoring import candidate_set  # bench/scoring.py: the same candidates the scoring bench times

from longrope.search.estimate import (
    Architecture,
    forward_shape,
    resolve_original_length,
    search_budget,
    seconds,
    stage_estimates,
    worker_dtype,
)
from longrope.search.estimate_cpu import measure_cpu_rates
from longrope.search.job_config import JobConfig, load_job_config
from longrope.workers.models import load_model, read_model_config
from longrope.workers.reference_recipe import reference_model_dir
from longrope.workers.scorer import Scorer

ROOT = Path(__file__).resolve().parent.parent


def random_llama(out: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    return out


class Case:
    """One model and job config: estimate with freshly measured rates, then score for real."""

    def __init__(self, name: str, model_dir: Path, config: JobConfig):
        self.name, self.config = name, config
        self.arch = Architecture.from_hf_config(read_model_config(model_dir), name=name)
        self.original = resolve_original_length(config, self.arch)
        stage = search_budget(config, self.original).stages[-1]
        self.dtype = worker_dtype(config, "cpu")
        self.shape = forward_shape(config, stage.length, stage.windows, "cpu")
        self.stage = stage_estimates(config, self.arch, self.original, self.dtype)[-1]
        self.model, rope = load_model(model_dir, device="cpu")
        tokens = np.random.default_rng(0).integers(0, self.arch.vocab_size, (stage.windows, stage.length + 1))
        self.scorer = Scorer(
            self.model,
            torch.from_numpy(tokens),
            rope.method.original_inv_freq(),
            candidates_per_forward=config.workers.candidates_per_forward,
        )
        self.batch = candidate_set(config.workers.batch_size, rope, stage.length)
        self.last_rates = None

    def estimated(self) -> float:
        self.last_rates = measure_cpu_rates(
            self.arch, self.shape, self.dtype, self.config.model.attn_implementation, repeats=2
        )
        return seconds(self.stage.flops_per_candidate, self.last_rates, self.stage.elementwise_bytes_per_candidate)

    def measured(self) -> float:
        start = time.perf_counter()
        self.scorer.score(self.batch)
        return (time.perf_counter() - start) / len(self.batch)


def llama_config(tokens: int) -> JobConfig:
    base = {
        "target_length": tokens,
        "original_length": 1024,
        "model": {"device": "cpu"},
        "data": {"search_windows": 1},
        "workers": {"candidates_per_forward": 1, "batch_size": 1},
    }
    return load_job_config(None, base=base)


def run_case(case: Case, rounds: int) -> None:
    case.measured()  # warm-up: the first forward grows the allocator's pools
    estimates, measures, ratios = [], [], []
    for _ in range(rounds):
        estimate, measure = case.estimated(), case.measured()
        estimates.append(estimate)
        measures.append(measure)
        ratios.append(estimate / measure)
    rates = case.last_rates
    square = rates.square_matmul
    print(
        f"{case.name:34s} estimated {statistics.median(estimates):8.3f} s  measured {statistics.median(measures):8.3f}"
        f" s  ratio {statistics.median(ratios):5.2f}  (rounds {', '.join(f'{r:.2f}' for r in ratios)})"
    )
    print(
        f"{'':34s} rates: linear {rates.linear / 1e9:5.1f}, attention {rates.attention / 1e9:5.1f}, lm_head+loss "
        f"{rates.lm_head / 1e9:5.1f} GFLOP/s = {rates.linear / square:.2f} / {rates.attention / square:.2f} / "
        f"{rates.lm_head / square:.2f} of a 2048^2 matmul ({square / 1e9:.1f} GFLOP/s); memory "
        f"{rates.memory / 1e9:.1f} GB/s"
    )
    flops = case.stage.flops_per_candidate
    print(
        f"{'':34s} FLOPs/candidate {flops.total:.3g} (linear {flops.linear / flops.total:.0%}, attention "
        f"{flops.attention / flops.total:.0%}, lm_head {flops.lm_head / flops.total:.0%}), forward {case.shape.rows}"
        f" x {case.shape.tokens} tokens, achieved {flops.total / statistics.median(measures) / 1e9:.1f} GFLOP/s"
    )
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="the reference model and 2048 tokens only")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32; ratio = estimated / measured")
    run_case(
        Case("reference (configs/demo.yaml)", reference_model_dir(), load_job_config(ROOT / "configs/demo.yaml")),
        args.rounds,
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = random_llama(Path(tmp) / "llama")
        for tokens in (2048,) if args.quick else (2048, 4096, 8192):
            run_case(Case(f"random Llama d1024 x2, {tokens} tokens", model_dir, llama_config(tokens)), args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
