"""Errors of the scoring side, each naming what is wrong and the value found."""

import contextlib
from collections.abc import Iterator

from longrope.encodings.errors import LongRopeError

__all__ = [
    "DataError",
    "LongRopeError",
    "ModelLoadError",
    "Terminated",
    "WindowsCacheError",
    "WorkerPoolError",
    "os_errors",
]


class ModelLoadError(LongRopeError, ValueError):
    """A model directory is missing, unreadable, or holds a model the rope patch cannot drive."""


class DataError(LongRopeError, ValueError):
    """Documents are missing, unreadable, or too few / too short for the requested windows."""


class WindowsCacheError(DataError):
    """The windows cache cannot be written there; whoever chose the folder (a config field) names itself."""


def one_line(exc: BaseException, limit: int = 400) -> str:
    """An exception's message on one line (its lines joined), for errors shown as `longrope: error: ...`: the
    reason is often not on the first line (transformers puts it on the second)."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text[:limit] or type(exc).__name__


@contextlib.contextmanager
def os_errors(where: str, action: str, error: type[Exception]) -> Iterator[None]:
    """An OSError in the block (disk full, read-only or immutable file, permission) becomes one `error` line,
    `{where}: cannot {action} ({strerror})`, with the OSError kept as its cause: the CLI prints one line naming
    the file, and --debug still shows where it came from."""
    try:
        yield
    except OSError as exc:
        raise error(f"{where}: cannot {action} ({exc.strerror or exc})") from exc


class Terminated(KeyboardInterrupt):
    """SIGTERM (what `kill`, `ray job stop` and schedulers send), raised in the main thread as Ctrl-C is, so the
    same unwinding stops the workers and leaves the run directory whole."""


class WorkerPoolError(LongRopeError, RuntimeError):
    """The worker pool cannot go on (no worker left, Ray unreachable)."""
