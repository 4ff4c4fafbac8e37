"""Where a command may write a file the user names (`export -o`, its CSV sidecar, `export --into`, `status --plot`):
one set of rules for every such path, checked on metadata alone before anything is computed or written.

- Never over a run directory's own files (config.json, job.json, history.jsonl, state.json, heartbeat.json), of
  this run or any other: `status RUN --plot RUN/history.jsonl` or `export RUN -o RUN/config.json` would replace
  the run's record with a PNG or a factors file, and every later command would call the run corrupted. The path
  is resolved first (`os.path.realpath`: symlinks, `..` and a link to the file all end at the same name), and a
  folder is a run directory when it holds config.json with a `config_hash` (what `RunDir.create` writes) or any
  of the run's other files.
- Only a regular file is replaced, atomically (`atomic_file`): a directory, a FIFO (opening one blocks;
  replacing it with a file is never what was meant), a device or a socket is refused, and so is a symlink to one
  of them or a loop of links. A symlink to a regular file, or a dangling one, is written through, as
  `open(path, "w")` does: the user's `-o link.json` means the file the link names.
- The folder it goes into must exist: a typo in a folder name (`-o rusn/demo/f.json`) is an error, not a new
  folder tree made silently (as `cp`, `tee` and shell redirection refuse it too).
- Every name fits the filesystem's NAME_MAX, so the write cannot fail half-way on a name too long.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from longrope.search.run.heartbeat import HEARTBEAT
from longrope.search.run.job_record import JOB_FILE
from longrope.search.run.run_store import CONFIG, HISTORY, STATE
from longrope.workers.atomic_files import atomic_file
from longrope.workers.errors import LongRopeError, os_errors
from longrope.workers.path_limits import NAME_MAX_FALLBACK, os_limit
from longrope.workers.user_files import file_kind

RUN_FILES = (CONFIG, JOB_FILE, HISTORY, STATE, HEARTBEAT)


class OutputPathError(LongRopeError, ValueError):
    """A path given for a command's output cannot be written as asked (see the module docstring)."""


def check_output_path(out: str | Path, where: str) -> Path:
    """Refuse, before anything is written, a path the module docstring's rules forbid; `where` names the path in
    the error ("-o 'x.json'"). Reads only metadata (lstat/stat, and a run's config.json). Returns the file that
    will be written (a symlink's resolved target)."""
    info = _lstat(Path(out), where)
    target = Path(out)
    if info is not None and stat.S_ISLNK(info.st_mode):
        info = _link_target_info(out, where)
        target = Path(os.path.realpath(out))
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise OutputPathError(f"{where}: is a directory; give a file name")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise OutputPathError(f"{where}: {file_kind(info)}, not a regular file; give a file name")
    _check_folder(target, where)
    _check_not_run_file(target, where)
    return target


def _lstat(path: Path, where: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # ENAMETOOLONG, EACCES on a folder above, ELOOP in a folder above
        raise OutputPathError(f"{where}: cannot write there ({exc.strerror or exc})") from exc


def _link_target_info(link: str | Path, where: str) -> os.stat_result | None:
    """What a symlink at the output path points to (None: dangling, its target is created)."""
    try:
        info = os.stat(link)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputPathError(f"{where}: a symlink loop; give a file name") from exc
        raise OutputPathError(f"{where}: cannot write there ({exc.strerror or exc})") from exc
    if not stat.S_ISREG(info.st_mode):
        raise OutputPathError(f"{where}: a symlink to {file_kind(info)}, not a regular file; give a file name")
    return info


def _check_folder(path: Path, where: str) -> None:
    """The folder `path` goes into exists and is a directory, and the file's name fits its NAME_MAX."""
    folder = path.parent
    if _lstat(folder, where) is None:
        raise OutputPathError(f"{where}: the folder {str(folder)!r} does not exist; create it first")
    if not os.path.isdir(folder):
        raise OutputPathError(f"{where}: {str(folder)!r} is not a directory")
    if len(os.fsencode(path.name)) > os_limit("PC_NAME_MAX", NAME_MAX_FALLBACK, folder):
        raise OutputPathError(f"{where}: cannot write there ({os.strerror(errno.ENAMETOOLONG)})")


def _check_not_run_file(path: Path, where: str) -> None:
    resolved = Path(os.path.realpath(path))
    if resolved.name in RUN_FILES and is_run_directory(resolved.parent):
        raise OutputPathError(
            f"{where}: {str(resolved)!r} is the {resolved.name} of the run directory {str(resolved.parent)!r}; "
            "writing there would destroy the run's record; give another file name"
        )


def check_not_run_directory(folder: str | Path, where: str) -> None:
    """Refuse a run directory as the folder a command fills with files of its own (a model directory's
    config.json): `train-reference --out RUN` would replace the run's config.json."""
    resolved = Path(os.path.realpath(folder))
    if is_run_directory(resolved):
        raise OutputPathError(
            f"{where}: {str(resolved)!r} is a search's run directory, whose files are the run's record and are "
            "never written over; give another folder"
        )


def is_run_directory(folder: Path) -> bool:
    """Whether `folder` holds a search's run (any of its files but config.json, or a config.json of a run: a
    model directory's config.json is no run's). Metadata and one small JSON read; False where nothing can be read."""
    if any(os.path.lexists(folder / name) for name in RUN_FILES if name != CONFIG):
        return True
    try:
        with open(folder / CONFIG, "rb") as config:
            data = json.loads(config.read(1 << 22) or b"null")
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "config_hash" in data


def write_output(out: str | Path, write, where: str, mode: str = "w") -> None:
    """Write an output file atomically, through a symlink at `out` to its target, keeping the target's mode
    (`atomic_file`); `write(file)` writes its content. Any OS error is one OutputPathError naming the path."""
    with os_errors(where, "write", OutputPathError), atomic_file(Path(out), mode, through_symlink=True) as tmp:
        write(tmp)
