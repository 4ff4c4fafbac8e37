"""What one window costs through the project's scorer on a real model at a job's target length: a forward
(`Scorer.score`) and a gradient pass (`Scorer.score_with_gradient`: the forward again under checkpointing, then the
backward), in float32 and in bfloat16, each with its time and the process's peak resident memory.

Why both dtypes: this CPU (AVX2, no AVX512-BF16) emulates bfloat16 matmuls, so which dtype is faster differs
between the forward and the backward and with the length (at 16k: forward 0.97x, gradient 1.19x in bfloat16's
favour, bench/results/smollm2_speed.json). The search config takes the faster one, and `longrope estimate --gpu
cpu` is checked against these times.

Peak memory: the kernel's high-water mark of the resident set (VmHWM in /proc/self/status), reset before each
pass by writing 5 to /proc/self/clear_refs (Linux >= 4.0, proc(5)), so each figure is that pass's own peak, the
model's weights included.

Each (dtype, pass) is saved as it is measured, and a rerun measures only what the file lacks: at 32k the four
passes take over an hour here, longer than a session may last.

Run (after `make real-model`):
  .venv/bin/python bench/real_model_speed.py --config configs/smollm2-135m-32k-cpu.yaml \
    --out bench/results/smollm2_speed_32k.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from benchlib import ROOT, provenance, save_json
from pydantic import BaseModel, Field

from longrope.search.job.job_context import JobContext
from longrope.search.optimizers.factory import load_job_config
from longrope.workers.models import load_model
from longrope.workers.scorer import Scorer

DTYPES = ("bfloat16", "float32")
PASSES = ("forward", "gradient")
GIB = 2**30


class PassCost(BaseModel):
    """One pass over one window: seconds, tokens per second, and the process's peak resident memory during it."""

    seconds: float = Field(gt=0)
    tokens_per_second: float = Field(gt=0)
    peak_rss_gib: float = Field(gt=0)


class SpeedResult(BaseModel):
    """The saved file: what was measured, where, and each dtype's passes as they were measured."""

    config: str
    length: int
    window: str  # the window's document and first token
    rates: dict[str, dict[str, PassCost]] = {}  # dtype -> pass -> cost
    provenance: dict = {}

    @property
    def complete(self) -> bool:
        return all(step in self.rates.get(dtype, {}) for dtype in DTYPES for step in PASSES)


def reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line")


def timed(step, length: int) -> PassCost:
    reset_peak_rss()
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    return PassCost(seconds=seconds, tokens_per_second=length / seconds, peak_rss_gib=peak_rss_bytes() / GIB)


def measure(context: JobContext, tokens: torch.Tensor, dtype: str, missing: list[str]) -> dict[str, PassCost]:
    """The passes of `missing` in `dtype` on the window, with YaRN's factors at the target (a seed of every search)."""
    model, rope = load_model(context.model_dir, device="cpu", dtype=dtype)
    scorer = Scorer(model, tokens, rope.method.original_inv_freq(), candidates_per_forward=1)
    yarn = context.baselines()["yarn"]
    as_longrope = context.longrope(yarn.factors(context.target_length).double(), attention_factor=yarn.attention_factor)
    steps = {"forward": lambda: scorer.score([yarn]), "gradient": lambda: scorer.score_with_gradient(as_longrope)}
    return {step: timed(steps[step], context.target_length) for step in missing}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "smollm2-135m-32k-cpu.yaml"))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "smollm2_speed_32k.json"))
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    config = load_job_config(args.config, args.set)
    context = JobContext.resolve(config)
    windows = context.windows(config.data.search_source, context.target_length, 1)
    window = f"{windows.names[0]}@{windows.offsets[0]}"
    out = Path(args.out)
    result = SpeedResult(config=args.config, length=context.target_length, window=window)
    if out.is_file():
        result = SpeedResult.model_validate_json(out.read_text())
        if (result.config, result.length, result.window) != (args.config, context.target_length, window):
            raise SystemExit(f"{out}: measured for another config or window; move it away to measure this one")
    tokens = torch.from_numpy(np.asarray(windows.tokens))
    for dtype in DTYPES:
        missing = [step for step in PASSES if step not in result.rates.get(dtype, {})]
        for step in missing:  # one pass at a time, saved as it lands
            result.rates.setdefault(dtype, {})[step] = measure(context, tokens, dtype, [step])[step]
            print(dtype, step, result.rates[dtype][step].model_dump(), flush=True)
            save_json(out, {**result.model_dump(), "provenance": provenance(), "complete": result.complete})


if __name__ == "__main__":
    main()
