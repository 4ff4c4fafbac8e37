"""Writing a file so that a reader, or a process killed half-way, sees the old file or the new one, never a mix.

The run store (state.json, config.json, exports) and the windows cache both write this way, through one
context manager: a temp file in the same folder, fsync, the replaced file's mode kept (a new file gets the
umask's mode, not the temp file's 0600), rename over the target, fsync the folder so the rename is durable.
On any error the temp file is removed and the error propagates; the old file is left whole.
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


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w") -> Iterator[IO]:
    """Yield a temp file to write; on leaving the block it replaces `path` (see the module docstring)."""
    path = Path(path)
    file_mode = path.stat().st_mode & 0o7777 if path.exists() else umask_mode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_name = None
    try:
        with tempfile.NamedTemporaryFile(mode, dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
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
