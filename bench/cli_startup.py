"""`longrope --help` against `python -c "import torch"`, side by side: the CLI's start-up cost.

The two commands alternate (so machine noise hits both alike), each run `--repeats` times in a fresh
interpreter after one untimed run of each (the file cache warmed for both); the medians and their ratio are
printed and saved to bench/results/cli_startup.json with the command, date and machine. Target:
`--help` at most 0.3x of the torch import.

    .venv/bin/python bench/cli_startup.py --repeats 9
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from benchlib import RESULTS, ROOT, provenance, save_json

from longrope.workers.timing import alternating_times

OUT = RESULTS / "cli_startup.json"
TARGET_RATIO = 0.3


def run(command: list[str]) -> None:
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--no-save", action="store_true", help="print only, save nothing")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to save (default {OUT.relative_to(ROOT)})")
    args = parser.parse_args()
    started = provenance()
    longrope = shutil.which("longrope", path=str(Path(sys.executable).parent)) or "longrope"
    commands = {"longrope --help": [longrope, "--help"], "import torch": [sys.executable, "-c", "import torch"]}
    times = alternating_times({name: lambda c=command: run(c) for name, command in commands.items()}, args.repeats)
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        spread = f"{min(times[name]):.3f}-{max(times[name]):.3f}"
        print(f"{name:18s} median {median:.3f} s  (range {spread} s, {args.repeats} runs)")
    ratio = medians["longrope --help"] / medians["import torch"]
    print(f"ratio --help / import torch: {ratio:.2f} (target <= {TARGET_RATIO})")
    if not args.no_save:
        result = {
            **started,
            "repeats": args.repeats,
            "commands": {name: " ".join(command) for name, command in commands.items()},
            "seconds": times,
            "median_s": medians,
            "ratio_help_to_import_torch": ratio,
            "target_ratio": TARGET_RATIO,
            "target_met": ratio <= TARGET_RATIO,
        }
        save_json(args.out, result)


if __name__ == "__main__":
    main()
