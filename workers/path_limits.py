"""Paths the operating system will take, checked where a path is given (a config field, a run directory argument)
and not where it is first opened: a name too long for the file system is otherwise `OSError: [Errno 36] File name
too long` from whichever `stat` or `open` meets it first, as a traceback, after other files may have been written."""

from __future__ import annotations

import errno
import os
from pathlib import Path

# What the file system at / takes (POSIX pathconf); the fallbacks are Linux's <linux/limits.h>
NAME_MAX_FALLBACK = 255  # bytes in one path component (ext4, xfs, btrfs; APFS too)
PATH_MAX_FALLBACK = 4096  # bytes in a path handed to a system call, its terminating NUL included
# what a run writes under its output_dir, longest first: stage-<k>-<length>/windows-cache/.windows-<32 hex>.npz.<8>
# (a staged job's windows cache, written atomically through a temporary name) is about 90 bytes
RUN_DIR_ROOM = 128
SHOWN_CHARACTERS = 120


def os_limit(name: str, fallback: int, where: str | os.PathLike = "/") -> int:
    """The file system's limit `name` (os.pathconf) where `where` lies, or `fallback` where it gives none (-1: no
    limit, which would otherwise refuse every name)."""
    try:
        limit = os.pathconf(where, name)
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows), or no limit for this name
        return fallback
    return limit if limit >= 0 else fallback


def path_length_problem(path: str, *, room: int = 0) -> str | None:
    """Why the OS would refuse `path` for its length (a component past NAME_MAX, or the whole past PATH_MAX less
    `room` for what is written under it), or None."""
    try:
        encoded = os.fsencode(path)
    except UnicodeEncodeError as exc:
        return f"character {exc.start} cannot be part of a file name on this system"
    name_max = os_limit("PC_NAME_MAX", NAME_MAX_FALLBACK)
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > name_max:
        return f"a path component of {len(longest)} bytes (at most {name_max})"
    path_max = os_limit("PC_PATH_MAX", PATH_MAX_FALLBACK) - 1 - room
    if len(encoded) > path_max:
        room_note = f", leaving {room} for the files written under it" if room else ""
        return f"{len(encoded)} bytes (at most {path_max}{room_note})"
    return None


def shown_path(path: str | Path, limit: int = SHOWN_CHARACTERS) -> str:
    """A path as an error line shows it: whole up to `limit` characters, else its start and end and its length."""
    text = str(path)
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}...{text[-limit // 2 :]} ({len(text)} characters)"


def os_error_text(exc: OSError) -> str:
    """What an OSError on a path says, in words a user acts on (the errno's own text otherwise)."""
    if exc.errno == errno.ENAMETOOLONG:
        name_max, path_max = os_limit("PC_NAME_MAX", NAME_MAX_FALLBACK), os_limit("PC_PATH_MAX", PATH_MAX_FALLBACK)
        return f"path too long for this system (a name is at most {name_max} bytes, a path {path_max})"
    if exc.errno == errno.ELOOP:
        return "a symbolic link loop (a link that points back to itself)"
    return f"cannot read ({exc.strerror or exc})"
