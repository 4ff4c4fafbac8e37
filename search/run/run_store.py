"""The run directory: everything a search needs to be watched, resumed and exported, as plain JSON.

- config.json: the resolved job config and its hash (a run directory never holds two configs);
- job.json: the model's shape and the search windows' hash, written with config.json (see `jobs.py`);
- history.jsonl: every scored candidate with its per-window NLL, appended and fsynced as results arrive; with
  racing also each window group of a candidate still racing ("partial") and the candidates racing stopped
  ("stopped"; see HistoryRecord). It is the one source of truth for scores and for the best candidate: a crash
  in the middle of a generation loses no evaluation, and a resumed run takes those scores instead of
  recomputing them;
- state.json: what the history cannot give (`RunState`), written atomically whenever a generation ends or new
  candidates go out: where the search stands, how it stopped, its timings, and only for a searcher whose state
  depends on the order results arrived in (the steady GA) that state, less what history.jsonl holds. A resumed
  run builds its searcher afresh from the same seed and replays the history: it asks for exactly the candidates
  already in history.jsonl, each told its recorded result, none scored again.
- heartbeat.json: who holds the run (pid, host), its last sign of life, and how it stopped (`heartbeat.py`);
  read only by `status`, never by the search, so no time reaches the files above.

config.json and state.json carry the run-directory `format` (FORMAT). A release reads its own format and every
earlier release's; a directory in another format (a newer release's, or one written before release 1.0) is refused
in one line naming the format it holds and the one this release reads, and nothing in it is changed.

A run directory has one writer at a time: `RunDir.lock()` takes an exclusive `flock` on the directory itself
(nothing is written for it), held for the run's life and released by the kernel when the process dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from longrope.search.config.job_config import JobConfig, identity_hash
from longrope.search.optimizers.factory import config_problem
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.optimizers.saved_state import OptimizerState
from longrope.search.optimizers.searcher import SearcherState, SearchProgress
from longrope.workers.atomic_files import atomic_file, fsync_folder
from longrope.workers.errors import LongRopeError, os_errors
from longrope.workers.path_limits import os_error_text, shown_path

CONFIG, STATE, HISTORY = "config.json", "state.json", "history.jsonl"
FORMAT = "1.1"  # the run-directory format this release writes; the formats it reads: READABLE_FORMATS
READABLE_FORMATS = ("1.0", FORMAT)  # 1.1 adds model.sliding_window to config.json, history's "failed" lines


Seconds = Annotated[float, Field(ge=0)]  # a duration measured on a monotonic clock: never negative


NOT_SCORED_YET = "no scored candidate yet (is the run still starting?)"  # every reader that needs a best


class RunState(BaseModel):
    """state.json: what history.jsonl cannot give. The searcher's own state only for a searcher that is not rebuilt
    by replaying the history (a `StatefulSearcher`: the steady GA's generator, parents and asks out, less what it was
    told and its early stop's bests, which history.jsonl gives); null for every other searcher, which a resume
    rebuilds by asking again and telling the recorded results. Beside it: where the search stands (`progress`, for
    `status`), how it stopped, and its timings (for the ETA)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    optimizer: OptimizerState
    progress: SearchProgress
    generation_seconds: list[Seconds]
    polish_seconds: list[Seconds] = []  # hybrid: each polish step's (and its rounding's), for status's ETA
    finished: bool = False
    stopped_early: bool = False  # the searcher's own stop rule ended it before its budget
    total_generations: int | None = Field(default=None, ge=1)  # the searcher's (CMA-ES: by its budget)
    config_hash: str | None = None  # the run's config (config.json's config_hash), stamped by `RunDir.write_state`
    format: str = FORMAT  # read_state refuses another format before the rest is read

    @property
    def searcher(self) -> SearcherState | None:  # the searcher's own state, when state.json holds it
        return self.optimizer.state


def format_problem(stored: Any) -> str | None:
    """What keeps this release from reading a file of format `stored` (None: a format it reads). Run directories
    written before release 1.0 hold an integer format (1 to 5) or none; a newer release's may mean something else by
    its fields, so neither is guessed at."""
    if stored in READABLE_FORMATS:
        return None
    reads = f"this release reads format {' and '.join(READABLE_FORMATS)}"
    if stored is None or type(stored) is int:
        held = "a pre-release format (no format key)" if stored is None else f"pre-release format {stored}"
        return f"holds {held}, written before release 1.0; {reads} (nothing was changed; start a new run)"
    if isinstance(stored, str) and _newer(_version(stored), _version(FORMAT)):
        return f"holds format {stored}, written by a newer longrope-search; {reads} (nothing was changed; upgrade)"
    return f"format must be one of {list(READABLE_FORMATS)}, got {stored!r}"


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return ()


def _newer(version: tuple[int, ...], than: tuple[int, ...]) -> bool:
    """Numerically later, trailing zeros aside ("1.0.0" is "1.0")."""
    width = max(len(version), len(than))
    return bool(version) and version + (0,) * (width - len(version)) > than + (0,) * (width - len(than))


def first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    return f"{'.'.join(str(part) for part in error['loc']) or '(top level)'}: {error['msg']}"


class RunStoreError(LongRopeError, ValueError):
    """A run directory is missing, holds another config, is in use, has a damaged file, or cannot be written."""


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=1))


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` atomically (`atomic_file`: readers never see half a file, the file keeps its mode). Any OS
    error (disk full, read-only or immutable file) becomes one RunStoreError naming the file, with no temp file
    left, so the old file is whole and a resumed run can write it again."""
    with os_errors(str(path), "write", RunStoreError), atomic_file(path) as tmp:
        tmp.write(text)


# history.jsonl's records by key, in the order of their last lines (a partial record replaced by the next)
Records = dict[str, HistoryRecord]


def final_count(history: Records) -> int:
    """Candidates done (scored on every window, or stopped by racing); a racing candidate's partial record is not."""
    return sum(1 for r in history.values() if r.final)


def window_passes(history: Records) -> tuple[int, int]:
    """(forward, backward) window passes in the history: each window with an NLL once forward, a descent step's
    gradient windows once backward too (a backward's cost in forward passes: bench/backward_cost.py)."""
    forward = sum(len(record.nll) for record in history.values())
    backward = sum(record.backward_windows for record in history.values())
    return forward, backward


def seed_perplexities(history: Records) -> dict[str, float | None]:
    """Perplexity of each seed method (pi, ntk, yarn, ...) as scored in a run's history."""
    return {r.seed: r.perplexity for r in history.values() if r.seed}


def best_of(history: Records) -> HistoryRecord | None:
    """The best scored candidate: lowest mean NLL, ties broken by key (the optimizer's own order); None if none
    has a finite score. Status, export, seeding from a run and the coordinator all use this one rule."""
    finite = [r for r in history.values() if r.mean_nll is not None and r.status == "scored"]
    return min(finite, key=lambda r: (r.mean_nll, r.key)) if finite else None


@dataclass(frozen=True)
class History:
    """history.jsonl as read: the records by key, and the bytes of a torn last line (a write cut by a crash)."""

    records: Records
    torn_tail: bytes = b""
    good_length: int = 0  # bytes up to and including the last complete line
    lines: tuple[HistoryRecord, ...] = ()  # every complete line in the order written (partial ones too)

    def line_numbers(self) -> dict[str, int]:
        """Each key's last complete line in history.jsonl (the record read for it), to name it in an error."""
        return {record.key: number for number, record in enumerate(self.lines, start=1)}


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._config: JobConfig | None = None  # config.json as read and checked once (a run's config never changes)
        self._config_hash: str | None = None

    def file(self, name: str) -> Path:
        return self.path / name

    # ---- the writer's lock ----

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold an exclusive lock on the run directory (creating it) for the block; refuse a second writer."""
        with os_errors(f"output_dir {str(self.path)!r}", "open", RunStoreError):
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise RunStoreError(
                    f"output_dir {str(self.path)!r} is in use by another running `longrope search`; "
                    "wait for it to end (or stop it) before resuming"
                ) from exc
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock, as the kernel does when the process dies

    def lock_held(self) -> bool:
        """Whether a `longrope search` holds this directory now: the liveness signal `status` trusts most, since
        the kernel drops the lock however the writer dies. Probed with a shared lock dropped at once (a writer
        starting in that instant would be refused once, as by any second writer); writes nothing."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:  # a filesystem without flock: no answer here (status falls back on the heartbeat)
            return False
        finally:
            os.close(fd)
        return False

    # ---- config ----

    def create(self, config: JobConfig) -> None:
        """Start a new run here; refuses a directory that already holds a run."""
        self.check_new(config)
        document = {"format": FORMAT, "config_hash": config.hash(), "config": config.model_dump(mode="json")}
        write_json_atomic(self.file(CONFIG), document)
        self._config, self._config_hash = config, config.hash()

    def check_new(self, config: JobConfig) -> None:
        """Refuse, without writing anything, a directory that already holds a run."""
        existing = self.path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise RunStoreError(f"output_dir {str(self.path)!r}: {str(existing)!r} exists and is not a directory")
        leftovers = [name for name in (STATE, HISTORY) if self.file(name).exists()]
        if leftovers and not self.file(CONFIG).exists():
            raise RunStoreError(
                f"output_dir {str(self.path)!r} holds {', '.join(leftovers)} but no config.json (the rest of "
                "another run?); choose another output_dir"
            )
        if self.file(CONFIG).exists():
            self.check_matches(config, hint="; choose another output_dir")
            raise RunStoreError(f"output_dir {str(self.path)!r} already holds this run; continue it with --resume")

    def read_config(self) -> JobConfig:
        """config.json's config, found to be what the run wrote: its format one this release reads, and its
        config_hash recomputed from the JSON as stored (never as today's model re-dumps it, so a field added later
        with a default leaves the run's identity as it was). Read once per RunDir."""
        if self._config is not None:
            return self._config
        data = self.read_json(CONFIG)
        if isinstance(data, dict):
            self._check_format(CONFIG, data)  # first: a newer release's file may hold another shape
        if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
            kind = type(data).__name__ if not isinstance(data, dict) else "object without a 'config' object"
            raise RunStoreError(f"{self.file(CONFIG)}: not a run config (a JSON {kind})")
        try:
            config = JobConfig.model_validate(data["config"])
            problem = config_problem(config)  # a setting its optimizer cannot honour
        except (KeyError, TypeError, ValueError) as exc:
            raise RunStoreError(f"{self.file(CONFIG)}: not a run config ({str(exc).splitlines()[0]})") from exc
        if problem:
            raise RunStoreError(f"{self.file(CONFIG)}: not a run config ({problem})")
        stored_hash = data.get("config_hash")
        if stored_hash != identity_hash(data["config"]):
            raise RunStoreError(f"{self.file(CONFIG)}: config_hash does not match its config (edited by hand?)")
        self._config, self._config_hash = config, stored_hash
        return config

    def _check_format(self, name: str, data: dict[str, Any]) -> None:
        if problem := format_problem(data.get("format")):
            raise RunStoreError(f"{self.file(name)}: {problem}")

    def check_matches(self, config: JobConfig, stored: JobConfig | None = None, hint: str = "") -> None:
        """Refuse a config other than the run's (`stored`, when read already; config.json otherwise)."""
        differs = (stored or self.read_config()).first_difference(config)
        if differs:
            where = f"output_dir {str(self.path)!r}"
            raise RunStoreError(f"{where} holds a run of another config ({differs} differs){hint}")

    # ---- state and history ----

    def write_state(self, state: RunState) -> None:
        """Write state.json stamped with the run's config hash, so a state.json copied from another run is seen
        (`polish_seconds` only once a polish step has run, as every format has written it)."""
        stamped = state.model_copy(update={"format": FORMAT, "config_hash": self.config_hash()})
        unused = set() if state.polish_seconds else {"polish_seconds"}
        written = stamped.model_dump(mode="json", exclude=unused)
        RunState.model_validate(written)  # what is written is what read_state accepts (the state as its kind's)
        write_json_atomic(self.file(STATE), written)

    def config_hash(self) -> str:
        """The run's identity hash as config.json stores it (found intact when read), read once per RunDir (the
        config of a run directory never changes)."""
        if self._config_hash is None:
            self.read_config()
        return self._config_hash

    def read_state(self) -> RunState | None:
        if not self.file(STATE).exists():
            return None
        state = self.read_json(STATE)
        if isinstance(state, dict):
            self._check_format(STATE, state)
        try:
            return RunState.model_validate(state)
        except ValidationError as exc:
            raise RunStoreError(f"{self.file(STATE)}: corrupted ({first_error(exc)})") from exc

    def append_history(self, record: HistoryRecord) -> None:
        path = self.file(HISTORY)
        with os_errors(str(path), "write", RunStoreError):
            new = not path.exists()
            with path.open("a") as history:
                history.write(record.line() + "\n")
                history.flush()
                os.fsync(history.fileno())
            if new:
                fsync_folder(path.parent)

    def read_history(self) -> Records:
        """Scored candidates by key. A torn last line (no newline yet: a write in progress or cut by a crash) is
        left out; any other line that is not a JSON object with a string `key` is an error naming the line."""
        return self.load_history().records

    def load_history(self) -> History:
        path = self.file(HISTORY)
        if not path.exists():
            return History({})
        with os_errors(str(path), "read", RunStoreError):
            data = path.read_bytes()
        good_length = data.rfind(b"\n") + 1
        records: Records = {}
        final_lines: dict[str, int] = {}
        lines: list[HistoryRecord] = []
        for number, line in enumerate(data[:good_length].splitlines(), start=1):
            record = _history_entry(path, number, line)
            key = record.key
            lines.append(record)
            if key in final_lines:  # nothing is scored twice: a resumed run takes the final record it finds
                raise RunStoreError(
                    f"{path}:{number}: a second record for candidate {key}, which line {final_lines[key]} already "
                    "holds as final (a line copied or added by hand?); the run directory is damaged"
                )
            records.pop(key, None)  # a partial record is replaced by the next one for its key, and the records
            records[key] = record  # stay in the order of their last lines: a final one's is when it landed
            if record.final:
                final_lines[key] = number
        return History(records, data[good_length:], good_length, tuple(lines))

    def cut_torn_history(self, history: History) -> None:
        """Drop a torn last line, so the next append starts on a line of its own (the writer does this on resume)."""
        with os_errors(str(self.file(HISTORY)), "cut the torn last line", RunStoreError):
            os.truncate(self.file(HISTORY), history.good_length)

    def check_directory(self) -> None:
        """The run directory itself is there and is a directory: one line for a path too long for the system, a
        symlink loop, a missing folder or a file, instead of an OSError traceback or "config.json: missing"."""
        try:
            info = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise RunStoreError(f"{shown_path(self.path)}: no such directory") from exc
        except OSError as exc:
            raise RunStoreError(f"{shown_path(self.path)}: {os_error_text(exc)}") from exc
        if not stat.S_ISDIR(info.st_mode):
            raise RunStoreError(f"{shown_path(self.path)}: not a directory (a run directory holds config.json)")

    def read_json(self, name: str) -> Any:
        self.check_directory()
        path = self.file(name)
        if not path.is_file():
            what = "not a regular file" if path.exists() else "missing"
            raise RunStoreError(f"{path}: {what} (is {str(self.path)!r} a run directory?)")
        try:
            return json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise RunStoreError(f"{path}: corrupted ({str(exc).splitlines()[0][:200]})") from exc
        except OSError as exc:
            raise RunStoreError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _history_entry(path: Path, number: int, line: bytes) -> HistoryRecord:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RunStoreError(f"{path}:{number}: corrupted line (not JSON)") from exc
    if not isinstance(record, dict):
        raise RunStoreError(f"{path}:{number}: corrupted line (a JSON {type(record).__name__}, not an object)")
    try:
        return HistoryRecord.model_validate(record)
    except ValidationError as exc:
        raise RunStoreError(f"{path}:{number}: corrupted line ({first_error(exc)})") from exc
