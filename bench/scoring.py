"""Scoring benchmarks, each measuring two things side by side in one run and printing their ratio.

1. candidates/s: the project's scorer (rope patch, B candidates per forward, chunked loss) vs the plain way
   (overwrite `inv_freq`, full forward with full logits, one candidate at a time), by length and batch size;
2. peak memory of scoring one 8k-token window with a 32k vocabulary: chunked loss vs full logits;
3. Ray pool overhead: the pool's throughput vs calling the scorer directly in this process;
4. achieved FLOP/s of the scoring forward pass vs a plain 2048x2048 float32 matmul.

Run: .venv/bin/python bench/scoring.py [--repeats 5] [--quick] [--only NAME]. Numbers are medians over the
repeats, the two sides of each ratio timed in alternating rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import weakref
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from longrope.encodings import LongRope
from longrope.search.cost.cpu_rates import median_seconds
from longrope.workers.models import load_model
from longrope.workers.reference_recipe import reference_model_dir
from longrope.workers.scorer import Scorer


def candidate_set(count: int, rope, target: int) -> list[LongRope]:
    pairs = rope.rotary_dim // 2
    return [
        LongRope.from_factors(
            torch.linspace(1.0, 1.0 + 0.5 * (i + 1), pairs),
            head_dim=rope.head_dim,
            original_length=rope.original_length,
            target_length=target,
        )
        for i in range(count)
    ]


def plain_scoring(model, windows: torch.Tensor, candidates: list[LongRope]) -> list[float]:
    """The plain way: overwrite inv_freq / attention_scaling, full forward with full logits, one at a time."""
    rotary = model.model.rotary_emb
    saved = rotary.inv_freq.clone(), rotary.attention_scaling
    totals = []
    with torch.inference_mode():
        for method in candidates:
            rotary.inv_freq.copy_(method.inv_freq(windows.shape[1] - 1))
            rotary.attention_scaling = method.attention_factor
            total = 0.0
            for window in windows:
                logits = model(input_ids=window[None, :-1]).logits
                total += float(F.cross_entropy(logits[0].float(), window[1:], reduction="sum"))
            totals.append(total)
    rotary.inv_freq.copy_(saved[0])
    rotary.attention_scaling = saved[1]
    return totals


def interleaved_times(fns: dict[str, object], repeats: int) -> dict[str, list[float]]:
    """Seconds of each function per round, timed in alternating rounds so drifting load hits all alike."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def interleaved_medians(fns: dict[str, object], repeats: int) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in interleaved_times(fns, repeats).items()}


def bench_throughput(repeats: int, quick: bool) -> None:
    print(
        "\n## 1. candidates/s: project scorer vs plain full-logits scoring (reference model, 4 windows, 8 candidates)"
    )
    model, rope = load_model(reference_model_dir(), device="cpu")
    rng = np.random.default_rng(0)
    lengths = (128, 256, 1024) if quick else (128, 256, 512, 1024, 2048)
    batches = (1, 2, 4, 8)
    print(f"{'length':>6} {'batch':>5} {'plain cand/s':>13} {'ours cand/s':>12} {'ratio':>6}")
    for length in lengths:
        windows = torch.from_numpy(rng.integers(0, 256, size=(4, length + 1)))
        candidates = candidate_set(8, rope, max(length, rope.original_length * 2))
        fns = {"plain": lambda w=windows, c=candidates: plain_scoring(model, w, c)}
        for batch in batches:
            scorer = Scorer(model, windows, rope.method.original_inv_freq(), candidates_per_forward=batch)
            fns[batch] = lambda s=scorer, c=candidates: s.score(c)
        seconds = interleaved_medians(fns, repeats)
        for batch in batches:
            print(
                f"{length:>6} {batch:>5} {len(candidates) / seconds['plain']:>13.2f} "
                f"{len(candidates) / seconds[batch]:>12.2f} {seconds['plain'] / seconds[batch]:>6.2f}"
            )


class PeakTensorMemory(TorchDispatchMode):
    """Peak bytes of live tensors created inside the block (close to what a GPU's max_memory_allocated reports).

    Deterministic, unlike the process's resident size, which moves with the C allocator's caching. Each op's
    outputs are counted once per storage and released when the last tensor on that storage is collected.
    Temporaries inside fused aten ops (cross_entropy's log-softmax) are not seen, on either side of the ratio.
    """

    def __init__(self):
        super().__init__()
        self.refs: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.current = self.peak = 0

    def _release(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            self.current -= self.sizes.pop(key)
            del self.refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                key = storage.data_ptr()
                if key not in self.refs:
                    self.refs[key], self.sizes[key] = 0, storage.nbytes()
                    self.current += storage.nbytes()
                    self.peak = max(self.peak, self.current)
                self.refs[key] += 1
                weakref.finalize(tensor, self._release, key)
        return out


def peak_tensor_mib(fn) -> float:
    with PeakTensorMemory() as tracker:
        fn()
    return tracker.peak / 2**20


def peak_rss_during(fn) -> float:
    """Peak resident memory (MiB) of this process while `fn` runs, above what it held just before."""
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark
    before = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - before) / 1024


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def random_llama(tmp: Path, *, hidden: int, layers: int, vocab: int, heads: int, max_positions: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 4 * 2 // 3 // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(tmp, safe_serialization=True)
    return tmp


def bench_memory(tmp: Path) -> None:
    print("\n## 2. peak memory scoring one 8192-token window, 32k vocabulary (random Llama, 2 layers, d 256)")
    model_dir = random_llama(tmp / "mem", hidden=256, layers=2, vocab=32000, heads=4, max_positions=1024)
    model, rope = load_model(model_dir, device="cpu")
    window = torch.from_numpy(np.random.default_rng(0).integers(0, 32000, size=(1, 8193)))
    candidates = candidate_set(1, rope, 8192)
    scorer = Scorer(model, window, rope.method.original_inv_freq(), candidates_per_forward=1)
    scorer.score(candidates)  # warm-up: the first forward grows the allocator's pools once, whatever the loss
    tensors = {
        "chunked": peak_tensor_mib(lambda: scorer.score(candidates)),
        "full": peak_tensor_mib(lambda: plain_scoring(model, window, candidates)),
    }
    rss_runs = {"chunked": [], "full": []}
    for _ in range(3):  # alternating; the resident size moves with the C allocator's caching, so take medians
        rss_runs["chunked"].append(peak_rss_during(lambda: scorer.score(candidates)))
        rss_runs["full"].append(peak_rss_during(lambda: plain_scoring(model, window, candidates)))
    rss = {name: statistics.median(values) for name, values in rss_runs.items()}
    for name, peaks in (("peak live tensors", tensors), ("peak resident size", rss)):
        print(
            f"{name:18s}: full logits {peaks['full']:6.0f} MiB   chunked loss ({scorer.loss_chunk_tokens} tokens a "
            f"chunk) {peaks['chunked']:6.0f} MiB   ratio chunked/full {peaks['chunked'] / peaks['full']:.3f}"
        )


def bench_pool(repeats: int) -> None:
    import ray

    from longrope.workers.pool import WorkerPool
    from longrope.workers.specs import ModelSpec, PoolSpec

    print("\n## 3. Ray pool (1 worker, 2 CPUs) vs the scorer called directly (reference model, 1024 tokens)")
    model, rope = load_model(reference_model_dir(), device="cpu")
    windows = np.random.default_rng(0).integers(0, 256, size=(4, 1025))
    candidates = candidate_set(16, rope, 1024)
    scorer = Scorer(model, torch.from_numpy(windows), rope.method.original_inv_freq(), candidates_per_forward=4)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        pool = WorkerPool(
            ModelSpec(model_dir=str(reference_model_dir()), candidates_per_forward=4),
            windows,
            PoolSpec(num_workers=1, num_cpus_per_worker=2, batch_size=4),
        )
        pool.worker_info()
        keyed = list(enumerate(candidates))
        times = interleaved_times(
            {"direct": lambda: scorer.score(candidates), "pool": lambda: list(pool.imap(keyed))}, repeats
        )
        direct, pooled = statistics.median(times["direct"]), statistics.median(times["pool"])
        overheads = sorted((p / d - 1) * 100 for p, d in zip(times["pool"], times["direct"], strict=True))
        print(
            f"direct: {len(candidates) / direct:.2f} cand/s   pool: {len(candidates) / pooled:.2f} cand/s   "
            f"overhead (median of rounds): {statistics.median(overheads):+.1f}%   "
            f"rounds from {overheads[0]:+.1f}% to {overheads[-1]:+.1f}%"
        )
        pool.shutdown()
    finally:
        ray.shutdown()


def forward_flops(config, tokens: int, batch: int) -> float:
    """Matmul FLOPs of one scoring forward (causal attention counted as half of T x T), lm_head included."""
    d, layers = config.hidden_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", d // config.num_attention_heads)
    q_out = config.num_attention_heads * head_dim
    kv_out = config.num_key_value_heads * head_dim
    per_token = layers * (d * (2 * q_out + 2 * kv_out) + 3 * d * config.intermediate_size) + d * config.vocab_size
    attention = layers * tokens * q_out  # QK^T and AV over T/2 keys on average (causal): T * q_out MACs a token
    return 2.0 * batch * tokens * (per_token + attention)


def bench_flops(repeats: int, tmp: Path) -> None:
    print("\n## 4. achieved FLOP/s of the scoring forward vs a 2048x2048 float32 matmul")
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    matmul = 2 * 2048**3 / median_seconds(lambda: a @ b, repeats * 3)
    print(f"matmul 2048x2048: {matmul / 1e9:.1f} GFLOP/s")
    models = {
        "reference (d 128)": reference_model_dir(),
        "random Llama d 1024, 2 layers, 32k vocab": random_llama(
            tmp / "flops", hidden=1024, layers=2, vocab=32000, heads=8, max_positions=1024
        ),
    }
    for name, model_dir in models.items():
        model, rope = load_model(model_dir, device="cpu")
        for tokens, batch in ((1024, 1), (1024, 4), (2048, 4)):
            windows = torch.from_numpy(np.random.default_rng(0).integers(0, model.config.vocab_size, (1, tokens + 1)))
            scorer = Scorer(model, windows, rope.method.original_inv_freq(), candidates_per_forward=batch)
            candidates = candidate_set(batch, rope, tokens)
            seconds = median_seconds(lambda s=scorer, c=candidates: s.score(c), repeats)
            achieved = forward_flops(model.config, tokens, batch) / seconds
            print(
                f"{name:42s} T={tokens:5d} B={batch}: {achieved / 1e9:6.1f} GFLOP/s = "
                f"{achieved / matmul * 100:5.1f}% of matmul"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer lengths")
    parser.add_argument("--only", choices=["throughput", "memory", "pool", "flops"])
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        steps = {
            "throughput": lambda: bench_throughput(args.repeats, args.quick),
            "memory": lambda: bench_memory(Path(tmp)),
            "pool": lambda: bench_pool(args.repeats),
            "flops": lambda: bench_flops(args.repeats, Path(tmp)),
        }
        for name, step in steps.items():
            if args.only in (None, name):
                step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
