"""How a search says what it is doing, without knowing where it is shown.

The run (the coordinator, `jobs.run_search`) never prints: it hands plain lines and progress to a reporter. The
command line gives it one that draws on a terminal (`cli/reporter.py`, rich); a script, a test or a benchmark
gives its own, or none: `SilentReporter` drops everything.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class ProgressBar(Protocol):
    """The search's progress while it runs: one `advance` per candidate whose score is final."""

    live: bool  # drawn as it goes; when False the coordinator says in a log line what it starts scoring

    def advance(self, best: str) -> None:
        """One more candidate done; `best` is the best search-split perplexity so far, as text."""


class SearchReporter(Protocol):
    """Where the run's lines and progress go."""

    def log(self, line: str) -> None:
        """One whole plain line (a generation's summary, a warning): no markup, never wrapped."""

    def progress(self, total: int, done: int) -> AbstractContextManager[ProgressBar]:
        """Progress over `total` candidates, `done` of them already scored (a resumed run)."""


class _NoBar:
    live = False

    def advance(self, best: str) -> None:
        pass


class SilentReporter:
    """A reporter that shows nothing: the run's files (history.jsonl, state.json, heartbeat.json) still say all."""

    def log(self, line: str) -> None:
        pass

    @contextmanager
    def progress(self, total: int, done: int) -> Iterator[ProgressBar]:
        yield _NoBar()
