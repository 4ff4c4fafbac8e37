"""Writing a file so that a reader, or a process killed half-way, sees the old file or the new one, never a mix.

The run store (state.json, config.json, exports) and the windows cache both write this way, through one
context manager: a temp file in the same folder, fsync, the replaced file's mode kept (a new file gets the
umask's mode, not the temp file's 0600), rename over the target, fsync the folder so the rename is durable.
On any error the temp file is removed and the error propagates; the old file is left whole.

A symlink at the path is replaced by the new file unless the caller asks to write through it (`through_symlink`),
as `open(path, "w")` does: a user's `-o link.json` means the file the link names. Writers of files that may sit
in a content-addressed store keep the default: a Hugging Face cache snapshot's config.json is a symlink to a blob
that other snapshots share, so `export --into` replaces the link rather than rewriting the shared blob.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def umask_mode() -> int:
    """The mode a plain `open(path, "w")` would give a new file (0666 less the umask). Read from /proc where it
    can be, since setting the umask to read it back races with other threads creating files."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def fsync_folder(folder: Path) -> None:
    """Make a rename or a new file in `folder` durable (its directory entry), not only the file's bytes."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# characters of the file's name kept in its temp file's name: the temp name adds a dot, a dot and 8 random
# characters, and must stay under NAME_MAX (255 bytes on Linux filesystems) for any name that is itself legal
# (40 characters are at most 160 bytes in UTF-8)
TEMP_NAME_KEEP = 40


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w", *, through_symlink: bool = False) -> Iterator[IO]:
    """Yield a temp file to write; on leaving the block it replaces `path` (see the module docstring).

    `through_symlink`: a symlink at `path` (a chain of them too) is resolved and its target replaced, keeping the
    target's mode; a dangling link's target is created. The link itself is left as it is."""
    path = Path(os.path.realpath(path)) if through_symlink else Path(path)
    file_mode = path.stat().st_mode & 0o7777 if path.exists() else umask_mode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_name, prefix = None, f".{path.name[:TEMP_NAME_KEEP]}."
    try:
        with tempfile.NamedTemporaryFile(mode, dir=path.parent, prefix=prefix, delete=False) as tmp:
            tmp_name = tmp.name
            yield tmp
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp_name, file_mode)
        os.replace(tmp_name, path)
        tmp_name = None
    finally:
        if tmp_name is not None:  # anything failed before the rename: the old file stays, the temp goes
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
    fsync_folder(path.parent)
