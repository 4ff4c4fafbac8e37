"""The runs of the GPU machine's `run` tool that give the table, one per part of the GGUF, written once here: printed
for bench/README.md by `gpu_table.py sequence` (tests/test_gpu_table.py checks the README holds them) and executed,
step for step with local paths, by `gpu_table.py dry-run`, so the sequence the README gives is the one CI runs.

Each run installs the carried wheels (pydantic for the project's models, gguf for reading the GGUF) into /tmp/site,
appends its part to the GGUF assembled under /tmp/longrope-gpu (bench/gpu_parts.py join); the last also carries the
bundle (bundle.json, windows.safetensors) and runs the table. The machine stays warm 30 s after a run: call the next
at once. A refusal names the part and what is next (a fresh machine starts again at part 000).
"""

from __future__ import annotations

import shlex

from pydantic import BaseModel, ConfigDict

INSTALL = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "
    ".whl/*.whl && export PYTHONPATH=/tmp/site"
)
WHEELS = ".whl"
INTO = "/tmp/longrope-gpu"
STAGE = "runs/gpu-table"  # here: ignored by git (runs/), so only what `carry` names travels
PART_TIMEOUT_S = 120
TABLE_TIMEOUT_S = 570
# the table's own deadline, from its start: 8 minutes leave the lease (15 minutes: the machine's start, the short
# runs that join the parts, this one) time to spare (bench/README.md); the run's timeout only stops a hang
DEADLINE_S = 480


class DeviceRun(BaseModel):
    """One call of the `run` tool: its command, carry and timeout_s; `steps` are the command's Python steps (script
    and arguments after `python3 -u`), which the dry run executes here."""

    model_config = ConfigDict(extra="forbid")

    command: str
    carry: list[str]
    timeout_s: int
    steps: list[list[str]]


def render(step: list[str]) -> str:
    """`python3 -u SCRIPT ARGS`, quoted for bash; $OUT (the run's output folder there) is left to the shell."""
    words = [f'"{word}"' if word.startswith("$OUT") else shlex.quote(word) for word in step]
    return " ".join(["python3", "-u", *words])


def device_runs(
    parts: list[str],
    gguf_name: str,
    *,
    stage: str = STAGE,
    into: str = INTO,
    out: str = "$OUT",
    result: str = "gpu_table",
    deadline_s: int = DEADLINE_S,
    extra: tuple[str, ...] = (),
) -> list[DeviceRun]:
    """The runs for `parts` (stage/parts/NAME.000 ...): each joins one part; the last also runs the table, writing
    out/RESULT.json."""
    runs = []
    for index, part in enumerate(parts):
        steps = [["bench/gpu_parts.py", "join", f"{stage}/parts/{part}", "--into", into]]
        carry = [WHEELS, f"{stage}/parts/manifest.json", f"{stage}/parts/{part}"]
        timeout = PART_TIMEOUT_S
        if index == len(parts) - 1:
            table = ["bench/gpu_table.py", "run", "--gguf", f"{into}/{gguf_name}", "--bundle", f"{stage}/bundle"]
            steps.append([*table, "--out", f"{out}/{result}.json", "--deadline-s", str(deadline_s), *extra])
            carry.append(f"{stage}/bundle")
            timeout = TABLE_TIMEOUT_S
        command = " && ".join([INSTALL, *map(render, steps)])
        runs.append(DeviceRun(command=command, carry=carry, timeout_s=timeout, steps=steps))
    return runs


def readme_block(runs: list[DeviceRun]) -> str:
    """The runs as bench/README.md gives them: one numbered line each, its timeout_s and carry, then the command."""
    lines = []
    for number, run in enumerate(runs, 1):
        carry = ", ".join(f'"{path}"' for path in run.carry)
        lines += [
            f"{number}. timeout_s {run.timeout_s}, carry [{carry}]:",
            "",
            "   ```bash",
            f"   {run.command}",
            "   ```",
        ]
    return "\n".join(lines)
