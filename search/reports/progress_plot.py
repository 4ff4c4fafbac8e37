"""`longrope status RUN... --plot`: the best search perplexity so far against the window-equivalents spent, one line
per run, every optimizer on one axis (a GA run and a gradient run of the same job compared at equal cost).

A run's line is its cost trajectory (`run.trajectory.cost_trajectory`): a point after every line of its
history.jsonl from the first scored candidate on, drawn as steps (the best holds until a better one is scored). A
progressive job draws its latest started stage, as `status` reports it (its line says which); an earlier stage is
drawn by naming its stage directory. The x axis's label says which c (a backward pass's cost in forwards) counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from longrope.search.reports.plot_axes import log_axis, method_colours
from longrope.search.run.run_store import RunDir, RunStoreError
from longrope.search.run.stages import is_staged, stage_lengths, started_stages
from longrope.search.run.trajectory import CostPoint, cost_trajectory, window_equivalents
from longrope.workers.atomic_files import atomic_file
from longrope.workers.path_limits import shown_path


@dataclass(frozen=True)
class PlottedRun:
    """The run a RUN argument names (a progressive job: its latest started stage), what its line is called, and
    its trajectory from its first scored candidate on (counted with c = 0: forward and backward passes apart)."""

    given: str  # as the user named it
    run_dir: RunDir  # the run directory read
    label: str  # "NAME (OPTIMIZER), GIVEN[, stage k/n at L tokens]"
    points: tuple[CostPoint, ...]

    @property
    def backward_windows(self) -> int:
        """Window passes with a backward pass so far: c matters only for a run that has some."""
        return self.points[-1].backward


@dataclass(frozen=True)
class ProgressLine:
    """One run's line: window-equivalents and the best search-split perplexity so far, point by point."""

    label: str
    cost: tuple[float, ...]
    perplexity: tuple[float, ...]


def plotted_run(given: str) -> PlottedRun:
    """A RUN argument as `status` reads it (a run directory, or a progressive job's latest started stage); one
    with no scored candidate yet is an error naming it."""
    job = RunDir(given)
    config = job.read_config()
    run_dir, stage = job, ""
    if is_staged(job):
        started = started_stages(job)
        if not started:
            raise RunStoreError(f"{given}: no stage has started yet; nothing to plot")
        run_dir, lengths = started[-1], stage_lengths(config)
        stage = f", stage {len(started)}/{len(lengths)} at {lengths[len(started) - 1]} tokens"
    points = tuple(point for point in cost_trajectory(run_dir, 0.0) if math.isfinite(point.best_nll))
    if not points:
        raise RunStoreError(f"{given}: no scored candidate yet (is the run still starting?); nothing to plot")
    return PlottedRun(given, run_dir, f"{config.name} ({config.search.optimizer}), {given}{stage}", points)


def progress_line(run: PlottedRun, backward_cost: float) -> ProgressLine:
    """The run's line with a backward pass counted as `backward_cost` forwards."""
    cost = tuple(window_equivalents(p.forward, p.backward, backward_cost) for p in run.points)
    return ProgressLine(run.label, cost, tuple(math.exp(p.best_nll) for p in run.points))


def plot_progress(lines: list[ProgressLine], cost_label: str, path: Path | None = None):
    """The lines on one axis: window-equivalents (labelled `cost_label`, which names c) against the best search
    perplexity so far, log y with plain numbers; a dot marks each line's last point (where the run stands).
    Returns the Figure (built without pyplot); with `path`, also writes it there as a PNG, atomically."""
    from matplotlib.figure import Figure  # matplotlib: only when drawing

    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.add_subplot()
    colours = method_colours([line.label for line in lines])
    for line in lines:
        colour = colours[line.label]
        ax.plot(line.cost, line.perplexity, drawstyle="steps-post", color=colour, label=line.label)
        ax.plot(line.cost[-1:], line.perplexity[-1:], "o", color=colour, markersize=4)
    ax.set_yscale("log")
    values = [value for line in lines for value in line.perplexity]
    low, high = min(values), max(values)
    log_axis(ax.yaxis, low / 1.02, high * 1.02)
    ax.set_ylim(low / 1.02, high * 1.02)
    ax.set_xlabel(cost_label)
    ax.set_ylabel("best search perplexity so far")
    ax.set_title("search progress: best candidate against cost")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small")
    if path is not None:
        write_png(fig, path)
    return fig


def write_png(fig, path: Path) -> None:
    """The figure as a PNG at `path`, atomically (a reader sees the old plot or the new one); any OS error is one
    RunStoreError naming the path."""
    try:
        with atomic_file(Path(path), "wb") as out:
            fig.savefig(out, format="png", dpi=120)
    except (FileExistsError, NotADirectoryError):  # mkdir of its folder, or the write, met a file on the way
        raise RunStoreError(f"--plot {shown_path(path)!r}: cannot write (a folder on its path is a file)") from None
    except OSError as exc:
        raise RunStoreError(f"--plot {shown_path(path)!r}: cannot write ({exc.strerror or exc})") from None
