"""How a subcommand ends: SIGTERM told from Ctrl-C, and a stop or an error that says what to do next.

Ray's core worker runs Python signal handlers inside its own wait loops and turns whatever they raise into a plain
KeyboardInterrupt (`ray._raylet.check_signals`), so a `Terminated` raised during `ray.get`/`ray.wait` arrives as
Ctrl-C; the flag keeps the stop's true cause, for the exit code (143, not 130) and for heartbeat.json.
"""

from __future__ import annotations

from longrope.workers.errors import Terminated, WorkerPoolError


class SigtermSeen:
    """Whether this process received SIGTERM since the entry point installed `raise_terminated`."""

    received = False


def raise_terminated(signum, frame) -> None:
    """The SIGTERM handler: remember the signal, then stop the work as an interrupt (`Terminated`)."""
    SigtermSeen.received = True
    raise Terminated()


class Stopped(KeyboardInterrupt):
    """Ctrl-C or SIGTERM that ended a subcommand, with the end of the line the entry point prints about it
    (`hint`: e.g. the command that resumes the run). `terminated`: whether SIGTERM caused it."""

    def __init__(self, *, terminated: bool, hint: str):
        super().__init__()
        self.terminated, self.hint = terminated, hint


class ResumableWorkerError(WorkerPoolError):
    """A worker failure (CUDA OOM, a crash) after the run directory was made: the pool's message, then how to
    continue once the cause is fixed (`hint`)."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        return f"{super().__str__()}; {self.hint}"
