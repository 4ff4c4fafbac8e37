"""`longrope extrapolation`: the suite's positional encodings, trained alike, read at 1x to 16x their length."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from longrope.search.config.factors_file import read_factors_file
from longrope.search.config.strict import JobConfigError
from longrope.search.reports.compare_out import CompareOut
from longrope.search.reports.extrapolation import (
    OUTPUT_FILES,
    markdown_table,
    run_extrapolation,
    write_outputs,
)
from longrope.workers.reference_recipe import ENCODING_NAMES

# 16 documents x 2048 predicted tokens per cell: the whole table in under 10 minutes on 2 cores (24 took 10.6)
DEFAULT_DOCUMENTS = 16


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "extrapolation",
        help="perplexity of every trained positional encoding (and RoPE's extension methods) at 1x-16x the "
        "training length",
    )
    parser.add_argument("-o", "--out-dir", type=Path, required=True, help="where extrapolation.json/.md/.png go")
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty --out-dir")
    parser.add_argument(
        "--checkpoints",
        type=Path,
        help="a directory with one checkpoint per encoding (what `longrope train-reference --encoding all --out "
        "DIR` writes; default: the shipped checkpoints)",
    )
    parser.add_argument(
        "--factors",
        type=Path,
        help="LongRoPE factors file for the rope model's longrope row (default: the demo's searched factors)",
    )
    parser.add_argument(
        "--documents",
        type=int,
        default=DEFAULT_DOCUMENTS,
        help=f"held-out documents per length (default {DEFAULT_DOCUMENTS})",
    )
    parser.add_argument("--device", default="cpu", help="torch device for the forwards (default cpu; e.g. cuda)")
    parser.set_defaults(handler=run_extrapolation_command)


def checkpoint_dirs(root: Path | None) -> dict[str, Path]:
    """{encoding: checkpoint directory}, in the suite's order; every encoding when `root` is None (shipped)."""
    from longrope.workers.suite_training import suite_model_dir  # torch: only when this command runs

    if root is None:
        return {name: suite_model_dir(name) for name in ENCODING_NAMES}
    if not root.is_dir():
        raise JobConfigError(f"--checkpoints {root}: no such directory")
    found = {name: root / name for name in ENCODING_NAMES if (root / name / "config.json").is_file()}
    if not found:
        raise JobConfigError(
            f"--checkpoints {root}: holds none of {', '.join(f'{n}/config.json' for n in ENCODING_NAMES)}"
        )
    return found


def check_device(name: str) -> None:
    """A device torch can use here, or one line naming it."""
    import torch  # torch: only when this command runs (`longrope --help` imports this module)

    try:
        device = torch.device(name)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:  # unknown name; CUDA not compiled in or no GPU
        raise JobConfigError(f"--device {name}: torch cannot use it here ({str(error).splitlines()[0]})") from error


def run_extrapolation_command(args: argparse.Namespace) -> int:
    from longrope.workers.suite_training import DEMO_FACTORS  # torch: only when this command runs

    if args.documents < 2:
        raise JobConfigError(f"--documents: needs at least 2 for an interval, got {args.documents}")
    check_device(args.device)
    out = CompareOut(args.out_dir, overwrite=args.overwrite)
    out.check()
    checkpoints = checkpoint_dirs(args.checkpoints)
    factors_path = args.factors or DEMO_FACTORS
    factors = read_factors_file(factors_path)
    started = time.monotonic()
    cells = run_extrapolation(
        checkpoints,
        factors,
        f"--factors {factors_path}",
        documents=args.documents,
        device=args.device,
        log=lambda line: print(line, flush=True),
    )
    write_outputs(cells, out.create())
    print(markdown_table(cells))
    print(f"extrapolation: wrote {out.path}/ ({', '.join(OUTPUT_FILES)}) in {time.monotonic() - started:.0f} s")
    return 0
