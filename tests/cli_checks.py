"""What every bad-input test checks, in one place: a snapshot of a folder (so "nothing written" is a comparison)
and the one-line-error contract of the CLI (exit 2, exactly one `longrope: error:` line naming the problem,
nothing on stdout, nothing written); and the factors files the CLI tests hand to `compare`, `verify` and
`search`, written as `longrope export` writes them."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# the provenance a hand-written factors file carries (export's fields, no run behind it)
TEST_PROVENANCE = {"created_by": "test", "method": "x", "method_rope_parameters": {}}


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under `folder` (relative path -> what it is): a file's sha256 and mode, a folder as "dir" (so a
    created empty directory counts as a write too), a symlink as its target (never followed), a FIFO or device as
    its kind (never opened: reading a FIFO would block)."""
    entries = {}
    for path in sorted(Path(folder).rglob("*")):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            entries[str(path.relative_to(folder))] = f"link -> {os.readlink(path)}"
        elif stat.S_ISDIR(info.st_mode):
            entries[str(path.relative_to(folder))] = "dir"
        elif stat.S_ISREG(info.st_mode):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            entries[str(path.relative_to(folder))] = f"{digest} {stat.S_IMODE(info.st_mode):o}"
        else:
            entries[str(path.relative_to(folder))] = f"special {stat.S_IFMT(info.st_mode):o}"
    return entries


def cli_error_line(args: list[str], capsys, caplog, *, folder: Path) -> str:
    """Run `longrope ARGS` in-process and return its one error line, after checking the contract: exit 2, one
    non-blank line on stderr starting `longrope: error:`, nothing on stdout, `folder` unchanged.

    Python warnings and WARNING log records count as stderr lines too: the CLI shows them there, pytest takes them
    for itself."""
    from longrope.search.cli.main import main

    capsys.readouterr()  # what building the case printed
    caplog.clear()
    before = snapshot(folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # as the CLI shows them: each once, on stderr
        code = main(args)
    out, err = capsys.readouterr()
    err += "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught)
    err += "".join(f"{r.getMessage()}\n" for r in caplog.records if r.levelno >= logging.WARNING)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("longrope: error:"), err
    assert out == ""
    assert snapshot(folder) == before, "bad input must not write or overwrite anything"
    return lines[0]


def longrope_block(
    long_factor: Sequence[float], *, original: int, factor: float, attention_factor: float
) -> dict[str, Any]:
    """A transformers `rope_parameters` block of rope_type longrope (theta 10000, short factors all ones)."""
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "long_factor": list(long_factor),
        "short_factor": [1.0] * len(long_factor),
        "original_max_position_embeddings": original,
        "factor": factor,
        "attention_factor": attention_factor,
    }


def write_factors_file(
    path: Path, rope_parameters: dict[str, Any], *, max_position_embeddings: int, provenance: dict | None = None
) -> Path:
    """A factors file (search/config/factors_file.py `FactorsFile`: the block, the length it is for, its provenance) at
    `path`, its folder made."""
    document = {
        "rope_parameters": rope_parameters,
        "max_position_embeddings": max_position_embeddings,
        "provenance": TEST_PROVENANCE if provenance is None else provenance,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path
