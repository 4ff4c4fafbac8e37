"""TensorBoard scalars of a running search (`search.tensorboard: true`): a cluster search runs for hours, and people
watch it where they watch their training runs.

After every generation (and every descent or polish step) the coordinator tells its `ProgressWatcher` where the
run stands (`reporting.Progress`, counted from history.jsonl as `status` counts it); this one writes, into
RUN/tensorboard/, at step = the evaluations so far (candidates done):

    search/best_perplexity   exp(best_nll): the best scored candidate's search-split perplexity
    search/best_nll          its mean NLL (nats per token)
    search/evaluations       candidates done (the step itself, as a value)
    search/generation        the last generation done (0: the initial population)
    search/forward_windows   window passes
    search/backward_windows  of which also had a backward pass (gradient and hybrid)
    search/window_equivalents forward + c x backward (`trajectory.window_equivalents`), c as `longrope estimate`
                             prices a backward pass for the job's model (given by the caller; without one, a
                             gradient or hybrid run writes no window_equivalents; the others need none)

The writer is torch's `torch.utils.tensorboard.SummaryWriter`, which needs the `tensorboard` package (the
`tensorboard` extra), not TensorFlow; it is imported when the first scalar is written, and every generation's
scalars are flushed at once. A resumed run opens a new event file in the same folder (TensorBoard reads a folder's
files in order, as one run) and writes only steps past the last one already there: a generation whose scalars
were written before a kill, and whose end the resumed run goes through again, is not written twice, and steps
never go back. Nothing here feeds back into the search: history.jsonl is the same with it on or off.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from longrope.search.config.job_config import JobConfig
from longrope.search.run.reporting import Progress
from longrope.search.run.run_store import RunStoreError
from longrope.search.run.trajectory import window_equivalents
from longrope.workers.errors import os_errors

TENSORBOARD_DIR = "tensorboard"
INSTALL = "pip install 'longrope-search[tensorboard]'"
EVENT_FILES = "events.out.tfevents.*"


def check_tensorboard_folder(config: JobConfig) -> None:
    """Refuse, before anything is scored, a RUN/tensorboard that cannot hold the scalars: a file, a dangling link,
    a folder this user cannot write. Found only at the first scalar, it would stop the run after a generation was
    scored, with the OS's "File exists" (which a dangling link also gives)."""
    if not config.search.tensorboard:
        return
    folder = Path(config.output_dir) / TENSORBOARD_DIR
    hint = "remove or rename it (the scalars go into a folder of that name), or set search.tensorboard: false"
    if folder.is_symlink() and not folder.exists():
        raise RunStoreError(f"{folder}: a dangling symbolic link (to {os.readlink(folder)!r}); {hint}")
    if folder.exists() and not folder.is_dir():
        raise RunStoreError(f"{folder}: not a folder; {hint}")
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        raise RunStoreError(f"{folder}: not writable by this user; {hint}")


def scalars(progress: Progress, backward_cost: float | None) -> dict[str, float]:
    """The tags and values written for one `Progress` (the best's only once there is one; window_equivalents
    only with a c: None, a run with backward passes whose cost is not known)."""
    values = {
        "search/evaluations": float(progress.evaluations),
        "search/generation": float(progress.generation),
        "search/forward_windows": float(progress.forward_windows),
        "search/backward_windows": float(progress.backward_windows),
    }
    if backward_cost is not None:
        cost = window_equivalents(progress.forward_windows, progress.backward_windows, backward_cost)
        values["search/window_equivalents"] = cost
    if progress.best_nll is not None:
        values["search/best_nll"] = progress.best_nll
        values["search/best_perplexity"] = math.exp(progress.best_nll)
    return values


class TensorBoardScalars:
    """A `ProgressWatcher` writing `scalars` into `folder` (see the module docstring)."""

    def __init__(self, folder: str | Path, backward_cost: float | None = None):
        self.folder, self.backward_cost = Path(folder), backward_cost
        self._writer = None
        self._last_step: int | None = None

    def update(self, progress: Progress) -> None:
        with os_errors(str(self.folder), "write TensorBoard scalars", RunStoreError):
            if self._writer is None:
                self._last_step = last_step(self.folder)
                self._writer = _summary_writer(self.folder)
            if self._last_step is not None and progress.evaluations <= self._last_step:
                return  # written before a resume (or no candidate done since the last write)
            for tag, value in scalars(progress, self.backward_cost).items():
                self._writer.add_scalar(tag, value, global_step=progress.evaluations)
            self._writer.flush()
        self._last_step = progress.evaluations

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _summary_writer(folder: Path):
    from torch.utils.tensorboard import SummaryWriter  # the tensorboard extra: only for a run that asks for it

    return SummaryWriter(log_dir=str(folder))


def last_step(folder: Path) -> int | None:
    """The largest step of any scalar in the folder's event files (None: none yet); a record cut short by a kill
    ends its file's reading, as in TensorBoard."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader  # the extra: only here

    steps = [
        event.step
        for path in sorted(folder.glob(EVENT_FILES))
        for event in EventFileLoader(str(path)).Load()
        if event.HasField("summary") and event.summary.value
    ]
    return max(steps, default=None)
