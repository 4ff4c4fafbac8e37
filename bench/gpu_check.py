"""The prepared GPU check: what a search costs on one GPU and whether bfloat16 ranks as float32, in one run.

On a random-weight Llama of Llama-3-8B's width (d_model 4096, 32 heads x 128, 8 key/value heads, MLP 14336, 128k
vocabulary, rope_theta 500000, pre-trained length 8192) with `--layers` decoder layers (2), built in this process
in bfloat16 with SDPA and scored by the project's own Scorer (no Ray, no files), it measures:
1. `peak`: a bfloat16 8192 x 8192 x 8192 matmul's TFLOP/s, the yardstick (the mean of 10 after 3 warm-ups);
2. `forward`: per length (8k, 32k, 128k tokens, one window, one candidate), tokens/s, achieved TFLOP/s counted as
   `longrope estimate` counts a forward (search/cost/flops.py `forward_flops`, SDPA's causal half), MFU against
   the measured peak, and the peak memory torch allocated against estimate's figure (search/cost/memory.py
   `worker_memory`);
3. `ranking`: a few candidates (bench/benchlib.py `ranking_candidates`) at 32k (scale 4: at 8k, the model's own
   length, every candidate is nearly the plain RoPE) in bfloat16 and in float32, ranked alike or not
   (bench/rank_agreement.py);
4. `overhead`: a 16-token forward, all launch overhead, against what estimate assumes for one (search/cost/
   hardware.py `gpu_forward_overhead`: ~10 us an eager op, where it withholds GPU times of tiny models);
5. `gradient`: the gradient optimizer's forward + backward (`Scorer.score_with_gradient`, layers checkpointed) at
   32k: its time and peak memory against the forward's, and memory against estimate's `gradient_memory`.
It writes one JSON file (`--out`, default $OUT/gpu_check.json where $OUT is set, else
bench/results/gpu_check.json), each part as it finishes, so a run stopped at its limit keeps what it measured.
Budget: under 8 minutes on one H200 (the 15 minutes a GPU is lent for hold two runs).

The GPU machine has torch (CUDA) and transformers but neither Ray nor pydantic, and nothing can be installed from
a registry there: the package is imported from this checkout (no install), and pydantic travels as wheels
(`bench/gpu_wheels.sh` downloads them into .whl/; the device command installs them with pip --no-index). Nothing
here imports Ray.

`--dry-run`: the same code on tiny shapes (d_model 64, vocabulary 256, 64 / 128 / 256 tokens) on the CPU, so the
script cannot rot; a test runs it (tests/test_gpu_check.py) and its output is bench/results/gpu_check_dry_run.json.

Run on the GPU machine: python3 bench/gpu_check.py [--layers 2] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


from checkout_package import importable_package  # noqa: E402 (bench/ is on the path: the script's folder)

importable_package()

import torch  # noqa: E402 (after the package is made importable)
from benchlib import provenance, ranking_candidates, save_json  # noqa: E402
from rank_agreement import rank_agreement  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

from longrope.search.cost.architecture import Architecture  # noqa: E402
from longrope.search.cost.flops import forward_flops  # noqa: E402
from longrope.search.cost.hardware import gpu_forward_overhead  # noqa: E402
from longrope.search.cost.memory import ForwardShape, gradient_memory, worker_memory  # noqa: E402
from longrope.workers.models import model_rope  # noqa: E402
from longrope.workers.random_llama import llama_config  # noqa: E402
from longrope.workers.scorer import Scorer  # noqa: E402

FULL = {
    "shape": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=128, vocab_size=128256, max_position_embeddings=8192,
                  rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    "lengths": (8192, 32768, 131072), "ranking_length": 32768, "gradient_length": 32768, "matmul": 8192,
    "candidates": 4,
}  # fmt: skip
DRY = {
    "shape": dict(hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  vocab_size=256, max_position_embeddings=32, rope_parameters={"rope_type": "default",
                  "rope_theta": 10000.0}),
    "lengths": (64, 128, 256), "ranking_length": 128, "gradient_length": 128, "matmul": 256, "candidates": 2,
}  # fmt: skip
GIB = 2**30


class Device:
    """Where the check runs: the clock and the memory counters (CUDA events and torch.cuda on a GPU, the wall
    clock and no memory figure on the CPU of a dry run)."""

    def __init__(self, name: str):
        self.name, self.cuda = name, name == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def seconds(self, fn, repeats: int, warm_ups: int = 1) -> float:
        """Mean seconds of `fn` over `repeats` calls after `warm_ups` untimed ones."""
        for _ in range(warm_ups):
            fn()
        self.sync()
        started = time.perf_counter()
        for _ in range(repeats):
            fn()
        self.sync()
        return (time.perf_counter() - started) / repeats

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated() / GIB if self.cuda else None


def matmul_peak(device: Device, size: int) -> dict:
    a = torch.randn(size, size, device=device.name, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device.name, dtype=torch.bfloat16)
    seconds = device.seconds(lambda: a @ b, repeats=10, warm_ups=3)
    return {"size": size, "seconds": seconds, "tflops": 2 * size**3 / seconds / 1e12}


def build_model(shape: dict, layers: int, device: Device, dtype: torch.dtype):
    """The random-weight Llama (seed 0), built straight on the device, in eval mode with SDPA."""
    config = llama_config(num_hidden_layers=layers, attn_implementation="sdpa", **shape)
    torch.manual_seed(0)
    with torch.device(device.name):
        model = LlamaForCausalLM(config).to(dtype).eval()
    return model, config


def candidates_for(config, length: int, count: int) -> list:
    rope = model_rope(config.to_dict())
    named = ranking_candidates(rope, length, near_ties=max(0, count - 2))
    return [named["yarn/1.2"], named["pi/1.0"], *[c for n, c in named.items() if n.startswith("near tie")]][:count]


def one_window_scorer(model, config, length: int, seed: int = 0) -> Scorer:
    """The project's Scorer on one window of `length` random tokens (seeded), one candidate a forward."""
    tokens = torch.randint(0, config.vocab_size, (1, length + 1), generator=torch.Generator().manual_seed(seed))
    inv_freq = model_rope(config.to_dict()).method.original_inv_freq()
    return Scorer(model, tokens, inv_freq, candidates_per_forward=1, tokens_per_forward=length)


def estimate_memory(config, tokens: int, dtype: str, gradient: bool = False) -> float:
    arch = Architecture.from_hf_config(config.to_dict())
    shape = ForwardShape(tokens=tokens, rows=1)
    memory = (gradient_memory if gradient else worker_memory)(arch, shape, dtype, "sdpa")
    return memory.peak / GIB


def forward_part(model, config, lengths, device: Device, peak_tflops: float, repeats: int) -> list[dict]:
    arch = Architecture.from_hf_config(config.to_dict())
    rows = []
    for length in lengths:
        scorer = one_window_scorer(model, config, length)
        candidate = candidates_for(config, length, 1)
        device.reset_peak()
        seconds = device.seconds(lambda s=scorer, c=candidate: s.score(c), repeats)
        flops = forward_flops(arch, length, causal=0.5).total
        rows.append({
            "tokens": length, "seconds": seconds, "tokens_per_s": length / seconds,
            "tflops": flops / seconds / 1e12, "mfu": flops / seconds / 1e12 / peak_tflops,
            "peak_memory_gib": device.peak_gib(), "estimate_memory_gib": estimate_memory(config, length, "bfloat16"),
        })  # fmt: skip
        print(f"forward {length}: {rows[-1]['tokens_per_s']:.0f} tokens/s, MFU {rows[-1]['mfu']:.3f}", flush=True)
        del scorer
    return rows


def ranking_part(model, config, length: int, count: int, device: Device) -> dict:
    candidates = candidates_for(config, length, count)
    scores = {}
    for dtype in (torch.bfloat16, torch.float32):
        scorer = one_window_scorer(model.to(dtype), config, length, seed=1)
        scores[str(dtype).removeprefix("torch.")] = [s.mean_nll for s in scorer.score(candidates)]
    model.to(torch.bfloat16)
    agreement = rank_agreement(scores["float32"], scores["bfloat16"], best_k=min(3, count))
    print(f"ranking at {length}: tau {agreement.kendall_tau:.3f}, best the same {agreement.best_same}", flush=True)
    return {"tokens": length, "mean_nll": scores, **agreement.as_dict()}


def overhead_part(model, config, device: Device, layers: int) -> dict:
    """One candidate on one 16-token window: no matmul is large enough to matter, so its time is the overhead."""
    scorer = one_window_scorer(model, config, 16)
    candidate = candidates_for(config, 2 * config.max_position_embeddings, 1)  # any candidate: 16 tokens read alike
    seconds = device.seconds(lambda: scorer.score(candidate), repeats=10, warm_ups=3)
    assumed = gpu_forward_overhead(layers)
    print(f"overhead: a 16-token forward {seconds * 1e3:.2f} ms, estimate assumes {assumed * 1e3:.2f} ms", flush=True)
    return {"forward_seconds": seconds, "estimate_assumes_seconds": assumed, "ratio": seconds / assumed}


def gradient_part(model, config, length: int, device: Device, repeats: int) -> dict:
    scorer = one_window_scorer(model, config, length)
    (candidate,) = candidates_for(config, length, 1)
    device.reset_peak()
    forward = device.seconds(lambda: scorer.score([candidate]), repeats)
    forward_peak = device.peak_gib()
    device.reset_peak()
    gradient = device.seconds(lambda: scorer.score_with_gradient(candidate), repeats)
    result = {
        "tokens": length, "forward_seconds": forward, "gradient_seconds": gradient,
        "time_ratio": gradient / forward, "forward_peak_gib": forward_peak, "gradient_peak_gib": device.peak_gib(),
        "estimate_gradient_memory_gib": estimate_memory(config, length, "bfloat16", gradient=True),
    }  # fmt: skip
    print(f"gradient at {length}: {result['time_ratio']:.2f}x the forward's time", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (what CI runs)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers at full width")
    default_out = Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args()
    sizes = DRY if args.dry_run else FULL
    out = args.out or ROOT / "bench" / "results" / ("gpu_check_dry_run.json" if args.dry_run else "gpu_check.json")
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: run it on the GPU machine, or --dry-run here")
    device = Device("cpu" if args.dry_run else "cuda")
    repeats = 1 if args.dry_run else 3
    result = {**provenance(), "dry_run": args.dry_run, "layers": args.layers, "shape": sizes["shape"]}
    if device.cuda:
        result["gpu"] = torch.cuda.get_device_name()
    result["peak"] = matmul_peak(device, sizes["matmul"])
    save_json(out, result)
    model, config = build_model(sizes["shape"], args.layers, device, torch.bfloat16)
    peak = result["peak"]["tflops"]
    result["forward"] = forward_part(model, config, sizes["lengths"], device, peak, repeats)
    save_json(out, result)
    result["ranking"] = ranking_part(model, config, sizes["ranking_length"], sizes["candidates"], device)
    save_json(out, result)
    result["overhead"] = overhead_part(model, config, device, args.layers)
    save_json(out, result)
    result["gradient"] = gradient_part(model, config, sizes["gradient_length"], device, repeats)
    save_json(out, result)


if __name__ == "__main__":
    main()
