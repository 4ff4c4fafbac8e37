"""Reading a file a user names (a factors file, a model's weights) without hanging or crashing on what is there.

What stands at the path is read from its metadata first (`os.stat`), never by opening it: opening a FIFO for
reading blocks until a writer comes, and a character device (/dev/zero, /dev/urandom) reads forever. Only a
regular file is opened, and no more of it is read than the caller's cap, so a wrong path (a disk image, a
log) costs a stat and one bounded read, and ends in one line that says what the path holds.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from longrope.workers.path_limits import os_error_text

# what a path holds when it is not a regular file, by stat's S_IFMT (the kinds `ls -l` shows)
KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symlink",
}


def file_kind(info: os.stat_result) -> str:
    """'a regular file', or what else `info` (from stat or lstat) describes, with its article."""
    if stat.S_ISREG(info.st_mode):
        return "a regular file"
    return KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")


def regular_file_size(path: Path, where: str, error: type[Exception]) -> int:
    """The size of the regular file at `path` (a symlink is followed); anything else is `error("{where}: ...")`:
    no such file, a FIFO or device (by kind, not opened), or the OS's reason it cannot be looked at."""
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise error(f"{where}: no such file") from exc
    except OSError as exc:  # a name too long, a symlink loop, a folder above it that cannot be searched
        raise error(f"{where}: {os_error_text(exc)}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{where}: {file_kind(info)}, not a regular file") from None
    return info.st_size


def read_head(path: Path, count: int, where: str, error: type[Exception]) -> bytes:
    """Up to `count` bytes from the start of the regular file at `path` (checked first, see `regular_file_size`)."""
    regular_file_size(path, where, error)
    try:
        with open(path, "rb") as file:
            return file.read(count)
    except OSError as exc:
        raise error(f"{where}: cannot read ({exc.strerror or exc})") from exc


def read_text_capped(path: Path, max_bytes: int, what: str, where: str, error: type[Exception]) -> str:
    """The UTF-8 text of the regular file at `path`, refused past `max_bytes` (`what` names the kind of file in
    that line: "a factors file is at most N bytes") and when it is not UTF-8 (a binary file, by the first byte
    that is not)."""
    size = regular_file_size(path, where, error)
    if size > max_bytes:
        raise error(f"{where}: {size} bytes; {what} is at most {max_bytes} bytes")
    data = read_head(path, max_bytes + 1, where, error)
    if len(data) > max_bytes:  # it grew after the stat
        raise error(f"{where}: more than {max_bytes} bytes; {what} is at most {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text (byte {exc.start}); is it a binary file?") from exc


def repeated_path(paths: list[str]) -> str | None:
    """Why `paths` name one file or folder twice ("'a' is given twice", "'a' and 'b' name the same file or
    folder"), or None.
    Paths are compared resolved (`os.path.realpath`: symlinks, `..`), which never raises: a link loop stays as given
    and is named when it is read."""
    seen: dict[Path, str] = {}
    for path in paths:
        real = Path(os.path.realpath(path))
        if real in seen:
            if seen[real] == path:
                return f"{path!r} is given twice"
            return f"{seen[real]!r} and {path!r} name the same file or folder"
        seen[real] = path
    return None
