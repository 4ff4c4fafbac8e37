"""`longrope --help` against `python -c "import torch"`, side by side: the CLI's start-up cost.

The two commands alternate (so machine noise hits both alike), each run `--repeats` times in a fresh
interpreter; the medians and their ratio are printed. Target (issue 10): `--help` at most 0.3x of the torch import.

    .venv/bin/python bench/cli_startup.py --repeats 9
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    longrope = shutil.which("longrope", path=str(Path(sys.executable).parent)) or "longrope"
    commands = {"longrope --help": [longrope, "--help"], "import torch": [sys.executable, "-c", "import torch"]}
    for command in commands.values():
        seconds(command)  # warm the file cache once for both
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, command in commands.items():
            times[name].append(seconds(command))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        spread = f"{min(times[name]):.3f}-{max(times[name]):.3f}"
        print(f"{name:18s} median {median:.3f} s  (range {spread} s, {args.repeats} runs)")
    ratio = medians["longrope --help"] / medians["import torch"]
    print(f"ratio --help / import torch: {ratio:.2f} (target <= 0.3)")


if __name__ == "__main__":
    main()
