"""How a search says what it is doing, without knowing where it is shown.

The run (the coordinator, `jobs.run_search`) never prints: it hands plain lines and progress to a reporter. The
command line gives it one that draws on a terminal (`cli/reporter.py`, rich); a script, a test or a benchmark
gives its own, or none: `SilentReporter` drops everything. A `ProgressWatcher` gets the numbers a dashboard plots
after every generation (TensorBoard's, `tensorboard_scalars.py`, with `search.tensorboard: true`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Progress:
    """Where a run stands after a generation (or a descent step, a polish step): what a dashboard plots. Counted
    from history.jsonl as `status` counts it, so a resumed run's numbers go on from the interrupted run's."""

    generation: int  # the last one done (0: the initial population)
    evaluations: int  # candidates done: scored on every window, or stopped by racing
    forward_windows: int  # window passes
    backward_windows: int  # of which also had a backward pass
    best_nll: float | None  # the best scored candidate's mean NLL on the search windows (None: none yet)


class ProgressWatcher(Protocol):
    """Told the run's progress after every generation; closed when the run ends, however it ends."""

    def update(self, progress: Progress) -> None: ...

    def close(self) -> None: ...
