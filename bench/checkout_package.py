"""`longrope.*` importable from this checkout without installing it, for the scripts that run on the GPU machine
(bench/gpu_check.py, bench/gpu_table.py), where nothing is installed: a folder on sys.path whose `longrope/` links to
search/, encodings/ and workers/ (pyproject.toml's package-dir mapping, made by hand). Imports nothing of ours, so a
script calls it before its first `longrope` import (benchlib's included)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def importable_package() -> None:
    try:
        import longrope.workers  # noqa: F401 (installed, or already importable)

        return
    except ImportError:
        pass
    shim = Path(os.environ.get("TMPDIR", "/tmp")) / f"longrope-shim-{os.getuid()}" / "longrope"
    shim.mkdir(parents=True, exist_ok=True)
    for name in ("search", "encodings", "workers"):
        link = shim / name
        if link.is_symlink() and link.resolve() != (ROOT / name).resolve():
            link.unlink()  # another checkout's: this script runs this checkout's code
        if not link.exists():
            link.symlink_to(ROOT / name, target_is_directory=True)
    sys.path.insert(0, str(shim.parent))
