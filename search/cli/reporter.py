"""The search's reporter on the command line: log lines on a rich console, and the live bar on a terminal.

The run hands its lines and progress to a `run.reporting.SearchReporter`; this one prints each line whole (a pipe's
console is 80 columns wide, and a wrapped path cannot be copied) and draws `SearchProgress` only where a bar can
be drawn: elsewhere (nohup, `ray job logs`) rich would print it once, at the end, so the lines are all there is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

from longrope.search.cli.progress import SearchProgress


class ConsoleReporter:
    """Lines on `console`; the bar when `show_progress` and the console is a terminal."""

    def __init__(self, console: Console, *, show_progress: bool = True):
        self.console, self.show_progress = console, show_progress

    def log(self, line: str) -> None:
        self.console.print(line, soft_wrap=True, markup=False, highlight=False)

    @contextmanager
    def progress(self, total: int, done: int) -> Iterator[_RichBar]:
        bar = SearchProgress(self.console, disable=not self.show_progress or not self.console.is_terminal)
        with bar:
            yield _RichBar(bar, bar.add_task("search", total=total, completed=done))


class _RichBar:
    """One task of a SearchProgress, advanced one candidate at a time."""

    def __init__(self, bar: SearchProgress, task: int):
        self.bar, self.task = bar, task
        self.live = not bar.disable

    def advance(self, best: str) -> None:
        self.bar.update(self.task, advance=1, best=best)
