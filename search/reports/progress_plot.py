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

from longrope.search.export.output_paths import write_output
from longrope.search.reports.plot_axes import enclosing_log_ticks, log_axis, method_colours
from longrope.search.run.run_store import NOT_SCORED_YET, RunDir, RunStoreError
from longrope.search.run.stages import is_staged, stage_lengths, started_stages
from longrope.search.run.trajectory import CostPoint, cost_trajectory, window_equivalents
from longrope.workers.path_limits import shown_path


@dataclass(frozen=True)
class PlottedRun:
    """The run a RUN argument names (a progressive job: its latest started stage), what its line is called, and
    its trajectory from its first scored candidate on (counted with c = 0: forward and backward passes apart)."""

    given: str  # as the user named it
    run_dir: RunDir  # the run directory read
    label: str  # "NAME (OPTIMIZER), GIVEN, L tokens[, stage k/n]"
    points: tuple[CostPoint, ...]
    target_length: int = 0  # the length its windows are read at: perplexities at other lengths are not comparable

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
    run_dir, stage, length = job, "", config.target_length
    if is_staged(job):
        started = started_stages(job)
        if not started:
            raise RunStoreError(f"{given}: no stage has started yet; nothing to plot")
        run_dir, lengths = started[-1], stage_lengths(config)
        stage, length = f", stage {len(started)}/{len(lengths)}", lengths[len(started) - 1]
    points = tuple(point for point in cost_trajectory(run_dir, 0.0) if math.isfinite(point.best_nll))
    if not points:
        diverged = any(record.final for record in run_dir.read_history().values())
        why = "every candidate scored has a non-finite NLL" if diverged else NOT_SCORED_YET
        raise RunStoreError(f"{given}: {why}; nothing to plot")
    label = f"{config.name} ({searcher_text(config.search)}), {given}, {length} tokens{stage}"
    return PlottedRun(given, run_dir, label, points, length)


def searcher_text(search) -> str:
    """The optimizer, and the surrogate screening its children when one does (an arm of its own on the plot)."""
    if search.surrogate.enabled:
        return f"{search.optimizer}, surrogate {search.surrogate.proposals}x"
    return search.optimizer


def lengths_title(runs: list[PlottedRun]) -> str:
    """The plot's title: what it shows, and a warning when the runs search different target lengths (a
    perplexity at 512 tokens and one at 1024 are not on one scale; each line's label gives its length)."""
    title = "search progress: best candidate against cost"
    lengths = sorted({run.target_length for run in runs})
    if len(lengths) > 1:
        shown = ", ".join(str(length) for length in lengths)
        title += f"\nnot comparable across lines: the runs search different target lengths ({shown} tokens)"
    return title


def plot_format(path: Path, where: str) -> str:
    """The file format `path`'s extension names, one matplotlib writes (png, pdf, svg, jpg, ...); PNG when it has
    none. Another extension is refused rather than written as PNG bytes under a name that says otherwise."""
    from matplotlib.backend_bases import FigureCanvasBase  # matplotlib: only when drawing

    suffix = Path(path).suffix.lower().lstrip(".")
    if not suffix:
        return "png"
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix not in formats:
        raise RunStoreError(
            f"{where}: matplotlib writes no .{suffix} files; name it .{', .'.join(sorted(formats))} (or leave the "
            "extension out for PNG)"
        )
    return suffix


def progress_line(run: PlottedRun, backward_cost: float) -> ProgressLine:
    """The run's line with a backward pass counted as `backward_cost` forwards."""
    cost = tuple(window_equivalents(p.forward, p.backward, backward_cost) for p in run.points)
    return ProgressLine(run.label, cost, tuple(math.exp(p.best_nll) for p in run.points))


def plot_progress(lines: list[ProgressLine], cost_label: str, path: Path | None = None, title: str | None = None):
    """The lines on one axis: window-equivalents (labelled `cost_label`, which names c) against the best search
    perplexity so far, on a log y axis whose labelled ticks enclose every value drawn; a dot marks each line's
    last point (where the run stands). Returns the Figure (built without pyplot); with `path`, also writes it
    there, atomically, in the format its extension names (`plot_format`)."""
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
    ticks = enclosing_log_ticks(min(values), max(values))
    log_axis(ax.yaxis, ticks[0], ticks[-1], ticks)
    ax.set_ylim(ticks[0], ticks[-1])
    ax.set_xlabel(cost_label)
    ax.set_ylabel("best search perplexity so far")
    ax.set_title(title or lengths_title([]))
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small")
    if path is not None:
        write_png(fig, path)
    return fig


def write_png(fig, path: Path) -> None:
    """The figure at `path`, in the format its name says, atomically (a reader sees the old plot or the new one),
    through a symlink to its target (`write_output`); any OS error is one error line naming the path."""
    where = f"--plot {shown_path(path)!r}"
    fmt = plot_format(path, where)
    write_output(path, lambda out: fig.savefig(out, format=fmt, dpi=120), where, mode="wb")
