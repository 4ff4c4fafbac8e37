"""The one way the CLI makes a rich Console, so piped output keeps its lines whole.

rich wraps every printed line at the console's width, and a console that is not a terminal (a pipe, a file,
`ray job logs`, CI) has no width to ask for, so it falls back to 80 columns and splits paths and commands
across lines, where they can no longer be copied or grepped. Off a terminal this console soft-wraps: each
printed line is written whole and whatever reads it wraps it if it wants to. On a terminal nothing changes.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console


def cli_console(*, stderr: bool = True, **options: Any) -> Console:
    """A Console on stderr (or stdout with `stderr=False`); `options` go to rich as they are (e.g. a table's
    `width`). Soft-wrapped when its stream is not a terminal (see the module docstring)."""
    console = Console(stderr=stderr, **options)
    if not console.is_terminal:
        console.soft_wrap = True
    return console
