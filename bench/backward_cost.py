"""What a gradient pass costs on this CPU, in window-equivalents: `Scorer.score_with_gradient` against `Scorer.score`.

One forward of one window is 1: each side's time is divided by the window evaluations it made, so the ratio is
what one window's forward + backward costs in forwards (what `longrope estimate` counts as a forward window
evaluation plus a backward window pass). Cases:
- the reference model as configs/demo.yaml scores it: 1024 tokens, 8 windows; `score` runs a worker's call of
  batch_size 2 candidates (a forward holds 2 candidates x 1 window), `score_with_gradient` one candidate on the 8
  windows (a forward stacks 2 windows: the same 2048-token budget);
- a random-weight Llama (d_model 1024, 2 layers, 8 heads x 128, 4 key/value heads, MLP 2816, 32k vocabulary; the
  one bench/estimate_accuracy.py builds), one candidate on one window of 2048 tokens.
Both sides run with one torch thread (a demo worker's: Ray sets OMP_NUM_THREADS to its num_cpus) and alternate
round by round, so the shared machine's load hits both alike; each side's figure is its least over the rounds
(timeit's advice: the least-disturbed) and its median is printed too. The FLOP ratio `longrope estimate` counts for
the same pass (search/cost/budget.py `backward_flops`) is printed beside the measured one.

Memory (d1024 case): each path runs in a fresh Python process with glibc told to map every allocation of 64 KiB or
more on its own and give it back at free (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_: a fixed threshold turns
off glibc's adaptive one, which otherwise keeps freed tensors in the heap), so the resident set size follows the
live tensors. After the model is loaded, the scorer built and one warm-up call (library pages, thread pools and
kernels' scratch buffers are then resident on both sides), the RSS is sampled every millisecond from
/proc/self/statm by a thread during a second call; its peak less the RSS just before the call is that path's
activation memory (the weights are resident on both sides). Beside them: `longrope estimate`'s figures for the same
shapes (search/cost/memory.py `worker_memory` and `gradient_memory`, less the weights).

Results: bench/results/backward_cost.json. About 3 min on 2 cores:
    .venv/bin/python bench/backward_cost.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from benchlib import RESULTS, ROOT, candidate_set, d1024_llama, one_window_config, provenance, save_json

from longrope.search.config.job_config import JobConfig
from longrope.search.cost.architecture import Architecture
from longrope.search.cost.budget import backward_flops, search_budget, stage_flops
from longrope.search.cost.cpu_rates import torch_threads
from longrope.search.cost.memory import ForwardShape, gradient_memory, worker_memory
from longrope.search.optimizers.factory import load_job_config
from longrope.workers.models import load_model, read_model_config
from longrope.workers.reference_recipe import reference_model_dir
from longrope.workers.scorer import Scorer
from longrope.workers.timing import alternating_times

OUT = RESULTS / "backward_cost.json"
DEMO = ROOT / "configs" / "demo.yaml"
THREADS = 1
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# mallopt's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD through the environment (glibc manual, "Memory Allocation
# Tunables"): allocations of 64 KiB or more are mmapped and unmapped at free, and setting them fixes the threshold
GLIBC_RETURNS_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}


class Case:
    """One model, its windows and candidates: `score` on a worker's call, `score_with_gradient` on one candidate."""

    def __init__(self, name: str, model_dir: Path, config: JobConfig):
        self.name, self.config = name, config
        self.arch = Architecture.from_hf_config(read_model_config(model_dir))
        self.original = config.original_length or self.arch.original_length
        self.stage = search_budget(config, self.original).stages[-1]
        model, rope = load_model(model_dir, device="cpu")
        tokens = np.random.default_rng(0).integers(0, self.arch.vocab_size, (self.stage.windows, self.stage.length + 1))
        self.scorer = Scorer(model, torch.from_numpy(tokens), rope.method.original_inv_freq(),
                             candidates_per_forward=config.workers.candidates_per_forward)  # fmt: skip
        self.batch = candidate_set(config.workers.batch_size, rope, self.stage.length)

    def estimated_flop_ratio(self) -> float:
        """(forward + what a gradient pass adds) / forward, in FLOPs, as `longrope estimate` counts them."""
        forward = stage_flops(self.config, self.arch, self.stage, self.original).total / self.stage.windows
        return (forward + backward_flops(self.config, self.arch, self.stage, self.original).total) / forward


def run_case(case: Case, rounds: int) -> dict:
    """Seconds per window of each side, alternating round by round (workers/timing.py), after a warm-up call each
    (the allocator's pools, the first autograd graph)."""
    with torch_threads(THREADS):
        times = alternating_times(
            {
                "forward": lambda: case.scorer.score(case.batch),
                "gradient": lambda: case.scorer.score_with_gradient(case.batch[0]),
            },
            rounds,
        )
    forward = [t / (len(case.batch) * case.stage.windows) for t in times["forward"]]
    gradient = [t / case.stage.windows for t in times["gradient"]]
    result = {
        "case": case.name,
        "tokens": case.stage.length,
        "windows": case.stage.windows,
        "forward_s_per_window": {"least": min(forward), "median": statistics.median(forward), "rounds": forward},
        "gradient_s_per_window": {"least": min(gradient), "median": statistics.median(gradient), "rounds": gradient},
        "ratio_least": min(gradient) / min(forward),
        "ratio_median": statistics.median(gradient) / statistics.median(forward),
        "estimated_flop_ratio": case.estimated_flop_ratio(),
    }
    print(
        f"{case.name:44s} forward {min(forward) * 1e3:8.1f} ms/window  forward+backward {min(gradient) * 1e3:8.1f} "
        f"ms/window  ratio {result['ratio_least']:.2f} (medians {result['ratio_median']:.2f}; estimate's FLOPs "
        f"{result['estimated_flop_ratio']:.2f})",
        flush=True,
    )
    return result


def demo_case() -> Case:
    return Case("reference (configs/demo.yaml), 1024 tokens", reference_model_dir(), load_job_config(DEMO))


def llama_config(model_dir: Path) -> JobConfig:
    """One candidate a call on one window of 2048 tokens of the d1024 Llama (trained, as it were, at 1024)."""
    return one_window_config(2048, 1024, str(model_dir))


# ----------------------------------------------------------------------------------------------------- memory


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES


def measure_memory_here(model_dir: str, path: str) -> dict:
    """In this (fresh) process: a warm-up call of `path` ("forward" or "gradient"), then a second one; its RSS peak
    over the RSS before it."""
    torch.set_num_threads(THREADS)
    case = Case("memory", Path(model_dir), llama_config(Path(model_dir)))
    call = case.forward_seconds_per_window if path == "forward" else case.gradient_seconds_per_window
    call()
    baseline, maxrss_before = rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak, done = [baseline], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    call()
    done.set()
    sampler.join()
    maxrss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "sampled_peak_bytes": peak[0] - baseline,
        "maxrss_peak_bytes": maxrss_after - baseline if maxrss_after > maxrss_before else None,
    }


def measure_memory(model_dir: Path, repeats: int) -> dict:
    """Each path `repeats` times, each in a fresh process; medians of the sampled peaks."""
    runs: dict[str, list[dict]] = {"forward": [], "gradient": []}
    for _ in range(repeats):
        for path in runs:
            code = (
                "import json; from backward_cost import measure_memory_here; "  # run in bench/: its modules import
                f"print(json.dumps(measure_memory_here({str(model_dir)!r}, {path!r})))"
            )
            env = {**os.environ, **GLIBC_RETURNS_FREED_MEMORY}
            out = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "bench", env=env, capture_output=True,
                                 text=True, check=True)  # fmt: skip
            runs[path].append(json.loads(out.stdout.strip().splitlines()[-1]))
    measured = {path: statistics.median(r["sampled_peak_bytes"] for r in rs) for path, rs in runs.items()}
    config = llama_config(model_dir)
    arch = Architecture.from_hf_config(read_model_config(model_dir))
    shape = ForwardShape(tokens=2048, rows=1)
    forward, gradient = worker_memory(arch, shape, "float32", "sdpa"), gradient_memory(arch, shape, "float32", "sdpa")
    estimated = {"forward": forward.peak - forward.weights, "gradient": gradient.peak - gradient.weights}
    result = {
        "how": "fresh process per path, glibc mmap/trim thresholds 64 KiB (freed tensors leave the RSS); after a "
        "warm-up call, RSS sampled every 1 ms from /proc/self/statm during a second call; peak less the RSS before "
        "it (weights resident); median of the repeats",
        "repeats": repeats,
        "runs": runs,
        "measured_bytes": measured,
        "measured_ratio": measured["gradient"] / measured["forward"],
        "estimated_bytes": estimated,
        "estimated_ratio": estimated["gradient"] / estimated["forward"],
        "attn_implementation": config.model.attn_implementation,
    }
    mib = 2**20
    print(
        f"memory, d1024 at 2048 tokens: forward {measured['forward'] / mib:.0f} MiB, gradient "
        f"{measured['gradient'] / mib:.0f} MiB (ratio {result['measured_ratio']:.2f}); estimate "
        f"{estimated['forward'] / mib:.0f} and {estimated['gradient'] / mib:.0f} MiB "
        f"(ratio {result['estimated_ratio']:.2f})",
        flush=True,
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory-repeats", type=int, default=2)
    parser.add_argument("--no-save", action="store_true", help="print only, save nothing")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to save (default {OUT.relative_to(ROOT)})")
    args = parser.parse_args()
    started = provenance()
    started["machine"]["torch_threads_per_side"] = THREADS
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {THREADS} torch thread; ratio = gradient / forward")
    cases = [run_case(demo_case(), args.rounds)]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = d1024_llama(Path(tmp) / "llama")
        cases.append(run_case(Case("random Llama d1024 x2, 2048 tokens", model_dir, llama_config(model_dir)),
                              args.rounds))  # fmt: skip
        memory = measure_memory(model_dir, args.memory_repeats)
    if not args.no_save:
        run = {**started, "rounds": args.rounds, "cases": cases, "memory_d1024_2048": memory}
        save_json(args.out, run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
