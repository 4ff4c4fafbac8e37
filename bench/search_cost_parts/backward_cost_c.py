"""c, what a backward pass costs in window-equivalents, measured first on this CPU (the docstring of
bench/search_cost.py, part 0, says how)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import torch

from longrope.search.cost.cpu_rates import torch_threads
from longrope.search.job.job_context import JobContext
from longrope.search.optimizers.factory import load_job_config
from longrope.workers.models import load_model
from longrope.workers.scorer import Scorer
from longrope.workers.timing import alternating_times
from search_cost_parts.variants import ROOT


def backward_cost(length: int, rounds: int, work: Path) -> dict[str, Any]:
    """c at `length`: seconds per window of a gradient task over seconds per window of the GA's forward, minus 1.

    Both sides run in the same process, on the same windows, one torch thread (a demo worker's), alternating, so
    the machine's load hits both alike; the median of the per-round ratios is c. A single-candidate forward on
    the same windows (how descent scores its held-out windows) is timed too, to show that the unit does not depend
    on which forward defines it."""
    config = load_job_config(ROOT / "configs/demo.yaml", [f"target_length={length}", f"output_dir={work}"])
    context = JobContext.resolve(config)
    windows = context.windows(config.data.search_source, length, config.data.search_windows)
    spec = context.model_spec()
    model, rope = load_model(
        context.model_dir, device="cpu", dtype=spec.dtype, attn_implementation=spec.attn_implementation
    )
    scorer = Scorer(
        model,
        torch.from_numpy(windows.tokens),
        rope.method.original_inv_freq(),
        candidates_per_forward=spec.candidates_per_forward,
        tokens_per_forward=spec.tokens_per_forward,
        loss_chunk_tokens=spec.loss_chunk_tokens,
    )
    gradient_windows = config.data.search_windows - config.search.gradient.holdout_windows
    share = math.ceil(gradient_windows / config.workers.num_workers)  # one chunk per worker (_point_ranges)
    span = (0, share)
    yarn = next(seed for seed in context.seeds() if seed.name == "yarn")
    candidates = [context.longrope(torch.tensor(yarn.factors), attention_factor=a) for a in (1.10, 1.15, 1.20, 1.25)][
        : spec.candidates_per_forward
    ]
    windows_scored = {"forward_batched": share * len(candidates), "gradient": share, "forward_one": share}
    with torch_threads(1):  # warm-up call each first: the allocator's pools, the first autograd graph
        seconds = alternating_times(
            {
                "forward_batched": lambda: scorer.score(candidates, span),
                "gradient": lambda: scorer.score_with_gradient(candidates[0], span),
                "forward_one": lambda: scorer.score(candidates[:1], span),
            },
            rounds,
        )
    timings = {name: [t / windows_scored[name] for t in times] for name, times in seconds.items()}
    ratios = [g / f for g, f in zip(timings["gradient"], timings["forward_batched"], strict=True)]
    ratios_one = [g / f for g, f in zip(timings["gradient"], timings["forward_one"], strict=True)]
    return {
        "length": length,
        "c": statistics.median(ratios) - 1.0,
        "c_vs_single_candidate_forward": statistics.median(ratios_one) - 1.0,
        "round_ratios": ratios,
        "seconds_per_window": {name: statistics.median(values) for name, values in timings.items()},
        "timings": timings,
        "rounds": rounds,
        "windows_per_task": share,
        "candidates_per_forward": len(candidates),
        "torch_threads": 1,
    }
