"""What the worker pool yields for a task that raised on every worker it was tried on: the search records it as
failed and goes on, instead of one bad candidate or one bad GPU ending a run."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskFailure:
    """A task given up after `attempts` tries; `error` is the last one's exception, on one line
    (`ExceptionName: message`), as history.jsonl records it."""

    error: str
    attempts: int
