"""A new user's first hour: the demo's last line says how to reach the `longrope` command that `make` installed
into .venv, and that command is there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_make_demo_ends_by_naming_the_installed_cli():
    recipe = subprocess.run(
        ["make", "-n", "demo", "DEMO_DIR=runs/demo"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    last = [line for line in recipe.splitlines() if line.startswith("echo ")][-1]
    command = re.search(r"e\.g\. (\S+/longrope) status runs/demo", last)
    assert command and "source .venv/bin/activate" in last, last
    assert command.group(1) == ".venv/bin/longrope"
    assert (Path(sys.executable).parent / "longrope").is_file(), "the venv's bin holds the longrope the line names"
