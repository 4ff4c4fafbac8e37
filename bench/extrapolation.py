"""The encoding suite measured: `longrope extrapolation` on the shipped checkpoints, timed, and what each
encoding's forward costs next to RoPE's.

1. table: runs `longrope extrapolation -o OUT --overwrite` as a user runs it (six trained encodings at 1x-16x
   their training length, the RoPE model with PI, NTK, Dynamic NTK, YaRN, Llama 3 and the demo's searched
   factors), and prints its wall time against the 10-minute target on 2 cores.
2. cost: one 16x window (2048 tokens) through each checkpoint, alternating the encodings in rounds; the median
   seconds of each and its ratio to the RoPE model's, measured side by side in the same rounds.

Writes OUT/extrapolation.{json,md,png} (the command's outputs) and OUT/bench.json (with the command, date and machine).
Run: .venv/bin/python bench/extrapolation.py [--documents 16] [--rounds 3] [--out bench/results/extrapolation]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from benchlib import provenance
from pydantic import BaseModel

from longrope.search.cli.extrapolation_command import DEFAULT_DOCUMENTS
from longrope.search.cli.main import main
from longrope.search.reports.extrapolation import evaluation_tokens
from longrope.workers.reference_recipe import ENCODING_NAMES
from longrope.workers.suite_training import load_suite_model, suite_model_dir
from longrope.workers.timing import alternating_times

TARGET_SECONDS = 600


class ExtrapolationBench(BaseModel):
    provenance: dict  # the command, date, commit and machine (bench/benchlib.py `provenance`)
    documents: int
    threads: int
    wall_seconds: float
    target_seconds: float
    forward_seconds_at_16x: dict[str, float]
    ratio_to_rope: dict[str, float]


def forward_seconds(rounds: int) -> dict[str, float]:
    """Median seconds of one 2048-token forward per encoding, the encodings alternating within each round."""
    models = {name: load_suite_model(suite_model_dir(name)) for name in ENCODING_NAMES if name != "learned"}
    ids = torch.from_numpy(evaluation_tokens(128, 1)[:, :-1])
    with torch.inference_mode():
        forwards = {name: lambda m=model: m(ids) for name, model in models.items()}
        times = alternating_times(forwards, rounds, warm_up=False)
    return {name: statistics.median(values) for name, values in times.items()}


def main_bench() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=DEFAULT_DOCUMENTS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/extrapolation"))
    args = parser.parse_args()
    measured_on = provenance()
    started = time.monotonic()
    argv = ["extrapolation", "-o", str(args.out), "--overwrite", "--documents", str(args.documents)]
    if main(argv) != 0:
        raise SystemExit("longrope extrapolation failed")
    wall = time.monotonic() - started
    print(f"table: {wall:.0f} s wall for `longrope {' '.join(argv)}` (target <= {TARGET_SECONDS} s on 2 cores)")
    seconds = forward_seconds(args.rounds)
    ratios = {name: value / seconds["rope"] for name, value in seconds.items()}
    print(f"cost: one 2048-token forward (median of {args.rounds} rounds), ratio to rope")
    for name, value in seconds.items():
        print(f"  {name:<11} {value:7.3f} s  {ratios[name]:5.2f}x")
    result = ExtrapolationBench(
        provenance=measured_on,
        documents=args.documents,
        threads=torch.get_num_threads(),
        wall_seconds=round(wall, 1),
        target_seconds=TARGET_SECONDS,
        forward_seconds_at_16x={name: round(value, 4) for name, value in seconds.items()},
        ratio_to_rope={name: round(value, 3) for name, value in ratios.items()},
    )
    (args.out / "bench.json").write_text(result.model_dump_json(indent=1) + "\n")


if __name__ == "__main__":
    main_bench()
