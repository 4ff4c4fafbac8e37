"""heartbeat.json: whether the search holding a run directory is alive, and why it stopped.

state.json and history.jsonl say how far a search got, and hold no times (a resumed run must reach the same
bytes), so on their own they cannot tell a running search from a killed one: a dead run's state reads as
"running" forever. The process holding a run directory therefore also keeps heartbeat.json: its pid and host,
when it took the run, when it last showed a sign of life (a result, a generation, or a background beat every
BEAT_INTERVAL_S while it waits on slow workers) and, when it stops, how (finished, or stopped by Ctrl-C,
SIGTERM or an error, with the error's one line). Only `longrope status` reads it; the search never does.

Liveness (`is_alive`): on the run's own host the writer's lock is the reliable signal (the kernel drops it when
the process dies, however it dies), with the pid as a fallback where a filesystem ignores `flock`; from another
host (a shared filesystem) only the heartbeat's age can tell, against STALE_AFTER_S.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from longrope.search.run.run_store import write_text_atomic
from longrope.workers.busy_clock import BusyTime
from longrope.workers.errors import Terminated, one_line

HEARTBEAT = "heartbeat.json"
BEAT_INTERVAL_S = 30.0  # the background beat: a run waiting minutes on one slow result still looks alive
STALE_AFTER_S = 180.0  # from another host, a "running" heartbeat older than this (6 missed beats) is a dead run
RESULT_BEAT_S = 1.0  # results closer together than this update heartbeat.json once (a write is an fsync)


class Heartbeat(BaseModel):
    """heartbeat.json (times are Unix seconds; they never reach state.json or history.jsonl)."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    state: Literal["running", "stopped", "finished"]
    pid: int = Field(ge=1)
    host: str
    started_at: float  # when this process took the run
    updated_at: float  # its last sign of life; for a stopped or finished run, when it stopped
    last_result_at: float | None = None  # when the last result arrived (None: none yet in this process)
    stop_reason: str | None = None  # "Ctrl-C", "SIGTERM" or "<ErrorType>: <one line>"; None unless stopped
    busy: BusyTime | None = None  # the workers' busy time in this process, as of the last result or generation


def this_host() -> str:
    return socket.gethostname()


def read_heartbeat(path: Path) -> Heartbeat | None:
    """The heartbeat, or None when there is none (lost, or not yet written) or it cannot be read: it only
    informs `status`, which then falls back on the lock, so it must never make a run unreadable."""
    try:
        return Heartbeat.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError):
        return None


def stop_reason(exc: BaseException, sigterm_seen: Callable[[], bool] = lambda: False) -> str:
    """How a run stopped, in a few words. Ray turns a SIGTERM raised inside its waits into a plain
    KeyboardInterrupt, so the caller may say whether one was received (the CLI records it)."""
    if isinstance(exc, Terminated) or (isinstance(exc, KeyboardInterrupt) and sigterm_seen()):
        return "SIGTERM"
    if isinstance(exc, KeyboardInterrupt):
        return "Ctrl-C"
    if isinstance(exc, Exception):
        return f"{type(exc).__name__}: {one_line(exc)}"
    return type(exc).__name__


def is_longrope_process(pid: int) -> bool:
    """Whether `pid` is a live process running longrope (not a zombie, not a recycled pid of something else).
    Without /proc (not Linux) only whether the pid exists."""
    proc = Path(f"/proc/{pid}")
    if not Path("/proc/self").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        command = (proc / "cmdline").read_bytes()
    except OSError:
        return False
    return b"longrope" in command  # a zombie's cmdline is empty


def is_alive(beat: Heartbeat | None, lock_held: bool, *, now: float, host: str, stale_after_s: float) -> bool:
    """Whether the search that wrote `beat` still runs (see the module docstring). A held lock always means
    alive: a resume that is still checking its input holds it before it writes its own heartbeat."""
    if lock_held:
        return True
    if beat is None or beat.state != "running":
        return False
    if beat.host == host:
        return beat.pid != os.getpid() and is_longrope_process(beat.pid)
    return now - beat.updated_at < stale_after_s


class HeartbeatWriter:
    """Keeps heartbeat.json for one process's hold on a run directory.

    `held()` marks the run running for the block and records how it ended; it nests (the job holds the run
    while it starts Ray and loads models, the coordinator while it searches), and only the outermost block
    writes the start and the stop. `result()` and `beat()` refresh it as the search goes; a daemon thread
    refreshes it every BEAT_INTERVAL_S in between, so a run waiting on slow workers does not look dead."""

    def __init__(self, path: Path, *, sigterm_seen: Callable[[], bool] = lambda: False):
        self.path, self.sigterm_seen = Path(path), sigterm_seen
        self.record: Heartbeat | None = None
        self.depth = 0
        self.written_at = -float("inf")  # time.monotonic() of the last write
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.depth += 1
        if self.depth > 1:
            try:
                yield
            finally:
                self.depth -= 1
            return
        try:
            self._start()
            yield
        except BaseException as exc:
            self._end("stopped", stop_reason(exc, self.sigterm_seen))
            raise
        else:
            self._end("finished", None)
        finally:
            self.depth = 0

    def result(self, busy: BusyTime | None = None) -> None:
        """A result arrived: written at most every RESULT_BEAT_S (the background beat writes the rest); `busy`: the
        workers' busy time so far, where the evaluator keeps one."""
        if self.record is None:
            return
        now = time.time()
        with self._lock:
            update = {"last_result_at": now, "updated_at": now} | ({"busy": busy} if busy else {})
            self.record = self.record.model_copy(update=update)
            if time.monotonic() - self.written_at >= RESULT_BEAT_S:
                self._write()

    def beat(self, busy: BusyTime | None = None) -> None:
        """A sign of life worth writing now (a generation ended)."""
        if self.record is None:
            return
        with self._lock:
            update = {"updated_at": time.time()} | ({"busy": busy} if busy else {})
            self.record = self.record.model_copy(update=update)
            self._write()

    def _start(self) -> None:
        now = time.time()
        with self._lock:
            self.record = Heartbeat(state="running", pid=os.getpid(), host=this_host(), started_at=now, updated_at=now)
            self._write()
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat_until_stopped, name="longrope-heartbeat", daemon=True)
        self._thread.start()

    def _beat_until_stopped(self) -> None:
        while not self._stop.wait(BEAT_INTERVAL_S):
            with contextlib.suppress(OSError, ValueError):  # a full disk stops the search, not this thread
                self.beat()

    def _end(self, state: str, reason: str | None) -> None:
        """Record the stop. A write that fails here is dropped: it must not hide the error that stopped the run,
        and status then still sees a dead run (the lock is gone, the heartbeat ages)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.record is None:
            return
        with self._lock, contextlib.suppress(OSError, ValueError):
            update = {"state": state, "stop_reason": reason, "updated_at": time.time()}
            self.record = self.record.model_copy(update=update)
            self._write()

    def _write(self) -> None:
        write_text_atomic(self.path, self.record.model_dump_json(indent=1))
        self.written_at = time.monotonic()
