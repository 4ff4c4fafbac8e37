"""Where a compare run writes: a directory of its own, so a second compare never overwrites the first one's
results, and none at all when the run fails or is stopped before its results are in."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from longrope.search.config.strict import JobConfigError
from longrope.search.run.run_store import CONFIG, RunDir, RunStoreError


class CompareOut:
    """Where one compare run writes its results.

    `-o DIR` (`path`): that directory, refused when it already holds anything unless `overwrite`, since a run into
    it would replace another run's results. Default (`parent`): a fresh `<prefix>-<YYYYmmdd-HHMMSS>` in `parent`
    (see `default_out` for which folder and prefix), named by the run's start time (sorted in time, and it says
    when; `-2`, `-3`... when the name is taken), made exclusively so that two runs never share one. `check` runs
    before anything is scored (a bad directory costs nothing); `create` only once the results are in, so a failed
    or stopped run leaves no empty directory behind."""

    def __init__(
        self,
        path: Path | None = None,
        *,
        parent: Path | None = None,
        prefix: str = "compare",
        overwrite: bool = False,
        started: datetime | None = None,
    ):
        if (path is None) == (parent is None):
            raise ValueError("CompareOut: give a path (-o) or a parent (a fresh directory in it)")
        self.path, self.parent, self.prefix, self.overwrite = path, parent, prefix, overwrite
        self.stamp = (started or datetime.now()).strftime("%Y%m%d-%H%M%S")

    @classmethod
    def default_out(cls, output_dir: Path) -> CompareOut:
        """Where a compare without -o writes: a fresh compare-<time> in the job's output_dir, unless output_dir is a
        run directory (it holds a search's config.json: the demo config's runs/demo, or the run a compare took its
        job from). A run directory belongs to its search, whose files and status it holds, and is deleted with it
        (`make demo` starts with rm -rf), so the results go beside it instead: <run>-compare-<time> in its parent
        folder, named for the run they compare."""
        if not RunDir(output_dir).file(CONFIG).exists():
            return cls(parent=output_dir)
        run = Path(os.path.abspath(output_dir))
        return cls(parent=run.parent, prefix=f"{run.name}-compare")

    def check(self) -> None:
        if self.path is None:
            _check_creatable(self.parent, "output_dir")
            return
        if self.path.exists() and not self.path.is_dir():
            raise JobConfigError(f"--out-dir {self.path}: exists and is not a directory")
        held = sorted(entry.name for entry in self.path.iterdir()) if self.path.is_dir() else []
        if held and not self.overwrite:
            shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
            raise JobConfigError(
                f"--out-dir {self.path}: not empty (holds {shown}); give --overwrite to replace the files "
                "there, or another directory"
            )
        _check_creatable(self.path, "--out-dir")

    def create(self) -> Path:
        try:
            if self.path is not None:
                self.path.mkdir(parents=True, exist_ok=True)
                return self.path
            self.parent.mkdir(parents=True, exist_ok=True)
            for attempt in range(1, 10_000):
                candidate = self.parent / (f"{self.prefix}-{self.stamp}" + (f"-{attempt}" if attempt > 1 else ""))
                try:
                    candidate.mkdir()
                except FileExistsError:
                    continue
                self.path = candidate
                return candidate
        except OSError as exc:
            raise RunStoreError(f"{self.path or self.parent}: cannot create ({exc.strerror or exc})") from exc
        raise RunStoreError(f"{self.parent}: every {self.prefix}-{self.stamp}-N name is taken")


def _check_creatable(path: Path, what: str) -> None:
    """A directory compare can create or write into: its nearest existing ancestor is a writable directory."""
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise JobConfigError(f"{what} {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise JobConfigError(f"{what} {path}: {existing} is not writable")
